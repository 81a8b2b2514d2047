"""debs: toolchain inputs shipped as Debian packages (.deb), pinned by pool path and sha256.

A recipe names each package (config.DebInput) the way Debian's archive does
(`pool/main/s/shaderc/glslc_2025.2-1_amd64.deb`) with the sha256 of the file; the fetch step downloads it through the project's one HTTP session from a Debian archive, checks the
sha256, and unpacks its data member. No archive host is written anywhere in the project: the archive comes from
`$ONEBIT_DEBIAN_MIRROR`, else from the host's own apt sources (every Debian archive URI they list, in order), so a Debian
host needs no setting at all. The archives are tried in order by the one mirror loop (`from_archives`, which the
Packages indexes of builders/roots.py go through too): the first that serves the file wins, and when none does, one
error names every archive and why it failed.

A download is cut off past the pinned `size` (the Packages entry's Size; MAX_DEB where none is pinned), before the
sha256 is computed.

A .deb is an `ar` archive holding `debian-binary`, `control.tar.*` and `data.tar.*`; only the data member is unpacked,
by this module itself (never tarfile's extract or its filters: CPython's realpath overflow on long link chains let a
crafted tar write outside its root before 3.11.13 / 3.12.11): every member's name is checked (no absolute path, no
`..`, no device), its parent directory resolved through the links known so far by builders/treepath.py (text only,
never the host's realpath) and refused when it leads out of the root, files written with O_NOFOLLOW and without
setuid/setgid bits, hard links only to regular files inside the root. A symlink is kept when it leads inside the
root: a relative one as written (`libfoo.so -> libfoo.so.1`), an absolute one re-rooted as the relative link to the
same place (`lib64/ld-linux-x86-64.so.2 -> ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2`); others are skipped.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import requests

from .archives import make_dirs, member_problem
from .config import DebInput, file_sha256
from .errors import FetchError, OnebitError
from .swap import replace_dir
from .treepath import link_in_root, resolve

MIRROR_ENV = "ONEBIT_DEBIAN_MIRROR"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
MAX_DEB = 2 << 30  # bytes: the stated bound of a download whose size is not pinned
MAX_UNPACKED = 16 << 30  # bytes written by one unpack
_POOL = re.compile(r"^pool/[a-z0-9-]+/[a-z0-9+.-]+/[a-z0-9+.-]+/[A-Za-z0-9+.~_-]+\.deb$")


def pool_path_problem(path: str) -> str | None:
    """Pure: why `path` is not a Debian pool path of a .deb (None when it is)."""
    if not _POOL.match(path or ""):
        return f"{path!r} is not a Debian pool path (pool/<component>/<prefix>/<source>/<file>.deb)"
    return None


# ---- where Debian's archive is: the host's apt sources -------------------------------------------------------------
def parse_sources(text: str, *, deb822: bool) -> list[tuple[str, tuple[str, ...]]]:
    """Pure: (archive URI, suites) of every binary-package source in one apt sources file, enabled ones only."""
    out: list[tuple[str, tuple[str, ...]]] = []
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            key = None
            for line in stanza.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[0] in " \t" and key:
                    fields[key] += " " + line.strip()
                    continue
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                continue
            for uri in fields.get("uris", "").split():
                out.append((uri, tuple(fields.get("suites", "").split())))
        return out
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        words = line.split()
        if len(words) < 3 or words[0] != "deb":
            continue
        rest = words[1:]
        if rest[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if len(rest) >= 2:
            out.append((rest[0], (rest[1],)))
    return out


def debian_archives(sources: Sequence[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Pure: the archive URIs that hold Debian's pool (not the security archive, which holds only its own fixes)."""
    out = []
    for uri, suites in sources:
        if not uri.startswith(("http://", "https://", "file:/")):
            continue
        if suites and all(s.endswith("-security") or "/updates" in s for s in suites):
            continue
        base = uri.rstrip("/")
        if base not in out:
            out.append(base)
    return out


