"""The host's own libraries a backend needs (the ROCm runtime), checked by name the way the dynamic loader finds them.

A backend's manifest entry lists `host_libraries`: the SONAMEs its programs link that the bundle does not ship, each
with what provides it (docs/strix.md: the ROCm runtime comes from the host). A program that lacks one never starts:
the loader prints "error while loading shared libraries" and exits 127 before our code runs. This module says,
before anything is run, whether this host's loader would find each SONAME, and if not, whether a different major of
the same library is there (libhipblas.so.2 of ROCm 6 where libhipblas.so.3 is wanted).

It looks where glibc's ld.so looks for a NEEDED name without a slash, and nothing is loaded (never dlopen: that
runs a library's constructors):
  1. the directories of LD_LIBRARY_PATH (an empty entry is the working directory; an entry holding a dynamic string
     token such as $ORIGIN or $LIB is skipped: it depends on the program that loads it);
  2. /etc/ld.so.cache, what ldconfig wrote: the old "ld.so-1.7.0" layout, the new "glibc-ld.so.cache1.1" one, or
     both (ldconfig's "compat" format), entries of this machine's ABI only (x86-64 libc6: 0x0303);
  3. the default directories (/lib and /usr/lib, their x86_64-linux-gnu multiarch directories, /lib64, /usr/lib64).
A file found in a directory counts only when it is a 64-bit ELF object for this machine (the loader skips a 32-bit
one). A program's own RUNPATH is not searched: the host libraries are by definition not in the bundle.

The decisions (reading the cache's bytes, matching names, the message) are pure functions, tested by tables; the file
system is read in `look_up` only.
"""

from __future__ import annotations

import os
import platform
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LD_SO_CACHE = "etc/ld.so.cache"
DEFAULT_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib", "usr/lib")

# glibc's sysdeps/generic/dl-cache.h: the two layouts and an entry's flags
OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER = struct.Struct("<12sI")  # magic (11 bytes, padded to 12), nlibs
_OLD_ENTRY = struct.Struct("<iII")  # flags, key, value
_NEW_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension_offset, unused
_NEW_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion (unused), hwcap
_NEW_ALIGN = 8  # __alignof__ (struct cache_file_new): where the new layout starts after the old one
_BIG_ENDIAN = 3  # cache_file_new.flags & 3: 2 little-endian, 3 big-endian (0: not recorded)
# an entry's flags for this machine's ABI: FLAG_ELF_LIBC6 | the architecture's "required" bits (_DL_CACHE_DEFAULT_ID)
ABI_FLAGS = {"x86_64": 0x0303, "aarch64": 0x0A03}
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}  # e_machine of the ELF objects this machine's loader takes

# The ROCm release that ships a SONAME (AMD's release notes: hipBLAS 0.x/1.x/2.x/3.x and rocBLAS 2.x/3.x/4.x/5.x
# came with ROCm 5.0-5.5/5.6-5.7/6.x/7.x; HIP's SONAME major is ROCm's). It only names a different major that is
# installed; an unknown one is still named, as "another major".
RELEASES = {
    "libamdhip64.so.5": "ROCm 5", "libamdhip64.so.6": "ROCm 6", "libamdhip64.so.7": "ROCm 7",
    "libhipblas.so.0": "ROCm 5", "libhipblas.so.1": "ROCm 5", "libhipblas.so.2": "ROCm 6", "libhipblas.so.3": "ROCm 7",
    "librocblas.so.0": "ROCm 5", "librocblas.so.3": "ROCm 5", "librocblas.so.4": "ROCm 6", "librocblas.so.5": "ROCm 7",
}


@dataclass(frozen=True)
class HostLibrary:
    """One entry of a backend's `host_libraries` in the manifest."""

    soname: str
    provided_by: str  # what to install for it ("ROCm 7.x HIP runtime (Debian: libamdhip64-7; ...)")
    set: str  # the set it belongs to ("rocm7")


@dataclass(frozen=True)
class Found:
    """What this host has for one SONAME."""

    soname: str
    path: str | None  # where the loader would take it from; None: the loader would not find it
    others: tuple[str, ...] = ()  # other majors of the same library that are installed ("libhipblas.so.2")


@dataclass(frozen=True)
class CacheEntry:
    name: str
    path: str
    flags: int
    hwcap: int = 0


class CacheError(ValueError):
    """The bytes are not an ld.so.cache this module can read."""


# --- names (pure) ----------------------------------------------------------------------------------------------------

_VERSIONED = re.compile(r"^(?P<stem>.+?\.so)\.(?P<major>\d+)(?:\.[0-9.]*)?$")


