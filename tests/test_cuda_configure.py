"""The CUDA variant on a machine with nvcc and no GPU (CI): fetch cuBLAS as a verified toolchain input, then run the
plan's exact CMake configure of llama.cpp at the pin. That proves nvcc is found and that llama.cpp at the pin uses
every -D the recipe passes (the unused-variable check is the build kind's own). No CUDA compile here."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from builders import config, host
from builders.execute import Executor
from builders.kinds.cmake import check_output
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout

ROOT = Path(__file__).resolve().parent.parent
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
pytestmark = pytest.mark.e2e


def driver_library() -> Path | None:
    """libcuda.so for CUDA::cuda_driver: the toolkit's stub, or an installed NVIDIA driver."""
    for p in (NVCC.parent.parent / "lib64" / "stubs" / "libcuda.so", Path("/usr/lib/x86_64-linux-gnu/libcuda.so"),
              Path("/usr/lib64/libcuda.so"), Path("/lib/libcuda.so")):
        if p.exists():
            return p
    return None


def nvidia_plan(cache: Path, work: Path):
    project = config.load_project(ROOT)
    layout = Layout(root=ROOT, cache=cache, work=work, out=work.parent / "out")
    facts = host.gather(all_tools(project, "nvidia"), toolchains=cache / "toolchains")
    # without a driver library VMM cannot link: configure the rest of the flags exactly as the release does
    overrides = {} if driver_library() else {"cuda": {"GGML_CUDA_NO_VMM": "ON"}}
    return project, make_plan(project, "nvidia", facts, layout, only={"cuda"}, overrides=overrides)


@pytest.mark.skipif(not NVCC.is_file(), reason=f"no nvcc at {NVCC} (CUDA_HOME)")
def test_cuda_variant_configures_with_nvcc_and_the_fetched_cublas(cpu_bundle, tmp_path):
    cache = cpu_bundle.layout.cache  # the llama.cpp objects are fetched there already
    project, plan = nvidia_plan(cache, tmp_path / "work")
    if os.environ.get("ONEBIT_CUBLAS_ROOT") is None and not (cache / "toolchains").exists():
        assert any("cublas for cuda" in m for m in plan.missing)  # named before any work, like any toolchain
    first = [s for s in plan.steps if s.action in ("fetch", "toolchain", "source")]
    Executor(replace(plan, steps=first), project).run()
    project, plan = nvidia_plan(cache, tmp_path / "work")
    assert plan.missing == [], plan.missing
    configure = plan.step("build:cuda").commands[0]
    build_dir = Path(plan.step("build:cuda").data.build_dir)
    build_dir.mkdir(parents=True)
    proc = subprocess.run(configure.argv, env={**os.environ, **dict(configure.env)}, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert check_output(0, output) is None, output[-3000:]  # every -D was used by llama.cpp at the pin
    cache_txt = (build_dir / "CMakeCache.txt").read_text()
    compiler = re.search(r"^CMAKE_CUDA_COMPILER:\w+=(.*)$", cache_txt, re.M)
    assert compiler and compiler.group(1) == str(NVCC)
    version = (build_dir / "CMakeFiles").glob("*/CMakeCUDACompiler.cmake")
    text = next(version).read_text()
    assert re.search(r'set\(CMAKE_CUDA_COMPILER_VERSION "13\.', text), text[:500]
    cublas = re.search(r"^CUDA_cublas_LIBRARY:\w+=(.*)$", cache_txt, re.M)
    assert cublas and Path(cublas.group(1)).resolve().is_file()