def host_sources(paths: Sequence[Path] = APT_SOURCES) -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for p in paths:
        files = sorted(p.glob("*.list")) + sorted(p.glob("*.sources")) if p.is_dir() else ([p] if p.is_file() else [])
        for f in files:
            try:
                out += parse_sources(f.read_text(errors="replace"), deb822=f.suffix == ".sources")
            except OSError:
                continue
    return out


def mirrors(env: Mapping[str, str] | None = None, paths: Sequence[Path] = APT_SOURCES) -> list[str]:
    """Where to download from: $ONEBIT_DEBIAN_MIRROR (space separated), then the host's Debian archives."""
    env = os.environ if env is None else env
    given = [m.rstrip("/") for m in env.get(MIRROR_ENV, "").split() if m]
    return given + [m for m in debian_archives(host_sources(paths)) if m not in given]


# ---- the mirror loop -------------------------------------------------------------------------------------------------
T = TypeVar("T")


class Unserved(Exception):
    """An archive that does not serve the request (an answer other than 200): the mirror loop tries the next one."""


def from_archives(archives: Sequence[str], attempt: Callable[[str], T], *, what: str, hint: str,
                  passes: tuple[type[BaseException], ...] = (OSError, requests.RequestException)) -> T:
    """The one mirror loop (the .deb downloads here, the Packages indexes of builders/roots.py): `attempt(base)` on
    each archive in order, the first answer wins. An archive that cannot serve it (Unserved, or an error of `passes`)
    is one line `base: why`; an OnebitError (the bytes differ from the pin's) stops the loop at once. When none
    serves it: one FetchError, `what` and a line for every attempt."""
    failures = []
    for base in archives:
        try:
            return attempt(base)
        except OnebitError:
            raise
        except Unserved as exc:
            failures.append(f"{base}: {exc}")
        except passes as exc:  # this archive cannot serve it: try the next
            failures.append(f"{base}: {type(exc).__name__}: {str(exc)[:200]}")
    raise FetchError(f"{what}:\n    " + "\n    ".join(failures or ["no archive is configured"]), hint=hint)


# ---- fetch -----------------------------------------------------------------------------------------------------------
def fetch(deb: DebInput, downloads: Path, *, offline: bool = False, archives: Sequence[str] | None = None,
          session=None, log=lambda m: None) -> Path:
    """The verified .deb in the download cache (`downloads/<sha256>/<name>`), downloaded when missing."""
    problem = pool_path_problem(deb.path)
    if problem:
        raise FetchError(problem, hint="copy the Filename field of the package's entry in the archive's Packages index")
    name = deb.name
    where = downloads / deb.sha256
    have = where / name
    if have.is_file() and file_sha256(have) == deb.sha256:
        return have
    if offline:
        raise FetchError(f"{name} is not in the download cache and --offline forbids downloading",
                         hint="run `1bit-build fetch BUNDLE` once with network")
    archives = mirrors() if archives is None else list(archives)
    if not archives:
        raise FetchError(f"no Debian archive to download {name} from: this host's apt sources list none",
                         hint=f"set {MIRROR_ENV} to a Debian archive URL (the one apt uses on a Debian host)")
    from .http import make_session

    http = session or make_session()
    limit = deb.size or MAX_DEB
    tmp = where.with_name(where.name + f".tmp-{os.getpid()}")

    def attempt(base: str) -> Path:
        url = f"{base}/{deb.path}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log(f"download {name}")
        if url.startswith("file:"):
            with open(url.removeprefix("file://").removeprefix("file:"), "rb") as src:
                _copy_capped(iter(lambda: src.read(1 << 20), b""), tmp / name, limit, name, base)
        else:
            with http.get(url, stream=True, timeout=(15, 300)) as resp:
                if resp.status_code != 200:
                    raise Unserved(f"HTTP {resp.status_code}")
                length = resp.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > limit:
                    raise _too_big(name, base, limit)
                _copy_capped(resp.iter_content(1 << 20), tmp / name, limit, name, base)
        got = file_sha256(tmp / name)
        if deb.size is not None and (tmp / name).stat().st_size != deb.size:
            raise FetchError(f"{name} from {base}: {(tmp / name).stat().st_size if (tmp / name).exists() else 0} bytes, "
                             f"not the pinned {deb.size}", hint="the archive served other bytes than were pinned")
        if got != deb.sha256:
            raise FetchError(f"{name} from {base}: sha256 {got} does not match the pinned {deb.sha256}",
                             hint="the archive served other bytes than were pinned; update the recipe's sha256 only "
                                  "after review")
        replace_dir(tmp, where)
        return have

    try:
        return from_archives(archives, attempt, what=f"{name} could not be downloaded",
                             hint="a Debian archive drops a package once its suite moves on: pin the version the suite "
                                  f"has now (its Packages index), or point {MIRROR_ENV} at an archive that keeps it")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # what a failed attempt left (a served one was renamed into place)


