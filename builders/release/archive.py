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
    return _write_compressed(buf.getvalue(), out)


def _write_compressed(raw: bytes, out: Path) -> Path:
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


def read_tar(path: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Every member of a .tar.zst/.tar.gz/.tar.xz with its bytes (None for directories and links)."""
    data = Path(path).read_bytes()
    if path.name.endswith(".tar.zst"):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
        fileobj, mode = io.BytesIO(data), "r:"
    else:
        fileobj, mode = io.BytesIO(data), "r:*"
    out = []
    with tarfile.open(fileobj=fileobj, mode=mode) as tar:
        for m in tar:
            out.append((m, tar.extractfile(m).read() if m.isfile() else None))
    return out


def repack(src: Path, out: Path, top: str, extra: Mapping[str, Path], *, mtime: int) -> Path:
    """Rewrite a one-folder tar under a new top folder, adding `extra` files; symlinks stay symlinks. Deterministic."""
    members = read_tar(src)
    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    for m, data in members:
        parts = m.name.split("/", 1)
        rel = parts[1] if len(parts) > 1 else ""
        entries[rel] = (m, data)
    for rel, path in extra.items():
        data = Path(path).read_bytes()
        entries[rel] = (_info(rel, size=len(data), mode=0o644, mtime=mtime), data)
        for i in range(1, len(rel.split("/"))):
            d = "/".join(rel.split("/")[:i])
            entries.setdefault(d, (_info(d, mode=0o755, mtime=mtime, kind=tarfile.DIRTYPE), None))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(entries):
            m, data = entries[rel]
            name = f"{top}/{rel}" if rel else top
            kind = m.type if m.type in (tarfile.DIRTYPE, tarfile.SYMTYPE) else tarfile.REGTYPE
            info = _info(name, size=len(data or b""), mode=m.mode & 0o7777, mtime=mtime, kind=kind)
            if kind == tarfile.SYMTYPE:
                info.linkname = m.linkname
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return _write_compressed(buf.getvalue(), out)


def extract_tree(src: Path, dest: Path) -> Path:
    """Extract a one-folder tar into `dest` (the top folder stripped); members escaping `dest` are refused."""
    for m, data in read_tar(src):
        parts = m.name.split("/")[1:]
        if not parts or ".." in parts or m.name.startswith("/"):
            continue
        path = dest.joinpath(*parts)
        if m.isdir():
            path.mkdir(parents=True, exist_ok=True)
        elif m.issym():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(m.linkname)
        elif m.isfile():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(m.mode & 0o777)
    return dest
