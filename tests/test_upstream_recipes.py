"""The upstream recipes (hrx, xdna, zinc, ds4, tokenizers, laya) as planned, and run plan -> build -> stage through
toolchain shims where the toolchain cannot exist here (TheRock amdclang + HRX, XRT + kernel headers, nvcc, cargo
without crates.io). The shims (tests/shims/shim.py) record every call; the tests assert the exact argv and env the
recipe asks for, and the real stage step (prune, RPATH, binaries, recipe tests) runs on what the shims leave behind.
"""
from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from release_fixture import SHIM_PASS_ENV

from builders.project import config
from builders.roots import sysroot
from builders.project.config import Bundle
from builders.execute import Executor
from builders.inputs.host import HostFacts, ToolFact
from builders.plan import all_tools, make_plan
from builders.roots.root import host as host_root
from builders.plan_types import Layout

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)
SHIM = ROOT / "tests" / "shims" / "shim.py"
LAYOUT = Layout(root=ROOT, cache=Path("/cache"), work=Path("/work/strix"), out=Path("/out/strix"))


def project_with(bundle: str, *components: tuple[str, tuple[str, ...] | None]) -> config.Project:
    b = Bundle(name=bundle, path=ROOT / "bundles" / f"{bundle}.yaml", version="2026.48", build_number=0,
               platform="linux-64", summary="test", components=tuple(components))
    return replace(HOST, bundles={**HOST.bundles, bundle: b})


def on_the_host(project: config.Project) -> config.Project:
    """The project with every build root left out: the recipes as planned on the host, TheRock and XRT from their
    variables (the shims stand in for them). Entering a build root is tested for real in tests/test_roots.py; the
    rooted plan's commands in tests/test_plan.py."""
    import copy

    recipes = {}
    for name, r in project.recipes.items():
        data = copy.deepcopy(r.data)
        data["build"].pop("root", None)
        data["stage"].pop("offload_targets", None)  # the shims' programs carry no device code (tests/test_strix_offload.py)
        for over in (data.get("variants") or {}).values():
            ((over or {}).get("build") or {}).pop("root", None)
            ((over or {}).get("stage") or {}).pop("offload_targets", None)
        recipes[name] = replace(r, data=data)
    return replace(project, recipes=recipes)


HOST = on_the_host(PROJECT)


def facts(tc: str = "/tc", python: str = "/py/bin/python3", project: config.Project = HOST) -> HostFacts:
    tools = {}
    for bundle in project.bundles:
        for t in all_tools(project, bundle):
            root = f"{tc}/{t.env}" if t.env else (f"{tc}/{t.tool}" if t.debs or t.wheels else None)  # pinned inputs
            tools[t.key] = ToolFact(t.key, f"{root}/{t.path}" if root else f"/usr/bin/{t.tool}", True, "99.0", root)
    # the host root's environment as the caller's is now (the shims' PATH and settings, when a test set them)
    return HostFacts(tools=tools, net_cut=(), jobs=2, python=python, home="/home/u", env=host_root(net_cut=()).base)


# ---- plan tables -----------------------------------------------------------------------------------------------
def step(plan, sid):
    return plan.step(sid)


def test_strix_has_the_companion_steps_in_order():
    plan = make_plan(HOST, "strix", facts(), LAYOUT)
    ids = [s.id for s in plan.steps]
    # xdna builds only the kernel module: its xrt submodule (XRT's source) is not fetched (recipes/xdna.yaml)
    assert ids.index("fetch:xdna-driver") < ids.index("source:xdna-driver@856409c")
    assert "fetch:submodules:xdna-driver" not in ids
    tok_src = next(s for s in plan.steps if s.id.startswith("source:onebit-engine@"))
    assert step(plan, "fetch:crates:tokenizers").needs == (tok_src.id,)
    assert "fetch:crates:tokenizers" in step(plan, "build:tokenizers").needs
    assert "fetch:hf:laya" in step(plan, "build:laya").needs
    hf = step(plan, "fetch:hf:laya").data
    assert (hf.repo, hf.revision) == ("convaiinnovations/laya", "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851")
    assert len(hf.files) == 5 and all(len(h) == 64 for _, h in hf.files)
    assert "ds4-cpu" in {s.data.variant for s in plan.steps if s.action == "build"}
    assert plan.refusals == []


