"""Advisory locks (fcntl) on the cache, work and out directories, so two `1bit-build` runs never write the same
directory at once: the second one says who holds the lock and waits for it."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .errors import OnebitError


def lock_path(directory: Path) -> Path:
    """The lock of a directory lives beside it (`<dir>.lock`), so the directory itself can be swapped or deleted."""
    directory = Path(directory)
    return directory.with_name(directory.name + ".lock")


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return "another 1bit-build"
    return f"1bit-build pid {text}" if text.isdigit() else "another 1bit-build"


@contextlib.contextmanager
def hold(directory: Path, what: str, *, wait: bool = True, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of `directory` for the block. Held already: say so, then wait (or refuse: wait=False).
    The lock is released when the process ends, however it ends."""
    path = lock_path(directory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OnebitError(f"cannot create the lock of the {what} directory {path}: {exc.strerror}",
                          hint=f"check the permissions of {path.parent}; nothing was changed") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            if not wait:
                raise OnebitError(f"the {what} directory {directory} is in use by {holder}",
                                  hint="wait for it to finish, or use another directory; nothing was changed") from None
            if say:
                say(f"waiting for {holder}, which holds the {what} directory {directory}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


@contextlib.contextmanager
def hold_all(dirs: Sequence[tuple[Path, str]], *, wait: bool = True, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold several directory locks, always taken in one order (by path) so two runs cannot deadlock."""
    unique = sorted({Path(d).resolve(): w for d, w in dirs}.items())
    with contextlib.ExitStack() as stack:
        for d, w in unique:
            stack.enter_context(hold(d, w, wait=wait, say=say))
        yield
