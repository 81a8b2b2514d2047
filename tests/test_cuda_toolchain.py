"""The CUDA toolchain from pinned inputs: NVIDIA's wheels of one CUDA release, fetched by name, version and sha256,
assembled into one toolkit root; the redistributables a variant ships (cudart, cuBLAS, cuBLASLt), byte for byte with
their license; and device code built path-independent. The e2e test builds a small real CUDA library (cudart, cuBLAS
and the driver API, linked as ggml-cuda links them) with the pinned nvcc through the real plan, installs its channel,
and resolves every CUDA library inside the prefix with `ldd`. No GPU needed: nothing here runs device code."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

from builders.project import config
from builders.inputs import host, toolchain
from builders.errors import StageError
from builders.ship.install import install_bundle
from builders.plan import make_plan
from builders.plan_types import Layout, RuntimeData
from mini_project import git_repo
from test_plan import facts

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)
NVCC = next(t for t in PROJECT.recipes["cuda"].variant("default").toolchain if t.tool == "nvcc")

# NVIDIA's own pins for CUDA 13.0.2: the Requires-Dist of its `cuda-toolkit==13.0.2` metapackage (extra "all") on the
# package index. The recipe's wheels must be exactly these: one CUDA release, not a mix.
CUDA_13_0_2 = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88", "nvidia-nvvm": "13.0.88",
               "nvidia-cuda-cccl": "13.0.85", "nvidia-cuda-runtime": "13.0.96", "nvidia-cublas": "13.1.0.3"}


# ---- pure ----------------------------------------------------------------------------------------------------------
def test_the_recipe_pins_one_cuda_release():
    assert {w.package: w.version for w in NVCC.wheels} == CUDA_13_0_2
    assert NVCC.env == "CUDA_HOME" and NVCC.default is None  # /usr/local/cuda is an override, not the default
    ships = {lib for w in NVCC.wheels for lib in w.ship}
    assert ships == {"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"}  # the EULA's Attachment A names them


@pytest.mark.parametrize("name, expected", [
    ("nvidia/cu13/bin/nvcc", "bin/nvcc"),
    ("nvidia/cu13/include/cccl/cub/cub.cuh", "include/cccl/cub/cub.cuh"),
    ("nvidia/cu13/", None),
    ("nvidia/cu13/lib/", None),
    ("nvidia_cublas-13.1.0.3.dist-info/METADATA", None),
    ("nvidia/cu12/lib/libcublas.so.12", None),
])
def test_unpack_target_table(name, expected):
    assert toolchain.unpack_target(name, "nvidia/cu13") == expected


@pytest.mark.parametrize("name", ["nvidia/cu13/../../etc/passwd", "nvidia/cu13/lib/../../x", "nvidia/cu13//x",
                                  "nvidia/cu13/a\\b"])
def test_unpack_target_refuses_escapes(name):
    with pytest.raises(ValueError, match="escapes"):
        toolchain.unpack_target(name, "nvidia/cu13")


def test_driver_entry_points_and_stub_source():
    text = "typedef int CUresult;\nCUresult cuInit(unsigned int Flags);\n extern CUresult cuMemCreate_v2 (void);\n" \
           "CUresult cuInit(unsigned int Flags);\nint notme(void);\n"
    assert toolchain.driver_entry_points(text) == ["cuInit", "cuMemCreate_v2"]
    src = toolchain.stub_source(["cuInit"])
    assert "int cuInit(void) { return 34; }" in src and "never shipped" in src


@pytest.mark.parametrize("metadata, expected", [
    ("Name: x\nLicense-Expression: LicenseRef-NVIDIA-Proprietary\nLicense: other\n\nbody", "LicenseRef-NVIDIA-Proprietary"),
    ("Name: x\nLicense: LicenseRef-NVIDIA-Proprietary\n", "LicenseRef-NVIDIA-Proprietary"),
    ("Name: x\n\nLicense: in the body\n", "NOASSERTION"),
])
def test_license_of_table(metadata, expected):
    assert toolchain.license_of(metadata) == expected


@pytest.mark.parametrize("recipe", sorted(PROJECT.recipes))
def test_no_recipe_replaces_the_compilers_environment_flags(recipe):
    """-DCMAKE_<LANG>_FLAGS replaces CFLAGS/CXXFLAGS/CUDAFLAGS/HIPFLAGS, where the -ffile-prefix-map flags are: that
    is how libggml-cuda.so came to hold the work dir."""
    r = PROJECT.recipes[recipe]
    for name in r.variant_names():
        v = r.variant(name)
        if v.kind != "cmake":
            continue
        flags = [k for k in v.options if re.fullmatch(r"CMAKE_(C|CXX|CUDA|HIP|OBJC)_FLAGS", k)]
        argv = [a for a in v.options.values() if isinstance(a, str) and "_FLAGS=" in a]
        assert not flags and not argv, f"{v.id} sets {flags or argv}; put such flags in build.env instead"


def test_the_plan_assembles_the_toolkit_and_ships_its_runtime():
    plan = make_plan(PROJECT, "nvidia", facts(), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")))
    configure = plan.step("build:cuda").commands[0]
    assert not any(a.startswith("-DCMAKE_CUDA_FLAGS") for a in configure.argv)
    cudaflags = dict(configure.env)["CUDAFLAGS"]
    assert f"-Xcompiler=-ffile-prefix-map={plan.step('build:cuda').data.source_dir}=/usr/src/onebit/llama.cpp" in cudaflags  # one target per checkout
    root = Path(dict((a.split("=", 1) for a in configure.argv if a.startswith("-DCMAKE_CUDA_COMPILER=")))
                ["-DCMAKE_CUDA_COMPILER"]).parent.parent
    assert f"-DCUDA_cuda_driver_LIBRARY={root}/lib64/stubs/libcuda.so" in configure.argv
    stage = plan.step("stage:cuda").data
    assert {(r.package, r.libs) for r in stage.runtime} == {
        ("nvidia-cuda-runtime", ("libcudart.so.13",)), ("nvidia-cublas", ("libcublas.so.13", "libcublasLt.so.13"))}
    assert all(r.root == str(root) for r in stage.runtime)
    assert plan.step("package:cuda").data.depends == ("__cuda >=99",)  # facts() finds every tool at 99.0


def _fake_root(tmp_path: Path, *, metadata: bool = True) -> Path:
    root = tmp_path / "tk"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF cudart")
    (root / "licenses" / "nvidia-cuda-runtime").mkdir(parents=True)
    (root / "licenses" / "nvidia-cuda-runtime" / "License.txt").write_text("End User License Agreement\n")
    if metadata:
        (root / toolchain.METADATA).write_text(json.dumps({"wheels": [{
            "package": "nvidia-cuda-runtime", "version": "13.0.96", "sha256": "ab" * 32,
            "license": "LicenseRef-NVIDIA-Proprietary", "license_files": ["licenses/nvidia-cuda-runtime/License.txt"],
            "ship": {"libcudart.so.13": hashlib.sha256(b"\x7fELF cudart").hexdigest()}}]}))
    return root


def test_ship_copies_bytes_license_and_describes_them(tmp_path):
    root = _fake_root(tmp_path)
    base = tmp_path / "stage"
    (base / "lib").mkdir(parents=True)
    shipped = toolchain.ship(base, [RuntimeData(str(root), "nvidia-cuda-runtime", ("libcudart.so.13",))])
    assert shipped == ["share/licenses/nvidia-cuda-runtime/License.txt", "lib/libcudart.so.13", toolchain.REDISTRIBUTABLES]
    assert (base / "lib" / "libcudart.so.13").read_bytes() == b"\x7fELF cudart"
    doc = json.loads((base / toolchain.REDISTRIBUTABLES).read_text())["redistributables"]
    assert doc == [{"package": "nvidia-cuda-runtime", "version": "13.0.96", "wheel_sha256": "ab" * 32,
                    "license": "LicenseRef-NVIDIA-Proprietary",
                    "license_files": ["share/licenses/nvidia-cuda-runtime/License.txt"],
                    "files": {"lib/libcudart.so.13": hashlib.sha256(b"\x7fELF cudart").hexdigest()}}]


def test_ship_refuses_a_changed_root_a_clobber_and_a_missing_license(tmp_path):
    root = _fake_root(tmp_path)
    base = tmp_path / "stage"
    (base / "lib").mkdir(parents=True)
    (base / "lib" / "libcudart.so.13").write_bytes(b"built")
    item = [RuntimeData(str(root), "nvidia-cuda-runtime", ("libcudart.so.13",))]
    with pytest.raises(StageError, match="both built and shipped"):
        toolchain.ship(base, item)
    (base / "lib" / "libcudart.so.13").unlink()
    (root / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF patched")
    with pytest.raises(StageError, match="differs from the one nvidia-cuda-runtime carries"):
        toolchain.ship(base, item)
    bare = _fake_root(tmp_path / "override", metadata=False)
    with pytest.raises(StageError, match="no license text"):
        toolchain.ship(tmp_path / "stage2", [RuntimeData(str(bare), "nvidia-cuda-runtime", ("libcudart.so.13",))])


# ---- real: the pinned wheels and a real CUDA library ------------------------------------------------------------------
def record_sha256(wheel: Path, member: str) -> str:
    """The sha256 the wheel's own RECORD gives for a member (hex)."""
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        for line in zf.read(record).decode().splitlines():
            name, digest, _ = line.rsplit(",", 2)
            if name == member:
                b64 = digest.removeprefix("sha256=")
                return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    raise KeyError(member)


