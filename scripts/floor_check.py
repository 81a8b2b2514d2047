"""floor_check: the floor, proven from outside the build: every ELF file of built conda channels read again.

    python scripts/floor_check.py CHANNEL_DIR... [--json]

The stage gate (builders/ship/stage.py, builders/io/elf.py) reads every ELF file inside the build. This reads what came out
of it instead, with other readers: every .conda and .tar.bz2 package of the channels (each CHANNEL_DIR holds
<subdir>/repodata.json) is unpacked by the project's one unpacker (builders/io/archives.py), and every ELF file for this
machine (programs, shared libraries, extension modules; not a kernel module, not a GPU code object) is read with
auditwheel's own ELF readers (auditwheel.elfutils: its DT_NEEDED list and its symbol-version needs, the ELF
interpreter's left out as auditwheel leaves them). What is allowed is auditwheel's policy data for floor.yaml's
policy (manylinux_2_34: the symbol versions of each family it governs, GLIBC_, GLIBCXX_, CXXABI_, GCC_ ..., and its
library whitelist), read through builders/project/floor.py as the build does, plus floor.yaml's host libraries: the base and
every host set (which recipe declares which set is the gate's business; here a library any set names is allowed).

A file fails when it needs a symbol version of a governed family the policy does not list, or links (DT_NEEDED) a
library that is neither shipped in the package set (a file or link of that name in any package read) nor allowed.

Prints one line per package (ELF files read, the highest GLIBC_, GLIBCXX_ and CXXABI_ version needed) and one line per
violation; `--json` prints the same as one JSON document. Exit status: 0 none, 1 any violation, 2 bad input (one line
naming the argument).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from builders.io import archives  # noqa: E402
from builders.project import floor  # noqa: E402

PACKAGE_SUFFIXES = (".conda", ".tar.bz2")
FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI")  # the ones each package's line reports
HOST_MACHINE = "EM_X86_64"


class BadInput(Exception):
    """A user mistake: one line, no traceback."""


@dataclass(frozen=True)
class Elf:
    rel: str  # path inside the package
    needed: tuple[str, ...] = ()
    versions: tuple[tuple[str, str], ...] = ()  # (library, version name), auditwheel's elf_find_versioned_symbols
    error: str = ""  # why it could not be read (a violation: nothing can be said of it)


@dataclass
class Package:
    name: str  # the package file's name
    elves: list[Elf] = field(default_factory=list)
    names: set[str] = field(default_factory=set)  # every file and link name it ships (what a NEEDED entry may find)
    skipped: int = 0  # ELF files the host's loader never loads (kernel modules, GPU code objects)


# ---- pure decisions ------------------------------------------------------------------------------------------------
def package_files(listing: Mapping[str, Sequence[str]]) -> list[str]:
    """Pure: the package files of a channel, from (subdir -> file names), sorted."""
    return sorted(f"{sub}/{name}" for sub, names in listing.items() for name in names if name.endswith(PACKAGE_SUFFIXES))


def number(version: str) -> tuple:
    """Pure: a version name's number as a sort key (GLIBCXX_3.4.9 < GLIBCXX_3.4.29); names (FLOAT128) sort last."""
    return floor.version_order(version.partition("_")[2])


def highest(versions: Iterable[str], family: str) -> str | None:
    """Pure: the highest numeric version of `family` among version names (GLIBC_2.34), or None."""
    mine = [v for v in versions if v.partition("_")[0] == family and number(v)[0] == 0]
    return max(mine, key=number) if mine else None


def violations(elf: Elf, allowed: Mapping[str, Collection[str]], libraries: Collection[str],
               shipped: Collection[str]) -> list[str]:
    """Pure: why one ELF file fails, each as a line's tail: a symbol version of a family the policy governs that it
    does not allow (a library's own versions, hip_4.2, are not governed), or a NEEDED library neither shipped in the
    package set nor allowed."""
    if elf.error:
        return [f"{elf.rel}: an ELF file that cannot be read ({elf.error})"]
    out = []
    for library, version in sorted(set(elf.versions)):
        family, sep, num = version.partition("_")
        if sep and family in allowed and num not in allowed[family]:
            out.append(f"{elf.rel}: needs {version} of {library}, which the policy does not allow")
    for library in elf.needed:
        if library not in libraries and library not in shipped:
            out.append(f"{elf.rel}: links {library}, neither shipped in the package set nor an allowed host library")
    return out


