"""sysroot: the flags that make a compiler build against the pinned sysroot, so that what a variant ships needs no
more of the C and C++ runtimes than the floor allows, whichever host or build root compiles it (docs/portability.md).

The sysroot is a toolchain input of Debian 12 packages (`tool: sysroot`, `debs:`), assembled in the cache like the
Vulkan SDK: every package unpacked under <root>/debian/ (glibc 2.36's headers, crt files and link libraries, gcc 11's
libstdc++ headers and its libgcc/crtbegin files), plus <root>/floor/, the link stand-ins of libstdc++.so.6 and
libgcc_s.so.1 capped at the floor (builders/roots/linkstub.py; `floor_standins` builds them at assembly). The compiler stays
the host's, the build root's or the pinned one; only its view of the C library and the C++ runtime changes.

What each family needs, as measured (gcc 12 on Debian 12, gcc 14 and clang 19 on Debian 13, nvcc 13.0, hipcc 7.2.4 /
clang 22 in the strix-sid root):
- gcc, g++: `--sysroot` alone is not enough. Debian's gcc searches its own `../../../x86_64-linux-gnu` (the host's or
  the root's multiarch directory) BEFORE the sysroot's for crt files and libraries: with `--sysroot` alone Scrt1.o,
  libc.so and libm.so still came from the host. `-B<sysroot>/usr/lib/x86_64-linux-gnu/` and explicit `-L`s put the
  sysroot's first. g++ reads C++ headers from the compiler's own /usr/include/c++/<its version>, never the sysroot's:
  `-nostdinc++` and the sysroot's c++/<N> directories as `-isystem`.
- clang, clang++, hipcc: `--sysroot` and `--gcc-toolchain=<sysroot>/usr`: clang then takes the GCC installation of
  the sysroot (its only one: gcc 11) for C++ headers, crtbegin and libgcc, and keeps its own wrapper headers
  (cuda_wrappers, the HIP math overloads) in front of libstdc++'s, which an `-isystem` would not. The explicit `-L`s
  put the stand-ins and the sysroot's libraries before any a wrapper adds. hipcc links libraries of the build root
  it does not ship (the user's ROCm): `HostLibs`, a folder holding only their SONAME links, never the root's
  multiarch directory itself (its libc.so would win over the sysroot's).
- nvcc: the g++ flags, compile ones through `-Xcompiler=` (nvcc passes them to every host-compiler step, the final
  link included), `-isystem` and `-L` as nvcc's own options.
- zig: no sysroot: zig links against its own glibc stubs of the version the target names (`glibc_target`).
- rustc-linker: the gcc link flags as `-Clink-arg=` (cargo links with `cc`); C compiled by build scripts takes the
  gcc family's compile flags through CFLAGS.

Pure: `flags`, `cmake_toolchain`, `make_variables`, `glibc_target`, `compiler_family`. `floor_standins` writes files.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MULTIARCH = "x86_64-linux-gnu"
TREE = "debian"  # where the assembled root holds the unpacked packages (toolchain.DEB_TREE): the sysroot itself
FLOOR_DIR = "floor"  # the link stand-ins, in the assembled root
FAMILIES = ("gcc", "g++", "clang", "clang++", "hipcc", "nvcc", "zig", "rustc-linker")
CMAKE_LANGUAGES = ("C", "CXX", "CUDA", "HIP")


# The floor itself (the policy, its glibc and the highest version of each family) is floor.yaml's (builders/project/floor.py):
# the functions here take its values, never a copy of them.
DEFAULT_GLIBC = "2.34"
# gcc 11's libstdc++ headers name helper templates after what newer front ends parse as built-in traits (g++ 13 on
# Ubuntu 24.04 and nvcc's EDG front end refuse `struct __is_convertible`, found on the H200): the sysroot's headers see
# them under other names, consistently, so every compiler reads the floor's headers
TRAITS = tuple(f"-D{n}=__onebit{n}" for n in ("__is_nothrow_convertible", "__is_convertible", "__remove_cv",
                                                "__remove_reference", "__remove_cvref"))


# the link stand-ins of the assembled root: (library in the sysroot, stand-in file in floor/, version families capped)
STANDINS = ((f"usr/lib/{MULTIARCH}/libstdc++.so.6", "libstdc++.so", ("GLIBCXX", "CXXABI")),
            (f"lib/{MULTIARCH}/libgcc_s.so.1", "libgcc_s.so", ("GCC",)))
# What a newer g++ emits calls to but the floor's libstdc++ lacks, linked statically and hidden into each ELF that
# needs it (as Red Hat's devtoolset links libstdc++_nonshared.a): g++ 14 calls __cxa_call_terminate (CXXABI_1.3.15)
# where an exception leaves a noexcept function; the floor's runtime does what gcc 14's does, with what gcc 11 has.
# floor/libstdc++.so is then a link script naming this archive before the stand-in (found on the -L path).
NONSHARED = ("libstdc++_floor_nonshared.a", """\
extern void *__cxa_begin_catch(void *);
extern void _ZSt9terminatev(void) __attribute__((noreturn)); /* std::terminate() */
__attribute__((visibility("hidden"), noreturn)) void __cxa_call_terminate(void *exception) {
  if (exception) __cxa_begin_catch(exception);
  _ZSt9terminatev();
}
""")
STDCXX_STANDIN = "libstdc++_floor.so"  # the libstdc++ stand-in itself, behind floor/libstdc++.so's link script


@dataclass(frozen=True)
class Sysroot:
    """An assembled sysroot input: `root` is the toolchain root ({tool:sysroot:root}); `cxx` the version of the
    libstdc++ headers it carries (usr/include/c++/<cxx>, gcc 11's)."""

    root: str
    cxx: str = "11"

    @property
    def path(self) -> str:
        """What `--sysroot` names."""
        return str(PurePosixPath(self.root) / TREE)

    @property
    def floor(self) -> str:
        return str(PurePosixPath(self.root) / FLOOR_DIR)

    @property
    def gcc_toolchain(self) -> str:
        """clang's --gcc-toolchain: the prefix holding lib/gcc/<triple>/<cxx>/ (crtbegin.o, libgcc) and
        include/c++/<cxx>/."""
        return f"{self.path}/usr"

    def cxx_includes(self) -> tuple[str, ...]:
        """The libstdc++ header directories, in the order g++ itself would search its own."""
        base = f"{self.path}/usr/include"
        return (f"{base}/c++/{self.cxx}", f"{base}/{MULTIARCH}/c++/{self.cxx}", f"{base}/c++/{self.cxx}/backward")

    def lib_dirs(self) -> tuple[str, ...]:
        """The link search path, first of all: the stand-ins, then the sysroot's multiarch directories."""
        return (self.floor, f"{self.path}/usr/lib/{MULTIARCH}", f"{self.path}/lib/{MULTIARCH}")


@dataclass(frozen=True)
class HostLibs:
    """Libraries a variant links against and does not ship, which the user's system provides (ROCm's libamdhip64.so.7,
    libhipblas.so.3): `links` is a folder holding only their link names (libhipblas.so -> the root's real file), and
    `rpath_link` where their own dependencies are found (the root's multiarch directory). Their own needs are the
    host's business: the link allows what they leave undefined against the sysroot's older glibc."""

    links: str
    rpath_link: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flags:
    """A compiler family's flags: `compile` for every compile, `link` for every link (a command that does both, as a
    Makefile's `$(CC) -o prog a.c` does, takes `both`)."""

    compile: tuple[str, ...] = ()
    link: tuple[str, ...] = ()

    @property
    def both(self) -> tuple[str, ...]:
        return self.compile + tuple(a for a in self.link if a not in self.compile)


def glibc_target(glibc: str = DEFAULT_GLIBC, arch: str = "x86_64") -> str:
    """Pure: zig's target that links against glibc of the floor's version (`zig build -Dtarget=...`)."""
    return f"{arch}-linux-gnu.{glibc}"


def _isystem(dirs: Sequence[str]) -> tuple[str, ...]:
    return tuple(a for d in dirs for a in ("-isystem", d))


def _gcc_link(sr: Sysroot) -> tuple[str, ...]:
    return (f"--sysroot={sr.path}", f"-B{sr.path}/usr/lib/{MULTIARCH}/", *[f"-L{d}" for d in sr.lib_dirs()])


def flags(family: str, sr: Sysroot, *, host_libs: HostLibs | None = None, glibc: str = DEFAULT_GLIBC) -> Flags:
    """Pure: the flags of one compiler family (FAMILIES) for building against `sr`. `host_libs`: libraries of the
    build root the link takes by SONAME and does not ship (clang, clang++, hipcc, gcc, g++)."""
    sysroot = f"--sysroot={sr.path}"
    extra_link: tuple[str, ...] = ()
    if host_libs is not None:
        extra_link = (f"-L{host_libs.links}", *[f"-Wl,-rpath-link,{d}" for d in host_libs.rpath_link],
                      "-Wl,--allow-shlib-undefined")
    if family == "gcc":
        return Flags((sysroot,), _gcc_link(sr) + extra_link)
    if family == "g++":
        return Flags((sysroot, "-nostdinc++", *TRAITS, *_isystem(sr.cxx_includes())), _gcc_link(sr) + extra_link)
    if family in ("clang", "clang++", "hipcc"):
        toolchain = f"--gcc-toolchain={sr.gcc_toolchain}"
        return Flags((sysroot, toolchain), (sysroot, toolchain, *[f"-L{d}" for d in sr.lib_dirs()]) + extra_link)
    if family == "nvcc":
        if host_libs is not None:
            raise ValueError("nvcc: host libraries are linked by the host compiler's flags (family g++)")
        compile_ = (f"-Xcompiler={sysroot}", "-Xcompiler=-nostdinc++", *TRAITS, *_isystem(sr.cxx_includes()))
        link = (f"-Xcompiler={sysroot}", f"-Xcompiler=-B{sr.path}/usr/lib/{MULTIARCH}/", *[f"-L{d}" for d in sr.lib_dirs()])
        return Flags(compile_, link)
    if family == "zig":
        return Flags((f"-Dtarget={glibc_target(glibc)}",), ())
    if family == "rustc-linker":
        return Flags((), tuple(f"-Clink-arg={a}" for a in _gcc_link(sr) + extra_link))
    raise ValueError(f"unknown compiler family {family!r} (one of {', '.join(FAMILIES)})")


def compiler_family(command: str) -> str | None:
    """Pure: the family of a compiler command (`cc`, `/usr/bin/g++-16`, `ccache clang++-22`, `hipcc`), by the name of
    its program; `cc` and `c++` are gcc's, as Debian's alternatives default them. None for anything else."""
    words = [w for w in shlex.split(command) if not w.startswith("-")]
    words = [w for w in words if PurePosixPath(w).name not in ("ccache", "sccache", "env")]
    if not words:
        return None
    name = PurePosixPath(words[0]).name
    base = name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].replace(".", "").isdigit() else name  # g++-16, clang-22
    base = base.rsplit("-", 1)[-1] if base.count("-") else base  # x86_64-linux-gnu-gcc
    return {"cc": "gcc", "gcc": "gcc", "c++": "g++", "g++": "g++", "clang": "clang", "clang++": "clang++",
            "amdclang": "clang", "amdclang++": "clang++", "hipcc": "hipcc", "nvcc": "nvcc", "zig": "zig"}.get(base)


