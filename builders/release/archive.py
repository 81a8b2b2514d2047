"""Deterministic tar archives: sorted members, fixed mtime and owner, no links, gzip header mtime 0."""
from __future__ import annotations

import gzip
import io
import lzma
import os
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import zstandard

from ..stage import is_elf


def _info(name: str, *, size: int = 0, mode: int, mtime: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime, ti.type = size, mode, mtime, kind
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def file_mode(path: Path) -> int:
    return 0o755 if is_elf(path) or os.access(path, os.X_OK) else 0o644


def write_tar(out: Path, top: str, files: Mapping[str, Path], *, mtime: int) -> Path:
    """Write `files` (archive-relative path -> source file; symlinks are followed) under one folder `top` into `out`
    (.tar.gz, .tar.xz or .tar.zst by its name). Same inputs, same bytes. Written aside and renamed into place."""
    dirs = {top}
    for rel in files:
        parts = rel.split("/")
        dirs.update(top + "/" + "/".join(parts[:i]) for i in range(1, len(parts)))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = [(d, None) for d in dirs] + [(f"{top}/{rel}", src) for rel, src in files.items()]
        for name, src in sorted(entries):
            if src is None:
                tar.addfile(_info(name, mode=0o755, mtime=mtime, kind=tarfile.DIRTYPE))
                continue
            data = Path(src).read_bytes()
            tar.addfile(_info(name, size=len(data), mode=file_mode(Path(src)), mtime=mtime), io.BytesIO(data))
    raw = buf.getvalue()
    name = out.name
    if name.endswith(".tar.gz"):
        packed = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=9) as gz:
            gz.write(raw)
        data = packed.getvalue()
    elif name.endswith(".tar.xz"):
        data = lzma.compress(raw, format=lzma.FORMAT_XZ, preset=6)
    elif name.endswith(".tar.zst"):
        data = zstandard.ZstdCompressor(level=19, threads=0).compress(raw)
    else:
        raise ValueError(f"unknown archive type: {name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("." + out.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return out


def tree_files(root: Path, under: str = "") -> dict[str, Path]:
    """Every file below `root` (symlinks to files followed), keyed by `under/relative path`."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            out[f"{under}/{rel}" if under else rel] = path
    return out


def names(paths: Iterable[Path]) -> list[str]:
    return sorted(p.name for p in paths)
