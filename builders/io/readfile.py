"""readfile: the project's one bounded reader of a file another party wrote (the evaluating job's reports, a user's
Lemonade config, a cache entry's marker and record). It decides what is read, not what it means:

- the file is opened with O_NOFOLLOW (a link as its last component is refused, never followed to /dev/zero or to
  another user's file) and O_NONBLOCK (a FIFO never blocks the open), then `fstat` on the open descriptor: anything
  but a regular file is refused;
- the size cap is enforced on the bytes actually read (`cap + 1` are asked for; more than `cap` is refused), never on a
  stat taken before, so a file that grows, or a device that says 0, cannot make the reader hold more than `cap`.

Each refusal is one `UnreadableFile` line naming the file; the caller adds what it was and that nothing was done.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import OnebitError

FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


class UnreadableFile(OnebitError):
    """A file that is not a regular file, a link, too large, or cannot be opened. `why` is the reason alone."""

    def __init__(self, path: Path, why: str, *, hint: str | None = None):
        super().__init__(why, where=str(path), hint=hint)
        self.path = Path(path)
        self.why = why


def kind(mode: int) -> str:
    """Pure: what a file of this st_mode is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _open_error(path: Path, exc: OSError) -> UnreadableFile:
    import errno

    if exc.errno == errno.ELOOP:
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return UnreadableFile(path, f"is a link (to {target}), not a regular file")
    return UnreadableFile(path, f"cannot be opened: {exc.strerror}")


def read_bytes(path: Path | str, cap: int) -> bytes:
    """The bytes of the regular file at `path` (not a link, a FIFO, a device or a directory), at most `cap` of them.
    Raises UnreadableFile (FileNotFoundError's own case too: `why` says it is absent)."""
    path = Path(path)
    try:
        fd = os.open(path, FLAGS)
    except OSError as exc:
        raise _open_error(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(path, f"is {kind(st.st_mode)}, not a regular file")
        chunks, got = [], 0
        while got <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise UnreadableFile(path, f"cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if got > cap:
        raise UnreadableFile(path, f"is larger than {cap} bytes")
    return b"".join(chunks)


def read_text(path: Path | str, cap: int) -> str:
    """read_bytes as UTF-8 text (strict: a file that is not UTF-8 is refused in one line)."""
    data = read_bytes(path, cap)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(Path(path), f"is not UTF-8 text (byte {exc.start})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(path: Path | str, cap: int) -> Any:
    """read_text parsed as strict JSON (no NaN or Infinity); malformed JSON is one UnreadableFile line."""
    text = read_text(path, cap)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise UnreadableFile(Path(path), f"is not JSON: {exc}") from None


def absent(path: Path | str) -> bool:
    """Nothing at `path`, not even a dangling link."""
    return not os.path.lexists(path)
