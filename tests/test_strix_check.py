"""`1bit check` on a host without the Strix hardware: a claimed ROCm0/HRX0/NPU0 that the program does not see, on a
host with no /dev/kfd (/dev/accel), is unproven, never ok and never failed; on a host that has the node it fails.
The programs are the recording stub (test_check.py) and, for a program that cannot load its GPU runtime here, a real
ELF linked against a library that is then removed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_check import rows_by_backend, stub_bundle

from onebit.check import absent_hardware, check
from onebit.manifest import load_manifest

KFD = "/dev/kfd"

# (device, the host's nodes, why this host cannot have it)
ABSENT = [
    ("ROCm0", (), "no /dev/kfd on this host: no AMD GPU driver"),
    ("HRX0", (), "no /dev/kfd on this host: no AMD GPU driver"),
    ("NPU0", (), "no /dev/accel on this host: no NPU driver"),
    ("CUDA0", (), "no /dev/nvidiactl on this host: no NVIDIA driver"),
    ("ROCm1", (KFD,), None),
    ("NPU0", ("/dev/accel",), None),
    ("Vulkan0", (), None),  # lavapipe: every host has a Vulkan device
    ("CPU", (), None),
]


@pytest.mark.parametrize("device,nodes,why", ABSENT)
def test_absent_hardware(device, nodes, why):
    assert absent_hardware(device, nodes) == why


# (backends, what the stub sees, host nodes, backend -> (seen cell, unproven cell, ok))
ROWS = [
    (["rocm"], {"rocm": ""}, (), {"rocm": ("none", "ROCm0: no /dev/kfd on this host: no AMD GPU driver", True)}),
    (["rocm"], {"rocm": ""}, (KFD,), {"rocm": ("none — FAIL: missing ROCm0", "", False)}),
    (["rocm"], {"rocm": "ROCm0"}, (), {"rocm": ("ROCm0", "", True)}),
    (["hrx"], {"hrx": "Vulkan0"}, (),
     {"hrx": ("Vulkan0", "HRX0: no /dev/kfd on this host: no AMD GPU driver", True)}),
    (["hrx"], {"hrx": "HRX0"}, (), {"hrx": ("HRX0 — FAIL: missing Vulkan0", "", False)}),  # lavapipe always
    (["hrx"], {"hrx": ""}, (),
     {"hrx": ("none — FAIL: missing Vulkan0", "HRX0: no /dev/kfd on this host: no AMD GPU driver", False)}),
]


@pytest.mark.parametrize("backends,sees,nodes,want", ROWS)
def test_rows_on_a_host_without_the_gpu(tmp_path, backends, sees, nodes, want):
    m = load_manifest(stub_bundle(tmp_path, backends, sees))
    rows = {r.backend: r for r in check(m, env=_env(), nodes=nodes)}
    assert {b: (r.seen, r.unproven, r.ok) for b, r in rows.items()} == want


def _env():
    import os
    return {k: v for k, v in os.environ.items() if k != "ONEBIT_STUB_DEVICES"}


@pytest.fixture
def unloadable(tmp_path) -> Path:
    """A real program that cannot start here: linked against libonebitgpu.so, which is then removed (as ds4-server
    built against the root's ROCm is on a host without libhipblas.so.3)."""
    cc = shutil.which("cc")
    assert cc, "the tests need a C compiler (nox -s tests installs g++)"
    (tmp_path / "gpu.c").write_text("int gpu(void) { return 0; }\n")
    (tmp_path / "main.c").write_text("int gpu(void);\nint main(void) { return gpu(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libonebitgpu.so", tmp_path / "gpu.c"], check=True)
    out = tmp_path / "ds4-server"
    subprocess.run([cc, "-o", out, tmp_path / "main.c", f"-L{tmp_path}", "-lonebitgpu"], check=True)
    (tmp_path / "libonebitgpu.so").unlink()
    return out


@pytest.mark.parametrize("nodes,seen,unproven,ok", [
    ((), "none", "ROCm0: cannot run here (libonebitgpu.so missing); no /dev/kfd on this host: no AMD GPU driver", True),
    ((KFD,), "FAIL", "", False),
])
def test_a_gpu_program_that_cannot_load_its_runtime(tmp_path, unloadable, nodes, seen, unproven, ok):
    prefix = tmp_path / "prefix"
    m = load_manifest(stub_bundle(prefix, ["ds4"]))
    shutil.copy(unloadable, m.prefix / "libexec/onebit/ds4-rocm/bin/ds4-server")
    (r,) = check(m, env=_env(), nodes=nodes)
    assert (r.seen.split(":")[0], r.unproven, r.ok) == (seen, unproven, ok)
    if not ok:
        assert "error while loading shared libraries: libonebitgpu.so" in r.seen


def test_rows_by_backend_is_the_hosts_own_view(tmp_path):
    """Without `nodes`, check() reads this host's /dev: a stub that sees no ROCm0 is unproven here exactly when
    this host has no /dev/kfd."""
    m = load_manifest(stub_bundle(tmp_path, ["rocm"], {"rocm": ""}))
    r = rows_by_backend(m)["rocm"]
    assert r.ok == (not Path(KFD).exists())
