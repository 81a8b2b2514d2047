"""Fuzz the GGUF inspector with mutations of small valid files written by the gguf library.

Mutations: truncations, flipped bytes, huge length/count fields, overwritten type tags, splices of two files,
inserted and deleted runs. Allowed outcomes: a normal return, or a ModelError whose message is one line. Nothing
may be printed, and no warning (the gguf library's numpy RuntimeWarnings included) may escape inspect_model.

The default run is short (ONEBIT_FUZZ_N, 2000); `nox -s fuzz` runs 100,000 and prints the counts.
ONEBIT_FUZZ_SEED picks another sequence; a failure names the input index, which regenerates it exactly.
"""

from __future__ import annotations

import collections
import os
import random
import re
import struct
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from tiny_gguf import write_tiny_gguf

from onebit.errors import ModelError
from onebit.inspect import inspect_model

N = int(os.environ.get("ONEBIT_FUZZ_N", "2000"))
SEED = int(os.environ.get("ONEBIT_FUZZ_SEED", "10"))
HUGE = (2**63 - 1, 2**64 - 1, 2**63, 2**32, 2**32 - 1, 2**31, 0xFFFFFFFF_FFFFFFF0, 1 << 40)


def _small(path: Path, variant: int) -> Path:
    """A small valid GGUF: a few keys of every kind (the stamp included) and one or two small tensors."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.expert_count", 4 if variant % 2 else 0)
    if variant % 3 != 2:
        w.add_uint32("onebit.hadamard_q4_0", 32)
    w.add_uint32("dflash.block_size", 16)
    w.add_file_type(2 if variant % 2 else 0)
    w.add_string("general.name", "fuzz-" + "x" * variant)
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    if variant % 2:
        w.add_tensor("output.weight", np.ones((2, 8), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> list[bytes]:
    d = tmp_path_factory.mktemp("seeds")
    out = [_small(d / f"s{v}.gguf", v).read_bytes() for v in range(4)]
    out.append(write_tiny_gguf(d / "tiny.gguf", experts=4, hadamard=32).read_bytes())
    for s in out:
        assert s[:4] == b"GGUF"
    return out


def _length_positions(data: bytes) -> list[int]:
    """Offsets of the u64 fields a parser trusts: tensor and KV counts, and the length before each ASCII key/string."""
    pos = [8, 16]
    for m in re.finditer(rb"[a-z_]+(\.[a-z0-9_]+)+", data[:4096]):
        if m.start() >= 8:
            pos.append(m.start() - 8)
    return pos


def mutate(rng: random.Random, seeds: list[bytes]) -> tuple[str, bytes]:
    base = rng.choice(seeds[:-1]) if rng.random() < 0.9 else seeds[-1]
    kind = rng.choice(("truncate", "flip", "huge", "type", "splice", "insert", "delete", "multi"))
    data = bytearray(base or b"GGUF")
    positions = [i for i in _length_positions(bytes(data)) if i + 8 <= len(data)]
    if kind in ("huge", "type") and len(positions) < 3:
        kind = "flip"
    if kind == "truncate":
        return kind, bytes(data[: rng.randrange(0, len(data))])
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return kind, bytes(data)
    if kind == "huge":
        i = rng.choice(positions)
        data[i: i + 8] = struct.pack("<Q", rng.choice(HUGE) - rng.randrange(0, 4))
        return kind, bytes(data)
    if kind == "type":  # the u32 after a key is its value type: make it another, or an unknown one
        i = rng.choice(positions[2:])
        n = struct.unpack_from("<Q", data, i)[0]
        t = i + 8 + n
        if t + 4 <= len(data):
            data[t: t + 4] = struct.pack("<I", rng.choice((*range(13), 13, 255, 2**31, 2**32 - 1)))
        return kind, bytes(data)
    if kind == "splice":
        other = rng.choice(seeds) or b"GGUF"
        return kind, bytes(data[: rng.randrange(len(data))] + other[rng.randrange(len(other)):])
    if kind == "insert":
        i = rng.randrange(len(data))
        return kind, bytes(data[:i] + os.urandom(rng.randint(1, 16)) + data[i:])
    if kind == "delete":
        i = rng.randrange(len(data))
        return kind, bytes(data[:i] + data[i + rng.randint(1, 16):])
    for _ in range(rng.randint(2, 4)):  # multi: several of the above, stacked
        _, data = mutate(rng, [bytes(data)] * 2)
        data = bytearray(data) or bytearray(b"GGUF")
    return kind, bytes(data)


def fuzz(n: int, seed: int, seeds: list[bytes], path: Path) -> tuple[collections.Counter, collections.Counter]:
    outcomes: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        kind, data = mutate(rng, seeds)
        path.write_bytes(data)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning that escapes inspect_model fails the input
            try:
                inspect_model(path)
            except ModelError as e:
                msg = str(e)
                assert msg and msg.isprintable(), (i, kind, msg)  # one line, no control characters
                outcomes[f"{kind}: ModelError"] += 1
                reasons[re.sub(r"\d+", "N", msg.replace(str(path), "F"))[:90]] += 1
                continue
            except Exception as e:
                raise AssertionError(f"input {i} (seed {seed}, {kind}): {type(e).__name__}: {e}") from e
        outcomes[f"{kind}: returned"] += 1
    return outcomes, reasons


def test_fuzz_inspector(seeds, tmp_path, capfd):
    outcomes, reasons = fuzz(N, SEED, seeds, tmp_path / "m.gguf")
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # nothing printed (warnings, logging) by the library
    assert sum(outcomes.values()) == N
    with capfd.disabled():
        print(f"\nfuzz: {N} inputs (seed {SEED})")
        for k, v in sorted(outcomes.items()):
            print(f"  {v:7d}  {k}")
        print("  most frequent errors:")
        for k, v in reasons.most_common(12):
            print(f"  {v:7d}  {k}")


def test_inspector_warnings_stay_inside(seeds, tmp_path, capfd):
    """Inputs that make gguf's numpy code warn: inspect_model returns or refuses, and the warning never shows."""
    rng = random.Random(1)
    path = tmp_path / "m.gguf"
    seen = 0
    for _ in range(300):
        _, data = mutate(rng, seeds)
        path.write_bytes(data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                inspect_model(path)
            except ModelError:
                pass
        assert [str(w.message) for w in caught] == []
        seen += 1
    assert capfd.readouterr() == ("", "")
    assert seen == 300
