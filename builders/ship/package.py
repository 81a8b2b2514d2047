"""package: one .conda per variant (py-rattler-build), a metapackage per bundle, a local channel (py-rattler),
a tar.zst of the installed tree, and SHA256SUMS. Every file is written aside and renamed into place."""
from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence


from ..project.config import file_sha256
from ..io.swap import replace_dir, write_text_atomic

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


def sha256sums(directory: Path, out: Path) -> Path:
    """The one SHA256SUMS writer (a bundle's out dir, a release dir): GNU `sha256sum` lines of every file below
    `directory` but `out` and dot-files, by path, written aside and swapped into place."""
    lines = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p != out and not p.name.startswith(".")):
        lines.append(f"{file_sha256(path)}  {path.relative_to(directory).as_posix()}\n")
    write_text_atomic(out, "".join(lines))
    return out
