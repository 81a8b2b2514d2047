"""archives: the project's one unpacker (and reader) of archives: tar of any compression (gz, xz, bz2, zst), zip and
wheels, a .deb's data member (ar + data.tar.*), and a .conda package's two tars (a zip holding pkg-*.tar.zst and
info-*.tar.zst: the same tree a .tar.bz2 package holds in one tar). Every unpack in the project goes through `unpack`; nothing else
opens an archive for reading.

What it decides, for every kind alike (the .deb unpacker's rules, first written for the build roots):

- every member's name is checked (`member_problem`: no absolute path, no `..`, no backslash, no NUL), a device, FIFO
  or other special member is refused, and where it lands is decided by the caller's `place` (a folder of a wheel, a
  sdist's git dir) or by stripping `strip` leading folders, as `tar --strip-components` does;
- a member's parent is resolved by the text of the links known so far (builders/io/treepath.py: the archive's own links,
  then those already on disk, read with lstat one component at a time), never by the host's realpath; a member
  reached through a link that leads out of the unpack root is refused;
- the archive's symlinks are written last, each only when it leads inside the root (an absolute one re-rooted as the
  relative link to the same place where `absolute="reroot"`: a package unpacked into a build root); one that leads out
  is skipped. So no member is ever written through a link the same archive made (`links="refuse"` refuses any link);
- files are opened O_NOFOLLOW|O_EXCL after whatever was at their place is removed, with mode (mode & 0755) | 0644: no
  setuid, setgid or sticky bit, no group or other write; hard links only to regular files inside the root;
- a budget bounds the members read and the bytes actually written (a file's declared size is checked first, its
  written bytes while they are written); a damaged archive is refused in one line (`Unreadable`).

An ArchiveError names the archive and the member; nothing of tarfile or zipfile escapes.
"""
from __future__ import annotations

import io
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Union

import zstandard

from ..errors import OnebitError
from .treepath import link_in_root, resolve

Source = Union[Path, str, BinaryIO]  # a file, or a binary stream (tar kinds only)

FILE, DIR, SYMLINK, HARDLINK, SPECIAL = "file", "dir", "symlink", "hardlink", "special"
MAX_LINK_TEXT = 4096  # bytes of a zip symlink's target (PATH_MAX)
CHUNK = 1 << 20


class ArchiveError(OnebitError):
    pass


class Unreadable(ArchiveError):
    """The bytes are not an archive of a kind this module reads, or are damaged; `why` is the reader's own word."""

    def __init__(self, label: str, why: str):
        super().__init__(f"{label}: not a readable archive ({why})",
                         hint="the file is damaged or not what was expected: delete it and download it again")
        self.why = why


class NotWritten(ArchiveError):
    """A member could not be written (the disk, not the archive: no space, a folder in a file's place)."""


class Clash(ArchiveError):
    """A member would replace a file already in the root with other bytes (`existing="same"`)."""

    def __init__(self, label: str, rel: str):
        super().__init__(f"{label}: {rel} is already in the unpack root with other bytes")
        self.rel = rel


def member_problem(name: str, *, is_link: bool = False, is_special: bool = False) -> str | None:
    """Why a member may not be unpacked, or None. Pure: a table test covers it."""
    if not name or "\0" in name:
        return "has an empty or NUL name"
    if is_link:
        return "is a link"
    if is_special:
        return "is a device, FIFO or other special file"
    if "\\" in name:
        return "has a backslash in its name"
    p = PurePosixPath(name)
    if p.is_absolute() or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "has an absolute path"
    if ".." in p.parts:
        return "climbs out with '..'"
    return None


def stripped(name: str, strip: int = 0) -> str | None:
    """Pure: where a member lands after `tar --strip-components=strip` (`.` and empty parts dropped): "" for the root
    itself, None for a member the strip removes whole (the stripped folder)."""
    parts = [p for p in name.split("/")[strip:] if p not in ("", ".")]
    if not parts:
        return None if strip else ""
    return "/".join(parts)