def _too_big(name: str, base: str, limit: int) -> FetchError:
    return FetchError(f"{name} from {base}: more than the pinned {limit} bytes; download stopped before hashing",
                      hint="the archive served other bytes than were pinned (or the recipe's size is wrong)")


def _copy_capped(chunks, dest: Path, limit: int, name: str, base: str) -> int:
    """Write `chunks` to dest, refusing once more than `limit` bytes arrived (nothing more is read)."""
    total = 0
    with open(dest, "wb") as f:
        for chunk in chunks:
            total += len(chunk)
            if total > limit:
                raise _too_big(name, base, limit)
            f.write(chunk)
    return total


# ---- unpack ----------------------------------------------------------------------------------------------------------
def ar_members(path: Path) -> Iterator[tuple[str, int, int]]:
    """(name, offset, size) of every member of an `ar` archive (the .deb container)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise FetchError(f"{path.name}: not a Debian package (no ar header)")
        while True:
            header = f.read(60)
            if not header:
                return
            if len(header) < 60 or header[58:60] != b"`\n":
                raise FetchError(f"{path.name}: a truncated or corrupt ar member header")
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip() or 0)
            offset = f.tell()
            yield name, offset, size
            f.seek(offset + size + (size & 1))


class _Slice:
    """A read-only file object over one ar member (tarfile streams it)."""

    def __init__(self, f, offset: int, size: int):
        self.f, self.left = f, size
        f.seek(offset)

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > self.left:
            n = self.left
        data = self.f.read(n)
        self.left -= len(data)
        return data


def _refuse(deb: str, name: str, why: str) -> FetchError:
    return FetchError(f"{deb}: member {name!r} {why}; refusing to unpack it",
                      hint="the package is corrupt or not what was pinned: delete it from the download cache")


def _check(member: tarfile.TarInfo, deb: str) -> str:
    """The member's name relative to the root ("" for the root itself), or refused."""
    name = member.name.removeprefix("./")
    special = not (member.isfile() or member.isdir() or member.issym() or member.islnk())
    why = member_problem(name or ".", is_special=special)
    if why:
        raise _refuse(deb, member.name, why)
    return name.rstrip("/") if name not in (".", "") else ""