def package_line(pkg: Package) -> str:
    """Pure: one line per package: ELF files read and the highest version needed of each reported family."""
    versions = {v for e in pkg.elves for _, v in e.versions}
    tops = "  ".join(f"{f} {(highest(versions, f) or '-').partition('_')[2] or '-'}" for f in FAMILIES)
    skipped = f" ({pkg.skipped} not for the host's loader)" if pkg.skipped else ""
    return f"{pkg.name}: {len(pkg.elves)} ELF{skipped}  {tops}"


# ---- effects -------------------------------------------------------------------------------------------------------
def channel_packages(channel: str) -> list[Path]:
    """The package files of one channel directory; BadInput when it is none."""
    top = Path(channel)
    if not top.is_dir():
        raise BadInput(f"{channel}: no such directory")
    subs = sorted(p.parent for p in top.glob("*/repodata.json"))
    if not subs:
        raise BadInput(f"{channel}: not a conda channel (no <subdir>/repodata.json)")
    return [top / rel for rel in package_files({s.name: sorted(os.listdir(s)) for s in subs})]


def read_elf(path: Path, rel: str) -> Elf | None:
    """auditwheel's reading of one ELF file; None for one the host's loader never loads."""
    from auditwheel.elfutils import elf_find_versioned_symbols, elf_read_dt_needed
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection  # auditwheel's reader needs one (a static program has none)
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_type"] not in ("ET_EXEC", "ET_DYN") or elf["e_machine"] != HOST_MACHINE:
                return None
            dynamic = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
            versions = tuple(elf_find_versioned_symbols(elf))
        return Elf(rel, tuple(elf_read_dt_needed(path)) if dynamic is not None else (), versions)
    except (ELFError, OSError, ValueError) as exc:
        return Elf(rel, error=str(exc) or type(exc).__name__)


def read_package(path: Path, scratch: Path) -> Package:
    """Unpack one package (builders/io/archives.py) and read its ELF files."""
    into = Path(tempfile.mkdtemp(dir=scratch))
    try:
        archives.unpack(path, into)
    except archives.ArchiveError as exc:
        raise BadInput(f"{path}: {str(exc).splitlines()[0]}") from None
    pkg = Package(path.name)
    for dirpath, dirs, files in os.walk(into):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = full.relative_to(into).as_posix()
            if rel.startswith("info/"):
                continue
            pkg.names.add(name)
            if full.is_symlink() or not full.is_file():
                continue
            with open(full, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            got = read_elf(full, rel)
            if got is None:
                pkg.skipped += 1
            else:
                pkg.elves.append(got)
    pkg.elves.sort(key=lambda e: e.rel)
    return pkg


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="floor_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("channels", nargs="+", metavar="CHANNEL_DIR", help="a conda channel directory (<subdir>/repodata.json)")
    ap.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    a = ap.parse_args(argv)
    try:
        files = [p for c in a.channels for p in channel_packages(c)]
        if not files:
            raise BadInput(f"{' '.join(a.channels)}: no .conda or .tar.bz2 package in the channel(s)")
        the_floor, problems = floor.load(ROOT)
        if the_floor is None:
            raise BadInput(f"floor.yaml: {problems[0]}")
        allowed, whitelist = floor.policy_data(the_floor.policy)
        libraries = (set(whitelist) | set(the_floor.base) | {floor.INTERPRETER}
                     | {lib.soname for libs in the_floor.sets.values() for lib in libs})
        with tempfile.TemporaryDirectory(prefix="floor-check-") as scratch:
            packages = [read_package(p, Path(scratch)) for p in files]
    except BadInput as exc:
        print(f"floor_check: {exc}", file=sys.stderr)
        return 2
    shipped = {n for p in packages for n in p.names}
    bad = {p.name: [v for e in p.elves for v in violations(e, allowed, libraries, shipped)] for p in packages}
    if a.json:
        versions = {p.name: {v for e in p.elves for _, v in e.versions} for p in packages}
        print(json.dumps({"policy": the_floor.policy, "packages": [
            {"package": p.name, "elf": len(p.elves), "skipped": p.skipped,
             "highest": {f: highest(versions[p.name], f) for f in FAMILIES}, "violations": bad[p.name]}
            for p in packages]}, indent=1))
    else:
        for p in packages:
            print(package_line(p))
            for line in bad[p.name]:
                print(f"  VIOLATION {p.name}: {line}")
        n = sum(map(len, bad.values()))
        print(f"{len(packages)} package(s), {sum(len(p.elves) for p in packages)} ELF file(s) against {the_floor.policy}"
              f" and floor.yaml's host libraries: {n} violation(s)")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