def kind_of(head: bytes) -> str:
    """Pure: an archive's kind from its first bytes: "deb" (ar), "zip", "tar.zst", else "tar" (tarfile's own
    detection: plain, gz, bz2, xz)."""
    if head.startswith(b"!<arch>\n"):
        return "deb"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "tar.zst"
    return "tar"


@dataclass(frozen=True)
class Member:
    """One archive member as the unpacker sees it, whatever the archive's kind."""

    name: str  # as the archive writes it
    kind: str  # FILE, DIR, SYMLINK, HARDLINK or SPECIAL
    size: int = 0
    mode: int = 0o644
    mtime: int | None = None
    linkname: str = ""  # a symlink's text, or the member a hard link names

    def isfile(self) -> bool:
        return self.kind == FILE

    def isdir(self) -> bool:
        return self.kind == DIR

    def issym(self) -> bool:
        return self.kind == SYMLINK

    def islnk(self) -> bool:
        return self.kind == HARDLINK


@dataclass(frozen=True)
class Budget:
    """How much one unpack may hold: members read, bytes written in all, bytes of one file (None: no own bound)."""

    bytes: int = 16 << 30
    members: int = 1_000_000
    file: int | None = None


BUDGET = Budget()


@dataclass
class Unpacked:
    count: int = 0  # members written (the root itself counts when the archive names it as a folder)
    bytes: int = 0  # file bytes written
    files: list[str] = field(default_factory=list)  # root-relative paths of the regular files written
    skipped: list[str] = field(default_factory=list)  # "name -> target" of each link skipped (it leads out)


# ---- reading: one stream of members for every kind -----------------------------------------------------------------
_BROKEN = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError, zipfile.BadZipFile,
           OSError, ValueError, NotImplementedError, RuntimeError)  # what the readers raise on damaged bytes


class _ReadError(Exception):
    pass


class _Reader:
    """A member's bytes; a reader's failure becomes _ReadError (told apart from a failed write)."""

    def __init__(self, raw):
        self.raw = raw

    def read(self, n: int = -1) -> bytes:
        try:
            return self.raw.read(n)
        except _BROKEN as exc:
            raise _ReadError(str(exc) or type(exc).__name__) from None


class _Slice:
    """A read-only stream over one ar member."""

    def __init__(self, f, offset: int, size: int):
        self.f, self.left = f, size
        f.seek(offset)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.left:
            n = self.left
        data = self.f.read(n)
        self.left -= len(data)
        return data


class _Prefixed:
    """A stream whose first bytes were read to learn its kind, given back first."""

    def __init__(self, head: bytes, raw):
        self.head, self.raw = head, raw

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self.raw.read(n)
        if n is None or n < 0:
            out, self.head = self.head + self.raw.read(), b""
            return out
        out, self.head = self.head[:n], self.head[n:]
        return out + (self.raw.read(n - len(out)) if len(out) < n else b"")


def ar_members(f, label: str) -> Iterator[tuple[str, int, int]]:
    """(name, offset, size) of every member of an `ar` archive (the .deb container), from a seekable file."""
    if f.read(8) != b"!<arch>\n":
        raise Unreadable(label, "not a Debian package: no ar header")
    while True:
        header = f.read(60)
        if not header:
            return
        field_ = header[48:58].strip()
        if len(header) < 60 or header[58:60] != b"`\n" or not field_.isdigit():
            raise Unreadable(label, "a truncated or corrupt ar member header")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(field_)
        offset = f.tell()
        yield name, offset, size
        f.seek(offset + size + (size & 1))


def _tar_member(ti: tarfile.TarInfo) -> Member:
    if ti.isreg():
        kind = FILE
    elif ti.isdir():
        kind = DIR
    elif ti.issym():
        kind = SYMLINK
    elif ti.islnk():
        kind = HARDLINK
    else:
        kind = SPECIAL
    return Member(name=ti.name, kind=kind, size=ti.size if kind == FILE else 0, mode=ti.mode, mtime=int(ti.mtime),
                  linkname=ti.linkname)


