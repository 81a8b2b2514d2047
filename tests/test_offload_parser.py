"""Hostile .hip_fatbin sections through the stage's offload check (issue 27): a staged library whose section holds a
truncated plain bundle, a plain bundle declaring 2^62 entries, or a compressed bundle declaring a total size of 0 made
the check raise struct.error (a traceback) or loop forever; each now fails the stage in one line naming the file.

The libraries are real ELF files made by gcc, their `.hip_fatbin` filled with the bytes under test; the bundles are
real ones (tests/offload_bundles/, written by the Strix root's hipcc and clang-offload-bundler 22: see
tests/test_fuzz_offload.py). The check runs as the stage runs it (`stage.check_offload` on the staged tree), in a
child process with a timeout (a parser that spins is a failure, not a hung test run). A malformed section never
reaches the bundler; where a well-formed one does, a stand-in for clang-offload-bundler on PATH answers what the real
one answers for these bundles (the real one lives in the Strix build root: tests/test_strix_offload.py runs it).
"""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from builders.ship import offload

BUNDLES = Path(__file__).parent / "offload_bundles"
PLAIN = (BUNDLES / "plain.bundle").read_bytes()
V2 = (BUNDLES / "v2.ccob").read_bytes()
V3 = (BUNDLES / "v3.ccob").read_bytes()
LISTED = ("host-x86_64-unknown-linux-gnu-", "hipv4-amdgcn-amd-amdhsa--gfx1151")  # what the bundler lists for each


def elf_with_fatbin(path: Path, section: bytes) -> Path:
    """A shared library built by gcc whose .hip_fatbin section holds exactly `section`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    body = ",".join(str(b) for b in section) or "0"
    src.write_text('__attribute__((section(".hip_fatbin"), used, aligned(4096)))\n'
                   f"const unsigned char fatbin[{max(len(section), 1)}] = {{{body}}};\n"
                   "int answer(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(path), str(src)], check=True)
    src.unlink()
    if section:
        assert offload.fatbin(path) == section
    return path


BUNDLER = f"""#!/bin/sh
# stands in for `clang-offload-bundler --list --type=o --input=B` on the real bundles of tests/offload_bundles
printf '%s\\n' {' '.join(LISTED)}
"""

CHILD = """
import sys
from pathlib import Path
from builders.ship import stage
from builders.errors import StageError
from builders.plan_types import StageData

base, work = Path(sys.argv[1]), Path(sys.argv[2])
data = StageData(variant="tiny", package="onebit-tiny", stage_root="", stage_tmp="", tmp_prefix="", prefix="", root="",
                 keep=(), binaries={}, links={}, backend=None, manifest_entry=None, build_dir=str(work), home="",
                 tests=(), test_values={}, where="recipes/tiny.yaml", offload_targets=("gfx1151",), build_root=None)
try:
    print("found", stage.check_offload(data, base, work / "scratch", lambda line: None))
except StageError as exc:
    print(exc)
