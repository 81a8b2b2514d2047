"""offload: which GPU targets a shipped HIP library or program carries, read with the build root's own LLVM tools.

A HIP program or library (clang -x hip / hipcc, without -fgpu-rdc) keeps its device code in the ELF section
`.hip_fatbin`: one clang offload bundle per translation unit, each either plain (`__CLANG_OFFLOAD_BUNDLE__`, a table
of entries) or compressed (`CCOB`, clang's --offload-compress). Every entry is named by its bundle id
`<kind>-<triple>-<target id>`: `host-x86_64-unknown-linux-gnu-` for the (empty) host part and
`hipv4-amdgcn-amd-amdhsa--gfx1151` for the gfx1151 code object. Listing a bundle's ids is the job of the compiler
that made it: `clang-offload-bundler --list --type=o --input=<bundle>` of the build root (LLVM's own reader, which
decompresses CCOB), run inside the root. This module only finds the bundles in the section (pure) and decides.

The stage step (builders/stage.py) calls `check_tree` on every variant that declares `stage.offload_targets`: each
shipped ELF file with a `.hip_fatbin` must list exactly those targets, else one line names the file and what it
carries; a variant that declares targets but ships no device code fails too (its GPU code went missing).
"""
from __future__ import annotations

import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .elf import is_elf

SECTION = ".hip_fatbin"
PLAIN = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED = b"CCOB"
BUNDLER = "clang-offload-bundler"

# runs argv (inside the build root) with `visible` bound read-only; returns the completed process (text)
Runner = Callable[[Sequence[str], Path], subprocess.CompletedProcess]


def _next_magic(data: bytes, start: int) -> int:
    hits = [i for i in (data.find(PLAIN, start), data.find(COMPRESSED, start)) if i >= 0]
    return min(hits) if hits else -1


def split_bundles(section: bytes) -> list[bytes]:
    """Pure: the offload bundles one after the other in a .hip_fatbin section (zero padding between them).

    A plain bundle ends at its last entry's end (offset + size); a compressed one (version 2 or 3) carries its total
    size in its header; a version-1 compressed bundle has none and runs to the next bundle's magic."""
    out: list[bytes] = []
    pos = _next_magic(section, 0)
    while pos >= 0:
        if section.startswith(PLAIN, pos):
            (n,) = struct.unpack_from("<Q", section, pos + 24)
            at, end = pos + 32, pos + 32
            for _ in range(n):
                offset, size, tlen = struct.unpack_from("<QQQ", section, at)
                at += 24 + tlen
                end = max(end, at, pos + offset + size)
        else:
            (version,) = struct.unpack_from("<H", section, pos + 4)
            if version == 2:
                end = pos + struct.unpack_from("<I", section, pos + 8)[0]
            elif version >= 3:
                end = pos + struct.unpack_from("<Q", section, pos + 8)[0]
            else:
                nxt = _next_magic(section, pos + 4)
                end = nxt if nxt >= 0 else len(section)
        out.append(section[pos:end])
        pos = _next_magic(section, end)
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


def fatbin(path: Path) -> bytes | None:
    """The .hip_fatbin section of an ELF file, or None when it has none (not HIP, or not ELF)."""
    if not is_elf(path):
        return None
    try:
        with open(path, "rb") as f:
            section = ELFFile(f).get_section_by_name(SECTION)
            return section.data() if section is not None and section["sh_type"] != "SHT_NOBITS" else None
    except (ELFError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class FileTargets:
    rel: str
    targets: tuple[str, ...]
    bundles: int


def list_file(path: Path, rel: str, run: Runner, scratch: Path) -> FileTargets | None:
    """The targets one file carries, each bundle listed by the root's clang-offload-bundler; None: no device code."""
    data = fatbin(path)
    if data is None:
        return None
    found: set[str] = set()
    parts = split_bundles(data)
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


class OffloadError(Exception):
    pass


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
