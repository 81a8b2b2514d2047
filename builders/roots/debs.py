"""debs: toolchain inputs shipped as Debian packages (.deb), pinned by pool path and sha256.

A recipe names each package (config.DebInput) the way Debian's archive does
(`pool/main/s/shaderc/glslc_2025.2-1_amd64.deb`) with the sha256 of the file; the fetch step downloads it through the project's one HTTP session from a Debian archive, checks the
sha256, and unpacks its data member. No archive host is written anywhere in the project: the archive comes from
`$ONEBIT_DEBIAN_MIRROR`, else from the host's own apt sources (every Debian archive URI they list, in order), so a Debian
host needs no setting at all. The archives are tried in order by the one mirror loop (`from_archives`, which the
Packages indexes of builders/roots/assemble.py go through too): the first that serves the file wins, and when none does, one
error names every archive and why it failed.

A download is cut off past the pinned `size` (the Packages entry's Size; MAX_DEB where none is pinned), before the
sha256 is computed.

A .deb is an `ar` archive holding `debian-binary`, `control.tar.*` and `data.tar.*`; only the data member is unpacked,
by the project's one unpacker, builders/io/archives.py (never tarfile's extract or its filters: CPython's realpath
overflow on long link chains let a crafted tar write outside its root before 3.11.13 / 3.12.11): every member's name
is checked (no absolute path, no `..`, no device), its parent directory resolved through the links known so far by
builders/io/treepath.py (text only, never the host's realpath) and refused when it leads out of the root, files written
with O_NOFOLLOW and without setuid/setgid bits, hard links only to regular files inside the root. A symlink is kept
when it leads inside the root: a relative one as written (`libfoo.so -> libfoo.so.1`), an absolute one re-rooted as
the relative link to the same place (`lib64/ld-linux-x86-64.so.2 -> ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2`);
others are skipped.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import requests

from ..io import archives
from ..project.config import DebInput, file_sha256
from ..errors import FetchError, OnebitError
from ..io.swap import replace_dir

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
    """The one mirror loop (the .deb downloads here, the Packages indexes of builders/roots/assemble.py): `attempt(base)` on
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
    from ..io.http import make_session

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
def unpack(deb: Path, into: Path) -> int:
    """Unpack a .deb's data member into `into` (created) with the project's one unpacker (builders/io/archives.py, the
    rules above): absolute links re-rooted inside the root, at most MAX_UNPACKED bytes. Returns how many members
    were written."""
    try:
        return archives.unpack(deb, into, kind="deb", absolute="reroot", budget=archives.Budget(bytes=MAX_UNPACKED)).count
    except archives.ArchiveError as exc:
        raise FetchError(exc.what, where=exc.where,
                         hint="the package is corrupt or not what was pinned: delete it from the download cache") from None
