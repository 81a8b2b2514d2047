"""The CUDA variant on a machine with no CUDA toolkit and no GPU (CI, a hosted runner): the toolchain step fetches
NVIDIA's pinned wheels and assembles the toolkit, then the plan's exact CMake configure of llama.cpp at the pin runs.
That proves nvcc comes from the pinned wheels (not from /usr/local/cuda), that cudart, cuBLAS and the driver link stub
come from the same root, and that llama.cpp at the pin uses every -D the recipe passes (the build kind's own
unused-variable check). Then one real ggml-cuda object is compiled with the plan's flags: no build path in it."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from builders.project import config
from builders.inputs import host
from builders.execute import Executor
from builders.kinds.cmake import check_output
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def nvidia_plan(cache: Path, work: Path):
    project = config.load_project(ROOT)
    layout = Layout(root=ROOT, cache=cache, work=work, out=work.parent / "out")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_HOME"}  # the pinned wheels, not an override
    facts = host.gather(all_tools(project, "nvidia"), env, toolchains=cache / "toolchains")
    return project, make_plan(project, "nvidia", facts, layout, only={"cuda"})


def cache_value(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\w+=(.*)$", text, re.M)
    assert m, f"{name} is not in CMakeCache.txt"
    return m.group(1)


def test_cuda_variant_configures_from_the_pinned_wheels(cpu_bundle, tmp_path):
    cache = cpu_bundle.layout.cache  # the llama.cpp objects are fetched there already
    project, plan = nvidia_plan(cache, tmp_path / "work")
    first = [s for s in plan.steps if s.action in ("fetch", "toolchain", "source")]
    assert "toolchain:nvcc" in [s.id for s in first]
    Executor(replace(plan, steps=first), project).run()
    project, plan = nvidia_plan(cache, tmp_path / "work")
    assert plan.missing == [], plan.missing
    root = Path(plan.step("toolchain:nvcc").data.dest)
    configure = plan.step("build:cuda").commands[0]
    build_dir = Path(plan.step("build:cuda").data.build_dir)
    build_dir.mkdir(parents=True)
    for path, text in configure.files:  # the sysroot's toolchain file, which the executor writes before the configure
        Path(path).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT")}
    proc = subprocess.run(configure.argv, env={**env, **dict(configure.env)}, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert check_output(0, output) is None, output[-3000:]  # every -D was used by llama.cpp at the pin
    cache_txt = (build_dir / "CMakeCache.txt").read_text()
    assert cache_value(cache_txt, "CMAKE_CUDA_COMPILER") == str(root / "bin" / "nvcc")
    version = next((build_dir / "CMakeFiles").glob("*/CMakeCUDACompiler.cmake")).read_text()
    assert 'set(CMAKE_CUDA_COMPILER_VERSION "13.0.88")' in version, version[:500]
    for var, lib in (("CUDA_CUDART", "libcudart.so"), ("CUDA_cublas_LIBRARY", "libcublas.so"),
                     ("CUDA_cublasLt_LIBRARY", "libcublasLt.so"), ("CUDA_cuda_driver_LIBRARY", "stubs/libcuda.so")):
        found = Path(cache_value(cache_txt, var))
        assert found.name == Path(lib).name and found.resolve().is_relative_to(root.resolve()), (var, found)
    assert cache_value(cache_txt, "CUDA_cuda_driver_LIBRARY") == str(root / "lib64" / "stubs" / "libcuda.so")
    # the prefix maps reach nvcc: CMAKE_CUDA_FLAGS is the CUDAFLAGS environment, untouched, then the sysroot's
    # toolchain file's CMAKE_CUDA_FLAGS_INIT (as CMake joins them)
    init = re.search(r'^set\(CMAKE_CUDA_FLAGS_INIT "(.*)"\)$', "".join(t for _, t in configure.files), re.M)
    assert init, configure.files
    assert cache_value(cache_txt, "CMAKE_CUDA_FLAGS") == f'{dict(configure.env)["CUDAFLAGS"]} {init.group(1)}'

    # one real ggml-cuda object (it includes common.cuh, whose __FILE__ leaked at main), built with the plan's flags
    obj = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/acc.cu.o"
    proc = subprocess.run(["ninja", "-C", str(build_dir), obj], env={**env, **dict(configure.env)}, capture_output=True,
                          text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    data = (build_dir / obj).read_bytes()
    assert b"/usr/src/onebit/llama.cpp/ggml/src/ggml-cuda/common.cuh" in data  # the checkout's one map target
    for forbidden in (tmp_path, cache, Path.home()):
        assert str(forbidden).encode() + b"/" not in data, forbidden
