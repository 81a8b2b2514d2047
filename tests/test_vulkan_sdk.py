"""The Vulkan SDK as a pinned toolchain input: Debian packages (pool path + sha256) assembled into one root laid out as
an SDK (bin/glslc, include/, lib/libvulkan.so, share/cmake/), its programs run through the packages' own loader; a
header states its version; zinc's build finds zig and glslc on a PATH the plan gives it."""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from builders.project import config
from builders.inputs import toolchain
from builders.inputs.host import HostFacts, ToolFact, header_version
from builders.plan import all_tools, make_plan
from builders.plan_types import Command, Layout
from test_debs import _info, make_deb

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)


def test_every_recipe_pins_the_same_sdk():
    """vulkan, zinc, lean's vulkan variant and hrx carry the same list: one SDK, assembled once (its root is named by the
    packages' sha256s)."""
    lists = {name: [t.get("debs") for t in yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())["toolchain"]
                    if t.get("tool") == "vulkan-sdk"] for name in ("vulkan", "zinc")}
    lean = yaml.safe_load((ROOT / "recipes" / "lean.yaml").read_text())["variants"]["vulkan"]["toolchain"]
    lists["lean-vulkan"] = [t.get("debs") for t in lean if t.get("tool") == "vulkan-sdk"]
    hrx = yaml.safe_load((ROOT / "recipes" / "hrx.yaml").read_text())["toolchain"]
    lists["hrx"] = [t.get("debs") for t in hrx if t.get("tool") == "vulkan-sdk"]
    assert lists["vulkan"] == lists["zinc"] == lists["lean-vulkan"] == lists["hrx"] and len(lists["vulkan"]) == 1
    assert len(lists["vulkan"][0]) == 8


@pytest.mark.parametrize("text, version", [
    ("#define VK_HEADER_VERSION 309\n#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)\n",
     "1.4.309"),
    ("#define VK_HEADER_VERSION 239\n#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n",
     "1.3.239"),
    ("#define VK_HEADER_VERSION 239\n", None),
    ("", None),
])
def test_header_version(text, version):
    assert header_version("vulkan_core.h", text) == version
    assert header_version("other.h", text) is None


@pytest.mark.parametrize("pc, want", [
    ("prefix=/usr\nlibdir=${prefix}/lib/x86_64-linux-gnu\nincludedir=${prefix}/include\nName: Vulkan-Loader\n",
     "prefix=${pcfiledir}/../..\nlibdir=${prefix}/lib\nincludedir=${prefix}/include\nName: Vulkan-Loader\n"),
])
def test_pc_files_are_relocatable(pc, want):
    assert toolchain.pc_file(pc) == want


def _host_file(*candidates: str) -> Path:
    return next(Path(c) for c in candidates if Path(c).exists())


