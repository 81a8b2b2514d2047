"""linkstub: a link-time stand-in for a shared library, carrying its SONAME and the symbols of the version nodes a
floor allows, so a link against it binds only versions at or below the floor (the way zig links against glibc stubs
of the target's version).

Why a stand-in and not the real library: a symbol's default version is what a link binds, and a newer library can move
an old symbol's default. Debian 12's libstdc++.so.6 (gcc 12) exports `std::condition_variable::wait` as
`@@GLIBCXX_3.4.30` beside the old `@GLIBCXX_3.4.11`, so code compiled with gcc 11's headers (which know only 3.4.11)
still binds 3.4.30 when linked against it: llama-server then needs GLIBCXX_3.4.30 for nothing it uses. The stand-in
drops every version above the floor and makes the highest remaining version of such a symbol its default, which is
what gcc 11's own library exported. A symbol that exists only above the floor is absent: an executable that needs it
fails to link, naming it.

The stand-in is never shipped and never loaded: each function is a `ret`, each object zeroes of its real size and
alignment (an executable's copy relocation takes both from the library it links against), each TLS object likewise.
`read` takes the symbols from the real library with pyelftools; `capped`, `assembly` and `version_script` are pure;
`build` assembles the text with the host's C compiler (as toolchain.driver_stub builds the CUDA driver stub).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import FetchError

KINDS = ("func", "object", "tls")
MAX_ALIGN = 64  # bytes: the most an object's alignment is taken from its address
LOCAL = "__onebit_stub_"  # the aliases versioned symbols are defined through (kept out of the stand-in's exports)


@dataclass(frozen=True)
class Symbol:
    """One dynamic symbol a library defines, as a link sees it."""

    name: str
    version: str | None  # the version node (GLIBCXX_3.4.11), None for an unversioned symbol
    default: bool  # `@@` (what a new link binds) rather than a hidden `@`
    kind: str = "func"  # func | object | tls
    weak: bool = False
    size: int = 0
    align: int = 1


def version_key(version: str) -> tuple[str, tuple[int, ...]] | None:
    """Pure: (family, numbers) of a numbered version node (GLIBCXX_3.4.29 -> ("GLIBCXX", (3, 4, 29))), None for a
    named one (CXXABI_TM_1, CXXABI_FLOAT128, GLIBC_PRIVATE)."""
    m = re.fullmatch(r"([A-Z][A-Z0-9]*?)_(\d+(?:\.\d+)*)", version)
    return (m.group(1), tuple(int(x) for x in m.group(2).split("."))) if m else None


def allowed(version: str | None, caps: Mapping[str, str]) -> bool:
    """Pure: whether a version node is at or below the floor (`caps`: family -> highest version, e.g. GLIBCXX ->
    3.4.29). Unversioned symbols, named nodes and families the floor does not name are allowed."""
    if version is None:
        return True
    key = version_key(version)
    if key is None or key[0] not in caps:
        return True
    return key[1] <= tuple(int(x) for x in caps[key[0]].split("."))


def capped(symbols: Sequence[Symbol], caps: Mapping[str, str]) -> list[Symbol]:
    """Pure: the symbols a link against the floor may bind. Versions above the floor are dropped; a symbol whose
    default was dropped gets its highest remaining numbered version as default (the library of the floor's era
    exported it so); one that only ever had hidden versions keeps them hidden."""
    had_default = {s.name for s in symbols if s.default}
    out: list[Symbol] = []
    by_name: dict[str, list[Symbol]] = {}
    for s in symbols:
        if allowed(s.version, caps):
            by_name.setdefault(s.name, []).append(s)
    for name in sorted(by_name):
        entries = by_name[name]
        if name in had_default and not any(s.default for s in entries):  # its default was above the floor
            numbered = [s for s in entries if s.version and version_key(s.version)]
            if numbered:
                best = max(numbered, key=lambda s: version_key(s.version))
                entries = [replace(s, default=s is best) for s in entries]
        out += entries
    return out


def assembly(symbols: Sequence[Symbol]) -> str:
    """Pure: GNU assembler text defining every symbol, each through a local name bound to its version with .symver."""
    lines = ['.section .note.GNU-stack,"",@progbits']
    for n, s in enumerate(symbols):
        label = s.name if s.version is None else f"{LOCAL}{n}"  # a versioned symbol is defined through an alias
        if s.kind == "func":
            lines += [".text", f".globl {label}", f".type {label},@function", f"{label}:", "  ret", f".size {label},1"]
        elif s.kind in ("object", "tls"):
            section = ".data" if s.kind == "object" else '.section .tbss,"awT",@nobits'
            lines += [section, f".balign {max(1, s.align)}", f".globl {label}",
                      f".type {label},{'@object' if s.kind == 'object' else '@tls_object'}", f"{label}:",
                      f"  .zero {max(1, s.size)}", f".size {label},{s.size}"]
        else:
            raise ValueError(f"{s.name}: unknown kind {s.kind!r}")
        if s.weak:
            lines.append(f".weak {label}")
        if s.version is not None:
            lines.append(f".symver {label},{s.name}{'@@' if s.default else '@'}{s.version}")
    return "\n".join(lines) + "\n"


def version_script(symbols: Sequence[Symbol]) -> str:
    """Pure: the linker version script declaring every node the symbols use (in version order within a family), the
    aliases hidden; unversioned symbols stay exported unversioned, as in the real library."""
    def order(v: str) -> tuple:
        key = version_key(v)
        return (key[0], key[1], v) if key else (v, (), v)

    nodes = sorted({s.version for s in symbols if s.version}, key=order)
    return "".join(f"{v} {{ }};\n" for v in nodes) + f"ONEBIT_STUB_LOCAL {{ local: {LOCAL}*; }};\n"


# ---- reading and building --------------------------------------------------------------------------------------------
def read(path: Path) -> tuple[str, list[Symbol]]:
    """(SONAME, defined dynamic symbols) of a real shared library, read with pyelftools."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynamic = elf.get_section_by_name(".dynamic")
            soname = next((t.soname for t in dynamic.iter_tags() if t.entry.d_tag == "DT_SONAME"), None) if dynamic else None
            dynsym = elf.get_section_by_name(".dynsym")
            versym = elf.get_section_by_name(".gnu.version")
            verdef = elf.get_section_by_name(".gnu.version_d")
            names = {vd["vd_ndx"]: next(aux).name for vd, aux in verdef.iter_versions()} if verdef else {}
            nodes = set(names.values())
            out = []
            for i, sym in enumerate(dynsym.iter_symbols() if dynsym else ()):
                if not sym.name or sym["st_shndx"] == "SHN_UNDEF" or (sym["st_shndx"] == "SHN_ABS" and sym.name in nodes):
                    continue  # undefined, or a version node's own absolute symbol (the linker makes those)
                kind = {"STT_FUNC": "func", "STT_GNU_IFUNC": "func", "STT_OBJECT": "object", "STT_TLS": "tls",
                        "STT_COMMON": "object"}.get(sym["st_info"]["type"])
                if kind is None:  # section and file symbols
                    continue
                ndx = versym.get_symbol(i)["ndx"] if versym else "VER_NDX_GLOBAL"
                if ndx == "VER_NDX_LOCAL":
                    continue
                version, default = (None, True) if ndx == "VER_NDX_GLOBAL" else (names.get(ndx & 0x7FFF), not ndx & 0x8000)
                value = sym["st_value"]
                align = min(value & -value, MAX_ALIGN) if value else MAX_ALIGN
                out.append(Symbol(sym.name, version, default, kind, sym["st_info"]["bind"] == "STB_WEAK",
                                  sym["st_size"], align))
    except (OSError, ELFError, AttributeError) as exc:
        raise FetchError(f"cannot read the symbols of {path}: {exc}") from None
    if not soname:
        raise FetchError(f"{path} has no SONAME; it is not a shared library a link stand-in can replace")
    return soname, out


