"""elf: facts read from ELF files with a real ELF reader (pyelftools): is it ELF, what it needs (DT_NEEDED), where it
looks (RPATH/RUNPATH), and which glibc symbol versions it requires (its GNU version-needs). Writing RPATHs is
patchelf's job (stage)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

ELF_MAGIC = b"\x7fELF"


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class ElfFacts:
    needed: tuple[str, ...] = ()  # DT_NEEDED
    rpath: tuple[str, ...] = ()  # DT_RUNPATH entries, else DT_RPATH entries
    version_needs: tuple[tuple[str, str], ...] = ()  # (library, version name), e.g. ("libc.so.6", "GLIBC_2.34")


def read(path: Path) -> ElfFacts:
    """The dynamic facts of one ELF file; empty for a static file (or one pyelftools cannot parse)."""
    needed: list[str] = []
    runpath: list[str] = []
    rpath: list[str] = []
    versions: list[tuple[str, str]] = []
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)
                        elif tag.entry.d_tag == "DT_RUNPATH":
                            runpath += [e for e in tag.runpath.split(":") if e]
                        elif tag.entry.d_tag == "DT_RPATH":
                            rpath += [e for e in tag.rpath.split(":") if e]
                elif isinstance(section, GNUVerNeedSection):
                    for verneed, auxs in section.iter_versions():
                        for aux in auxs:
                            versions.append((verneed.name, aux.name))
    except (ELFError, OSError, ValueError):
        return ElfFacts()
    return ElfFacts(needed=tuple(needed), rpath=tuple(runpath or rpath), version_needs=tuple(versions))


def glibc_version(facts: ElfFacts) -> tuple[int, ...]:
    """Pure: the highest GLIBC_x.y[.z] version this file needs (() when none)."""
    best: tuple[int, ...] = ()
    for _lib, name in facts.version_needs:
        if name.startswith("GLIBC_"):
            try:
                best = max(best, tuple(int(p) for p in name.removeprefix("GLIBC_").split(".")))
            except ValueError:  # GLIBC_PRIVATE
                continue
    return best


def glibc_needed(prefix: Path) -> str | None:
    """The highest GLIBC_x.y any ELF file below `prefix` needs (from its version-needs), or None."""
    best: tuple[int, ...] = ()
    for path in Path(prefix).rglob("*"):
        if path.is_file() and not path.is_symlink() and is_elf(path):
            best = max(best, glibc_version(read(path)))
    return ".".join(map(str, best)) if best else None