def test_assembled_sdk_runs_its_program_through_its_own_loader(tmp_path):
    """A package set with a loader and a libc (here the host's own, as the real set carries Debian 13's): bin/<prog>
    runs usr/bin/<prog> with them; lib/ holds only what a build links against."""
    loader = _host_file("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2").resolve()
    libc = _host_file("/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6").resolve()
    prog = Path(shutil.which("printf")).resolve()
    mk = lambda name, src, mode=0o755: _info(name, data=Path(src).read_bytes(), mode=mode)  # noqa: E731
    runtime, sdk = tmp_path / "runtime.deb", tmp_path / "sdk.deb"
    make_deb(runtime, [mk("./usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", loader),
                       mk("./usr/lib/x86_64-linux-gnu/libc.so.6", libc, 0o644)])
    make_deb(sdk, [mk("./usr/bin/glslc", prog),
                   _info("./usr/include/vulkan/vulkan_core.h", data=b"#define VK_HEADER_VERSION 309\n"
                         b"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)\n"),
                   _info("./usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake", data=b"# config\n"),
                   _info("./usr/lib/x86_64-linux-gnu/libvulkan.so.1.3.239", data=b"\x7fELF loader"),
                   _info("./usr/lib/x86_64-linux-gnu/libvulkan.so.1", kind=tarfile.SYMTYPE, link="libvulkan.so.1.3.239"),
                   _info("./usr/lib/x86_64-linux-gnu/libvulkan.so", kind=tarfile.SYMTYPE, link="libvulkan.so.1"),
                   _info("./usr/lib/x86_64-linux-gnu/pkgconfig/vulkan.pc",
                         data=b"prefix=/usr\nlibdir=${prefix}/lib/x86_64-linux-gnu\nincludedir=${prefix}/include\n")])
    dest = tmp_path / "toolchains" / "sdk"
    dest.parent.mkdir()
    spec = config.DebInput("pool/main/t/t/t_1_amd64.deb", "0" * 64)
    toolchain.assemble_debs([(spec, runtime), (spec, sdk)], dest)
    out = subprocess.run([dest / "bin" / "glslc", "%s-%s", "sdk", "ok"], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "sdk-ok")
    assert "ld-linux-x86-64.so.2" in (dest / "bin" / "glslc").read_text()  # through the packages' own loader
    moved = tmp_path / "moved"
    shutil.copytree(dest, moved, symlinks=True)  # the root may move: the wrapper finds itself
    assert subprocess.run([moved / "bin" / "glslc", "moved"], capture_output=True, text=True).stdout == "moved"
    assert header_version("vulkan_core.h", (dest / "include/vulkan/vulkan_core.h").read_text()) == "1.4.309"
    assert (dest / "share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake").is_file()
    assert sorted(p.name for p in (dest / "lib").iterdir()) == ["libvulkan.so", "libvulkan.so.1", "libvulkan.so.1.3.239",
                                                                "pkgconfig"]  # never the packages' libc
    assert (dest / "lib/libvulkan.so").resolve().read_bytes() == b"\x7fELF loader"
    assert (dest / "lib/pkgconfig/vulkan.pc").read_text().startswith("prefix=${pcfiledir}/../..")
    assert (dest / ".complete").is_file() and (dest / toolchain.METADATA).is_file()


def _facts(tmp_path: Path) -> HostFacts:
    tools = {}
    for bundle in PROJECT.bundles:
        for t in all_tools(PROJECT, bundle):
            root = str(tmp_path / "tc" / t.tool) if (t.env or t.pinned) else None
            tools[t.key] = ToolFact(t.key, f"{root}/{t.path}" if root else f"/usr/bin/{t.tool}", True, "99.0", root)
    return HostFacts(tools=tools, net_cut=(), jobs=2, python="/py/bin/python3", home="/home/u", env={"PATH": "/usr/bin"})


def test_zinc_builds_with_zig_and_glslc_first_on_path_and_ships_no_debug_info(tmp_path):
    plan = make_plan(PROJECT, "strix", _facts(tmp_path), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")), only={"zinc"})
    build = plan.step("build:zinc").commands[0]
    assert build.argv[:2] == ("zig", "build")
    assert build.path == (str(tmp_path / "tc/zig"), str(tmp_path / "tc/vulkan-sdk/bin"))
    env = build.environ({"PATH": "/usr/bin"})
    assert env["PATH"] == f"{tmp_path}/tc/zig:{tmp_path}/tc/vulkan-sdk/bin:/usr/bin"
    assert env["PKG_CONFIG_PATH"] == f"{tmp_path}/tc/vulkan-sdk/lib/pkgconfig"
    assert f"PATH={tmp_path}/tc/zig:{tmp_path}/tc/vulkan-sdk/bin:/usr/bin " in build.shell()  # the host's, declared
    stage = plan.step("stage:zinc").data
    assert stage.strip == "debug" and str(tmp_path / "tc/vulkan-sdk") in stage.toolchains


def test_vulkan_finds_its_sdk_through_vulkan_sdk_and_the_prefix_path(tmp_path):
    plan = make_plan(PROJECT, "vulkan", _facts(tmp_path), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")),
                     only={"vulkan"})
    env = dict(plan.step("build:vulkan").commands[0].env)
    assert env["VULKAN_SDK"] == env["CMAKE_PREFIX_PATH"] == str(tmp_path / "tc/vulkan-sdk")


def test_command_path_renders_and_composes():
    c = Command(("zig", "build"), env=(("A", "1"),), path=("/t/zig", "/t/sdk/bin"))
    assert c.environ({"PATH": "/bin", "A": "0"}) == {"PATH": "/t/zig:/t/sdk/bin:/bin", "A": "1"}
    assert c.environ({}) == {"PATH": "/t/zig:/t/sdk/bin", "A": "1"}
    assert c.to_json()["path"] == ["/t/zig", "/t/sdk/bin"]
    assert os.pathsep == ":"
