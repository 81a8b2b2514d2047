"""digest: a file's sha256, read in chunks: serve's Laya checkpoint check and the build side's keys and checks (which
may import onebit; onebit never imports builders) read a file's digest this one way."""
from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