class _Root:
    """The unpack root as the resolver sees it: the package's own links, then the links already on disk (read as
    text with lstat, component by component, so no host path is ever followed)."""

    def __init__(self, into: Path, links: dict[str, str]):
        self.into, self.links = into, links
        self.written = 0  # bytes of file data written

    def readlink(self, rel: str) -> str | None:
        if rel in self.links:  # the package's own links (written last), then what is on disk
            return self.links[rel]
        try:
            st = os.lstat(self.into / rel)
        except OSError:
            return None
        return os.readlink(self.into / rel) if stat.S_ISLNK(st.st_mode) else None

    def parent(self, name: str, deb: str) -> str:
        """The real (link-free) directory a member's parent leads to; refused when it leaves the root."""
        parent = resolve(name.rpartition("/")[0], self.readlink, absolute="reroot")
        if parent is None:
            raise _refuse(deb, name, "is reached through a link that leads out of the unpack root")
        return parent

    def mkdirs(self, rel: str, deb: str) -> Path:
        here, bad = make_dirs(self.into, rel.split("/"))
        if bad is not None:
            raise _refuse(deb, rel, "has a parent that is not a directory")
        return here

    def clear(self, path: Path) -> None:
        """Make room for a new entry at `path` (never following it): a file or link there is removed."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise FileExistsError(path)
        os.unlink(path)


def _data_tar(deb: Path):
    data = [(n, o, s) for n, o, s in ar_members(deb) if n.startswith("data.tar")]
    if len(data) != 1:
        raise FetchError(f"{deb.name}: expected one data.tar member, found {len(data)}")
    name, offset, size = data[0]

    def open_tar(f):
        raw = _Slice(f, offset, size)
        if name.endswith(".zst"):
            import zstandard

            return tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(raw), mode="r|")
        return tarfile.open(fileobj=raw, mode="r|*")
    return open_tar


def unpack(deb: Path, into: Path) -> int:
    """Unpack a .deb's data member into `into` (created). Returns how many members were written.

    One streaming pass: directories, files and hard links are written as they come, through the links seen so far
    (resolved by their text); the package's symlinks are written at the end, each checked against all of them."""
    open_tar = _data_tar(deb)
    into.mkdir(parents=True, exist_ok=True)
    root = _Root(into, {})
    pending: list[tuple[str, str, str]] = []  # (name, target, member name) of each symlink, in archive order
    count = 0
    with open(deb, "rb") as f, open_tar(f) as tar:
        for m in tar:
            name = _check(m, deb.name)
            if not name:  # the root itself
                count += m.isdir()
                continue
            if m.issym():
                root.links[name] = m.linkname
                pending.append((name, m.linkname, m.name))
                continue
            if name in root.links:  # a later member of that name replaces the link, as tar would
                del root.links[name]
                pending = [p for p in pending if p[0] != name]
            try:
                count += _write(tar, m, name, root, into, deb.name)
            except OSError as exc:
                raise _refuse(deb.name, m.name, f"cannot be written ({exc.strerror})") from None
    for name, target, shown in pending:
        try:
            count += _write_link(name, target, root, deb.name)
        except OSError as exc:
            raise _refuse(deb.name, shown, f"cannot be written ({exc.strerror})") from None
    return count


def _write_link(name: str, target: str, root: _Root, deb: str) -> int:
    """Write one symlink kept inside the root (1), or skip one that leads out (0)."""
    text = link_in_root(name, target, root.readlink)
    if text is None:
        return 0  # a link out of the root: skipped, not followed
    parent = root.parent(name, deb)
    where = root.mkdirs(parent, deb) / name.rpartition("/")[2]
    root.clear(where)
    os.symlink(text, where)
    return 1


def _write(tar: tarfile.TarFile, m: tarfile.TarInfo, name: str, root: _Root, into: Path, deb: str) -> int:
    """Write one member (already checked); 1 when written, 0 when skipped."""
    parent = root.parent(name, deb)
    rel = f"{parent}/{name.rpartition('/')[2]}" if parent else name.rpartition("/")[2]
    if m.isdir():
        root.mkdirs(rel, deb)
        return 1
    where = root.mkdirs(parent, deb) / name.rpartition("/")[2]
    if m.islnk():
        target = resolve(_check(tarfile.TarInfo(m.linkname), deb), root.readlink, absolute="reroot")
        src = into / target if target else None
        if src is None or not stat.S_ISREG(os.lstat(src).st_mode if os.path.lexists(src) else 0):
            raise _refuse(deb, m.name, f"is a hard link to {m.linkname!r}, not a file inside the root")
        root.clear(where)
        os.link(src, where, follow_symlinks=False)
    else:
        root.written += m.size
        if root.written > MAX_UNPACKED:
            raise FetchError(f"{deb}: unpacks to more than {MAX_UNPACKED >> 30} GiB; refusing it")
        root.clear(where)
        mode = (m.mode & 0o755) | 0o600  # no setuid, setgid, sticky or group/other write
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as out, tar.extractfile(m) as src:
            shutil.copyfileobj(src, out, 1 << 20)
        os.chmod(where, mode)
        os.utime(where, (m.mtime, m.mtime), follow_symlinks=False)
    return 1
