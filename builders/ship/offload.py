"""offload: which GPU targets a shipped HIP library or program carries, read with the build root's own LLVM tools.

A HIP program or library (clang -x hip / hipcc, without -fgpu-rdc) keeps its device code in the ELF section
`.hip_fatbin`: one clang offload bundle per translation unit, each either plain (`__CLANG_OFFLOAD_BUNDLE__`, a table
of entries) or compressed (`CCOB`, clang's --offload-compress). Every entry is named by its bundle id
`<kind>-<triple>-<target id>`: `host-x86_64-unknown-linux-gnu-` for the (empty) host part and
`hipv4-amdgcn-amd-amdhsa--gfx1151` for the gfx1151 code object. Listing a bundle's ids is the job of the compiler
that made it: `clang-offload-bundler --list --type=o --input=<bundle>` of the build root (LLVM's own reader, which
decompresses CCOB), run inside the root. This module only finds the bundles in the section (pure) and decides.

The stage step (builders/ship/stage.py) calls `check_tree` on every variant that declares `stage.offload_targets`: each
shipped ELF file with a `.hip_fatbin` must list exactly those targets, else one line names the file and what it
carries; a variant that declares targets but ships no device code fails too (its GPU code went missing).
"""
from __future__ import annotations

import os
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..io.elf import is_elf

SECTION = ".hip_fatbin"
PLAIN = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED = b"CCOB"
BUNDLER = "clang-offload-bundler"

# runs argv (inside the build root) with `visible` bound read-only; returns the completed process (text)
Runner = Callable[[Sequence[str], Path], subprocess.CompletedProcess]


PLAIN_HEAD = len(PLAIN) + 8  # magic, u64 entry count
PLAIN_ENTRY = 24  # u64 offset, u64 size, u64 id length (the id follows)
CCOB_HEAD = {1: 20, 2: 24, 3: 32}  # magic, u16 version, u16 method, [total size: u32 (2) | u64 (3)], sizes, hash


class OffloadError(Exception):
    """A shipped file's device code is not what its variant declares (one line per file, naming it)."""


class MalformedBundle(OffloadError):
    """A .hip_fatbin whose bundle headers do not fit the section: what no compiler writes."""


class _Magics:
    """The next bundle magic at or after a position, for positions asked in increasing order: each magic is searched
    forward once (a section packed with magics costs one pass, not one pass per bundle)."""

    def __init__(self, data: bytes):
        self.data = data
        self.hits = {PLAIN: -1, COMPRESSED: -1}
        self.done = {PLAIN: False, COMPRESSED: False}

    def next(self, start: int) -> int:
        found = []
        for magic in (PLAIN, COMPRESSED):
            if not self.done[magic] and self.hits[magic] < start:
                self.hits[magic] = self.data.find(magic, start)
                self.done[magic] = self.hits[magic] < 0
            if not self.done[magic]:
                found.append(self.hits[magic])
        return min(found) if found else -1


def _plain_end(section: bytes, pos: int) -> int:
    """Where the plain bundle at `pos` ends: its table's end or its last entry's end, whichever is later. Every field
    is checked against the section before it is used (clang's BinaryFileHandler::ReadHeader reads the same fields)."""
    size = len(section)
    if pos + PLAIN_HEAD > size:
        raise MalformedBundle(f"a plain bundle at byte {pos} is cut off before its entry count")
    (n,) = struct.unpack_from("<Q", section, pos + len(PLAIN))
    room = (size - pos - PLAIN_HEAD) // PLAIN_ENTRY
    if n > room:
        raise MalformedBundle(f"the plain bundle at byte {pos} declares {n} entries; the section holds at most {room}")
    at = end = pos + PLAIN_HEAD
    for i in range(n):
        if at + PLAIN_ENTRY > size:
            raise MalformedBundle(f"the plain bundle at byte {pos} is cut off in entry {i} of {n}")
        offset, length, id_len = struct.unpack_from("<QQQ", section, at)
        at += PLAIN_ENTRY
        if id_len > size - at:
            raise MalformedBundle(f"entry {i} of the plain bundle at byte {pos} has a {id_len}-byte id past the "
                                  f"section's end")
        at += id_len
        if offset == 0 or offset > size - pos or length > size - pos - offset:
            raise MalformedBundle(f"entry {i} of the plain bundle at byte {pos} (offset {offset}, size {length}) "
                                  f"lies outside the section")
        end = max(end, at, pos + offset + length)
    return end


def _compressed_end(section: bytes, pos: int, magics: _Magics) -> int:
    """Where the compressed bundle at `pos` ends: its header's total size (versions 2 and 3, which counts the header),
    or the next bundle's magic (version 1, which has no total size)."""
    size = len(section)
    if pos + 6 > size:
        raise MalformedBundle(f"a compressed bundle at byte {pos} is cut off before its version")
    (version,) = struct.unpack_from("<H", section, pos + 4)
    head = CCOB_HEAD.get(version)
    if head is None:
        raise MalformedBundle(f"the compressed bundle at byte {pos} has version {version} (known: 1, 2, 3)")
    if pos + head > size:
        raise MalformedBundle(f"the version {version} compressed bundle at byte {pos} is cut off in its header")
    if version == 1:
        nxt = magics.next(pos + head)
        return nxt if nxt >= 0 else size
    (total,) = struct.unpack_from("<I" if version == 2 else "<Q", section, pos + 8)
    if total < head:
        raise MalformedBundle(f"the version {version} compressed bundle at byte {pos} declares {total} bytes, less "
                              f"than its own {head}-byte header")
    if total > size - pos:
        raise MalformedBundle(f"the version {version} compressed bundle at byte {pos} declares {total} bytes; the "
                              f"section holds {size - pos} from there")
    return pos + total


