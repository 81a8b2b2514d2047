"""Fuzz the offload parser (builders/ship/offload.py `split_bundles`, which the stage runs on every shipped .hip_fatbin)
with mutations of real bundles: no exception but MalformedBundle, no hang, bounded memory.

The seeds are real (tests/offload_bundles/): `plain.bundle` is the clang offload bundle hipcc 22 wrote for a one-kernel
gfx1151 object in the Strix build root (host entry + code object, 7,920 bytes); `v2.ccob` and `v3.ccob` are that
bundle compressed by the root's clang-offload-bundler --compress (COMPRESSED_BUNDLE_FORMAT_VERSION=2 and 3); `v1.ccob`
is v2 rewritten in the version-1 layout (no total size), which the same bundler lists. Sections are single bundles and
bundles packed as the linker packs them (zero padding between). Mutations: truncations, bit flips, huge and zero
values in every header field of the first bundle (entry count, offsets, sizes, id lengths, versions, total sizes),
splices, inserted and deleted runs, and several of those stacked.

What each input MUST give is decided from the mutation alone, never from the parser: a cut inside the first bundle's
header or data, a huge count/offset/size/id length/total size, a zero offset or total size, an unknown version must be
refused; a cut before any whole magic gives no bundle; an unchanged seed gives exactly its bundles. Anything else may
give either, but a result is always non-empty slices of the section, each at a magic, in order, not overlapping.

The whole run happens in a child process under RLIMIT_AS (512 MiB: no allocation follows a declared size) and a
timeout (a case that spins fails the test instead of hanging it). ONEBIT_FUZZ_N sets the count (default 100,000, a
few seconds), ONEBIT_FUZZ_SEED the sequence; a failure names the input's index, which regenerates it exactly.
"""
from __future__ import annotations

import collections
import json
import os
import random
import resource
import struct
import subprocess
import sys
from pathlib import Path

N = int(os.environ.get("ONEBIT_FUZZ_N", "100000"))
SEED = int(os.environ.get("ONEBIT_FUZZ_SEED", "27"))
MEMORY = 512 << 20  # RLIMIT_AS of the child
BUNDLES = Path(__file__).resolve().parent / "offload_bundles"
PLAIN_MAGIC, CCOB_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__", b"CCOB"
HUGE = {8: (2**64 - 1, 2**63, 2**62, 2**63 - 1, 2**32, 1 << 40), 4: (2**32 - 1, 2**31, 2**31 - 1), 2: (0xFFFF, 0x8000, 4, 255)}
# header fields whose huge value leaves the section (or names no version), and whose zero no compiler writes
REFUSED_IF_HUGE = {"count", "offset", "size", "id length", "total", "version"}
REFUSED_IF_ZERO = {"offset", "total", "version"}


def seeds() -> dict[str, tuple[bytes, list[bytes]]]:
    """name -> (section, the bundles it holds)."""
    b = {name: (BUNDLES / name).read_bytes() for name in ("plain.bundle", "v1.ccob", "v2.ccob", "v3.ccob")}
    plain, v1, v2, v3 = b["plain.bundle"], b["v1.ccob"], b["v2.ccob"], b["v3.ccob"]
    pad = b"\0" * (8192 - len(plain))
    return {"plain": (plain, [plain]), "v1": (v1, [v1]), "v2": (v2, [v2]), "v3": (v3, [v3]),
            "plain+v3": (plain + pad + v3, [plain, v3]), "v2+plain": (v2 + b"\0" * 12 + plain, [v2, plain]),
            "v1+v3": (v1 + v3, [v1, v3]), "v3+v2+v1": (v3 + b"\0" * 4 + v2 + v1, [v3, v2, v1])}


def fields(bundle: bytes) -> list[tuple[str, int, int]]:
    """(name, position, width) of every header field of a well-formed bundle at the start of a section."""
    if bundle.startswith(PLAIN_MAGIC):
        out, at = [("count", 24, 8)], 32
        for _ in range(struct.unpack_from("<Q", bundle, 24)[0]):
            id_len = struct.unpack_from("<Q", bundle, at + 16)[0]
            out += [("offset", at, 8), ("size", at + 8, 8), ("id length", at + 16, 8)]
            at += 24 + id_len
        return out
    version = struct.unpack_from("<H", bundle, 4)[0]
    head = [("version", 4, 2), ("method", 6, 2)]
    if version == 1:
        return head + [("uncompressed", 8, 4), ("hash", 12, 8)]
    if version == 2:
        return head + [("total", 8, 4), ("uncompressed", 12, 4), ("hash", 16, 8)]
    return head + [("total", 8, 8), ("uncompressed", 16, 8), ("hash", 24, 8)]


def header_size(bundle: bytes) -> int:
    """Where a cut stops refusing a version-1 bundle (it runs to the section's end)."""
    return 20 if bundle.startswith(CCOB_MAGIC) and struct.unpack_from("<H", bundle, 4)[0] == 1 else len(bundle)


