"""lean-rocm's CI-sized proof: ROCmFPX at the pin's upstream base (charlie12345/ROCmFPX, pins.yaml rocmfpx
`upstream.commit`; the fork commit is not reachable) configured for real inside the pinned root with CMake's HIP
language (GGML_HIP=ON, GPU_TARGETS=gfx1151, MMQ only), and ROCmFPX's own HIP objects compiled for gfx1151: the
rocmfp4 kernels, the q4_0_rocmfp4 MMQ and flash-attention vector instances, and convert.cu. The whole ggml-hip (over an
hour on 2 cores) is `nox -s build-strix`'s job, not CI's.

What the configure gets is recipes/lean.yaml's rocm variant, less what only the fork has: GGML_HIP_ROCMI4_W4A4 (no such
option at the upstream base: ggml/CMakeLists.txt declares none) and LLAMA_USE_PREBUILT_UI (the upstream base's CMake
never reads it, and this project turns an unused -D into an error)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from strix_root import strix_root
from strix_sources import export_tree

from builders.project import config
from builders.inputs import fetch
from builders.ship import offload, stage
from builders.session import default_cache

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e
# ggml/src/ggml-hip/CMakeLists.txt at the upstream base: :64 appends rocmfp4_hip.cu, :69 globs mmq-instance-*,
# :82 lists the q4_0_rocmfp4 fattn-vec instance; convert.cu is ggml-cuda's, with ROCmFPX's dequantizers
OBJECTS = ("__/__/rocmfp4/rocmfp4_hip.cu.o", "__/ggml-cuda/template-instances/mmq-instance-q4_0_rocmfp4.cu.o",
           "__/ggml-cuda/template-instances/fattn-vec-instance-q4_0_rocmfp4-q4_0_rocmfp4.cu.o",
           "__/ggml-cuda/convert.cu.o")
FORK_ONLY = ("GGML_HIP_ROCMI4_W4A4", "LLAMA_USE_PREBUILT_UI")


def _rocm_variant():
    project = config.load_project(ROOT)
    return project, project.recipes["lean"].variant("rocm")


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    project, variant = _rocm_variant()
    up = fetch.upstream_pin(project.pins["rocmfpx"])
    repo = next((d / n for d in fetch.mirror_dirs((), os.environ) for n in config.repo_names(up.name, up.url)
                 if (d / n).is_dir()), None)
    assert repo is not None, (f"{up.name} {up.short} comes from GitHub only; set {config.MIRRORS_ENV} to a directory "
                              "holding it (`nox -s tests` uses ../shared/mirrors)")
    base = tmp_path_factory.mktemp("rocmfpx")
    src, build = base / "src", base / "build"
    absent = export_tree(repo, up.commit, src)
    assert all(re.fullmatch(r"models/ggml-vocab-[\w.-]+\.gguf", a) for a in absent), absent  # lean.yaml may_lack
    root = strix_root()
    options = {k: str(v) for k, v in variant.options.items() if k not in FORK_ONLY}
    options = {**options, "CMAKE_HIP_COMPILER": "/usr/lib/llvm-22/bin/clang++", "CMAKE_PREFIX_PATH": "/usr",
               "LLAMA_BUILD_NUMBER": "0", "LLAMA_BUILD_COMMIT": up.short}
    env = {**{k: str(v) for k, v in variant.env.items()}, "ROCM_PATH": "/usr",
           "CCACHE_DIR": str(default_cache() / "ccache"), "CMAKE_HIP_COMPILER_LAUNCHER": "ccache"}
    argv = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            *[f"-D{k}={'ON' if v == 'True' else 'OFF' if v == 'False' else v}" for k, v in sorted(options.items())]]
    (default_cache() / "ccache").mkdir(parents=True, exist_ok=True)
    proc, wall = root.run(argv, cwd=base, rw=(default_cache() / "ccache",), env=env, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return root, base, build, env, out


def test_configure_finds_the_hip_compiler_and_hipblas(configured):
    _, _, _, _, out = configured
    assert "The HIP compiler identification is Clang 22.1.8" in out, out[-3000:]
    assert "HIP and hipBLAS found" in out
    assert "Manually-specified variables were not used" not in out, out[-3000:]


def test_the_recipe_asks_for_mmq_only_and_gfx1151():
    """The seeds' MMQ-only setting is upstream's GGML_HIP_FORCE_MMQ (ggml/CMakeLists.txt:221 at the base; ggml-hip's
    CMakeLists.txt:105-106 turns it into GGML_CUDA_FORCE_MMQ)."""
    _, variant = _rocm_variant()
    assert variant.options["GGML_HIP_FORCE_MMQ"] in (True, "ON") and variant.options["GPU_TARGETS"] == "gfx1151"
    assert variant.offload_targets == ("gfx1151",)


def test_rocmfpx_hip_objects_compile_for_gfx1151(configured):
    root, base, build, env, _ = configured
    targets = [f"ggml/src/ggml-hip/CMakeFiles/ggml-hip.dir/{o}" for o in OBJECTS]
    proc, wall = root.run(["ninja", "-C", str(build), "-j2", *targets], cwd=base,
                          rw=(default_cache() / "ccache",), env=env, timeout=3600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    objs = build / "objs"
    objs.mkdir()
    for t in targets:
        (objs / Path(t).name).hardlink_to(build / t)
    files = offload.check_tree(objs, ["gfx1151"], stage.offload_runner(root.root))
    assert sorted(f.rel for f in files) == sorted(Path(o).name for o in OBJECTS)
    assert all(f.targets == ("gfx1151",) for f in files)
