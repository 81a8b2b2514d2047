"""Advisory locks (fcntl) on the cache, work and out directories, so two `1bit-build` runs never write the same
directory at once: the second one says who holds the lock and waits for it. The project's one lock: every lock file
(a directory's, Lemonade's cache and config, a root pin file's) is taken by `hold`.

A lock file lives where others may write (a shared cache), so it is opened with O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK
(a planted link is refused, never followed to truncate its target; a FIFO never blocks the open), checked on the open
descriptor (a regular file with one link, else refused in one line), and the holder's pid is written into it only then."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import OnebitError

FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
PID_WIDTH = 20  # the pid is written padded to this width: a shorter pid never leaves a longer one's tail


class LockFileError(OnebitError):
    pass


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


def _refuse(path: Path, what: str, why: str) -> LockFileError:
    return LockFileError(f"the lock file of the {what} {why}; nothing was changed", where=str(path),
                         hint=f"remove it (`rm -r {path}`) if no 1bit-build is running, then run again")


def open_lock(path: Path, what: str) -> int:
    """The descriptor of the lock file at `path` (created 0o644 when absent; `what` it guards, for the message), or one
    line saying why it is refused: a link (never followed), a directory, a FIFO, a device, a file with other hard links
    (never written through)."""
    from .readfile import kind

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, FLAGS, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, what, f"is a link (to {os.readlink(path) if path.is_symlink() else '?'}); "
                                      "it is not followed") from None
        if exc.errno == errno.EISDIR:
            raise _refuse(path, what, "is a directory, not a regular file") from None
        raise LockFileError(f"cannot create the lock of the {what} directory {path}: {exc.strerror}",
                            hint=f"check the permissions of {path.parent}; nothing was changed") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, what, f"is {kind(st.st_mode)}, not a regular file")
        if st.st_nlink != 1:
            raise _refuse(path, what, f"has {st.st_nlink} hard links; it is not written through")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def hold(directory: Path, what: str, *, wait: bool = True, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of `directory` for the block. Held already: say so, then wait (or refuse: wait=False).
    The lock is released when the process ends, however it ends."""
    path = lock_path(directory)
    fd = open_lock(path, what)
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
        # a regular file with one link, opened without following a link: writing the pid changes only this file
        os.pwrite(fd, str(os.getpid()).ljust(PID_WIDTH).encode(), 0)
        if os.fstat(fd).st_size > PID_WIDTH:
            os.ftruncate(fd, PID_WIDTH)
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
