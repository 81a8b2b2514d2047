"""The project's own flags (path maps) are ADDED to upstream's, never replace them: tables over builders/kinds/flags.py,
real gcc builds in two directories, and the real `make -n` of the plan's exact ds4 commands against ds4's own
Makefiles at the pins (tests/upstream/ds4/, copied unchanged): upstream's -O3 and our map on the same compile line."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from builders.project import config
from builders.cli import main
from builders.project.config import Bundle
from builders.inputs.host import HostFacts, ToolFact
from builders.kinds import flags
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)
UPSTREAM = ROOT / "tests" / "upstream" / "ds4"
SRC = '#include <stdio.h>\nint main(void) { printf("%s\\n", __FILE__); return 0; }\n'


def test_prefix_map_env_table():
    env = flags.prefix_map_env([("/w/src/k/", "/usr/src/onebit/cpu"), ("", "/x")], {"CFLAGS": "-O2", "PATH": "/bin"})
    assert env["CFLAGS"] == "-O2 -ffile-prefix-map=/w/src/k=/usr/src/onebit/cpu"
    assert env["CXXFLAGS"] == "-ffile-prefix-map=/w/src/k=/usr/src/onebit/cpu"
    assert env["KCFLAGS"] == "-ffile-prefix-map=/w/src/k=/usr/src/onebit/cpu"  # kbuild's room for additions
    assert env["CUDAFLAGS"] == "-Xcompiler=-ffile-prefix-map=/w/src/k=/usr/src/onebit/cpu"
    assert env["RUSTFLAGS"] == "--remap-path-prefix=/w/src/k=/usr/src/onebit/cpu"
    assert env["PATH"] == "/bin"


def test_build_maps_name_the_checkout_not_the_recipe():
    assert flags.build_maps(source="/w/s", build="/w/b", name="llama.cpp", cache="/c", home="/h") == [
        ("/h", "/home/builder"), ("/c", "/onebit/cache"), ("/w/b", "/usr/src/onebit/llama.cpp-build"),
        ("/w/s", "/usr/src/onebit/llama.cpp")]


@pytest.mark.parametrize("options, expected", [
    ({"GGML_NATIVE": False}, {"GGML_NATIVE": False}),  # nothing of ours in other options
    ({"CMAKE_C_FLAGS": "-O1 -g"}, {"CMAKE_C_FLAGS": "-O1 -g -ffile-prefix-map=/w=/n"}),
    ({"CMAKE_CUDA_FLAGS": "-I/cublas/include"}, {"CMAKE_CUDA_FLAGS": "-I/cublas/include -Xcompiler=-ffile-prefix-map=/w=/n"}),
    ({"CMAKE_HIP_FLAGS": ""}, {"CMAKE_HIP_FLAGS": "-ffile-prefix-map=/w=/n"}),
])
def test_a_recipes_cmake_flags_option_keeps_the_maps(options, expected):
    assert flags.cmake_options(options, [("/w", "/n")]) == expected


@pytest.mark.parametrize("variables, expected", [
    ({"DEBUG_FLAGS": ""}, {"CC": "cc -ffile-prefix-map=/w=/n", "DEBUG_FLAGS": ""}),  # make's own default compiler
    ({"CC": "clang", "X": "1"}, {"CC": "clang -ffile-prefix-map=/w=/n", "X": "1"}),
    ({"CC": "cc", "GPU_CC": "/r/bin/hipcc"}, {"CC": "cc -ffile-prefix-map=/w=/n", "GPU_CC": "/r/bin/hipcc -ffile-prefix-map=/w=/n"}),
    ({"CC": "cc", "NVCC": "/cuda/bin/nvcc"}, {"CC": "cc -ffile-prefix-map=/w=/n", "NVCC": "/cuda/bin/nvcc -Xcompiler=-ffile-prefix-map=/w=/n"}),
    ({"CFLAGS_EXTRA": "-O1", "CXX": "g++"}, {"CFLAGS_EXTRA": "-O1", "CXX": "g++ -ffile-prefix-map=/w=/n"}),
])
def test_make_gets_the_maps_through_its_compiler_variables(variables, expected):
    out = flags.make_variables(variables, [("/w", "/n")])
    assert out == expected
    assert not any(k.endswith("FLAGS") and "prefix-map" in v for k, v in out.items())


def build_in(tmp: Path, name: str) -> bytes:
    """Compile the same source in a different directory, as cmake would (absolute paths, -g)."""
    src = tmp / name / "src"
    bld = tmp / name / "build"
    src.mkdir(parents=True)
    bld.mkdir()
    (src / "main.c").write_text(SRC)
    env = flags.prefix_map_env(flags.build_maps(source=str(src), build=str(bld), name="demo"), dict(os.environ))
    subprocess.run(["gcc", "-g", "-O1", *env["CFLAGS"].split(), "-Wl,--build-id", "-o", str(bld / "demo"),
                    str(src / "main.c")], check=True, cwd=bld)
    return (bld / "demo").read_bytes()


def test_prefix_maps_make_gcc_output_identical_across_dirs(tmp_path):
    a, b = build_in(tmp_path, "one"), build_in(tmp_path, "two-longer-name")
    assert a == b
    assert str(tmp_path).encode() not in a
    assert b"/usr/src/onebit/demo/main.c" in a


# ---- ds4: the plan's exact make command against upstream's own Makefile -----------------------------------------
def facts(tc: Path) -> HostFacts:
    tools = {}
    for bundle in PROJECT.bundles:
        for t in all_tools(PROJECT, bundle):
            root = f"{tc}/{t.env}" if t.env else None
            tools[t.key] = ToolFact(t.key, f"{root}/{t.path}" if root else t.tool, True, "99.0", root)
    return HostFacts(tools=tools, net_cut=(), jobs=2, python="/py/bin/python3", home="/home/u")


def with_ds4_cuda() -> config.Project:
    b = Bundle(name="ds4cuda", path=ROOT / "bundles" / "ds4cuda.yaml", version="2026.48", build_number=0,
               platform="linux-64", summary="test", components=(("ds4", ("cuda",)),))
    return replace(PROJECT, bundles={**PROJECT.bundles, "ds4cuda": b})


def make_n(project, bundle: str, variant: str, makefile: Path, tmp_path: Path, monkeypatch) -> tuple[list[str], dict]:
    """Run the plan's build commands for `variant` for real, with `make -n`, in a checkout holding upstream's
    Makefile (and an empty file for every source it names). The caller's environment has CFLAGS=-O0."""
    layout = Layout(root=ROOT, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")
    plan = make_plan(project, bundle, facts(tmp_path / "tc"), layout, only={variant})
    src = Path(plan.step(f"build:{variant}").data.source_dir)
    src.mkdir(parents=True)
    shutil.copy(makefile, src / "Makefile")
    for name in set(re.findall(r"[\w/.-]+\.(?:c|h|inc|cu|m)\b", makefile.read_text())):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).touch()
    monkeypatch.setenv("CFLAGS", "-O0")  # what a caller's shell (or a conda env) may carry: it must not reach make
    # a build root's commands as they run inside it (make -n needs no root: the host's make reads the Makefile)
    rm, cp, build = (c.inside or c for c in plan.step(f"build:{variant}").commands)
    Path(plan.step(f"build:{variant}").data.build_dir).mkdir(parents=True)  # as the executor does
    for cmd in (rm, cp):
        subprocess.run(cmd.argv, check=True)
    argv = list(build.argv)
    argv.insert(argv.index("make") + 1, "-n")
    proc = subprocess.run(argv, env=build.environ(os.environ), capture_output=True, text=True)  # as the executor runs it
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = plan.step(f"build:{variant}").data
    return proc.stdout.splitlines(), {"source": str(src), "build": data.build_dir, "env": dict(build.env),
                                      "unset": build.unset}


