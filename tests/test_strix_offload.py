"""The offload check (builders/ship/offload.py, called by the stage step): the GPU targets of shipped HIP files, listed by
the build root's own clang-offload-bundler. Tables for the pure parts; then a real tiny HIP program compiled for
gfx1151 in the root (two translation units, one with a compressed bundle) is accepted, and one compiled for gfx1100
is refused in one line."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from strix_root import strix_root

from builders.ship import offload, stage
from builders.errors import StageError
from builders.plan_types import StageData

HOST = "host-x86_64-unknown-linux-gnu-"
GFX1151 = "hipv4-amdgcn-amd-amdhsa--gfx1151"


def plain(*ids: str, payload: bytes = b"\xaa" * 40) -> bytes:
    """A plain clang offload bundle (clang/lib/Driver/OffloadBundler.cpp BinaryFileHandler: magic, entry count, then
    per entry offset, size, id length, id; the payloads after the table)."""
    head = len(offload.PLAIN) + 8 + sum(24 + len(i) for i in ids)
    table, at = b"", head
    for i in ids:
        table += struct.pack("<QQQ", at, len(payload), len(i)) + i.encode()
        at += len(payload)
    return offload.PLAIN + struct.pack("<Q", len(ids)) + table + payload * len(ids)


def ccob(version: int, body: bytes = b"\x28\xb5\x2f\xfd" + b"\x01" * 30) -> bytes:
    """A compressed bundle header (OffloadBundler.cpp CompressedOffloadBundle): magic, version, method, then the
    total size (32-bit in version 2, 64-bit in 3), the uncompressed size and a hash."""
    if version == 2:
        head = offload.COMPRESSED + struct.pack("<HHII", 2, 1, 0, 100) + struct.pack("<Q", 7)
        size = len(head) + len(body)
        return offload.COMPRESSED + struct.pack("<HHII", 2, 1, size, 100) + struct.pack("<Q", 7) + body
    head = offload.COMPRESSED + struct.pack("<HHQQ", 3, 1, 0, 100) + struct.pack("<Q", 7)
    size = len(head) + len(body)
    return offload.COMPRESSED + struct.pack("<HHQQ", 3, 1, size, 100) + struct.pack("<Q", 7) + body


PAD = b"\0" * 96
SPLITS = [
    ("one plain", [plain(HOST, GFX1151)], b""),
    ("two plain, padded", [plain(HOST, GFX1151), plain(HOST, "hipv4-amdgcn-amd-amdhsa--gfx1100")], PAD),
    ("plain then compressed v2", [plain(HOST, GFX1151), ccob(2)], PAD),
    ("compressed v3 then plain", [ccob(3), plain(HOST, GFX1151)], PAD),
    # a compressed body that happens to hold the plain magic is not split there (its total size says where it ends)
    ("v3 body holding a magic", [ccob(3, b"\x28\xb5" + offload.PLAIN + b"\x01" * 8), plain(HOST, GFX1151)], PAD),
]


@pytest.mark.parametrize("name,bundles,pad", SPLITS, ids=[s[0] for s in SPLITS])
def test_split_bundles(name, bundles, pad):
    section = pad.join(bundles) + pad
    assert offload.split_bundles(section) == bundles


def test_split_bundles_of_nothing():
    assert offload.split_bundles(b"\0" * 64) == []


TARGETS = [
    ([HOST, GFX1151, ""], {"gfx1151"}),
    ([HOST, "hipv4-amdgcn-amd-amdhsa--gfx1151", "hipv4-amdgcn-amd-amdhsa--gfx1100"], {"gfx1151", "gfx1100"}),
    (["hip-amdgcn-amd-amdhsa--gfx90a:xnack+"], {"gfx90a:xnack+"}),
    ([HOST], set()),
    (["openmp-nvptx64-nvidia-cuda-sm_90"], {"openmp-nvptx64-nvidia-cuda-sm_90"}),  # unknown form: kept, so refused
]


@pytest.mark.parametrize("ids,want", TARGETS)
def test_targets_of(ids, want):
    assert offload.targets_of(ids) == want


PROBLEMS = [
    ({"gfx1151"}, ["gfx1151"], None),
    ({"gfx1100"}, ["gfx1151"], "bin/x: offload targets gfx1100 (carries gfx1100; lacks gfx1151), declared gfx1151"),
    ({"gfx1151", "gfx1100"}, ["gfx1151"], "bin/x: offload targets gfx1100, gfx1151 (carries gfx1100), declared gfx1151"),
    (set(), ["gfx1151"], "bin/x: offload targets none (lacks gfx1151), declared gfx1151"),
]


@pytest.mark.parametrize("found,declared,want", PROBLEMS)
def test_problem(found, declared, want):
    assert offload.problem("bin/x", found, declared) == want


# --- real: HIP compiled in the pinned root ---------------------------------------------------------------------------

KERNEL_A = """#include <hip/hip_runtime.h>
__global__ void add(float *x, float y) { x[threadIdx.x] += y; }
int launch(float *x) { hipLaunchKernelGGL(add, dim3(1), dim3(32), 0, 0, x, 1.0f);
                       return hipDeviceSynchronize() == hipSuccess ? 0 : 1; }