def test_companion_keys_are_content_not_location():
    plan = make_plan(HOST, "strix", facts(), LAYOUT)
    other = make_plan(HOST, "strix", facts(), replace(LAYOUT, cache=Path("/elsewhere")))
    assert step(plan, "fetch:hf:laya").key == step(other, "fetch:hf:laya").key
    assert step(plan, "fetch:crates:tokenizers").key == step(other, "fetch:crates:tokenizers").key


def test_laya_is_refused_when_its_checkpoint_is_not_pinned():
    raw = json.loads(json.dumps(PROJECT.pins["laya"].raw))
    raw["companions"]["huggingface"]["files"]["model.safetensors"] = None
    pins = {**PROJECT.pins, "laya": replace(PROJECT.pins["laya"], raw=raw)}
    plan = make_plan(replace(PROJECT, pins=pins), "strix", facts(), LAYOUT, only={"laya"})
    assert plan.refusals == [("laya: the Hugging Face files of pin 'laya' can't be fetched "
                              f"({PROJECT.pins['laya'].where}): no sha256 for model.safetensors")]


def test_xdna_test_expands_the_xrt_tool_and_the_ko_lands_in_the_prefix():
    plan = make_plan(HOST, "strix", facts(), LAYOUT)
    stage = step(plan, "stage:xdna")
    assert stage.data.tests[0].run == ("/tc/XILINX_XRT/bin/xrt-smi", "examine")
    argv = [c.argv for c in step(plan, "build:xdna").commands]
    src, acc = step(plan, "source:xdna-driver@856409c").data.dir, "/work/strix/build/xdna/drivers/accel"
    # drivers/accel/CMakeLists.txt:20-28, :31-37, :39-45, one command each
    assert argv[:4] == [("mkdir", "-p", f"{acc}/drivers/accel/amdxdna"),
                        ("cp", "-rf", f"{src}/drivers/accel/amdxdna/.", f"{acc}/drivers/accel/amdxdna/"),
                        ("cp", "-r", f"{src}/include", f"{acc}/"),
                        ("cp", f"{src}/drivers/accel/tools/configure_kernel.sh", f"{acc}/")]
    assert argv[4][:2] == ("sh", "-c") and argv[4][-1] == acc and "configure_kernel.sh" in argv[4][2]
    assert argv[5][:4] == ("make", "-f", f"{acc}/drivers/accel/amdxdna/Makefile", f"BUILD_ROOT_DIR={acc}/amdxdna")
    assert "KERNEL_SRC=/tc/ONEBIT_KERNEL_BUILD" in argv[5] and "XDNA_BUS_TYPE=pci" in argv[5]
    assert argv[6][-1] == "copy_ko"
    assert argv[-1] == ("install", "-D", "-m", "0644", f"{acc}/amdxdna/amdxdna.ko",
                        "/work/strix/build/xdna/_prefix/lib/modules/amdxdna.ko")
    assert not any("/bins" in a for c in argv for a in c if not a.startswith("/work/"))
    assert dict(step(plan, "build:xdna").commands[5].env)["KERNEL_SRC"] == "/tc/ONEBIT_KERNEL_BUILD"


def test_hrx_is_one_build_with_both_devices():
    plan = make_plan(HOST, "strix", facts(), LAYOUT)
    entry = step(plan, "stage:hrx").data.manifest_entry
    assert entry["devices"] == ["HRX0", "Vulkan0"]
    configure = step(plan, "build:hrx").commands[0].argv
    assert {"-DGGML_HRX=ON", "-DGGML_VULKAN=ON", "-DGGML_HRX_BUNDLE_RUNTIME_LIBS=OFF", "-DBUILD_SHARED_LIBS=ON"} <= set(configure)