@pytest.mark.parametrize("bundle, variant, makefile, compilers, n_objects", [
    ("strix", "ds4-cpu", "main-8d576642", ("cc",), 9),
    ("strix", "ds4-rocm", "rocm-7a751eb5", ("cc", "hipcc"), 6),
    ("ds4cuda", "ds4-cuda", "main-8d576642", ("cc", "nvcc"), 9),
])
def test_ds4_builds_with_upstreams_O3_and_our_maps(tmp_path, monkeypatch, bundle, variant, makefile, compilers, n_objects):
    project = with_ds4_cuda() if bundle == "ds4cuda" else PROJECT
    lines, where = make_n(project, bundle, variant, UPSTREAM / makefile / "Makefile", tmp_path, monkeypatch)
    name = "ds4-rocm" if variant == "ds4-rocm" else "ds4"
    src_map = f"-ffile-prefix-map={where['source']}=/usr/src/onebit/{name}"
    build_map = f"-ffile-prefix-map={where['build']}=/usr/src/onebit/{name}-build"
    compiles = [ln for ln in lines if re.search(r" -c -o \S+\.o \S+\.(c|cu)$", ln)]
    assert len(compiles) >= n_objects, "\n".join(lines)
    seen = set()
    for line in compiles:
        words = line.split()
        exe = words[1] if Path(words[0]).name == "ccache" else words[0]  # the make kind's ccache launcher, where found
        seen.add(Path(exe).name)
        assert "-O3" in line.split(), line  # upstream's CFLAGS / NVCCFLAGS / GPU_CFLAGS, not replaced
        assert "-O0" not in line.split(), line  # the caller's CFLAGS never reached make
        if Path(exe).name == "nvcc":
            assert f"-Xcompiler={src_map}" in line and "--use_fast_math" in line, line
        else:
            assert src_map in line and build_map in line, line
        if Path(exe).name == "cc":
            assert "-ffast-math" in line and "-march=x86-64-v3" in line and "-D_GNU_SOURCE" in line, line
    assert seen == set(compilers), seen
    assert not any("FLAGS" in k for k in where["env"]), where["env"]  # nothing of ours in make's flag variables
    assert "CFLAGS" in where["unset"]