def _tar_stream(raw, compressed: str) -> Iterator[tuple[Member, Callable[[], BinaryIO] | None]]:
    if compressed == "zst":
        raw = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    tar = tarfile.open(fileobj=raw, mode="r|" if compressed == "zst" else "r|*")
    try:
        for ti in tar:
            m = _tar_member(ti)
            yield m, ((lambda ti=ti: tar.extractfile(ti)) if m.kind == FILE else None)
    finally:
        tar.close()


def _zip_stream(f) -> Iterator[tuple[Member, Callable[[], BinaryIO] | None]]:
    with zipfile.ZipFile(f) as zf:
        for info in zf.infolist():
            mode = (info.external_attr >> 16) & 0o177777
            fmt = stat.S_IFMT(mode)
            if info.is_dir() or fmt == stat.S_IFDIR:
                m = Member(info.filename, DIR, mode=mode & 0o7777 or 0o755)
            elif fmt == stat.S_IFLNK:
                with zf.open(info) as src:
                    text = src.read(MAX_LINK_TEXT + 1).decode("utf-8", "surrogateescape")
                m = Member(info.filename, SYMLINK, mode=0o777, linkname=text if len(text) <= MAX_LINK_TEXT else "")
            elif fmt in (0, stat.S_IFREG):
                m = Member(info.filename, FILE, size=info.file_size, mode=mode & 0o7777 or 0o644)
            else:
                m = Member(info.filename, SPECIAL, mode=mode & 0o7777)
            yield m, ((lambda info=info: zf.open(info)) if m.kind == FILE else None)


def _deb_stream(f, label: str) -> Iterator[tuple[Member, Callable[[], BinaryIO] | None]]:
    data = [(n, o, s) for n, o, s in ar_members(f, label) if n.startswith("data.tar")]
    if len(data) != 1:
        raise Unreadable(label, f"expected one data.tar member, found {len(data)}")
    name, offset, size = data[0]
    yield from _tar_stream(_Slice(f, offset, size), "zst" if name.endswith(".zst") else "")


def _conda_stream(f, label: str) -> Iterator[tuple[Member, Callable[[], BinaryIO] | None]]:
    """A .conda package's members: its pkg-*.tar.zst (the files), then its info-*.tar.zst (info/...)."""
    with zipfile.ZipFile(f) as zf:
        names = [i.filename for i in zf.infolist()]
        tars = [[n for n in names if n.startswith(p) and n.endswith(".tar.zst") and "/" not in n]
                for p in ("pkg-", "info-")]
        if any(len(t) != 1 for t in tars):
            raise Unreadable(label, "a .conda package holds one pkg-*.tar.zst and one info-*.tar.zst; found "
                             + (", ".join(names) or "nothing"))
        for (name,) in tars:
            with zf.open(name) as raw:
                yield from _tar_stream(raw, "zst")


def _stream(f, kind: str, label: str):
    if kind == "conda":
        return _conda_stream(f, label)
    if kind == "deb":
        return _deb_stream(f, label)
    if kind == "zip":
        return _zip_stream(f)
    return _tar_stream(f, "zst" if kind == "tar.zst" else "")


@contextmanager
def reading(source: Source, *, kind: str | None = None, label: str | None = None
            ) -> Iterator[Iterator[tuple[Member, Callable[[], BinaryIO] | None]]]:
    """The members of an archive in order, each with a function that opens its bytes (files only; call it before
    asking for the next member). `kind` forces a kind ("deb" for a package named .deb); a file named .conda is read
    as a conda package; else the kind is read from the first bytes. A stream (not a path) may hold a tar of any
    compression only. Damaged bytes raise Unreadable."""
    label = label or (Path(source).name if isinstance(source, (str, Path)) else "archive")

    def guarded(it):
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            except _BROKEN as exc:
                raise Unreadable(label, str(exc) or type(exc).__name__) from None
            yield item

    if isinstance(source, (str, Path)):
        try:
            f = open(source, "rb")
        except OSError as exc:
            raise ArchiveError(f"{label}: cannot be read ({exc.strerror})", where=str(source)) from None
        with f:
            found = kind or ("conda" if str(source).endswith(".conda") else kind_of(f.read(8)))
            f.seek(0)
            it = _stream(f, found, label)
            try:
                yield guarded(it)
            finally:
                it.close()
    else:
        head = source.read(8)
        found = kind or kind_of(head)
        if found in ("zip", "deb", "conda"):
            raise Unreadable(label, f"a {found} is read from a file, not a stream")
        it = _stream(_Prefixed(head, source), found, label)
        try:
            yield guarded(it)
        finally:
            it.close()