def test_zinc_and_ds4_commands():
    plan = make_plan(HOST, "strix", facts(), LAYOUT)
    zig = step(plan, "build:zinc").commands[0]
    # the floor's glibc as zig's target, the CPU baseline the recipe names (never the build host's own CPU)
    assert zig.argv == ("zig", "build", "-Doptimize=ReleaseFast", "-Dshaders=true", "-Dcpu=x86_64_v3",
                        "-Dtarget=x86_64-linux-gnu.2.34", "--prefix", "/work/strix/build/zinc/_prefix",
                        "--cache-dir", "/work/strix/build/zinc/zig-cache", "-j2")
    assert dict(zig.env)["ZIG_GLOBAL_CACHE_DIR"] == "/work/strix/build/zinc/zig-global-cache"
    make = step(plan, "build:ds4-cpu").commands[2].argv
    # upstream's `CFLAGS ?= -O3 ...` stays: the path maps go into CC, and make inherits no flag variables
    # and the floor's sysroot after the compiler (builders/roots/sysroot.py): what it compiles and links against
    sr = sysroot.Sysroot("/tc/sysroot")
    assert make == ("make", "-C", "/work/strix/build/ds4-cpu/tree", "-j2", "cpu",
                    "CC=/usr/bin/ccache cc " + maps("/home/u", "/cache", "/work/strix/build/ds4-cpu", "/work/strix/src/ds4@8d576642c39b", "ds4")
                    + " " + " ".join(sysroot.flags("gcc", sr).both),
                    "NATIVE_CPU_FLAG=-march=x86-64-v3", "DEBUG_FLAGS=")
    assert not any(k.endswith("FLAGS") for k, _ in step(plan, "build:ds4-cpu").commands[2].env)
    assert step(plan, "build:ds4-cpu").commands[2].unset == ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "OBJCFLAGS", "LDFLAGS",
                                                             "LDLIBS", "NVCCFLAGS")


def maps(home: str, cache: str, build: str, source: str, name: str, prefix: str = "-ffile-prefix-map=") -> str:
    """The path maps a build of checkout `name` gets, as compiler flags (builders/kinds/flags.py)."""
    return " ".join(f"{prefix}{old}={new}" for old, new in ((home, "/home/builder"), (cache, "/onebit/cache"),
                                                           (build, f"/usr/src/onebit/{name}-build"),
                                                           (source, f"/usr/src/onebit/{name}")))