def test_plan_json_shows_the_maps_added_to_upstreams_flags(capsys):
    main(["--root", str(ROOT), "--cache", "/c", "--work", "/w/strix", "plan", "strix", "--json"])
    doc = json.loads(capsys.readouterr().out)
    steps = {s["id"]: s for s in doc["steps"]}
    make = steps["build:ds4-cpu"]["commands"][-1]
    assert make["argv"][make["argv"].index("make"):][:2] == ["make", "-C"] and "CFLAGS" in make["unset"]
    cc = next(a for a in make["argv"] if a.startswith("CC="))
    assert re.match(r"CC=(\S*/ccache )?cc -ffile-prefix-map=", cc), cc
    maps_part = cc.split(" --sysroot=")[0]  # then the floor's sysroot (builders/roots/sysroot.py)
    assert maps_part.endswith("=/usr/src/onebit/ds4") and " --sysroot=/c/toolchains/" in cc, cc
    assert "-ffile-prefix-map=/w/strix/build/ds4-cpu=/usr/src/onebit/ds4-build" in cc
    assert not any(k.endswith("FLAGS") for k in make.get("env", {}))
    # one target per checkout: cpu and vulkan build one llama.cpp checkout and map it (and their build dirs) alike
    cpu, vulkan = (dict(steps[f"build:{v}"]["commands"][0]["env"]) for v in ("cpu", "vulkan"))
    assert cpu["CFLAGS"].replace("/build/cpu=", "/build/X=") == vulkan["CFLAGS"].replace("/build/vulkan=", "/build/X=")
    assert "=/usr/src/onebit/llama.cpp-build" in cpu["CFLAGS"] and cpu["CFLAGS"].endswith("=/usr/src/onebit/llama.cpp")


def test_cuda_device_code_gets_the_maps(tmp_path):
    """cuda.yaml sets no CMAKE_CUDA_FLAGS (a -D of it would replace CUDAFLAGS): nvcc gets the maps from the environment,
    for its host and its device-side preprocessing alike."""
    plan = make_plan(PROJECT, "nvidia", facts(tmp_path / "tc"), Layout(root=ROOT, cache=Path("/c"), work=Path("/w"),
                                                                        out=Path("/o")), only={"cuda"})
    cmd = plan.step("build:cuda").commands[0]
    assert not [a for a in cmd.argv if a.startswith("-DCMAKE_CUDA_FLAGS=")]
    assert "-Xcompiler=-ffile-prefix-map=/w/build/cuda=/usr/src/onebit/llama.cpp-build" in dict(cmd.env)["CUDAFLAGS"]


def test_the_xdna_kernel_module_gets_the_maps_through_kcflags(tmp_path):
    """kbuild ignores CFLAGS from the environment (the amdxdna Makefile passes its own CFLAGS_MODULE on the command
    line); KCFLAGS is its room for additions. Against upstream's Makefile at the pin and Debian's 6.1 kbuild,
    `make -n modules` shows kbuild's -O2 and the map on each compile line with KCFLAGS, and no map with CFLAGS only
    (the manual proof is in the branch's closing note)."""
    plan = make_plan(PROJECT, "strix", facts(tmp_path / "tc"), Layout(root=ROOT, cache=Path("/c"), work=Path("/w"),
                                                                       out=Path("/o")), only={"xdna"})
    build = plan.step("build:xdna")
    src = build.data.source_dir
    for cmd in build.commands:
        env = dict((cmd.inside or cmd).env)  # as it runs inside the build root
        assert env["KCFLAGS"].split()[-2:] == ["-ffile-prefix-map=/w/build/xdna=/usr/src/onebit/xdna-driver-build",
                                              f"-ffile-prefix-map={src}=/usr/src/onebit/xdna-driver"]
        assert env["CFLAGS"] == env["KCFLAGS"]
