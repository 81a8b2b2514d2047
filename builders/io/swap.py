"""swap: the project's one way to put a finished output in place. A directory is built aside and exchanged with the
old one in one step (a reader sees the old tree or the new one, never neither, never half); a file is written beside
its target and renamed over it. Every step, the release, `lemonade install` and the fetch caches use these."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator


def write_text_atomic(path: Path, text: str) -> None:
    """Write beside the target and rename into place: a reader sees the old file or the new one, never half. The
    file beside is created afresh (O_EXCL | O_NOFOLLOW, after removing whatever had its name), so a link planted under
    that name is replaced, never written through; a link at the target itself is replaced by the rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".part")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (renameat2 RENAME_EXCHANGE). False when the host or filesystem cannot."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, target: Path) -> None:
    """Swap a finished directory into place so a reader always sees the old tree or the new one, never neither.

    Where `target` exists it is exchanged with `new` in one step (renameat2 RENAME_EXCHANGE); a target that is a
    symlink is re-pointed atomically; only a host without either falls back to two renames."""
    new, target = Path(new), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(target):
        os.rename(new, target)  # rename(2) of a directory onto nothing: atomic
        return
    if target.is_symlink():
        _swap_symlink(new, target)
        return
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # `new` now holds the old tree
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _swap_symlink(new: Path, target: Path) -> None:
    """target -> versioned sibling: move `new` to a fresh sibling, re-point the link with one rename, drop the old."""
    previous = target.parent / os.readlink(target)
    versioned = Path(tempfile.mkdtemp(prefix=f".{target.name}.v-", dir=target.parent))
    os.rename(new, versioned / "tree")
    link = target.with_name(f".{target.name}.link-{os.getpid()}")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.relpath(versioned / "tree", target.parent), link)
    os.replace(link, target)
    if previous.name == "tree" and previous.parent.name.startswith(f".{target.name}.v-"):
        shutil.rmtree(previous.parent, ignore_errors=True)


def aside(target: Path) -> Path:
    """A fresh, empty directory beside `target` (same filesystem, so the swap is a rename), unique per call."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".new", dir=target.parent))


@contextlib.contextmanager
def building(target: Path) -> Iterator[Path]:
    """Build a directory aside and swap it into place when the block finishes; on any error (or a kill) the target
    keeps what it had, and the aside directory is removed."""
    tmp = aside(target)
    try:
        yield tmp
        replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- finished cache entries: a marker that names the entry's key, and a record that agrees ------------------------------
MARKER = ".complete"  # in a finished entry: its key, written last inside the aside directory, before the swap
MAX_MARKER = 1 << 20  # bytes of a marker (a key, or the list of pinned inputs it was made from)
MAX_RECORD = 64 << 20  # bytes of an entry's record file (onebit-root.json lists every package of a root)
ABSENT = "absent"


def offline_refusal(what: str, why: str, dest: Path, *, absent: str = "not in the cache"):
    """The one refusal of a cache entry that `--offline` cannot make: `<what> <state> (<dest>) and --offline forbids
    downloading`, the state being `absent` when nothing is there (`why` is ABSENT), else why it is not trusted."""
    from ..errors import FetchError

    state = absent if why == ABSENT else f"not trusted in the cache ({why})"
    return FetchError(f"{what} {state} ({dest}) and --offline forbids downloading",
                      hint="run `1bit-build fetch BUNDLE` once with network")


def mark(tmp: Path, key: str) -> None:
    """Finish an entry built aside (`tmp`): its marker names `key`. The caller swaps `tmp` into place next."""
    (Path(tmp) / MARKER).write_text(key.strip() + "\n", encoding="utf-8")


def why_untrusted(dest: Path, key: str, *, record: str | None = None,
                  record_problem: Callable[[object], str | None] | None = None) -> str | None:
    """None when `dest` is a finished entry for `key`: its marker (a regular file, read bounded, never through a link)
    names exactly `key`, and its record file (when the entry has one) is JSON of which `record_problem` finds nothing
    wrong (it checks that the record names the same key). Otherwise why not, in a few words (ABSENT: nothing there).
    A cache entry that is not trusted is assembled again aside and swapped into place by its caller, which says why."""
    from .readfile import UnreadableFile, read_json, read_text

    dest = Path(dest)
    if not os.path.lexists(dest):
        return ABSENT
    if not (dest / MARKER).exists() and not (dest / MARKER).is_symlink():
        return f"it has no {MARKER} marker (an assembly that never finished)"
    try:
        text = read_text(dest / MARKER, MAX_MARKER).strip()
    except UnreadableFile as exc:
        return f"its {MARKER} {exc.why}"
    if not text:
        return f"its {MARKER} is empty"
    if text != key.strip():
        return f"its {MARKER} names another key ({text.splitlines()[0][:40]})"
    if record is None:
        return None
    if not (dest / record).exists() and not (dest / record).is_symlink():
        return f"its record {record} is missing"
    try:
        data = read_json(dest / record, MAX_RECORD)
    except UnreadableFile as exc:
        return f"its record {record} {exc.why}"
    problem = record_problem(data) if record_problem else None
    return f"its record {record} {problem}" if problem else None