# ---- plan -> build -> stage through the shims ------------------------------------------------------------------
@pytest.fixture
def shims(tmp_path, monkeypatch):
    bindir = tmp_path / "shim-bin"
    bindir.mkdir()
    for tool in ("cmake", "make", "cargo"):
        (bindir / tool).symlink_to(SHIM)
    log = tmp_path / "shim.jsonl"
    monkeypatch.setenv("PATH", os.pathsep.join([str(bindir), str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    monkeypatch.setenv("ONEBIT_SHIM_LOG", str(log))
    monkeypatch.setenv("ONEBIT_SHIM_ENV", "CC,CXX,LD_LIBRARY_PATH,KERNEL_SRC,DESTDIR")
    for k, v in SHIM_PASS_ENV.items():
        monkeypatch.setenv(k, v)

    def run(project, bundle: str, variant: str, source_files: dict[str, str]):
        layout = Layout(root=ROOT, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")
        plan = make_plan(project, bundle, facts(str(tmp_path / "tc"), sys.executable, project), layout, only={variant})
        src = next(s for s in plan.steps if s.action == "source").data.dir
        for name, text in source_files.items():
            (Path(src) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(src) / name).write_text(text)
        monkeypatch.setenv("ONEBIT_SHIM_COMMIT", plan.step(f"stage:{variant}").data.test_values["commit7"])
        plan.steps = [s for s in plan.steps if s.id in (f"build:{variant}", f"stage:{variant}")]
        Executor(plan, project, console=Console(file=io.StringIO())).run()
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        data = plan.step(f"stage:{variant}").data
        return plan, calls, Path(data.prefix) / data.root  # the variant's own subtree of the staged prefix

    return run


def expanded(plan, variant: str, tool: str) -> list[list[str]]:
    return [list(c.argv[1:]) for c in plan.step(f"build:{variant}").commands if c.argv[0] == tool]


def test_hrx_three_passes_through_the_shims(shims, tmp_path):
    plan, calls, prefix = shims(HOST, "strix", "hrx", {"CMakeLists.txt": "project(x)\n"})
    tc = f"{tmp_path}/tc/ONEBIT_HRX_TOOLCHAIN"
    build = f"{tmp_path}/work/build/hrx"
    cmake = [c for c in calls if c["tool"] == "cmake"]
    assert [c["argv"] for c in cmake] == expanded(plan, "hrx", "cmake")
    assert [c["argv"][:4] for c in cmake] == [["-S", plan.step("build:hrx").commands[0].argv[2], "-B", f"{build}/llama"],
                                             ["--build", f"{build}/llama", "--target", "ggml-hrx-deps"],
                                             ["-S", plan.step("build:hrx").commands[0].argv[2], "-B", f"{build}/llama"],
                                             ["--build", f"{build}/llama"], ["--install", f"{build}/llama"]]
    deps = f"{build}/llama/ggml/src/ggml-hrx/hrx/src/ggml-hrx-deps-build"
    assert cmake[2]["argv"][4:] == ["-DGGML_HRX_BUNDLE_RUNTIME_LIBS=ON",
                                    f"-DGGML_HRX_BUNDLE_LIBRARY_DIRS={deps}/libhrx/src/libhrx;{deps}/loom/binding/c;{tc}/lib;{tc}/lib/llvm/lib"]
    for c in cmake:
        assert c["env"] == {"CC": f"{tc}/lib/llvm/bin/amdclang", "CXX": f"{tc}/lib/llvm/bin/amdclang++",
                            "LD_LIBRARY_PATH": f"{tc}/lib:{tc}/lib/rocm_sysdeps/lib", "KERNEL_SRC": None, "DESTDIR": None}
        assert c["cwd"] == build
    assert f"-DCMAKE_INSTALL_PREFIX={build}/_prefix" in cmake[0]["argv"]
    assert f"-DIREE_ROCM_PATH={tc}" in cmake[0]["argv"]
    staged = sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if p.is_file())
    assert "bin/llama-server" in staged and "lib/libggml-hrx.so" in staged and "lib/rocm_sysdeps/lib/libelf.so.1" in staged
    assert prefix.name == "hrx" and (prefix.parents[2] / "bin" / "llama-server-hrx").is_symlink()


# xdna: no shim test; its module is compiled for real in the pinned root (tests/test_strix_xdna.py)


def test_tokenizers_cdylib_and_header_through_the_shims(shims, tmp_path):
    plan, calls, prefix = shims(HOST, "strix", "tokenizers", {"hf_tokenizers/include/hf_tokenizer.h": "/* c abi */\n"})
    crates = plan.step("build:tokenizers").commands[0].argv[plan.step("build:tokenizers").commands[0].argv.index("--config") + 1]
    src = next(s for s in plan.steps if s.action == "build").commands[0].argv
    assert [c["argv"] for c in calls] == [["rustc", "--release", "--locked", "--offline", "--config", crates,
                                           "--manifest-path", src[src.index("--manifest-path") + 1],
                                           "--target-dir", f"{tmp_path}/work/build/tokenizers", "-j", "2",
                                           "--lib", "--crate-type", "cdylib"]]
    assert crates.startswith(f"{tmp_path}/cache/crates/") and crates.endswith("/config.toml")
    assert (prefix / "lib" / "libtokenizers.so").is_file()
    assert (prefix / "include" / "tokenizers.h").read_text() == "/* c abi */\n"


def test_ds4_cuda_through_the_shims(shims, tmp_path):
    project = project_with("nv", ("ds4", ("cuda",)))
    plan, calls, prefix = shims(project, "nv", "ds4-cuda", {"Makefile": "all:\n"})
    cuda = f"{tmp_path}/tc/CUDA_HOME"
    build, src = f"{tmp_path}/work/build/ds4-cuda", f"{tmp_path}/work/src/ds4@8d576642c39b"
    sr = sysroot.Sysroot(f"{tmp_path}/tc/sysroot")  # the floor's sysroot after each compiler (builders/roots/sysroot.py)
    assert [c["argv"] for c in calls] == [["-C", f"{build}/tree", "-j2", "cuda",
                                           "CC=/usr/bin/ccache cc " + maps("/home/u", f"{tmp_path}/cache", build, src, "ds4")
                                           + " " + " ".join(sysroot.flags("gcc", sr).both),
                                           "NATIVE_CPU_FLAG=-march=x86-64-v3", "DEBUG_FLAGS=", f"CUDA_HOME={cuda}",
                                           f"NVCC=/usr/bin/ccache {cuda}/bin/nvcc " + maps("/home/u", f"{tmp_path}/cache", build, src, "ds4",
                                                                           "-Xcompiler=-ffile-prefix-map=")
                                           + " " + " ".join(sysroot.flags("nvcc", sr).both),
                                           "CUDA_ARCH=sm_89"]]
    assert sorted(p.name for p in (prefix / "bin").iterdir()) == ["ds4", "ds4-agent", "ds4-bench", "ds4-eval", "ds4-server"]
    assert plan.step("stage:ds4-cuda").data.manifest_entry["devices"] == ["CUDA0"]


def test_ds4_rocm_through_the_shims(shims, tmp_path):
    plan, calls, prefix = shims(HOST, "strix", "ds4-rocm", {"Makefile": "all:\n"})
    rocm = f"{tmp_path}/tc/ONEBIT_DS4_ROCM_TOOLCHAIN"
    src = plan.step("build:ds4-rocm").data.source_dir  # ds4-rocm@7a751eb56201-<patches>: patch 0001 is applied
    assert src.startswith(f"{tmp_path}/work/src/ds4-rocm@7a751eb56201-")
    m = maps("/home/u", f"{tmp_path}/cache", f"{tmp_path}/work/build/ds4-rocm", src, "ds4-rocm")
    sr = sysroot.Sysroot(f"{tmp_path}/tc/sysroot")  # the floor's sysroot after each compiler (builders/roots/sysroot.py)
    cc, hip = (" ".join(sysroot.flags(f, sr).both) for f in ("gcc", "hipcc"))
    assert [c["argv"] for c in calls] == [["-C", f"{tmp_path}/work/build/ds4-rocm/tree", "-j2", "rocm", f"CC=/usr/bin/ccache cc {m} {cc}",
                                           f"GPU_CC=/usr/bin/ccache {rocm}/bin/hipcc {m} {hip}", "NATIVE_CPU_FLAG=-march=x86-64-v3",
                                           f"ROCM_PATH={rocm}", "ROCM_ARCH=gfx1151"]]
    assert sorted(p.name for p in (prefix / "bin").iterdir()) == ["ds4", "ds4-bench", "ds4-server"]
    entry = plan.step("stage:ds4-rocm").data.manifest_entry
    assert (entry["devices"], entry["source"]["commit"]) == (["ROCm0"], "7a751eb5620113bdede014345b85152ee58f0436")
