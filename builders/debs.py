"""debs: toolchain inputs shipped as Debian packages (.deb), pinned by pool path and sha256.

A recipe names each package (config.DebInput) the way Debian's archive does
(`pool/main/s/shaderc/glslc_2025.2-1_amd64.deb`) with the sha256 of the file; the fetch step downloads it through the project's one HTTP session from a Debian archive, checks the
sha256, and unpacks its data member. No archive host is written anywhere in the project: the archive comes from
`$ONEBIT_DEBIAN_MIRROR`, else from the host's own apt sources (every Debian archive URI they list, in order), so a Debian
host needs no setting at all.

A .deb is an `ar` archive holding `debian-binary`, `control.tar.*` and `data.tar.*`; only the data member is unpacked,
streamed, every member checked (no absolute path, no `..`, no device), and a link that would point outside the
unpacked tree (`/lib64/ld-linux-x86-64.so.2 -> /lib/...`) is skipped, not followed.
"""
from __future__ import annotations

import os
import re
import shutil
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import requests

from .archives import member_problem
from .config import DebInput, file_sha256
from .errors import FetchError
from .swap import replace_dir

MIRROR_ENV = "ONEBIT_DEBIAN_MIRROR"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
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
    failures = []
    tmp = where.with_name(where.name + f".tmp-{os.getpid()}")
    for base in archives:
        url = f"{base}/{deb.path}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log(f"download {name}")
        try:
            if url.startswith("file:"):
                shutil.copyfile(url.removeprefix("file://").removeprefix("file:"), tmp / name)
            else:
                with http.get(url, stream=True, timeout=(15, 300)) as resp:
                    if resp.status_code != 200:
                        failures.append(f"{base}: HTTP {resp.status_code}")
                        continue
                    with open(tmp / name, "wb") as f:
                        for chunk in resp.iter_content(1 << 20):
                            f.write(chunk)
        except (OSError, requests.RequestException) as exc:  # this archive cannot serve it: try the next
            failures.append(f"{base}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        got = file_sha256(tmp / name)
        if got != deb.sha256:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(f"{name} from {base}: sha256 {got} does not match the pinned {deb.sha256}",
                             hint="the archive served other bytes than were pinned; update the recipe's sha256 only "
                                  "after review")
        replace_dir(tmp, where)
        return have
    shutil.rmtree(tmp, ignore_errors=True)
    raise FetchError(f"{name} could not be downloaded:\n    " + "\n    ".join(failures),
                     hint="a Debian archive drops a package once its suite moves on: pin the version the suite has "
                          f"now (its Packages index), or point {MIRROR_ENV} at an archive that keeps it")


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


def _keep(member: tarfile.TarInfo, dest: str, deb: str, keep_absolute_links: bool = False) -> tarfile.TarInfo | None:
    """The project's member check (builders.archives) on the name, then tarfile's data filter, except that a link
    pointing outside the tree is skipped instead of failing the unpack. keep_absolute_links (a build root, which is
    entered as /): an absolute symlink becomes the relative link to the same path inside the tree, so it points
    there on the host too."""
    if keep_absolute_links and member.issym() and member.linkname.startswith("/"):
        here = os.path.dirname("/" + member.name.removeprefix("./").lstrip("/"))
        member = member.replace(linkname=os.path.relpath(os.path.normpath(member.linkname), here), deep=False)
    why = member_problem(member.name.removeprefix("./") or ".",
                         is_special=not (member.isfile() or member.isdir() or member.issym() or member.islnk()))
    if why:
        raise FetchError(f"{deb}: member {member.name!r} {why}; refusing to unpack it",
                         hint="the package is corrupt or not what was pinned: delete it from the download cache")
    try:
        return tarfile.data_filter(member, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None
    except tarfile.FilterError as exc:
        raise FetchError(f"{deb}: member {member.name!r} is unsafe ({exc}); refusing to unpack it",
                         hint="the package is corrupt or not what was pinned: delete it from the download cache") from None


def unpack(deb: Path, into: Path, *, keep_absolute_links: bool = False) -> int:
    """Unpack a .deb's data member into `into` (created). Returns how many members were written.
    keep_absolute_links: see `_keep` (a build root)."""
    data = [(n, o, s) for n, o, s in ar_members(deb) if n.startswith("data.tar")]
    if len(data) != 1:
        raise FetchError(f"{deb.name}: expected one data.tar member, found {len(data)}")
    name, offset, size = data[0]
    into.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(deb, "rb") as f:
        raw = _Slice(f, offset, size)
        if name.endswith(".zst"):
            import zstandard

            stream = zstandard.ZstdDecompressor().stream_reader(raw)
            mode = "r|"
        else:
            stream, mode = raw, "r|*"
        with tarfile.open(fileobj=stream, mode=mode) as tar:
            for m in tar:
                kept = _keep(m, str(into), deb.name, keep_absolute_links)
                if kept is None:
                    continue
                tar.extract(kept, into, filter="fully_trusted")  # the member was filtered above
                count += 1
    return count
