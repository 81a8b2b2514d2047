"""Stand-ins for the user's ROCm: stub shared libraries with the real SONAMEs, version nodes and exported symbols.

The bundle's ROCm programs (ds4-server of ds4-rocm) link the host's ROCm 7 runtime by SONAME (docs/strix.md). Where
no AMD GPU and no ROCm exist (these build machines, a clean Debian root of `nox -s fresh`), a program can only be
shown to start against a stand-in, and this is the one place one is allowed: it is the user's ROCm, not ours.

Each stub is generated from the real library of the pinned build root (roots/strix-sid.yaml; tests/strix_root.py
assembles it): its SONAME, its DT_NEEDED (kept only for the libraries stubbed here and the C/C++ runtime every host
has, so a stub set is closed), its version definitions (a linker version script with the same nodes and parents) and
its exported dynamic symbols, each with the version it carries in the real library (`.symver` where a name has more
than one, or a hidden one). Functions return an error: every HIP call answers hipErrorNoDevice (100) and
hipGetDeviceCount sets its count to 0, so a program starts and says there is no GPU; the other libraries' calls
return 1 (their status enums' first error; HSA's is 0x1000). Objects are zeroed storage of the real size.

    python scripts/rocm_stubs.py OUT                  # the ROCm 7 set, from the strix-sid root (assembled if needed)
    python scripts/rocm_stubs.py OUT --root ROOT --soname libamdhip64.so.7 --soname libhipblas.so.3

OUT gets one file per SONAME (named by it) and stubs.json (what each came from, what it exports, which NEEDED
entries of the real library it leaves to the host). OUT is built aside and swapped into place.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerSymSection

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from builders.io.swap import aside, replace_dir  # noqa: E402

# The ROCm 7 runtime as Debian's libamdhip64-7, libhipblas3 and librocblas5 bring it (their dependencies librocsolver0,
# libhsa-runtime64-1 and libroctx64-4 included): what the strix bundle's ROCm programs need, directly or not.
ROCM7 = ("libamdhip64.so.7", "libhipblas.so.3", "librocblas.so.5", "librocsolver.so.0", "libhsa-runtime64.so.1",
         "libroctx64.so.4")
# NEEDED entries a stub keeps although it does not stub them: the C and C++ runtime every glibc host has
BASE = frozenset({"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1", "libdl.so.2",
                  "libpthread.so.0", "librt.so.1"})
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib64", "lib64", "usr/lib", "lib")
# what a stub function returns, by library (the stem of its SONAME); 1 for the others
ERRORS = {"libamdhip64.so": 100, "libhsa-runtime64.so": 0x1000}  # hipErrorNoDevice, HSA_STATUS_ERROR
# functions whose stub must do more than return the error, by name: (parameters, body)
SPECIAL = {
    "hipGetDeviceCount": ("int *count", "if (count) *count = 0; return 100;"),
    "hipGetErrorString": ("int error", 'return "no ROCm device (a stand-in HIP runtime)";'),
    "hipGetErrorName": ("int error", 'return "hipErrorNoDevice";'),
}
# linker-made names every shared object defines itself
LINKER_NAMES = frozenset({"_init", "_fini", "_edata", "_end", "__bss_start"})


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: str  # "func", "object" or "tls"
    weak: bool
    size: int
    version: str | None  # the version node it is defined in; None: unversioned (the library defines no versions)
    default: bool = True  # name@@version (False: a hidden name@version, kept for old programs only)


@dataclass(frozen=True)
class Library:
    soname: str
    needed: tuple[str, ...]
    versions: tuple[tuple[str, str | None], ...]  # version definitions in order: (name, parent or None)
    symbols: tuple[Symbol, ...]


class StubError(RuntimeError):
    """A library this generator cannot stand in for."""


# --- reading the real library ------------------------------------------------------------------------------------


def read_library(path: Path) -> Library:
    """The SONAME, NEEDED, version definitions and exported dynamic symbols of a real shared library."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dyn = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
        if dyn is None:
            raise StubError(f"{path}: no dynamic section")
        soname = next((t.soname for t in dyn.iter_tags() if t.entry.d_tag == "DT_SONAME"), None)
        if soname is None:
            raise StubError(f"{path}: no SONAME")
        needed = tuple(t.needed for t in dyn.iter_tags() if t.entry.d_tag == "DT_NEEDED")
        verdef = next((s for s in elf.iter_sections() if isinstance(s, GNUVerDefSection)), None)
        names: dict[int, str] = {}
        versions: list[tuple[str, str | None]] = []
        if verdef is not None:
            for vd, auxs in verdef.iter_versions():
                aux = list(auxs)
                names[vd["vd_ndx"]] = aux[0].name
                if not vd["vd_flags"] & 1:  # VER_FLG_BASE: the file's own name, not a node
                    versions.append((aux[0].name, aux[1].name if len(aux) > 1 else None))
        versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
        dynsym = elf.get_section_by_name(".dynsym")
        symbols = []
        for i, sym in enumerate(dynsym.iter_symbols()):
            bind, typ = sym["st_info"]["bind"], sym["st_info"]["type"]
            if sym["st_shndx"] == "SHN_UNDEF" or bind not in ("STB_GLOBAL", "STB_WEAK") or sym.name in LINKER_NAMES:
                continue
            if sym["st_shndx"] == "SHN_ABS" and sym.name in names.values():
                continue  # the symbol ld makes for each version node; the version script makes it again
            kind = {"STT_FUNC": "func", "STT_GNU_IFUNC": "func", "STT_OBJECT": "object", "STT_TLS": "tls"}.get(typ)
            if kind is None:
                continue
            version, default = None, True
            if versym is not None and names:
                entry = versym.get_symbol(i).entry
                raw = entry["ndx"]
                ndx = raw if isinstance(raw, int) else {"VER_NDX_LOCAL": 0, "VER_NDX_GLOBAL": 1}[raw]
                default = not ndx & 0x8000
                ndx &= 0x7FFF
                if ndx > 1:
                    version = names[ndx]
                elif ndx == 1:
                    raise StubError(f"{path}: {sym.name} is exported unversioned beside version nodes; "
                                    "a version script cannot say that")
            symbols.append(Symbol(sym.name, kind, bind == "STB_WEAK", sym["st_size"], version, default))
    return Library(soname, needed, tuple(versions), tuple(sorted(symbols, key=lambda s: (s.name, s.version or ""))))