"""


def stage_check(tmp_path: Path, files: dict[str, bytes]) -> subprocess.CompletedProcess:
    """The stage's offload check over a staged tree holding `files` (rel -> .hip_fatbin bytes), in a child."""
    base, work, bindir = tmp_path / "staged", tmp_path / "work", tmp_path / "tools"
    for rel, section in files.items():
        elf_with_fatbin(base / rel, section)
    bindir.mkdir(exist_ok=True)
    (bindir / offload.BUNDLER).write_text(BUNDLER)
    (bindir / offload.BUNDLER).chmod(0o755)
    work.mkdir(exist_ok=True)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    try:
        return subprocess.run([sys.executable, "-c", CHILD, str(base), str(work)], capture_output=True, text=True,
                              env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the offload check was still running after 120 s: the parser spins")


def _plain_with_count(n: int) -> bytes:
    return PLAIN[:24] + struct.pack("<Q", n) + PLAIN[32:]


def _total(bundle: bytes, total: int) -> bytes:
    (version,) = struct.unpack_from("<H", bundle, 4)
    return bundle[:8] + struct.pack("<I" if version == 2 else "<Q", total) + bundle[(12 if version == 2 else 16):]


PREFIX = "recipes/tiny.yaml: tiny: offload check failed: lib/libhostile.so: malformed .hip_fatbin: "
BREAKS = [
    ("a truncated plain bundle", PLAIN[:100], "entry 0 of the plain bundle at byte 0 (offset 4096, size 0) lies "
                                              "outside the section"),
    ("a plain bundle declaring 2^62 entries", _plain_with_count(1 << 62),
     f"the plain bundle at byte 0 declares {1 << 62} entries; the section holds at most {(len(PLAIN) - 32) // 24}"),
    ("a version 2 compressed bundle of total size 0", _total(V2, 0),
     "the version 2 compressed bundle at byte 0 declares 0 bytes, less than its own 24-byte header"),
    ("a version 3 compressed bundle of total size 0", _total(V3, 0),
     "the version 3 compressed bundle at byte 0 declares 0 bytes, less than its own 32-byte header"),
]


@pytest.mark.parametrize("name, section, why", BREAKS, ids=[b[0] for b in BREAKS])
def test_a_hostile_fatbin_fails_the_stage_in_one_line_naming_the_file(tmp_path, name, section, why):
    proc = stage_check(tmp_path, {"bin/tiny": PLAIN, "lib/libhostile.so": section})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    first, hint = proc.stdout.splitlines()
    assert first == PREFIX + why
    assert hint.strip().startswith("hint: no compiler writes such a bundle")


def test_well_formed_bundles_pass_the_same_path(tmp_path):
    """The control: the real bundles, alone and packed into one section as the linker packs them, list gfx1151."""
    pad = b"\0" * (8192 - len(PLAIN))
    proc = stage_check(tmp_path, {"bin/tiny": PLAIN, "lib/libk.so": PLAIN + pad + V3, "lib/libv2.so": V2 + b"\0" * 12})
    assert proc.returncode == 0 and proc.stdout == "found ['gfx1151']\n", proc.stdout + proc.stderr[-2000:]


def test_a_section_past_the_end_of_its_file_is_refused_without_reading_it(tmp_path):
    """A .hip_fatbin whose header claims 2^40 bytes: nothing is read for it, one line names the file."""
    lib = elf_with_fatbin(tmp_path / "staged" / "lib" / "libhostile.so", PLAIN)
    data = bytearray(lib.read_bytes())
    from elftools.elf.elffile import ELFFile

    with open(lib, "rb") as f:
        elf = ELFFile(f)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == offload.SECTION)
        at = elf["e_shoff"] + index * elf["e_shentsize"] + 32  # Elf64_Shdr.sh_size
    data[at: at + 8] = struct.pack("<Q", 1 << 40)
    lib.write_bytes(bytes(data))
    proc = stage_check(tmp_path, {"bin/tiny": PLAIN})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0].startswith(PREFIX + f"the .hip_fatbin section ({1 << 40} bytes at ")


@pytest.mark.parametrize("section, why", [
    (PLAIN[:20], None),  # not even a whole magic: no bundle at all
    (PLAIN[:31], "a plain bundle at byte 0 is cut off before its entry count"),
    (_plain_with_count(1)[:56], "entry 0 of the plain bundle at byte 0 has a 30-byte id past the section's end"),
    (PLAIN[:32] + struct.pack("<QQQ", 0, 0, 30) + PLAIN[56:],
     "entry 0 of the plain bundle at byte 0 (offset 0, size 0) lies outside the section"),
    (PLAIN[:32] + struct.pack("<QQQ", 4096, 1 << 63, 30) + PLAIN[56:],
     f"entry 0 of the plain bundle at byte 0 (offset 4096, size {1 << 63}) lies outside the section"),
    (V3[:5], "a compressed bundle at byte 0 is cut off before its version"),
    (V3[:4] + struct.pack("<H", 4) + V3[6:], "the compressed bundle at byte 0 has version 4 (known: 1, 2, 3)"),
    (V3[:4] + struct.pack("<H", 0) + V3[6:], "the compressed bundle at byte 0 has version 0 (known: 1, 2, 3)"),
    (V3[:20], "the version 3 compressed bundle at byte 0 is cut off in its header"),
    (_total(V2, len(V2) + 1), f"the version 2 compressed bundle at byte 0 declares {len(V2) + 1} bytes; the section "
                              f"holds {len(V2)} from there"),
    (PLAIN + _total(V3, (1 << 64) - 1), f"the version 3 compressed bundle at byte {len(PLAIN)} declares {(1 << 64) - 1}"
                                      f" bytes; the section holds {len(V3)} from there"),
])
def test_each_malformed_header_is_named(section, why):
    if why is None:
        assert offload.split_bundles(section) == []
        return
    with pytest.raises(offload.MalformedBundle) as exc:
        offload.split_bundles(section)
    assert str(exc.value) == why


def test_a_section_packed_with_version_1_headers_is_split_in_one_pass(tmp_path):
    """Each version-1 compressed bundle runs to the next magic: 8 MiB of 20-byte headers are 419,430 bundles, found
    with one forward search per magic (searching the rest of the section again for each took minutes)."""
    v1 = (BUNDLES / "v1.ccob").read_bytes()[:20]
    code = ("import sys; from builders.ship import offload; s = sys.stdin.buffer.read(); "
            "parts = offload.split_bundles(s); print(len(parts), sum(map(len, parts)) == len(s))")
    proc = subprocess.run([sys.executable, "-c", code], input=v1 * ((8 << 20) // 20), capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.decode().split() == [str((8 << 20) // 20), "True"]