def members(source: Source, *, kind: str | None = None, label: str | None = None) -> list[Member]:
    """Every member (names, kinds, sizes), in archive order; no bytes are read."""
    with reading(source, kind=kind, label=label) as stream:
        return [m for m, _ in stream]


def read(source: Source, want: str | Callable[[str], bool], *, limit: int = 16 << 20, kind: str | None = None,
         label: str | None = None) -> bytes | None:
    """The bytes of the first regular file named `want` (or whose name `want` accepts); None when there is none.
    A file larger than `limit` is refused."""
    label = label or (Path(source).name if isinstance(source, (str, Path)) else "archive")
    accept = want if callable(want) else (lambda name: name == want)
    with reading(source, kind=kind, label=label) as stream:
        for m, open_ in stream:
            if m.kind == FILE and accept(m.name):
                if m.size > limit:
                    raise ArchiveError(f"{label}: member {m.name!r} holds {m.size:,} bytes, more than the "
                                       f"{limit:,} read here")
                return _read_all(open_, label, limit)
    return None


def contents(source: Source, *, limit: int = 256 << 20) -> list[tuple[Member, bytes | None]]:
    """Every member with its bytes (None for folders and links), in archive order. For tests and small archives."""
    label = Path(source).name if isinstance(source, (str, Path)) else "archive"
    with reading(source, label=label) as stream:
        return [(m, _read_all(open_, label, limit) if open_ else None) for m, open_ in stream]


def _read_all(open_: Callable[[], BinaryIO], label: str, limit: int) -> bytes:
    try:
        with open_() as src:
            data = src.read(limit + 1)
    except _BROKEN as exc:
        raise Unreadable(label, str(exc) or type(exc).__name__) from None
    if len(data) > limit:
        raise ArchiveError(f"{label}: a member holds more than the {limit:,} bytes read here")
    return data


# ---- deciding -----------------------------------------------------------------------------------------------------
def _refuse(label: str, name: str, why: str) -> ArchiveError:
    return ArchiveError(f"{label}: member {name!r} {why}; refusing to unpack it",
                        hint="the archive is corrupt or malicious: delete it and download it again")


def _checked(m: Member, label: str, links: str) -> None:
    """Refuse a member whose name or kind no unpack accepts (or any link, with links="refuse")."""
    why = member_problem(m.name.removeprefix("./") or ".", is_link=links == "refuse" and m.kind in (SYMLINK, HARDLINK),
                         is_special=m.kind == SPECIAL)
    if why is None and m.kind == HARDLINK:
        why = member_problem(m.linkname.removeprefix("./") or ".")
        why = f"is a hard link whose target {why}" if why else None
    if why:
        raise _refuse(label, m.name, why)


Place = Callable[[Member], "str | None"]


def _placer(place: Place | None, strip: int) -> Place:
    if place is not None:
        return place
    return lambda m: stripped(m.name, strip)


def _rel(got: str | None, m: Member, label: str) -> str | None:
    """A place's answer, normalised and checked ("" is the root itself)."""
    if got is None:
        return None
    rel = "/".join(p for p in got.split("/") if p not in ("", "."))
    why = member_problem(rel) if rel else None
    if why:
        raise _refuse(label, m.name, why if got == m.name else f"would land at {got!r}, which {why}")
    return rel