# --- writing the stub (pure) -------------------------------------------------------------------------------------


def _stem(soname: str) -> str:
    m = re.match(r"^(.+?\.so)(\.\d+)*$", soname)
    return m.group(1) if m else soname


def version_script(lib: Library) -> str:
    """The linker version script: every node of the real library with its parent, each listing the names defined
    in it; `local: *` in the first node keeps the stubs' own internal names out of the dynamic table."""
    if not lib.versions:
        names = sorted({s.name for s in lib.symbols})
        return "{\n  global:\n" + "".join(f"    {_quote(n)};\n" for n in names) + "  local: *;\n};\n"
    out = []
    for i, (node, parent) in enumerate(lib.versions):
        names = sorted({s.name for s in lib.symbols if s.version == node})
        body = "".join(f"    {_quote(n)};\n" for n in names)
        local = "  local: *;\n" if i == 0 else ""
        out.append(f"{node} {{\n" + ("  global:\n" + body if body else "") + local + f"}}{' ' + parent if parent else ''};\n")
    return "".join(out)


def _quote(name: str) -> str:
    return f'"{name}"' if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name) else name


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def c_source(lib: Library) -> str:
    """The C file defining every exported symbol. Each is defined under an internal name and given its real name
    by the assembler: `.symver internal, name@@node` (or @node for a hidden one) where the library has versions,
    else an asm label with the real name (any name the linker takes, C++ ones included)."""
    error = ERRORS.get(_stem(lib.soname), 1)
    versioned = bool(lib.versions)
    lines = [f"/* stand-in for {lib.soname}: generated by scripts/rocm_stubs.py from the real library */", ""]
    for i, s in enumerate(lib.symbols):
        internal = f"onebit_stub_{i}"
        label = "" if versioned else f" __asm__({_c_string(s.name)})"
        attrs = '__attribute__((visibility("default")' + ("))" if not s.weak else ", weak))")
        if s.kind == "func":
            params, body = SPECIAL.get(s.name, ("void", f"return {error};"))
            ret = "const char *" if body.startswith("return \"") else "long "
            lines.append(f"{attrs} {ret}{internal}({params}){label};")
            lines.append(f"{ret}{internal}({params}) {{ {body} }}")
        else:
            size = max(s.size, 1)
            tls = "__thread " if s.kind == "tls" else ""
            lines.append(f"{attrs} {tls}char {internal}[{size}]{label} __attribute__((aligned(16)));")
            lines.append(f"{tls}char {internal}[{size}] __attribute__((aligned(16)));")
        if versioned:
            at = "@@" if s.default else "@"
            lines.append(f'__asm__(".symver {internal}, {s.name}{at}{s.version}");')
    return "\n".join(lines) + "\n"


