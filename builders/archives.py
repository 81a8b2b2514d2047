"""Unpack archives safely: a member whose name is absolute or climbs out with `..`, and any link or device, is
refused before anything is written. One place for every unpack (sdists, wheels, Lemonade archives)."""
from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from .errors import OnebitError


class ArchiveError(OnebitError):
    pass


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


def _tar_problem(m: tarfile.TarInfo) -> str | None:
    return member_problem(m.name, is_link=m.issym() or m.islnk(), is_special=not (m.isfile() or m.isdir()))


def _zip_problem(info: zipfile.ZipInfo) -> str | None:
    mode = info.external_attr >> 16
    is_link = (mode & 0o170000) == 0o120000
    return member_problem(info.filename, is_link=is_link)


def _refuse(archive: Path, name: str, problem: str) -> ArchiveError:
    return ArchiveError(f"archive {Path(archive).name}: member {name!r} {problem}; refusing to unpack it",
                        where=str(archive), hint="the archive is corrupt or malicious: delete it and download it again")


def check_tar(archive: Path) -> None:
    """Refuse the whole tar if any member is unsafe (one streaming pass)."""
    with tarfile.open(archive, "r|*") as tar:
        for m in tar:
            problem = _tar_problem(m)
            if problem:
                raise _refuse(archive, m.name, problem)


# PEP 706's extraction filters came with Python 3.11.4 and 3.12; Debian 12's python3 is 3.11.2 without them. There
# every member is extracted as member_problem checked it, with what the "data" filter would also do: no setuid,
# setgid or sticky bit, no group or other write, and owned by whoever unpacks it.
HAS_FILTERS = hasattr(tarfile, "data_filter")


def extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path, filter: str = "data") -> None:
    """Extract one checked member with the stdlib's `filter` where it has filters, else as described above."""
    if HAS_FILTERS:
        tar.extract(member, into, filter=filter)
        return
    if filter == "data":
        member.mode &= 0o755
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    tar.extract(member, into)


def extract_tar(archive: Path, into: Path, *, select: Callable[[str], bool] = lambda name: True) -> int:
    """Unpack the members `select` accepts into `into`; every member is checked first, so nothing is written when
    one is unsafe. Returns how many members were unpacked. Two streaming passes (a .tar.gz has no random access)."""
    check_tar(archive)
    into.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(archive, "r|*") as tar:
        for m in tar:
            if select(m.name):
                extract_member(tar, m, into)  # the stdlib's own guard too, where it has one
                count += 1
    return count


def extract_zip(archive: Path, into: Path, *, select: Callable[[str], bool] = lambda name: True) -> int:
    """Unpack a zip (a wheel) with the same checks; nothing is written when one member is unsafe."""
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            problem = _zip_problem(info)
            if problem:
                raise _refuse(archive, info.filename, problem)
        into.mkdir(parents=True, exist_ok=True)
        count = 0
        for info in infos:
            if not select(info.filename):
                continue
            target = into / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(target, mode & 0o755)
            count += 1
    return count


def make_dirs(into: Path, parts) -> tuple[Path, str | None]:
    """Create into/<parts...> one component at a time without following any link: (the directory, None), or (where
    it stopped, the component that exists and is not a real directory)."""
    here = into
    for part in [p for p in parts if p]:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            os.mkdir(here, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return here, part
    return here, None


def write_member(into: Path, rel: str, data: bytes, mode: int = 0o644) -> Path:
    """Write one checked member at into/rel without following any link: each parent must be a real directory
    (created when missing), an existing file or link at rel is replaced, the file is opened O_NOFOLLOW|O_EXCL, and
    setuid, setgid, sticky and group/other write bits are dropped."""
    problem = member_problem(rel)
    if problem:
        raise ArchiveError(f"member {rel!r} {problem}; refusing to unpack it")
    into.mkdir(parents=True, exist_ok=True)
    _here, bad = make_dirs(into, rel.split("/")[:-1])
    if bad is not None:
        raise ArchiveError(f"member {rel!r}: {bad} is not a directory in the unpacked tree; refusing to unpack it")
    target = into / rel
    if os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
            raise ArchiveError(f"member {rel!r} would replace a directory; refusing to unpack it")
        os.unlink(target)
    mode = (mode & 0o755) | 0o600
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(target, mode)
    return target


def check_archive_file(archive: Path) -> None:
    """Check every member of a zip/wheel or tar without unpacking it."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                problem = _zip_problem(info)
                if problem:
                    raise _refuse(archive, info.filename, problem)
        return
    check_tar(archive)


def extract(archive: Path, into: Path, *, select: Callable[[str], bool] = lambda name: True) -> int:
    """A .whl/.zip or any tar the stdlib reads."""
    if zipfile.is_zipfile(archive):
        return extract_zip(archive, into, select=select)
    return extract_tar(archive, into, select=select)
