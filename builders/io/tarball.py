"""tarball: the project's one deterministic tar writer.

Same inputs, same bytes: members sorted, every parent folder listed, fixed mtime, owner 0:0 with no names, mode 0755
for programs and folders and 0644 for the rest, PAX format, a gzip header without name or time. The archive is
streamed to a file beside the target through the compressor its name asks for (.tar.gz, .tar.xz, .tar.zst) and renamed
into place, so a multi-gigabyte CUDA tree never sits in memory and a reader never sees half an archive.

Used for the bundle tarball (`package`), the release tarball and the Lemonade archives (`release`). Reading one back
(`members`, `extract_tree`) goes through the project's one unpacker, builders/io/archives.py.
"""
from __future__ import annotations

import gzip
import io
import lzma
import os
import tarfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from . import archives
from .elf import is_elf

ZSTD_LEVEL = 10  # about as small as 19 for these trees, several times faster


@dataclass(frozen=True)
class Entry:
    """One member to write: a file's bytes come from `src` (read while streaming) or `data`; a link has `link`."""

    src: Path | None = None
    data: bytes | None = None
    link: str | None = None  # symlink target (kept as a link)
    executable: bool | None = None  # None: decided from the file (ELF or executable bit)


def file_mode(path: Path) -> int:
    return 0o755 if is_elf(path) or os.access(path, os.X_OK) else 0o644


def tree_entries(root: Path, under: str = "", *, follow_links: bool = False) -> dict[str, Entry]:
    """Every file and symlink below `root`, keyed by `under/relative path`. With follow_links, a link to a file is
    written as the file it points to (Lemonade archives carry no links); a dangling link is skipped."""
    out: dict[str, Entry] = {}
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        key = f"{under}/{rel}" if under else rel
        if path.is_symlink() and not follow_links:
            out[key] = Entry(link=os.readlink(path))
        elif path.is_file():
            out[key] = Entry(src=path)
    return out


def _info(name: str, *, mtime: int, mode: int, kind: bytes = tarfile.REGTYPE, size: int = 0) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime, ti.size = kind, mode, mtime, size
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


@contextmanager
def _compressed(raw: BinaryIO, name: str, level: int | None) -> Iterator[BinaryIO]:
    if name.endswith(".tar.gz"):
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=level or 9) as gz:
            yield gz
    elif name.endswith(".tar.xz"):
        with lzma.LZMAFile(raw, "wb", format=lzma.FORMAT_XZ, preset=6 if level is None else level) as xz:
            yield xz
    elif name.endswith(".tar.zst"):
        # zstd's output does not depend on the number of workers (>= 1): any host gives the same bytes
        cctx = zstandard.ZstdCompressor(level=level or ZSTD_LEVEL, threads=-1)
        with cctx.stream_writer(raw, closefd=False) as zf:
            yield zf
    elif name.endswith(".tar"):
        yield raw
    else:
        raise ValueError(f"unknown archive type: {name} (.tar.gz, .tar.xz, .tar.zst or .tar)")


def write(out: Path, top: str, entries: Mapping[str, Entry], *, mtime: int, level: int | None = None) -> Path:
    """Write `entries` (archive-relative path -> Entry) under one folder `top` into `out`. Deterministic, streamed,
    written aside and renamed into place."""
    out = Path(out)
    names = sorted(entries)
    dirs = {top}
    for rel in names:
        parts = rel.split("/")
        dirs.update(f"{top}/" + "/".join(parts[:i]) for i in range(1, len(parts)))
    members = sorted([(d, None) for d in dirs] + [(f"{top}/{rel}", entries[rel]) for rel in names], key=lambda x: x[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("." + out.name + ".part")
    try:
        with open(tmp, "wb") as raw, _compressed(raw, out.name, level) as stream, \
                tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name, e in members:
                if e is None:
                    tar.addfile(_info(name, mtime=mtime, mode=0o755, kind=tarfile.DIRTYPE))
                elif e.link is not None:
                    info = _info(name, mtime=mtime, mode=0o777, kind=tarfile.SYMTYPE)
                    info.linkname = e.link
                    tar.addfile(info)
                elif e.data is not None:
                    mode = 0o755 if e.executable else 0o644
                    tar.addfile(_info(name, mtime=mtime, mode=mode, size=len(e.data)), io.BytesIO(e.data))
                else:
                    src = Path(e.src)
                    mode = file_mode(src) if e.executable is None else (0o755 if e.executable else 0o644)
                    with open(src, "rb") as f:
                        size = os.fstat(f.fileno()).st_size
                        tar.addfile(_info(name, mtime=mtime, mode=mode, size=size), f)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def members(path: Path) -> list[tuple[archives.Member, bytes | None]]:
    """Every member with its bytes (None for folders and links), in archive order, read by the project's one reader
    (builders/io/archives.py). For tests and small archives."""
    return archives.contents(path)


def extract_tree(src: Path, dest: Path) -> Path:
    """Unpack one of our one-folder tarballs into `dest` with the top folder stripped, by the project's one unpacker
    (builders/io/archives.py): links kept where they lead inside `dest` (written last, so nothing is written through
    one), a member reached through a link that leads out refused in one line naming the tarball."""
    archives.unpack(src, dest, strip=1)
    return Path(dest)