def split_bundles(section: bytes) -> list[bytes]:
    """Pure: the offload bundles one after the other in a .hip_fatbin section (zero padding between them).

    A plain bundle ends at its last entry's end (offset + size); a compressed one (version 2 or 3) carries its total
    size in its header; a version-1 compressed bundle has none and runs to the next bundle's magic. A header that does
    not fit the section (cut off, more entries than the section can hold, an entry or a total size past its end, a
    total size smaller than the header, an unknown version) raises MalformedBundle; every bundle ends after its start,
    so the walk always advances, and reads nothing past the section."""
    out: list[bytes] = []
    magics = _Magics(section)
    pos = magics.next(0)
    while pos >= 0:
        if section.startswith(PLAIN, pos):
            end = _plain_end(section, pos)
        else:
            end = _compressed_end(section, pos, magics)
        if not pos < end <= len(section):  # cannot happen (each end is checked above); never loop on it
            raise MalformedBundle(f"the bundle at byte {pos} ends at byte {end}")
        out.append(section[pos:end])
        pos = magics.next(end)
    return out


def targets_of(bundle_ids: Iterable[str]) -> set[str]:
    """Pure: the GPU target ids of bundle entry ids (`hipv4-amdgcn-amd-amdhsa--gfx1151` -> gfx1151; the host entry and
    empty lines carry none). A target id keeps its features (`gfx90a:xnack+`)."""
    out = set()
    for bid in bundle_ids:
        bid = bid.strip()
        if not bid or bid.startswith("host-"):
            continue
        kind, _, rest = bid.partition("-")
        if kind not in ("hip", "hipv4", "openmp") or "--" not in rest:
            out.add(bid)  # not a form this check knows: reported as it is, never silently accepted
            continue
        out.add(rest.split("--", 1)[1])
    return out


def problem(rel: str, found: set[str], declared: Sequence[str]) -> str | None:
    """Pure: what is wrong with one file's device code (None: exactly the declared targets)."""
    want = set(declared)
    if found == want:
        return None
    extra, missing = sorted(found - want), sorted(want - found)
    parts = ([f"carries {', '.join(extra)}"] if extra else []) + ([f"lacks {', '.join(missing)}"] if missing else [])
    return f"{rel}: offload targets {', '.join(sorted(found)) or 'none'} ({'; '.join(parts)}), declared {', '.join(declared)}"


SHF_COMPRESSED = 0x800


def fatbin(path: Path) -> bytes | None:
    """The .hip_fatbin section of an ELF file, or None when it has none (not HIP, or not ELF). A section that claims
    bytes past the end of the file, or is ELF-compressed (no compiler writes one: it could inflate to any size), raises
    MalformedBundle: nothing is read for it."""
    if not is_elf(path):
        return None
    try:
        with open(path, "rb") as f:
            section = ELFFile(f).get_section_by_name(SECTION)
            if section is None or section["sh_type"] == "SHT_NOBITS":
                return None
            size = os.fstat(f.fileno()).st_size
            if section["sh_flags"] & SHF_COMPRESSED:
                raise MalformedBundle(f"the {SECTION} section is ELF-compressed")
            if section["sh_offset"] > size or section["sh_size"] > size - section["sh_offset"]:
                raise MalformedBundle(f"the {SECTION} section ({section['sh_size']} bytes at {section['sh_offset']}) "
                                      f"runs past the end of the file ({size} bytes)")
            return section.data()
    except (ELFError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class FileTargets:
    rel: str
    targets: tuple[str, ...]
    bundles: int


def list_file(path: Path, rel: str, run: Runner, scratch: Path) -> FileTargets | None:
    """The targets one file carries, each bundle listed by the root's clang-offload-bundler; None: no device code."""
    try:
        data = fatbin(path)
        if data is None:
            return None
        parts = split_bundles(data)
    except MalformedBundle as exc:
        raise MalformedBundle(f"{rel}: malformed {SECTION}: {exc}") from None
    found: set[str] = set()
    for i, part in enumerate(parts):
        piece = scratch / f"bundle-{i}"
        piece.write_bytes(part)
        proc = run([BUNDLER, "--list", "--type=o", f"--input={piece}"], scratch)
        if proc.returncode != 0:
            why = ((proc.stderr or proc.stdout).strip().splitlines() or ["no message"])[-1]
            raise OffloadError(f"{rel}: {BUNDLER} --list could not read bundle {i} of its {SECTION}: {why}")
        found |= targets_of(proc.stdout.splitlines())
        piece.unlink()
    return FileTargets(rel=rel, targets=tuple(sorted(found)), bundles=len(parts))


def check_tree(base: Path, declared: Sequence[str], run: Runner, scratch_parent: Path | None = None) -> list[FileTargets]:
    """Every ELF file below `base` with device code, listed; raises OffloadError (one line per bad file) unless each
    carries exactly `declared` and at least one file carries device code."""
    files: list[FileTargets] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="offload-", dir=scratch_parent) as tmp:
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            rel = path.relative_to(base).as_posix()
            got = list_file(path, rel, run, Path(tmp))
            if got is None:
                continue
            files.append(got)
            bad = problem(rel, set(got.targets), declared)
            if bad:
                problems.append(bad)
    if not files:
        problems.append(f"no shipped file carries device code ({SECTION}), declared {', '.join(declared)}")
    if problems:
        raise OffloadError("; ".join(problems))
    return files
