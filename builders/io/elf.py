"""elf: facts read from ELF files with a real ELF reader (pyelftools): is it ELF, what it is (program or shared
object, relocatable object such as a kernel module, and for which machine), what it needs (DT_NEEDED), where it looks
(RPATH/RUNPATH), which symbol versions it requires (its GNU version-needs) and which symbol needs one, and a kernel
module's vermagic. Writing RPATHs is patchelf's job (stage); what the facts allow is builders/project/floor.py's."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
from elftools.elf.sections import SymbolTableSection

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
    type: str = ""  # e_type: ET_EXEC, ET_DYN (programs, libraries, extension modules), ET_REL (kernel modules)
    machine: str = ""  # e_machine: EM_X86_64 for host code; a GPU code object is EM_AMDGPU
    vermagic: str | None = None  # a kernel module's .modinfo vermagic (the kernel release it loads into)
    interpreter: bool = False  # a PT_INTERP segment: a dynamic program the loader starts (not a library or module)
    error: str | None = None  # why pyelftools could not read it (the facts above are then empty)


def _modinfo(elf: ELFFile) -> dict[str, str]:
    """A kernel module's .modinfo: NUL-separated key=value strings (the first value of each key)."""
    section = elf.get_section_by_name(".modinfo")
    out: dict[str, str] = {}
    for item in (section.data() if section is not None else b"").split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            out.setdefault(key, value)
    return out


def read(path: Path) -> ElfFacts:
    """The dynamic facts of one ELF file; empty for a static file, with `error` set for one pyelftools cannot parse."""
    needed: list[str] = []
    runpath: list[str] = []
    rpath: list[str] = []
    versions: list[tuple[str, str]] = []
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            kind, machine = elf["e_type"], elf["e_machine"]
            vermagic = _modinfo(elf).get("vermagic") if kind == "ET_REL" else None
            interpreter = any(seg["p_type"] == "PT_INTERP" for seg in elf.iter_segments())
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
    except (ELFError, OSError, ValueError) as exc:
        return ElfFacts(error=str(exc) or type(exc).__name__)
    return ElfFacts(needed=tuple(needed), rpath=tuple(runpath or rpath), version_needs=tuple(versions), type=kind,
                    machine=machine, vermagic=vermagic, interpreter=interpreter)


def symbols_needing(path: Path, wanted: set[str]) -> dict[str, str]:
    """For each symbol version in `wanted` (GLIBCXX_3.4.30), the first undefined dynamic symbol bound to it (its
    .gnu.version entry names the version-need): what the gate names in its message. Read only for a file that fails,
    since walking .dynsym of a large library is slow in pure Python."""
    out: dict[str, str] = {}
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            index: dict[int, str] = {}
            versym = dynsym = None
            for section in elf.iter_sections():
                if isinstance(section, GNUVerNeedSection):
                    for _verneed, auxs in section.iter_versions():
                        for aux in auxs:
                            if aux.name in wanted:
                                index[aux.entry["vna_other"] & 0x7FFF] = aux.name
                elif isinstance(section, GNUVerSymSection):
                    versym = section
                elif isinstance(section, SymbolTableSection) and section.name == ".dynsym":
                    dynsym = section
            if not index or versym is None or dynsym is None:
                return out
            for i, sym in enumerate(dynsym.iter_symbols()):
                ndx = versym.get_symbol(i)["ndx"]
                if sym["st_shndx"] == "SHN_UNDEF" and isinstance(ndx, int) and (ndx & 0x7FFF) in index:
                    out.setdefault(index[ndx & 0x7FFF], sym.name)
                    if len(out) == len(index):
                        break
    except (ELFError, OSError, ValueError):
        pass
    return out


def any_elf(prefix: Path) -> bool:
    """Does anything below `prefix` ship an ELF file (a package that does declares the floor's glibc)?"""
    return any(path.is_file() and not path.is_symlink() and is_elf(path) for path in Path(prefix).rglob("*"))
