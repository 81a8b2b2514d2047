"""checkout: the project's checkout copied into a root: git's tracked files and the untracked ones it does not ignore
(no `.onebit/`, no `.nox/`, no cache, no venv: nothing of the product), links kept only where they stay inside it."""
from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from ..io import gitcmd, treepath


def checkout_files(root: Path) -> list[str]:
    """git's tracked files and the untracked ones it does not ignore (our own checkout, read through builders/io/gitcmd.py)."""
    out = gitcmd.run(["-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--deduplicate"],
                     text=False, check=True).stdout
    return [f for f in out.decode().split("\0") if f]


def copy_checkout(src: Path, dest: Path, say: Callable[[str], None] = print) -> int:
    """Copy git's files of the checkout at `src` (checkout_files) into `dest`, a folder this copy makes; returns how
    many entries it copied and says in one line which links it skipped.

    Links are copied as links, never followed: one that leads inside the checkout (resolved by its text,
    builders/io/treepath.py: a relative link, or a chain of them, that stays inside) is copied as written; one that leads
    out (absolute, climbing above the top, into a loop) is skipped. A path under a linked folder (a tracked folder
    replaced by a link) is left to that link: nothing is read or written through it. Every folder on the way is one
    this copy made, and each file is created anew (O_EXCL, O_NOFOLLOW), so no byte lands outside `dest`."""
    def readlink(rel: str) -> str | None:
        p = src / rel
        return os.readlink(p) if p.is_symlink() else None

    made: set[str] = set()

    def folder(rel: str) -> Path:
        """dest/rel, each missing folder on the way made; a folder that is not a real one (a link) is an error."""
        at = dest
        parts = [p for p in rel.split("/") if p]
        for i, part in enumerate(parts):
            at = at / part
            key = "/".join(parts[:i + 1])
            if key in made:
                continue
            try:
                os.mkdir(at, 0o755)
            except FileExistsError:
                if at.is_symlink() or not at.is_dir():
                    raise OSError(f"{at} is not a folder this copy made") from None
            made.add(key)
        return at

    dest.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():
        raise OSError(f"{dest} is a link")
    n = 0
    links: set[str] = set()
    skipped: dict[str, str] = {}
    for rel in checkout_files(src):
        parts = rel.split("/")
        link = next(("/".join(parts[:i]) for i in range(1, len(parts) + 1)
                     if (src / "/".join(parts[:i])).is_symlink()), None)
        if link is not None:  # the entry is a link, or lies under one: the link stands for it
            if link in links or link in skipped:
                continue
            target = os.readlink(src / link)
            if target.startswith("/") or treepath.resolve(link, readlink) is None:
                skipped[link] = target
                continue
            links.add(link)
            parent, _, name = link.rpartition("/")
            os.symlink(target, folder(parent) / name)
            n += 1
            continue
        s = src / rel
        st = os.lstat(s) if os.path.lexists(s) else None
        if st is None or not stat.S_ISREG(st.st_mode):  # deleted but still tracked, a submodule, a special file
            continue
        parent, _, name = rel.rpartition("/")
        fd = os.open(folder(parent) / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     stat.S_IMODE(st.st_mode))
        with open(fd, "wb") as out, open(s, "rb") as ins:
            shutil.copyfileobj(ins, out)
            os.fchmod(out.fileno(), stat.S_IMODE(st.st_mode))
            os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        n += 1
    if skipped:
        shown = sorted(skipped.items())
        say(f"skipped {len(shown)} link(s) of the checkout that lead out of it or loop (not copied): "
            + ", ".join(f"{k} -> {v}" for k, v in shown[:10]) + (f" and {len(shown) - 10} more" if len(shown) > 10 else ""))
    return n

