"""The no-op re-run of a whole nox build session against its cold run, as a user types it (issue 29: a no-op is a no-op).

    python3 bench/bench_noop.py [--runs 3] [--cold] [--cold-seconds S] [-- ARGS...]

ARGS default to `-s build-strix -- --only ds4-rocm --only xdna --only serve`. The no-op is that command re-run in this
checkout with nothing changed (after one run that brings it up to date, not counted): nox reuses its venv without pip
(noxfile.py `install_project`), every step is cached, the install finds the prefix as it is, and `1bit check` runs.
--cold times the same command once in a fresh clone of this checkout whose caches (XDG_CACHE_HOME: the onebit cache,
ccache, pip, nox's venvs) start empty; --cold-seconds takes a cold time measured before (a cold run is tens of
minutes). Prints each run's wall seconds, the median no-op and its share of the cold run (goal <= 1%).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["-s", "build-strix", "--", "--only", "ds4-rocm", "--only", "xdna", "--only", "serve"]


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_noop: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="time a cold run in a fresh clone with empty caches")
    ap.add_argument("--cold-seconds", type=float, help="a cold run's time measured before")
    ap.add_argument("args", nargs="*", help="nox's arguments (after --)")
    a = ap.parse_args()
    args = a.args or DEFAULT
    nox = [sys.executable, "scripts/nox.py", *args]
    cold = a.cold_seconds
    if a.cold:
        with tempfile.TemporaryDirectory(prefix="bench-noop-") as tmp:
            clone = Path(tmp) / "clone"
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
            env = {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / "cache")}
            env.pop("ONEBIT_CACHE", None)
            env.pop("CCACHE_DIR", None)
            cold = timed(nox, clone, env)
            print(f"cold   {cold:8.1f} s  (fresh clone, empty caches)")
    timed(nox, ROOT)  # up to date first, not counted
    runs = [timed(nox, ROOT) for _ in range(a.runs)]
    for i, t in enumerate(runs, 1):
        print(f"no-op  {t:8.1f} s  (run {i})")
    median = statistics.median(runs)
    print(f"no-op median {median:.1f} s" + (f" = {100 * median / cold:.2f}% of the cold run ({cold:.0f} s); goal <= 1%"
                                             if cold else ""))


if __name__ == "__main__":
    main()