class _Budget:
    def __init__(self, budget: Budget, label: str):
        self.budget, self.label = budget, label
        self.members = self.bytes = 0

    def member(self) -> None:
        self.members += 1
        if self.members > self.budget.members:
            raise ArchiveError(f"{self.label}: more than {self.budget.members:,} members; refusing to unpack it",
                               hint="an archive this large is not one of the pinned inputs")

    def declared(self, m: Member) -> None:
        if self.budget.file is not None and m.size > self.budget.file:
            raise self._file(m.name)
        if self.bytes + m.size > self.budget.bytes:
            raise self._total()

    def add(self, n: int, name: str, in_file: int) -> None:
        self.bytes += n
        if self.budget.file is not None and in_file > self.budget.file:
            raise self._file(name)
        if self.bytes > self.budget.bytes:
            raise self._total()

    def _file(self, name: str) -> ArchiveError:
        return ArchiveError(f"{self.label}: member {name!r} unpacks to more than {self.budget.file:,} bytes; "
                            f"refusing to unpack it", hint="the archive is corrupt or not what was pinned")

    def _total(self) -> ArchiveError:
        return ArchiveError(f"{self.label}: unpacks to more than {self.budget.bytes:,} bytes; refusing to unpack it",
                            hint="the archive is corrupt or not what was pinned")


def check(source: Source, *, links: str = "keep", place: Place | None = None, strip: int = 0,
          budget: Budget = BUDGET, kind: str | None = None, label: str | None = None) -> int:
    """Everything `unpack` decides from the archive alone, without writing: names, kinds, places, the member count
    and the declared sizes against `budget`. Returns how many members there are."""
    label = label or (Path(source).name if isinstance(source, (str, Path)) else "archive")
    where, spent = _placer(place, strip), _Budget(budget, label)
    with reading(source, kind=kind, label=label) as stream:
        for m, _ in stream:
            spent.member()
            rel = _rel(where(m), m, label)
            _checked(m, label, links)
            if rel is not None and m.kind == FILE:
                spent.declared(m)
                spent.bytes += m.size
    return spent.members


# ---- writing --------------------------------------------------------------------------------------------------------
def make_dirs(into: Path, parts, known: set[str] | None = None) -> tuple[str, str | None]:
    """Create into/<parts...> one component at a time without following any link: (the directory, None), or (where
    it stopped, the component that exists and is not a real directory). `known`: root-relative folders already found
    real in this unpack (no other process writes there meanwhile, and an unpack never turns a folder into a link), so
    they are not asked again; those found now are added."""
    here, rel = str(into), ""
    for part in [p for p in parts if p]:
        here, rel = f"{here}/{part}", f"{rel}/{part}" if rel else part
        if known is not None and rel in known:
            continue
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            os.mkdir(here, 0o755)
        else:
            if not stat.S_ISDIR(st.st_mode):
                return here, part
        if known is not None:
            known.add(rel)
    return here, None


def file_mode(mode: int) -> int:
    """Pure: the mode a member's file is written with: its exec bits kept, readable by all, writable by its owner;
    no setuid, setgid, sticky or group/other write."""
    return (mode & 0o755) | 0o644