def stem_of(soname: str) -> str:
    """"libhipblas.so.3" -> "libhipblas.so"; a SONAME without a version after .so is its own stem."""
    m = _VERSIONED.match(soname)
    return m["stem"] if m else soname


def other_majors(soname: str, names: Iterable[str]) -> tuple[str, ...]:
    """The other majors of `soname`'s library among file or SONAME names ("libhipblas.so.2" for names holding
    libhipblas.so.2.4.60400), sorted by major; () for an unversioned SONAME."""
    m = _VERSIONED.match(soname)
    if not m or m.group(0) != f"{m['stem']}.{m['major']}":
        return ()
    majors = set()
    for n in names:
        o = _VERSIONED.match(n)
        if o and o["stem"] == m["stem"] and o["major"] != m["major"]:
            majors.add(int(o["major"]))
    return tuple(f"{m['stem']}.{j}" for j in sorted(majors))


def is_loadable_elf(header: bytes, machine: str = "x86_64") -> bool:
    """Pure: the first 20 bytes of a file are those of a 64-bit little-endian ELF object for `machine`."""
    if len(header) < 20 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        return False
    return struct.unpack_from("<H", header, 18)[0] == ELF_MACHINE.get(machine, -1)


def library_path_dirs(value: str | None, cwd: str = ".") -> tuple[str, ...]:
    """LD_LIBRARY_PATH's directories in order (':' or ';' separated, as ld.so splits it); an empty entry is the working
    directory; an entry holding a dynamic string token ($ORIGIN, $LIB, $PLATFORM) is left out."""
    if not value:
        return ()
    return tuple(d or cwd for d in re.split(r"[:;]", value) if "$" not in d)


# --- /etc/ld.so.cache (pure) -----------------------------------------------------------------------------------------


def _string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if offset >= len(data) or end < 0:
        raise CacheError(f"string offset {offset} outside the cache")
    return os.fsdecode(data[offset:end])


def _new_entries(data: bytes, base: int) -> list[CacheEntry]:
    magic, nlibs, _len_strings, flags, _ext = _NEW_HEADER.unpack_from(data, base)
    if magic != NEW_MAGIC:
        raise CacheError("no glibc-ld.so.cache1.1 header")
    if flags & 3 == _BIG_ENDIAN:
        raise CacheError("a big-endian cache")
    start = base + _NEW_HEADER.size
    if start + nlibs * _NEW_ENTRY.size > len(data):
        raise CacheError(f"{nlibs} entries do not fit in {len(data)} bytes")
    out = []
    for i in range(nlibs):
        fl, key, value, _os, hwcap = _NEW_ENTRY.unpack_from(data, start + i * _NEW_ENTRY.size)
        out.append(CacheEntry(_string(data, base + key), _string(data, base + value), fl, hwcap))
    return out


def parse_ld_so_cache(data: bytes) -> tuple[CacheEntry, ...]:
    """Every entry of an ld.so.cache, in its order. Where the old layout is followed by the new one (ldconfig's
    compat format), the new one is read, as ld.so does; its string offsets count from its own header, the old
    layout's from the end of its entries. Raises CacheError for anything else."""
    if data.startswith(NEW_MAGIC):
        return tuple(_new_entries(data, 0))
    if not data.startswith(OLD_MAGIC):
        raise CacheError("not an ld.so.cache (neither ld.so-1.7.0 nor glibc-ld.so.cache1.1)")
    if len(data) < _OLD_HEADER.size:
        raise CacheError("a truncated ld.so-1.7.0 header")
    _magic, nlibs = _OLD_HEADER.unpack_from(data, 0)
    strings = _OLD_HEADER.size + nlibs * _OLD_ENTRY.size
    if strings > len(data):
        raise CacheError(f"{nlibs} entries do not fit in {len(data)} bytes")
    new = (strings + _NEW_ALIGN - 1) & ~(_NEW_ALIGN - 1)
    if data[new:new + len(NEW_MAGIC)] == NEW_MAGIC:
        return tuple(_new_entries(data, new))
    out = []
    for i in range(nlibs):
        fl, key, value = _OLD_ENTRY.unpack_from(data, _OLD_HEADER.size + i * _OLD_ENTRY.size)
        out.append(CacheEntry(_string(data, strings + key), _string(data, strings + value), fl))
    return tuple(out)


def cache_names(entries: Sequence[CacheEntry], machine: str = "x86_64") -> dict[str, str]:
    """SONAME -> path for the entries of this machine's ABI. Where a name has entries for hardware capabilities
    (glibc-hwcaps subdirectories) and one without, the one without wins: every CPU can load it."""
    want = ABI_FLAGS.get(machine)
    out: dict[str, str] = {}
    for e in sorted((e for e in entries if e.flags == want), key=lambda e: e.hwcap != 0):
        out.setdefault(e.name, e.path)
    return out