@pytest.fixture(scope="module")
def toolkit(cpu_bundle) -> Path:
    """The pinned toolkit, assembled by the toolchain step into the test session's cache."""
    cache = cpu_bundle.layout.cache
    root = host.pinned_root(NVCC, cache / "toolchains")
    toolchain.fetch_and_assemble(NVCC.wheels, cache / "downloads", root)
    return root


@pytest.mark.e2e
def test_toolkit_from_the_pinned_wheels(toolkit, cpu_bundle):
    out = subprocess.run([toolkit / "bin" / "nvcc", "--version"], capture_output=True, text=True)
    assert "release 13.0, V13.0.88" in out.stdout, out.stdout + out.stderr
    meta = json.loads((toolkit / toolchain.METADATA).read_text())
    assert {(w["package"], w["version"]) for w in meta["wheels"]} == set(CUDA_13_0_2.items())
    downloads = cpu_bundle.layout.cache / "downloads"
    for w in meta["wheels"]:
        wheel = downloads / w["sha256"] / w["wheel"]
        for name, sha in w["ship"].items():  # what may ship is what NVIDIA's wheel says it holds
            assert sha == record_sha256(wheel, f"nvidia/cu13/lib/{name}")
    stub = toolkit / toolchain.DRIVER_STUB
    readelf = subprocess.run(["readelf", "-dW", "--dyn-syms", stub], capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in readelf
    for fn in ("cuMemCreate", "cuMemMap", "cuMemAddressReserve", "cuGetErrorString", "cuDeviceGet"):
        assert re.search(rf"FUNC\s+GLOBAL\s+DEFAULT\s+\d+\s+{fn}$", readelf, re.M), fn


MINI_CMAKE = """\
cmake_minimum_required(VERSION 3.21)
project(minicuda LANGUAGES C CXX CUDA)
find_package(CUDAToolkit REQUIRED)
add_library(gemm SHARED gemm.cu)
# linked as ggml-cuda links: the runtime, cuBLAS (and through it cuBLASLt) and the driver API for VMM
target_link_libraries(gemm PRIVATE CUDA::cudart CUDA::cublas CUDA::cuda_driver)
# uncompressed device code, so the test can read its strings
target_compile_options(gemm PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-compress-mode=none>)
install(TARGETS gemm)
"""
MINI_WHERE = """\
#pragma once
#include <cstdio>
/* __FILE__ as common.cuh uses it: in a macro (the file that uses it) and in device code (this header's own path) */
#define WHERE_AM_I() printf("%s:%d\\n", __FILE__, __LINE__)
__device__ inline void where_on_the_device() { printf("%s:%d\\n", __FILE__, __LINE__); }
"""
MINI_GEMM = """\
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include "where.cuh"
__global__ void kernel(int *flag) { if (flag == nullptr) { where_on_the_device(); } }
extern "C" int gemm_probe(void) {
    CUmemAllocationProp prop = {};
    size_t granularity = 0;
    cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    cublasHandle_t handle;
    int devices = 0;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) { WHERE_AM_I(); return -1; }
    kernel<<<1, 1>>>(nullptr);
    return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : -1;
}
"""


def mini_cuda_project(base: Path) -> Path:
    upstream = base / "upstream"
    commit = git_repo(upstream, {"CMakeLists.txt": MINI_CMAKE, "where.cuh": MINI_WHERE, "gemm.cu": MINI_GEMM}, "minicuda 1.0")
    root = base / "project"
    (root / "recipes").mkdir(parents=True)
    (root / "bundles").mkdir()
    (root / "pins.yaml").write_text(yaml.safe_dump({"schema_version": 1, "pins": {"minicuda": {
        "url": f"file://{upstream}", "policy": "release", "commit": commit, "cadence": "daily", "license": "MIT",
        "mirrors": [{"git": f"file://{upstream}"}]}}}))
    cuda = yaml.safe_load((ROOT / "recipes" / "cuda.yaml").read_text())
    nvcc = next(t for t in cuda["toolchain"] if t["tool"] == "nvcc")  # the real recipe's pinned toolkit, as is
    recipe = {
        "schema_version": 1, "name": "minicuda", "summary": "a CUDA library linked as ggml-cuda is", "license": "MIT",
        "source": {"pin": "minicuda"},
        "toolchain": [{"tool": "cmake"}, {"tool": "ninja"}, {"tool": "c++"}, {"tool": "patchelf"}, nvcc],
        "build": {"kind": "cmake", "options": {
            "CMAKE_CUDA_ARCHITECTURES": "90-real", "CMAKE_CUDA_COMPILER": "{tool:nvcc}",
            "CUDA_cuda_driver_LIBRARY": cuda["build"]["options"]["CUDA_cuda_driver_LIBRARY"]}},
        "requirements": {"run": cuda["requirements"]["run"]},
        "stage": {"root": "libexec/onebit/{variant}", "keep": ["lib/lib*.so*"], "binaries": {"gemm": "lib/libgemm.so"},
                  "host_libraries": ["cuda"]},  # libgemm.so links the driver's libcuda.so.1, as ggml-cuda does
        "provides": {"backend": "cuda", "devices": ["CUDA0"], "features": []},
    }
    (root / "recipes" / "minicuda.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    (root / "bundles" / "minicuda.yaml").write_text(textwrap.dedent("""\
        schema_version: 1
        name: minicuda
        summary: one CUDA library
        version: "1.0"
        platform: linux-64
        components:
          - recipe: minicuda
        """))
    return root


def ldd(path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
    return {m[1]: m[2] for m in re.finditer(r"^\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$", out, re.M)}


@pytest.mark.e2e
def test_a_cuda_library_built_with_the_pinned_toolkit_resolves_inside_the_prefix(toolkit, cpu_bundle, tmp_path,
                                                                                 monkeypatch):
    """The distro maintainer's offline build: a cache that holds only the downloaded wheels and sysroot packages
    (carried over), `build --offline` assembles the toolkit and the sysroot from them, builds, stages (the leak check unchanged), packages and indexes."""
    project_root = mini_cuda_project(tmp_path)
    cache = tmp_path / "cache"
    for w in NVCC.wheels:  # only what `1bit-build fetch` downloaded; no assembled toolkit
        wheel = next((cpu_bundle.layout.cache / "downloads" / w.sha256).glob("*.whl"))
        (cache / "downloads" / w.sha256).mkdir(parents=True)
        os.link(wheel, cache / "downloads" / w.sha256 / wheel.name)
    for deb in (cpu_bundle.layout.cache / "downloads").glob("*/*.deb"):  # and the pinned sysroot's Debian packages
        (cache / "downloads" / deb.parent.name).mkdir(parents=True, exist_ok=True)
        os.link(deb, cache / "downloads" / deb.parent.name / deb.name)
    layout = Layout(root=project_root, cache=cache, work=tmp_path / "work", out=tmp_path / "out")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "ONEBIT_CACHE")}
    proc = subprocess.run([sys.executable, "-m", "builders.cli", "--root", project_root, "--cache", cache, "--work",
                           layout.work, "--out", layout.out, "build", "minicuda", "--offline"], capture_output=True,
                          text=True, env=env, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert (host.pinned_root(NVCC, cache / "toolchains") / ".complete").is_file()

    # a host without a driver: a conda client detects no __cuda, and the solver says what is missing
    monkeypatch.delenv("CONDA_OVERRIDE_CUDA", raising=False)
    detected = subprocess.run(["sh", "-c", "ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1"],
                              capture_output=True).returncode == 0
    if not detected:
        with pytest.raises(Exception, match="__cuda"):
            install_bundle(layout.out / "channel", tmp_path / "nodriver", "minicuda", cache_dir=tmp_path / "pkgs")
    monkeypatch.setenv("CONDA_OVERRIDE_CUDA", "13.0")  # what a client detects on a host with driver 580
    prefix = tmp_path / "prefix"
    install_bundle(layout.out / "channel", prefix, "minicuda", cache_dir=tmp_path / "pkgs")

    sub = prefix / "libexec" / "onebit" / "minicuda"
    lib = sub / "lib" / "libgemm.so"
    resolved = ldd(lib)
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        assert resolved.get(name) == str(sub / "lib" / name), (name, resolved)
    assert resolved.get("libcuda.so.1") == "not found" or not resolved["libcuda.so.1"].startswith(str(prefix))
    assert not any(v.startswith(("/usr/local/cuda", str(cache))) for v in resolved.values()), resolved
    assert ldd(sub / "lib" / "libcublas.so.13")["libcublasLt.so.13"] == str(sub / "lib" / "libcublasLt.so.13")

    # shipped byte for byte (NVIDIA's RECORD), with the license text, named for the SBOM
    downloads = cache / "downloads"
    doc = json.loads((sub / toolchain.REDISTRIBUTABLES).read_text())["redistributables"]
    by_package = {e["package"]: e for e in doc}
    assert set(by_package) == {"nvidia-cuda-runtime", "nvidia-cublas"}
    for w in NVCC.wheels:
        if not w.ship:
            continue
        wheel = next((downloads / w.sha256).glob("*.whl"))
        entry = by_package[w.package]
        assert (entry["version"], entry["wheel_sha256"], entry["license"]) == (w.version, w.sha256,
                                                                                 "LicenseRef-NVIDIA-Proprietary")
        for name in w.ship:
            got = hashlib.sha256((sub / "lib" / name).read_bytes()).hexdigest()
            assert got == record_sha256(wheel, f"nvidia/cu13/lib/{name}") == entry["files"][f"lib/{name}"]
        with zipfile.ZipFile(wheel) as zf:
            eula = zf.read(next(n for n in zf.namelist() if n.endswith("licenses/License.txt")))
        assert (sub / "share" / "licenses" / w.package / "License.txt").read_bytes() == eula

    # path-independent host and device code: the source's path is mapped, the work dir and cache are nowhere
    data = lib.read_bytes()
    assert b"/usr/src/onebit/minicuda/gemm.cu\0" in data  # host code
    assert b"/usr/src/onebit/minicuda/where.cuh\0" in data  # device code only (a __device__ function)
    for root in (tmp_path, cache):
        assert str(root).encode() not in data

    # the package asks a client for the driver and the glibc it needs, nothing else
    conda = json.loads((layout.out / "channel" / "linux-64" / "repodata.json").read_text())["packages.conda"]
    depends = next(r["depends"] for name, r in conda.items() if name.startswith("onebit-minicuda-"))
    assert sorted(d.split()[0] for d in depends) == ["__cuda", "__glibc"] and "__cuda >=13" in depends


@pytest.mark.e2e
def test_device_preprocessing_gets_the_prefix_maps(toolkit, tmp_path):
    """nvcc hands -Xcompiler flags to the host compiler's device-side preprocessing too (`--dryrun` shows each pass)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cu").write_text(MINI_WHERE + "__global__ void k() { where_on_the_device(); }\n")
    flag = f"-Xcompiler=-ffile-prefix-map={src}=/usr/src/x"
    out = subprocess.run([toolkit / "bin" / "nvcc", "--dryrun", "-arch=sm_90", "-c", src / "k.cu", flag, "-o",
                          tmp_path / "k.o"], capture_output=True, text=True)
    passes = [line for line in out.stderr.splitlines() if re.match(r"#\$ (gcc|g\+\+|c\+\+|cc)\b", line)]
    device = [p for p in passes if "-D__CUDA_ARCH__=900" in p and " -E " in p]
    assert device and all(f"-ffile-prefix-map={src}=/usr/src/x" in p for p in passes), out.stderr