def _compiler(given: str | None, what: str, *, tool: str = "cc") -> str:
    """The host's C compiler (or another tool of its toolchain, `tool`) that assembles `what`: `given`, else found on
    PATH; FetchError in one line when there is none."""
    found = given or shutil.which(tool) or (shutil.which("gcc") if tool == "cc" else None)
    if found is None:
        raise FetchError(f"{what} needs a C compiler's {tool}; none is on PATH",
                         hint="install the C toolchain (gcc, binutils) the compiled recipes need anyway")
    return found


def build(library: Path, out: Path, caps: Mapping[str, str], *, cc: str | None = None) -> Path:
    """Write the stand-in of `library` (capped at `caps`) to `out`, a shared object with the library's SONAME."""
    soname, symbols = read(library)
    symbols = capped(symbols, caps)
    cc = _compiler(cc, f"the link stand-in of {library.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onebit-linkstub-") as tmp:
        src, script = Path(tmp) / "stub.s", Path(tmp) / "stub.map"
        src.write_text(assembly(symbols))
        script.write_text(version_script(symbols))
        proc = subprocess.run([cc, "-shared", "-nostdlib", f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}",
                               "-Wl,-z,noexecstack", "-o", str(out), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"assembling the link stand-in of {library.name} failed: {proc.stderr.strip()[-400:]}")
    return out


def archive(source: str, out: Path, *, cc: str | None = None) -> Path:
    """Write `out`, a static archive of one object compiled from the C text `source` with the host's C compiler
    (position-independent, so shared libraries link it too)."""
    cc, ar = _compiler(cc, out.name), _compiler(None, out.name, tool="ar")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onebit-linkstub-") as tmp:
        src, obj = Path(tmp) / f"{out.stem}.c", Path(tmp) / f"{out.stem}.o"
        src.write_text(source)
        proc = subprocess.run([cc, "-c", "-O2", "-fPIC", "-o", str(obj), str(src)], capture_output=True, text=True)
        if proc.returncode == 0:
            proc = subprocess.run([ar, "rcsD", str(out), str(obj)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"building {out.name} failed: {proc.stderr.strip()[-400:]}")
    return out
