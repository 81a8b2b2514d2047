"""hrx's Vulkan side without the HRX sources: the pinned Vulkan SDK (recipes/hrx.yaml's `vulkan-sdk`, the Debian
packages every Vulkan recipe pins) inside the pinned build root, never the host's glslc.

The plan binds the assembled SDK read-only into the root and gives the build VULKAN_SDK and the prefix path. Then, in
the root through its Root value (builders/roots/root.py) with exactly those binds: CMake's FindVulkan, run by a llama.cpp tree with GGML_VULKAN
(ROCmFPX at its upstream base from the mirror: the HRX fork itself is unreachable), takes glslc, the headers and the
loader from the SDK, and the SDK's glslc (Debian 13's shaderc, through its own loader) compiles a compute shader to
SPIR-V there."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from strix_root import PROJECT, strix_root
from strix_sources import export_tree

from builders.project import config
from builders.inputs import fetch, host, toolchain
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout
from builders.session import default_cache

pytestmark = pytest.mark.e2e
SHADER = """#version 450
layout(local_size_x = 64) in;
layout(binding = 0) buffer B { float v[]; };
void main() { v[gl_GlobalInvocationID.x] *= 2.0; }
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """strix --only hrx, planned as `1bit-build build` plans it: (the SDK's toolchain step, hrx's build step)."""
    project = config.load_project(PROJECT)
    cache = default_cache()
    base = tmp_path_factory.mktemp("hrx-plan")
    layout = Layout(root=PROJECT, cache=cache, work=base / "work", out=base / "out")
    facts = host.gather(all_tools(project, "strix"), toolchains=cache / "toolchains",
                        roots={n: str(p.dest(cache)) for n, p in project.roots.items()})
    plan = make_plan(project, "strix", facts, layout, only={"hrx"})
    steps = {s.id: s for s in plan.steps}
    return steps["toolchain:vulkan-sdk"], steps["build:hrx"]


@pytest.fixture(scope="module")
def sdk(planned):
    step, _ = planned
    d = step.data
    toolchain.fetch_and_assemble(d.wheels, default_cache() / "downloads", Path(d.dest), debs=d.debs)
    return Path(d.dest)


def test_the_plan_binds_the_pinned_sdk_into_the_root(planned):
    tc, build = planned
    sdk = tc.data.dest
    assert build.needs and tc.id in build.needs
    for cmd in build.commands:
        argv = list(cmd.argv)
        assert argv[0] == "bwrap", argv[:3]  # inside the root
        assert ["--ro-bind", sdk, sdk] == argv[argv.index(sdk) - 1:argv.index(sdk) + 2]
        assert ["--setenv", "VULKAN_SDK", sdk] == argv[argv.index("VULKAN_SDK") - 1:argv.index("VULKAN_SDK") + 2]
    configure = list(build.commands[0].argv)
    assert any(a.startswith("-DCMAKE_PREFIX_PATH=") and a.endswith(f";{sdk}") for a in configure)
    assert not any(a.endswith("/glslc") and not a.startswith(sdk) for a in configure)  # no host glslc named


def test_the_sdks_glslc_compiles_a_shader_inside_the_root(sdk, tmp_path):
    root = strix_root()
    (tmp_path / "k.comp").write_text(SHADER)
    proc = root.root.run(["sh", "-c", "command -v glslc && glslc --version | head -1 && "
                                      "glslc -fshader-stage=compute --target-env=vulkan1.2 k.comp -o k.spv"],
                         path=(f"{sdk}/bin",), cwd=str(tmp_path), ro=(str(sdk),), rw=(str(tmp_path),), timeout=300)
    assert proc.returncode == 0, proc.stderr
    found, version = proc.stdout.splitlines()[:2]
    assert found == f"{sdk}/bin/glslc" and version.startswith("shaderc 2025.2"), proc.stdout
    spv = (tmp_path / "k.spv").read_bytes()
    assert spv[:4] == bytes.fromhex("03022307")  # the SPIR-V magic number, little-endian


def test_findvulkan_takes_the_sdk_inside_the_root(sdk, tmp_path):
    project = config.load_project(PROJECT)
    up = fetch.upstream_pin(project.pins["rocmfpx"])
    repo = next((d / n for d in fetch.mirror_dirs((), os.environ) for n in config.repo_names(up.name, up.url)
                 if (d / n).is_dir()), None)
    assert repo is not None, (f"{up.name} {up.short} comes from GitHub only; set {config.MIRRORS_ENV} to a directory "
                              "holding it (`nox -s tests` uses ../shared/mirrors)")
    src, build = tmp_path / "src", tmp_path / "build"
    export_tree(repo, up.commit, src)
    root = strix_root()
    env = {"VULKAN_SDK": str(sdk), "CC": "/usr/lib/llvm-22/bin/clang", "CXX": "/usr/lib/llvm-22/bin/clang++"}
    proc = root.root.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                          f"-DCMAKE_PREFIX_PATH={sdk}", "-DGGML_VULKAN=ON", "-DGGML_NATIVE=OFF",
                          "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF"],
                         env=env, cwd=str(tmp_path), ro=(str(sdk),), rw=(str(tmp_path),), timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"Found Vulkan: \S*" + re.escape(f"{sdk}/lib/libvulkan.so"), out), out[-4000:]
    cache = (build / "CMakeCache.txt").read_text()
    assert f"Vulkan_GLSLC_EXECUTABLE:FILEPATH={sdk}/bin/glslc" in cache
    assert f"Vulkan_INCLUDE_DIR:PATH={sdk}/include" in cache
