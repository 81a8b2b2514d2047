"""Test-only: the pinned Strix build root (Debian sid + experimental's ROCm 7.2.4, linux-headers 7.2, rustc 1.98.1,
XRT 2.25) the Strix compile tests build in, and a way to run a command inside it through the one sandbox."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builders import sandbox

ROOT_ENV = "ONEBIT_TEST_STRIX_ROOT"
LLVM_PATH = "/usr/lib/llvm-22/bin:/usr/bin:/bin"
BITCODE = "/usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode"  # rocm-device-libs-22's bitcode: HIP_DEVICE_LIB_PATH


@dataclass(frozen=True)
class Root:
    path: Path

    def run(self, argv: Sequence[str], *, cwd: Path, rw: Sequence[Path] = (), ro: Sequence[Path] = (),
            env: Mapping[str, str] | None = None, timeout: float = 3600, log: Path | None = None
            ) -> tuple[subprocess.CompletedProcess, float]:
        """argv in the root (no network), cwd and rw bound read-write; (the result, wall seconds)."""
        full = {"PATH": LLVM_PATH, "LANG": "C.UTF-8", **(env or {})}
        sb = sandbox.Sandbox(env=full, cwd=str(cwd), root=str(self.path), rw=tuple(str(p) for p in (cwd, *rw)),
                             ro=tuple(str(p) for p in ro), timeout=timeout)
        start = time.monotonic()
        proc = sandbox.run(sb, argv)
        wall = time.monotonic() - start
        if log is not None:
            log.write_text(proc.stdout + proc.stderr)
        return proc, wall


NAME = "strix-sid"
PROJECT = Path(__file__).resolve().parent.parent


def strix_root() -> Root:
    """roots/strix-sid.yaml assembled into the project cache ($ONEBIT_CACHE or ~/.cache/onebit): ~1.3 GiB of .debs
    downloaded once (verified by sha256), assembled once, shared with `1bit-build build strix`. ONEBIT_TEST_STRIX_ROOT
    names an assembled root instead (a development shortcut)."""
    path = os.environ.get(ROOT_ENV)
    if path:
        return Root(Path(path))
    from builders import roots
    from builders.session import default_cache

    found, problems = roots.load_roots(PROJECT / "roots")
    assert not problems, problems
    pin = found[NAME]
    cache = default_cache()
    dest = pin.dest(cache)
    roots.assemble(pin, cache / "downloads", dest)
    return Root(dest)