# --- the decision (pure) ---------------------------------------------------------------------------------------------


def decide(soname: str, path_dirs: Sequence[tuple[str, Mapping[str, bool]]], cache: Mapping[str, str],
           default_dirs: Sequence[tuple[str, Mapping[str, bool]]]) -> Found:
    """Where the loader finds `soname` (LD_LIBRARY_PATH's directories, then the cache, then the default
    directories), and the other majors of its library present in any of those places. Each directory comes with
    its file names, True for a loadable ELF object of this machine (a 32-bit one is skipped, as ld.so skips it)."""
    path = None
    for d, names in path_dirs:
        if names.get(soname):
            path = f"{d.rstrip('/')}/{soname}"
            break
    if path is None and soname in cache:
        path = cache[soname]
    if path is None:
        for d, names in default_dirs:
            if names.get(soname):
                path = f"{d.rstrip('/')}/{soname}"
                break
    everything = [*cache, *(n for _, names in (*path_dirs, *default_dirs) for n, ok in names.items() if ok)]
    return Found(soname=soname, path=path, others=other_majors(soname, everything))


def _installed(others: Sequence[str]) -> str:
    named = [f"{o} ({RELEASES[o]})" if o in RELEASES else o for o in others]
    verb = "is" if len(named) == 1 else "are"
    return f"{', '.join(named)} {verb} installed, another major"


def missing(needs: Sequence[HostLibrary], found: Mapping[str, Found]) -> list[HostLibrary]:
    """The entries of `needs` this host's loader would not find (a SONAME nobody looked up counts as found)."""
    return [h for h in needs if h.soname in found and found[h.soname].path is None]


def missing_text(lacking: Sequence[HostLibrary], found: Mapping[str, Found]) -> str:
    """One line: which SONAMEs are missing, the other majors installed instead, and what provides them.
    "libhipblas.so.3 missing (libhipblas.so.2 (ROCm 6) is installed, another major); provided by ROCm 7.x hipBLAS
    (...)"; several missing libraries share one sentence, each provider named once, in the manifest's order."""
    names = ", ".join(h.soname for h in lacking)
    others = [o for h in lacking for o in (found[h.soname].others if h.soname in found else ())]
    providers = list(dict.fromkeys(h.provided_by for h in lacking))
    text = f"{names} missing"
    if others:
        text += f" ({_installed(others)})"
    return f"{text}; provided by {' / '.join(providers)}"


# --- the file system (thin) ------------------------------------------------------------------------------------------


def _listing(directory: Path, stems: frozenset[str], machine: str) -> dict[str, bool]:
    """The file names of `directory` that belong to one of the libraries `stems` names ("libhipblas.so"), each True
    when it is a loadable ELF object (only those files are opened, and only their first 20 bytes are read)."""
    try:
        names = [n for n in os.listdir(directory) if stem_of(n) in stems]
    except OSError:
        return {}
    out = {}
    for n in names:
        try:
            with open(directory / n, "rb") as f:  # through the SONAME link, as the loader opens it
                out[n] = is_loadable_elf(f.read(20), machine)
        except OSError:
            out[n] = False
    return out


def read_cache(root: Path = Path("/"), machine: str = "x86_64") -> dict[str, str]:
    """cache_names() of the host's ld.so.cache; {} where there is none or it cannot be read (ld.so then searches the
    default directories only)."""
    try:
        return cache_names(parse_ld_so_cache((root / LD_SO_CACHE).read_bytes()), machine)
    except (OSError, CacheError, struct.error):
        return {}


def look_up(sonames: Iterable[str], env: Mapping[str, str] | None = None, root: Path = Path("/"),
            machine: str | None = None) -> dict[str, Found]:
    """Where this host's loader would find each SONAME, for a program started with `env` (LD_LIBRARY_PATH). `root`
    is the file system's root (a test points it at a directory that holds etc/ld.so.cache and lib/...)."""
    env = os.environ if env is None else env
    machine = machine or platform.machine()
    sonames = list(dict.fromkeys(sonames))
    if not sonames:
        return {}
    stems = frozenset(stem_of(s) for s in sonames)
    path_dirs = [(d, _listing(Path(d), stems, machine))
                 for d in library_path_dirs(env.get("LD_LIBRARY_PATH"), os.getcwd())]
    defaults = [(f"/{d}", _listing(root / d, stems, machine)) for d in DEFAULT_DIRS]
    cache = read_cache(root, machine)
    return {s: decide(s, path_dirs, cache, defaults) for s in sonames}
