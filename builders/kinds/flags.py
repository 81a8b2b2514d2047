"""The project's own compiler flags (path maps that keep build paths out of binaries), and where each build system
leaves room for them. Pure: the plan hands a kind its maps; the kind adds them without replacing upstream's flags.

- CMake reads CFLAGS/CXXFLAGS/HIPFLAGS/OBJCFLAGS/CUDAFLAGS from the environment to start CMAKE_<LANG>_FLAGS, and
  upstream's CMakeLists add to that; a recipe's own `CMAKE_<LANG>_FLAGS` option replaces that start, so the maps are
  appended to the option too.
- cargo reads RUSTFLAGS (and cc-rs build scripts CFLAGS); kbuild reads KCFLAGS, its room for additions.
- make: a Makefile's `CFLAGS ?= -O3 ...` does nothing when CFLAGS is in the environment, and a command-line CFLAGS
  replaces every assignment of the Makefile. So for make the maps go into the compiler variables (CC="cc -ffile-...")
  and the caller's flag variables are removed from its environment.

gcc and clang apply the last matching map, so the most specific maps come last.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

PREFIX_MAPS = "file-prefix-map-2"  # in every build key (2: one target per checkout, added to upstream's flags)

Maps = Sequence[tuple[str, str]]

# environment variables read by the compilers and build systems the recipes use -> the flag family they take
ENV_FLAGS = {"CFLAGS": "c", "CXXFLAGS": "c", "HIPFLAGS": "c", "OBJCFLAGS": "c", "KCFLAGS": "c", "CUDAFLAGS": "cuda",
             "RUSTFLAGS": "rust"}
# a recipe option that replaces CMake's start from the environment -> its family
CMAKE_FLAG_OPTIONS = {"CMAKE_C_FLAGS": "c", "CMAKE_CXX_FLAGS": "c", "CMAKE_HIP_FLAGS": "c", "CMAKE_OBJC_FLAGS": "c",
                      "CMAKE_OBJCXX_FLAGS": "c", "CMAKE_CUDA_FLAGS": "cuda"}
# the flag variables a Makefile conventionally defaults with `?=`: removed from a make build's inherited environment
MAKE_FLAG_VARIABLES = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "OBJCFLAGS", "LDFLAGS", "LDLIBS", "NVCCFLAGS")


def build_maps(*, source: str, build: str, name: str, cache: str | None = None, home: str | None = None) -> list[tuple[str, str]]:
    """Pure: the path maps for one build: its source and build dirs to fixed names, the cache and $HOME to neutral ones.

    `name` names the checkout (its pin, or the local source's folder), never the recipe or variant: variants that build
    one checkout get the same targets, so a compiler-cache hit across them (ccache hashes a map's option name, not its
    value) cannot carry another variant's paths into a package."""
    maps = []
    if home:
        maps.append((home, "/home/builder"))
    if cache:
        maps.append((cache, "/onebit/cache"))
    maps += [(build, f"/usr/src/onebit/{name}-build"), (source, f"/usr/src/onebit/{name}")]
    return maps


def _clean(maps: Maps) -> list[tuple[str, str]]:
    return [(old.rstrip("/"), new) for old, new in maps if old and old.rstrip("/")]


def flags(maps: Maps, family: str) -> list[str]:
    """Pure: the maps as one compiler family's flags: c (gcc, clang, hipcc), cuda (nvcc passes them on to its host
    compiler), rust (rustc). -ffile-prefix-map covers __FILE__, debug info and profile paths (gcc >= 8, clang >= 10)."""
    maps = _clean(maps)
    if family == "c":
        return [f"-ffile-prefix-map={old}={new}" for old, new in maps]
    if family == "cuda":
        return [f"-Xcompiler=-ffile-prefix-map={old}={new}" for old, new in maps]
    if family == "rust":
        return [f"--remap-path-prefix={old}={new}" for old, new in maps]
    raise ValueError(f"unknown flag family {family!r}")


def append(value: str | None, more: Iterable[str]) -> str:
    """Pure: `more` after what is there (upstream's or the recipe's value comes first and stays)."""
    return " ".join(([str(value)] if value not in (None, "") else []) + list(more))


def prefix_map_env(maps: Maps, base: Mapping[str, str] | None = None,
                   variables: Iterable[str] | None = None) -> dict[str, str]:
    """Pure: `base` with the maps appended to the compiler flag variables the build reads (`variables`, default every
    one of ENV_FLAGS), existing flags kept first."""
    env = dict(base or {})
    for var in (ENV_FLAGS if variables is None else variables):
        more = flags(maps, ENV_FLAGS[var])
        if more:
            env[var] = append(env.get(var), more)
    return env


def cmake_options(options: Mapping[str, object], maps: Maps) -> dict[str, object]:
    """Pure: a recipe's CMAKE_<LANG>_FLAGS options with the maps appended (the option replaces the environment's
    start, so without this a recipe's flags would drop the maps)."""
    out = dict(options)
    for name, family in CMAKE_FLAG_OPTIONS.items():
        if name in out:
            out[name] = append(out[name], flags(maps, family))
    return out


def compiler_family(variable: str) -> str | None:
    """Which flag family a make variable that names a compiler takes: CC, CXX, HIPCC, GPU_CC, HOST_CXX, ... take c
    flags; NVCC takes cuda ones. None for anything else."""
    if variable == "NVCC":
        return "cuda"
    if variable in ("CC", "CXX", "HIPCC") or variable.endswith(("_CC", "_CXX")):
        return "c"
    return None


def make_variables(variables: Mapping[str, str], maps: Maps) -> dict[str, str]:
    """Pure: make command-line variables with the maps added to every compiler variable the recipe passes, and to
    CC (`cc`, GNU make's own default) when it passes none."""
    out = dict(variables)
    if not any(compiler_family(k) for k in out):
        out = {"CC": "cc", **out}
    for k, v in out.items():
        family = compiler_family(k)
        if family:
            out[k] = append(v, flags(maps, family))
    return out


def cmake_flag_variables(options: Mapping[str, object]) -> tuple[str, ...]:
    """Pure: the flag variables a CMake configure reads for the languages it compiles: C and C++ always; HIP and CUDA
    where the recipe sets their CMake variables (CMAKE_HIP_*, CMAKE_CUDA_*: a project that enables the language);
    Objective-C where it sets CMAKE_OBJC*. Nothing else is put in its environment (no KCFLAGS or RUSTFLAGS)."""
    out = ["CFLAGS", "CXXFLAGS"]
    for prefix, var in (("CMAKE_HIP_", "HIPFLAGS"), ("CMAKE_CUDA_", "CUDAFLAGS"), ("CMAKE_OBJC", "OBJCFLAGS")):
        if any(str(k).startswith(prefix) for k in options):
            out.append(var)
    return tuple(out)


CARGO_FLAG_VARIABLES = ("RUSTFLAGS", "CFLAGS", "CXXFLAGS")  # rustc, and the cc-rs build scripts' C compilers