def mutate(rng: random.Random, pool: dict[str, tuple[bytes, list[bytes]]], depth: int = 0) -> tuple[str, bytes, str]:
    """(kind, bytes, what it must give: "refused", "nothing" or ""), decided from the mutation alone."""
    name = rng.choice(sorted(pool))
    section, bundles = pool[name]
    first = bundles[0] if bundles else b""
    data = bytearray(section)
    kind = rng.choice(("truncate", "flip", "huge", "zero", "splice", "insert", "delete", "multi"))
    if kind in ("huge", "zero") and not first:
        kind = "flip"
    if kind == "truncate":
        cut = rng.randrange(0, len(data)) if rng.random() < 0.7 else rng.randrange(0, min(len(data), 64))
        need = ""
        if first and section.startswith(first):
            if cut < 4 or (first.startswith(PLAIN_MAGIC) and cut < len(PLAIN_MAGIC)):
                need = "nothing"  # not one whole magic left
            elif cut < header_size(first):
                need = "refused"  # cut inside the first bundle's header or data
        return kind, bytes(data[:cut]), need
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data)) if rng.random() < 0.5 else rng.randrange(min(len(data), 160))
            data[i] ^= 1 << rng.randrange(8)
        return kind, bytes(data), ""
    if kind in ("huge", "zero"):
        field, at, width = rng.choice(fields(first))
        value = rng.choice(HUGE[width]) if kind == "huge" else 0
        data[at: at + width] = value.to_bytes(width, "little")
        refused = field in (REFUSED_IF_HUGE if kind == "huge" else REFUSED_IF_ZERO)
        return f"{kind} {field}", bytes(data), "refused" if refused and depth == 0 else ""
    if kind == "splice":
        other = pool[rng.choice(sorted(pool))][0]
        return kind, bytes(data[: rng.randrange(len(data))] + other[rng.randrange(len(other)):]), ""
    if kind == "insert":
        i = rng.randrange(len(data))
        junk = rng.choice((PLAIN_MAGIC, CCOB_MAGIC, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 16)))))
        return kind, bytes(data[:i] + junk + data[i:]), ""
    if kind == "delete":
        i = rng.randrange(len(data))
        return kind, bytes(data[:i] + data[i + rng.randint(1, 64):]), ""
    for _ in range(rng.randint(2, 4)):  # multi: several of the above, stacked
        _, out, _ = mutate(rng, {"m": (bytes(data), [])}, depth + 1)
        data = bytearray(out) or bytearray(CCOB_MAGIC)
    return kind, bytes(data), ""


def check_result(section: bytes, parts: list[bytes]) -> str | None:
    """Why a returned split is impossible (None: it is a split of the section)."""
    at = 0
    for p in parts:
        if not isinstance(p, bytes) or not p.startswith((PLAIN_MAGIC, CCOB_MAGIC)):
            return "a part that is not a bundle"
        i = section.find(p, at)
        if i < 0:
            return "parts that are not in order, overlap, or are not in the section"
        at = i + len(p)
    return None


def fuzz(n: int, seed: int) -> dict:
    """Run n cases; raises AssertionError naming the first input that breaks a rule."""
    from builders.ship import offload

    pool = seeds()
    exact = {section: bundles for section, bundles in pool.values()}
    outcomes: collections.Counter = collections.Counter()
    classes: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for i in range(n):
        kind, data, need = mutate(random.Random(seed * 1_000_003 + i), pool)
        if data in exact:
            need = "exact"
        where = f"input {i} (seed {seed}, {kind}, must give {need or 'any'})"
        try:
            parts = offload.split_bundles(data)
        except offload.MalformedBundle as exc:
            msg = str(exc)
            assert msg and msg.isprintable(), (where, msg)
            assert need in ("refused", ""), (where, msg)
            outcomes[f"{kind.split()[0]}: refused"] += 1
            classes[f"{need or 'any'} -> refused"] += 1
            reasons[" ".join(w if not w.isdigit() else "N" for w in msg.split())[:80]] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - any other exception is the failure this fuzz looks for
            raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
        assert need not in ("refused",), (where, [len(p) for p in parts])
        if need == "nothing":
            assert parts == [], where
        elif need == "exact":
            assert parts == exact[data], where
        why = check_result(data, parts)
        assert why is None, (where, why)
        outcomes[f"{kind.split()[0]}: returned"] += 1
        classes[f"{need or 'any'} -> returned"] += 1
    return {"outcomes": dict(outcomes), "classes": dict(classes), "reasons": dict(reasons.most_common(12))}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def test_the_seeds_split_as_they_were_made():
    from builders.ship import offload

    for name, (section, bundles) in seeds().items():
        assert offload.split_bundles(section) == bundles, name


def test_fuzz_split_bundles():
    proc = subprocess.run([sys.executable, __file__, str(N), str(SEED)], capture_output=True, text=True, timeout=600,
                          preexec_fn=_limited)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout)
    classes = got["classes"]
    assert sum(classes.values()) == N
    # what must be refused was, what must split did, and the run made every kind of input it claims to
    assert not {k for k in classes if k in ("refused -> returned", "nothing -> refused", "exact -> refused")}
    assert classes["refused -> refused"] > N // 20 and classes["nothing -> returned"] > 0
    assert classes["exact -> returned"] > 0 and classes["any -> returned"] > 0 and classes["any -> refused"] > 0
    for kind in ("truncate", "flip", "huge", "zero", "splice", "insert", "delete", "multi"):
        assert got["outcomes"].get(f"{kind}: refused", 0) + got["outcomes"].get(f"{kind}: returned", 0) > 0, kind
    print(f"\noffload fuzz: {N} inputs (seed {SEED}), in a child under RLIMIT_AS {MEMORY >> 20} MiB")
    for k, v in sorted(classes.items()):
        print(f"  {v:7d}  {k}")
    for k, v in got["reasons"].items():
        print(f"  {v:7d}  {k}")


if __name__ == "__main__":  # the child: python tests/test_fuzz_offload.py N SEED
    print(json.dumps(fuzz(int(sys.argv[1]), int(sys.argv[2]))))