def _clear(path) -> int:
    """Make room for a new entry at `path` (never following it): a file or link there is removed. Returns the mode
    of what was there (0: nothing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "a folder is in its place", str(path))
    os.unlink(path)
    return st.st_mode


class _Counted:
    """The file being written, each chunk counted against the budget before it is written."""

    def __init__(self, out, count: Callable[[int], None]):
        self.out, self.count = out, count

    def write(self, data: bytes) -> int:
        self.count(len(data))
        return self.out.write(data)


def _same(path: str, src) -> bool:
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as have:
        while True:
            a, b = src.read(CHUNK), have.read(CHUNK)
            while len(b) < len(a):  # a short read of the file on disk
                more = have.read(len(a) - len(b))
                if not more:
                    break
                b += more
            if a != b:
                return False
            if not a:
                return True


def write_member(into: Path, rel: str, data: bytes | BinaryIO, mode: int = 0o644, *, existing: str = "replace",
                 count: Callable[[int], None] | None = None, mtime: int | None = None, label: str = "",
                 known: set[str] | None = None) -> bool:
    """Write one file at into/rel without following any link: each parent must be a real directory (created when
    missing; `known` as in make_dirs), whatever is at rel is removed first (existing="same": a regular file there must
    hold the same bytes, else Clash, and is kept), the file is opened O_NOFOLLOW|O_EXCL with `file_mode(mode)`, and
    every chunk is counted by `count` before it is written. True when written, False when an equal file was kept."""
    shown = f"{label}: " if label else ""
    problem = member_problem(rel)
    if problem:
        raise ArchiveError(f"{shown}member {rel!r} {problem}; refusing to unpack it")
    if known is None:
        Path(into).mkdir(parents=True, exist_ok=True)
    _here, bad = make_dirs(into, rel.split("/")[:-1], known)
    if bad is not None:
        raise ArchiveError(f"{shown}member {rel!r}: {bad} is not a directory in the unpacked tree; refusing to unpack it")
    target = f"{into}/{rel}"
    src = data if hasattr(data, "read") else io.BytesIO(data)
    if existing == "same" and stat.S_ISREG(_lmode(target)):
        if _same(target, src):
            return False
        raise Clash(label or Path(into).name, rel)
    _clear(target)
    mode = file_mode(mode)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, _Counted(out, count) if count else out, CHUNK)
        out.flush()
        os.fchmod(fd, mode)  # the umask may have taken bits from the mode asked at open
        if mtime is not None:
            os.utime(fd, (mtime, mtime))
    return True


def _lmode(path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


class _Tree:
    """The unpack root as the resolver sees it: the archive's own symlinks (kept aside and written last, keyed by
    where they live), then the links already on disk, read as text with lstat, one component at a time."""

    def __init__(self, into: Path, label: str, absolute: str, spent: _Budget, existing: str):
        self.into, self.label, self.absolute, self.spent, self.existing = into, label, absolute, spent, existing
        self.links: dict[str, tuple[str, str]] = {}  # where -> (text, member name) of each symlink, in order
        self.dirs: set[str] = set()  # folders found real in this unpack (see make_dirs)
        self.out = Unpacked()

    def readlink(self, rel: str) -> str | None:
        if rel in self.links:
            return self.links[rel][0]
        if rel in self.dirs:
            return None
        path = f"{self.into}/{rel}"
        try:
            st = os.lstat(path)
        except OSError:
            return None
        return os.readlink(path) if stat.S_ISLNK(st.st_mode) else None

    def locate(self, rel: str, name: str) -> str:
        """The link-free place of `rel`: its parent resolved through the links known so far, refused when that
        leads out of the root. A link of the archive kept aside for that place is dropped (the member replaces it)."""
        parent_rel, _, leaf = rel.rpartition("/")
        parent = resolve(parent_rel, self.readlink, absolute=self.absolute)
        if parent is None:
            raise _refuse(self.label, name, "is reached through a link that leads out of the unpack root")
        where = f"{parent}/{leaf}" if parent else leaf
        self.links.pop(where, None)
        return where

    def mkdirs(self, rel: str, name: str) -> str:
        here, bad = make_dirs(self.into, rel.split("/"), self.dirs)
        if bad is not None:
            raise _refuse(self.label, name, "has a parent that is not a directory")
        return here

    def member(self, m: Member, rel: str, open_: Callable[[], BinaryIO] | None, place: Place) -> None:
        if m.kind == SYMLINK:
            parent = resolve(rel.rpartition("/")[0], self.readlink, absolute=self.absolute)
            if parent is None:
                self.out.skipped.append(f"{m.name} -> {m.linkname}")
                return
            where = f"{parent}/{rel.rpartition('/')[2]}" if parent else rel
            self.links.pop(where, None)  # a later link of one name replaces the earlier (and moves to the end)
            self.links[where] = (m.linkname, m.name)
            return
        where = self.locate(rel, m.name)
        if m.kind == DIR:
            self.mkdirs(where, m.name)
        elif m.kind == HARDLINK:
            self.hardlink(m, where, place)
        else:
            self.spent.declared(m)
            self.file(m, where, open_)
        self.out.count += 1

    def file(self, m: Member, where: str, open_: Callable[[], BinaryIO]) -> None:
        self.mkdirs(where.rpartition("/")[0], m.name)  # refused here, in the archive's words, when not a folder
        in_file = [0]

        def count(n: int) -> None:
            in_file[0] += n
            self.spent.add(n, m.name, in_file[0])

        with open_() as src:
            if write_member(self.into, where, _Reader(src), m.mode, existing=self.existing, count=count,
                            mtime=m.mtime, label=self.label, known=self.dirs):
                self.out.files.append(where)
        self.out.bytes += in_file[0]

    def hardlink(self, m: Member, where: str, place: Place) -> None:
        named = _rel(place(Member(m.linkname, FILE)), m, self.label)
        target = resolve(named, self.readlink, absolute=self.absolute) if named else None
        src = f"{self.into}/{target}" if target else None
        if src is None or not stat.S_ISREG(_lmode(src)):
            raise _refuse(self.label, m.name, f"is a hard link to {m.linkname!r}, not a file inside the root")
        dest = f"{self.mkdirs(where.rpartition('/')[0], m.name)}/{where.rpartition('/')[2]}"
        _clear(dest)
        os.link(src, dest, follow_symlinks=False)

    def finish(self) -> Unpacked:
        """The archive's symlinks, each checked against all of them: kept inside the root, else skipped."""
        for where, (text, name) in list(self.links.items()):
            out = link_in_root(where, text, self.readlink, absolute=self.absolute)
            if out is None:
                self.out.skipped.append(f"{name} -> {text}")
                continue
            try:
                dest = f"{self.mkdirs(where.rpartition('/')[0], name)}/{where.rpartition('/')[2]}"
                _clear(dest)
                os.symlink(out, dest)
            except OSError as exc:
                raise NotWritten(f"{self.label}: member {name!r} cannot be written ({exc.strerror})") from None
            self.out.count += 1
        return self.out