def cmake_families(options: Mapping[str, object], env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the compiler family of each language a CMake build compiles (cmake_toolchain's `families`): C and C++
    always (the recipe's CMAKE_<LANG>_COMPILER, else CC/CXX of its environment, else cc and c++); CUDA and HIP where
    the recipe sets their CMake variables (CMAKE_CUDA_*: nvcc; CMAKE_HIP_*: its compiler, clang++ by default)."""
    out = {"C": compiler_family(str(options.get("CMAKE_C_COMPILER") or env.get("CC") or "cc")) or "gcc",
           "CXX": compiler_family(str(options.get("CMAKE_CXX_COMPILER") or env.get("CXX") or "c++")) or "g++"}
    if any(str(k).startswith("CMAKE_CUDA_") for k in options):
        out["CUDA"] = "nvcc"
    if any(str(k).startswith("CMAKE_HIP_") for k in options):
        out["HIP"] = compiler_family(str(options.get("CMAKE_HIP_COMPILER") or "clang++")) or "clang++"
    return out


def make_variables(variables: Mapping[str, str], sr: Sysroot, *, host_libs: HostLibs | None = None) -> dict[str, str]:
    """Pure: make command-line variables with the sysroot's flags after each compiler variable's command (CC, CXX,
    GPU_CC, NVCC, ...): a Makefile compiles and links with the same variable, so each takes both sets. `host_libs` go to
    the hipcc variable only (ds4's GPU_CC links the ROCm libraries; CC's programs link none). A variable whose command
    is no known compiler (ROCM_ARCH=gfx1151, programs=ds4 ...) is left as it is."""
    out = dict(variables)
    for k, v in variables.items():
        family = compiler_family(v)
        if family is None or family == "zig":
            continue
        hl = host_libs if family == "hipcc" else None  # the ROCm libraries: what hipcc links
        out[k] = " ".join([v, *map(shlex.quote, flags(family, sr, host_libs=hl).both)])
    return out


def _cmake_list(items: Sequence[str]) -> str:
    return " ".join(f'"{i}"' for i in items)


def _cmake_string(items: Sequence[str]) -> str:
    return '"' + " ".join(items).replace("\\", "\\\\").replace('"', '\\"') + '"'


def cmake_toolchain(sr: Sysroot, families: Mapping[str, str], *, host_libs: HostLibs | None = None) -> str:
    """Pure: a CMake toolchain file (`--toolchain FILE`) that builds against `sr`. `families` names the compiler
    family of each language the project enables (C: gcc, CXX: g++, CUDA: nvcc, HIP: clang++; a language not named
    gets nothing). CMAKE_SYSROOT gives --sysroot to the gcc and clang languages and roots find_library/find_path in
    the sysroot first; nvcc gets it through -Xcompiler. Link flags are the linking compiler's (CMake links C, C++
    and CUDA targets with the C or C++ compiler): those of CXX's family, else C's."""
    for lang, fam in families.items():
        if lang not in CMAKE_LANGUAGES or fam not in FAMILIES:
            raise ValueError(f"cmake_toolchain: {lang}={fam} (languages {', '.join(CMAKE_LANGUAGES)}; families "
                             f"{', '.join(FAMILIES)})")
    lines = ["# Generated by builders/roots/sysroot.py: build against the pinned sysroot (docs/portability.md).",
             f'set(CMAKE_SYSROOT "{sr.path}")']
    for lang in CMAKE_LANGUAGES:
        fam = families.get(lang)
        if fam is None:
            continue
        f = flags(fam, sr)
        if fam in ("g++", "nvcc"):
            # the libstdc++ headers as the toolchain's own system include directories (CMake adds them last, after
            # the project's, as -isystem); -nostdinc++ drops the compiler's own
            init = [a for a in f.compile if a.startswith(("-nostdinc", "-Xcompiler=-nostdinc")) or a in TRAITS]
            if fam == "nvcc":
                init = [f"-Xcompiler=--sysroot={sr.path}", *init]
            lines.append(f"set(CMAKE_{lang}_FLAGS_INIT {_cmake_string(init)})")
            lines.append(f"set(CMAKE_{lang}_STANDARD_INCLUDE_DIRECTORIES {_cmake_list(sr.cxx_includes())})")
        elif fam in ("clang", "clang++", "hipcc"):
            lines.append(f"set(CMAKE_{lang}_FLAGS_INIT {_cmake_string([a for a in f.compile if not a.startswith('--sysroot')])})")
    linker = families.get("CXX") or families.get("C")
    if linker is not None:
        hl = host_libs if linker in ("gcc", "g++", "clang", "clang++", "hipcc") else None
        link = flags(linker, sr, host_libs=hl).link
        for kind in ("EXE", "SHARED", "MODULE"):
            lines.append(f"set(CMAKE_{kind}_LINKER_FLAGS_INIT {_cmake_string(link)})")
    return "\n".join(lines) + "\n"


# ---- assembly: the link stand-ins -------------------------------------------------------------------------------------
def is_sysroot(tree: Path) -> bool:
    """Whether an unpacked package tree is a sysroot (it holds libc6-dev's link script and a libstdc++ -dev's headers),
    which the assembly gives link stand-ins."""
    return (tree / "usr" / "lib" / MULTIARCH / "libc.so").is_file() and any((tree / "usr" / "include" / "c++").glob("*"))


def floor_standins(tree: Path, dest: Path, caps: Mapping[str, str], *, cc: str | None = None) -> dict[str, str]:
    """Write the link stand-ins of STANDINS into dest (the root's floor/), each capped at the floor (`caps`: version
    family -> the highest version floor.yaml's policy allows, builders/project/floor.py `Floor.caps`). Returns stand-in name ->
    the real library it stands in for (relative to the tree)."""
    from . import linkstub

    out = {}
    for rel, name, families in STANDINS:
        real = tree / rel
        if not real.is_file():
            continue
        if name != "libstdc++.so":
            linkstub.build(real, dest / name, {f: caps[f] for f in families}, cc=cc)
        else:
            linkstub.build(real, dest / STDCXX_STANDIN, {f: caps[f] for f in families}, cc=cc)
            linkstub.archive(NONSHARED[1], dest / NONSHARED[0], cc=cc)
            (dest / name).write_text(f"/* onebit: the floor's libstdc++ (docs/portability.md) */\n"
                                     f"INPUT({NONSHARED[0]} {STDCXX_STANDIN})\n")
        out[name] = rel
    return out
