"""Test-only: a pinned commit's tree exported from a git mirror that may be a partial clone (`../shared/mirrors/`),
for the Strix compile tests until the fetch step's mirror directory lands. Every blob present is written (verified
by git against the commit's tree, which names its id); the absent ones (a partial clone's promisor blobs) are
returned, never fetched (GIT_NO_LAZY_FETCH=1), so a test can assert that none of them is a build input."""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

ENV = {**os.environ, "GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}


def export_tree(mirror: Path, commit: str, dest: Path) -> list[str]:
    """Write commit's tree into dest (created); return the paths whose blobs the mirror lacks."""
    git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "--git-dir", str(mirror)]
    out = subprocess.run([*git, "ls-tree", "-r", "-z", "--full-tree", commit], capture_output=True, check=True,
                         env=ENV).stdout
    entries = []
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        mode, kind, oid = meta.split()
        entries.append((mode.decode(), kind.decode(), oid.decode(), path.decode()))
    blobs = [e for e in entries if e[1] == "blob"]
    listed = subprocess.run([*git, "rev-list", "--objects", "--no-walk", "--missing=print", commit], capture_output=True, text=True,
                            check=True, env=ENV).stdout.splitlines()
    missing = {line[1:].split()[0] for line in listed if line.startswith("?")}
    present = [e for e in blobs if e[2] not in missing]
    absent = sorted(e[3] for e in blobs if e[2] in missing)
    proc = subprocess.Popen([*git, "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV)
    def feed() -> None:  # in its own thread: git answers while it reads, and both pipes have a bounded buffer
        proc.stdin.write("".join(f"{e[2]}\n" for e in present).encode())
        proc.stdin.close()

    writer = threading.Thread(target=feed)
    writer.start()
    for mode, _, oid, path in present:
        header = proc.stdout.readline().split()
        assert header[0].decode() == oid, (header, oid)
        data = proc.stdout.read(int(header[2]))
        proc.stdout.read(1)
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            target.symlink_to(data.decode())
        else:
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
    writer.join()
    if proc.wait() != 0:
        raise RuntimeError(f"git cat-file --batch failed in {mirror}")
    return absent