def kept_needed(lib: Library, stubbed: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the NEEDED entries the stub keeps, those it leaves out): kept are the libraries stubbed too and BASE."""
    stubbed = set(stubbed)
    keep = tuple(n for n in lib.needed if n in stubbed or n in BASE)
    return keep, tuple(n for n in lib.needed if n not in keep)


# --- building --------------------------------------------------------------------------------------------------------


def build_stub(lib: Library, keep: Sequence[str], out: Path, work: Path, cc: str = "cc") -> Path:
    """Compile one stub into out/<SONAME>: -shared, its SONAME, its version script, its NEEDED (each stub it needs
    is already in `out`)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", lib.soname)
    src, script = work / f"{stem}.c", work / f"{stem}.map"
    src.write_text(c_source(lib))
    script.write_text(version_script(lib))
    target = out / lib.soname
    needed = [f"-l:{n}" for n in keep]  # in the real library's order
    argv = [cc, "-shared", "-fPIC", "-O0", "-w", "-o", str(target), str(src), f"-Wl,-soname,{lib.soname}",
            f"-Wl,--version-script,{script}", f"-L{out}", "-Wl,--no-as-needed", *needed]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        said = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise StubError(f"{lib.soname}: {cc} failed: {said}")
    return target


def find_in_root(root: Path, soname: str) -> Path:
    for d in LIB_DIRS:
        p = root / d / soname
        if p.exists():
            return p
    raise StubError(f"{soname} is not in {root} ({', '.join(LIB_DIRS)})")


def _order(libs: dict[str, Library]) -> list[str]:
    """SONAMEs so that a stub comes after every stub it needs (a cycle keeps the given order)."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done or name in path:
            return
        for n in libs[name].needed:
            if n in libs:
                visit(n, (*path, name))
        done.append(name)

    for name in libs:
        visit(name, ())
    return done


def generate(root: Path, out: Path, sonames: Sequence[str] = ROCM7, cc: str = "cc") -> dict:
    """Stubs for `sonames`, read from the real libraries under `root`, into `out` (built aside, swapped in)."""
    libs = {s: read_library(find_in_root(root, s)) for s in sonames}
    for s, lib in libs.items():
        if lib.soname != s:
            raise StubError(f"{find_in_root(root, s)} has SONAME {lib.soname}, not {s}")
    new = aside(out)
    about = root / "onebit-root.json"  # what tests/strix_root.py assembled: the root's name and content address
    pinned = json.loads(about.read_text()) if about.is_file() else {}
    record: dict = {"root": {k: pinned.get(k) for k in ("name", "key", "glibc")}, "libraries": {}}
    try:
        with tempfile.TemporaryDirectory() as work:
            for s in _order(libs):
                lib = libs[s]
                keep, left = kept_needed(lib, libs)
                build_stub(lib, keep, new, Path(work), cc)
                record["libraries"][s] = {
                    "from": str(find_in_root(root, s).relative_to(root)),
                    "needed": list(keep), "left_to_the_host": list(left),
                    "versions": [list(v) for v in lib.versions],
                    "symbols": len(lib.symbols),
                }
        (new / "stubs.json").write_text(json.dumps(record, indent=1) + "\n")
        os.chmod(new, 0o755)
        replace_dir(new, out)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Stub shared libraries standing in for the user's ROCm 7 runtime.")
    ap.add_argument("out", type=Path, help="directory to write the stubs into (replaced whole)")
    ap.add_argument("--root", type=Path, help="an assembled root holding the real libraries (default: strix-sid)")
    ap.add_argument("--soname", action="append", help=f"a SONAME to stub (repeatable; default: {' '.join(ROCM7)})")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"), help="the C compiler (default: $CC or cc)")
    args = ap.parse_args(argv)
    root = args.root
    if root is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from strix_root import strix_root

        root = strix_root().path
    try:
        record = generate(root, args.out, tuple(args.soname or ROCM7), args.cc)
    except (StubError, OSError) as e:
        print(f"rocm_stubs: {e}", file=sys.stderr)
        return 1
    for name, info in record["libraries"].items():
        left = f"; left to the host: {', '.join(info['left_to_the_host'])}" if info["left_to_the_host"] else ""
        print(f"{args.out / name}: {info['symbols']} symbols, {len(info['versions'])} version nodes{left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
