"""package: one .conda per variant (py-rattler-build), a metapackage per bundle, a local channel (py-rattler),
a tar.zst of the installed tree, and SHA256SUMS. Every file is written aside and renamed into place."""
from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import zstandard

from .config import file_sha256

# A fixed timestamp makes packages reproducible: the same inputs give the same bytes.
FIXED_TIME = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def source_date() -> dt.datetime:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return dt.datetime.fromtimestamp(int(epoch), tz=dt.timezone.utc) if epoch else FIXED_TIME


def conda_filename(name: str, version: str, build_string: str) -> str:
    return f"{name}-{version}-{build_string}.conda"


def assemble(*, name: str, version: str, build_string: str, build_number: int, files_dir: Path, out_dir: Path,
             platform: str = "linux-64", license: str | None = None, summary: str | None = None,
             homepage: str | None = None, depends: Sequence[str] = (), license_files: Sequence[str] = ()) -> Path:
    from rattler_build import assemble_package

    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / conda_filename(name, version, build_string)
    with tempfile.TemporaryDirectory(prefix=".assemble-", dir=out_dir) as tmp:
        result = assemble_package(
            name=name,
            version=version,
            target_platform=platform,
            build_string=build_string,
            output_dir=tmp,
            files_dir=str(files_dir),
            license=license,
            summary=summary,
            homepage=homepage,
            depends=list(depends),
            build_number=build_number,
            timestamp=source_date(),
            detect_prefix=False,
            license_files=list(license_files) or None,
        )
        produced = Path(getattr(result, "path", "") or next(Path(tmp).rglob("*.conda")))
        os.replace(produced, final)
    return final


def index_channel(packages: Iterable[Path], channel_dir: Path, platform: str = "linux-64") -> Path:
    """A local channel holding exactly these packages, built aside and swapped into place."""
    from rattler.index import index_fs

    tmp = channel_dir.with_name(channel_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / platform).mkdir(parents=True)
    (tmp / "noarch").mkdir()
    for pkg in packages:
        shutil.copy2(pkg, tmp / platform / pkg.name)
    asyncio.run(index_fs(tmp, write_zst=False, write_shards=False))
    replace_dir(tmp, channel_dir)
    return channel_dir


def write_text_atomic(path: Path, text: str) -> None:
    """Write beside the target and rename into place: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


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


def tar_zst(trees: Sequence[Path], extra: dict[str, bytes], out: Path, top: str) -> Path:
    """A deterministic tar.zst of the merged trees (later trees win), under one top-level directory."""
    mtime = int(source_date().timestamp())
    entries: dict[str, Path] = {}
    for tree in trees:
        for path in tree.rglob("*"):
            if path.is_file() or path.is_symlink():
                entries[path.relative_to(tree).as_posix()] = path
    tmp = out.with_name("." + out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    cctx = zstandard.ZstdCompressor(level=10, threads=-1)
    with open(tmp, "wb") as raw, cctx.stream_writer(raw) as zf, tarfile.open(fileobj=zf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        names = sorted(set(entries) | set(extra))
        dirs = sorted({str(Path(n).parent) for n in names if str(Path(n).parent) != "."})
        all_dirs = sorted({str(p) for d in dirs for p in [Path(d), *Path(d).parents] if str(p) != "."})
        for d in [""] + all_dirs:
            info = tarfile.TarInfo(f"{top}/{d}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for name in names:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "root", "root"
            if name in extra:
                data = extra[name]
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            path = entries[name]
            if path.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                tar.addfile(info)
            else:
                info.size = path.stat().st_size
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    os.replace(tmp, out)
    return out


def sha256sums(directory: Path, out: Path) -> Path:
    lines = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p != out and not p.name.startswith(".")):
        lines.append(f"{file_sha256(path)}  {path.relative_to(directory).as_posix()}\n")
    write_text_atomic(out, "".join(lines))
    return out
