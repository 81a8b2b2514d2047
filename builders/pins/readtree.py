"""readtree: the pin bot reads upstream's build files from a checkout, never through a link out of the tree or into
/dev and /proc, never more than a bounded size (per file and per tree). What is not read is named in one line each.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from ..io.treepath import resolve

MAX_FILE = 8 << 20  # bytes of one build file
MAX_TREE = 64 << 20  # bytes of all the build files read from one checkout


class _Budget:
    def __init__(self, total: int):
        self.left = total


def _readlink(top: Path) -> Callable[[str], str | None]:
    def readlink(rel: str) -> str | None:
        try:
            st = os.lstat(top / rel)
        except OSError:
            return None
        return os.readlink(top / rel) if stat.S_ISLNK(st.st_mode) else None
    return readlink


def _read(top: Path, rel: str, refused: list[str], budget: _Budget) -> str | None:
    real = resolve(rel, _readlink(top))
    if real is None:
        refused.append(f"{rel}: a link out of the tree")
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(top / real, flags)
    except OSError as exc:
        refused.append(f"{rel}: cannot be opened ({exc.strerror})")
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            refused.append(f"{rel}: not a regular file")
            return None
        cap = min(MAX_FILE, budget.left)
        data = fh.read(cap + 1)
    if len(data) > MAX_FILE:
        refused.append(f"{rel}: larger than {MAX_FILE >> 20} MiB")
        return None
    if len(data) > budget.left:
        refused.append(f"{rel}: the build files of this tree exceed {MAX_TREE >> 20} MiB; not read")
        budget.left = 0
        return None
    budget.left -= len(data)
    return data.decode("utf-8", errors="replace")


def read_files(top: Path, pick: Callable[[str], bool], *, refused: list[str], limit: int = MAX_TREE) -> dict[str, str]:
    """tree-relative path -> text of every file `pick` chooses (links inside the tree followed by their text)."""
    budget = _Budget(limit)
    found: dict[str, str] = {}
    for d, dirs, names in os.walk(top):  # never into a linked directory
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for n in sorted(names):
            rel = os.path.relpath(os.path.join(d, n), top).replace(os.sep, "/")
            if pick(rel):
                text = _read(top, rel, refused, budget)
                if text is not None:
                    found[rel] = text
    return found


def read_one(top: Path, rel: str, *, refused: list[str]) -> str | None:
    """One file of the tree by its path, or None (absent, or refused: then `refused` says why)."""
    if not os.path.lexists(top / rel):
        return None
    return _read(top, rel, refused, _Budget(MAX_FILE))