"""
KERNEL_B = """#include <hip/hip_runtime.h>
#include <cstdio>
int launch(float *x);
__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f; }
int main() { float *d = nullptr;
             if (hipMalloc(&d, 128) != hipSuccess) { std::puts("no device"); return 0; }
             hipLaunchKernelGGL(scale, dim3(1), dim3(32), 0, 0, d); return launch(d); }
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny (gfx1151: a.hip by hipcc, b.hip by clang++-22 -x hip with a compressed bundle) and tiny-gfx1100, built in
    the root; tiny runs there without a GPU (the HIP runtime loads, finds no device)."""
    root = strix_root()
    d = tmp_path_factory.mktemp("tiny")
    (d / "a.hip").write_text(KERNEL_A)
    (d / "b.hip").write_text(KERNEL_B)
    (d / "gfx1151").mkdir()
    (d / "gfx1100").mkdir()
    script = ("hipcc --offload-arch=gfx1151 -c a.hip -o a.o && "
              "clang++-22 -x hip --offload-arch=gfx1151 --offload-compress -c b.hip -o b.o && "
              "hipcc --offload-arch=gfx1151 a.o b.o -o gfx1151/tiny && "
              "hipcc --offload-arch=gfx1100 a.hip b.hip -o gfx1100/tiny && ./gfx1151/tiny")
    proc, _ = root.run(["sh", "-c", script], cwd=d, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "no device"
    return root, d


def _run(root):
    return stage.offload_runner(root.root)


def test_a_gfx1151_program_lists_gfx1151(tiny):
    root, d = tiny
    (f,) = offload.check_tree(d / "gfx1151", ["gfx1151"], _run(root))
    assert (f.rel, f.targets, f.bundles) == ("tiny", ("gfx1151",), 2)
    assert [p[:4] for p in offload.split_bundles(offload.fatbin(d / "gfx1151/tiny"))] == [b"__CL", b"CCOB"]


def test_a_gfx1100_program_is_refused_in_one_line(tiny):
    root, d = tiny
    with pytest.raises(offload.OffloadError) as exc:
        offload.check_tree(d / "gfx1100", ["gfx1151"], _run(root))
    assert str(exc.value) == "tiny: offload targets gfx1100 (carries gfx1100; lacks gfx1151), declared gfx1151"


def test_no_device_code_at_all_is_refused(tiny, tmp_path):
    root, _ = tiny
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "readme").write_text("not a program")
    with pytest.raises(offload.OffloadError, match=r"^no shipped file carries device code \(\.hip_fatbin\), "
                                                    r"declared gfx1151$"):
        offload.check_tree(tmp_path, ["gfx1151"], _run(root))


def _stage_data(tmp_path: Path, root, targets) -> StageData:
    return StageData(variant="tiny", package="onebit-tiny", stage_root="", stage_tmp="", tmp_prefix="",
                           prefix="", root="", keep=(), binaries={}, links={}, backend=None, manifest_entry=None,
                           build_dir=str(tmp_path), home="", tests=(), test_values={}, where="recipes/tiny.yaml",
                           offload_targets=tuple(targets), build_root=root.root)


def test_the_stage_step_records_or_refuses(tiny, tmp_path):
    import json

    root, d = tiny
    lines: list[str] = []
    assert stage.check_offload(_stage_data(tmp_path, root, ["gfx1151"]), d / "gfx1151", tmp_path / "w",
                               lines.append) == ["gfx1151"]
    assert json.loads((tmp_path / stage.OFFLOAD_NOTES).read_text()) == {"offload_targets": ["gfx1151"]}
    assert lines == ["offload targets of tiny (clang-offload-bundler of build root strix-sid): tiny gfx1151"]
    with pytest.raises(StageError) as exc:
        stage.check_offload(_stage_data(tmp_path, root, ["gfx1151"]), d / "gfx1100", tmp_path / "w", lines.append)
    assert exc.value.args[0] == ("tiny: offload check failed: tiny: offload targets gfx1100 (carries gfx1100; lacks "
                                 "gfx1151), declared gfx1151")


def test_a_hostile_fatbin_beside_a_real_program_fails_the_stage_in_one_line(tiny, tmp_path):
    """The stage's check with the root's own clang-offload-bundler: the real program lists gfx1151, and a library
    whose .hip_fatbin holds a compressed bundle declaring a total size of 0 (an endless loop before) is named."""
    import shutil

    from test_offload_parser import V2, elf_with_fatbin

    root, d = tiny
    base = tmp_path / "staged"
    (base / "bin").mkdir(parents=True)
    shutil.copy2(d / "gfx1151" / "tiny", base / "bin" / "tiny")
    assert stage.check_offload(_stage_data(tmp_path, root, ["gfx1151"]), base, tmp_path / "w", print) == ["gfx1151"]
    elf_with_fatbin(base / "lib" / "libhostile.so", V2[:8] + struct.pack("<I", 0) + V2[12:])
    with pytest.raises(StageError) as exc:
        stage.check_offload(_stage_data(tmp_path, root, ["gfx1151"]), base, tmp_path / "w", print)
    assert exc.value.args[0] == ("tiny: offload check failed: lib/libhostile.so: malformed .hip_fatbin: the version 2 "
                                 "compressed bundle at byte 0 declares 0 bytes, less than its own 24-byte header")