def unpack(source: Source, into: Path, *, place: Place | None = None, strip: int = 0, links: str = "keep",
           absolute: str = "refuse", budget: Budget = BUDGET, existing: str = "replace", precheck: bool = False,
           kind: str | None = None, label: str | None = None) -> Unpacked:
    """Unpack `source` into `into` (created) under the rules above.

    place: member -> root-relative path ("" the root itself), or None to leave it out (default: the name with `strip`
      leading folders stripped); links: "keep" (inside the root, written last) or "refuse" (any link refuses the
      archive); absolute: what a link to "/x" means, "refuse" (leads out: skipped) or "reroot" (the root's x);
      existing: "replace" a file already at a member's place, or require the "same" bytes there (Clash otherwise);
      precheck: check every member first (`check`), so nothing is written when one is refused; kind: see `reading`."""
    label = label or (Path(source).name if isinstance(source, (str, Path)) else "archive")
    where_of = _placer(place, strip)
    if precheck:
        check(source, links=links, place=where_of, budget=budget, kind=kind, label=label)
    into = Path(into)
    spent = _Budget(budget, label)
    with reading(source, kind=kind, label=label) as stream:
        into.mkdir(parents=True, exist_ok=True)
        tree = _Tree(into, label, absolute, spent, existing)
        for m, open_ in stream:
            spent.member()
            rel = _rel(where_of(m), m, label)  # the caller's place first: it may refuse a member in its own words
            _checked(m, label, links)
            if rel is None:
                continue
            if rel == "":
                tree.out.count += m.kind == DIR
                continue
            try:
                tree.member(m, rel, open_, where_of)
            except _ReadError as exc:
                raise Unreadable(label, str(exc)) from None
            except OSError as exc:
                raise NotWritten(f"{label}: member {m.name!r} cannot be written ({exc.strerror})") from None
        return tree.finish()


def extract(archive: Path, into: Path, *, select: Callable[[str], bool] = lambda name: True) -> int:
    """A sdist's or a wheel's members that `select` accepts, unpacked as they are named: no links at all, and every
    member checked before any is written. Returns how many were unpacked."""
    return unpack(archive, into, place=lambda m: stripped(m.name) if select(m.name) else None, links="refuse",
                  precheck=True).count


extract_tar = extract  # the name the fetch step knows it by


def check_archive_file(archive: Path) -> None:
    """Check every member of a zip/wheel or tar without unpacking it (no links at all)."""
    check(archive, links="refuse")

