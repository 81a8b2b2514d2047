"""llama-bench of the cpu recipe's build with ggml's own thread pool (GGML_OPENMP OFF, the recipe) against OpenMP
(`--set cpu.GGML_OPENMP=ON`, upstream's default), side by side in one run on one model:

    python bench/bench_openmp.py [--model M.gguf] [--threads N] [--reps R] [--cache ~/.cache/onebit]

Both are built by the project's own build step (fetch, patch, cmake exactly as `1bit-build build cpu` runs it, ccache
on), each in a work dir of its own, and benchmarked from their build trees (the stage's floor gate is not the
question here). Without --model the tests' tiny llama model (tests/tiny_gguf.py) is used: a 2-layer, 64-wide network,
so the figures measure the threads' hand-off per graph far more than arithmetic; pass a real model for that.
Prints pp and tg tokens/s of each and the ratio thread pool / OpenMP (why the recipe dropped OpenMP: docs/portability.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from builders.project import config  # noqa: E402
from builders.inputs import host  # noqa: E402
from builders.execute import Executor  # noqa: E402
from builders.plan import all_tools, make_plan  # noqa: E402
from builders.plan_types import Layout  # noqa: E402


def build(base: Path, cache: Path, overrides: dict) -> Path:
    """The cpu variant's fetch, source and build steps (nothing after): its build tree's bin/."""
    project = config.load_project(ROOT)
    facts = host.gather(all_tools(project, "cpu"))
    plan = make_plan(project, "cpu", facts, Layout(ROOT, cache, base / "work", base / "out"), only={"cpu"},
                     overrides=overrides)
    keep = [s for s in plan.steps if s.action in ("fetch", "source", "build")]
    Executor(replace(plan, steps=keep), project).run()
    return Path(plan.step("build:cpu").data.build_dir) / "bin"


def bench(bin_dir: Path, model: Path, threads: int, reps: int) -> dict[str, float]:
    # the build tree keeps its libraries beside the programs (the installed RUNPATH $ORIGIN/../lib is the stage's)
    env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
    proc = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(model), "-p", "128", "-n", "32", "-t", str(threads),
                           "-r", str(reps), "-o", "json"], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench: llama-bench of {bin_dir} exited {proc.returncode}: {proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="a GGUF model (default: the tests' tiny llama model)")
    ap.add_argument("--n-embd", type=int, default=64, help="the generated model's width (tiny_gguf's default 64)")
    ap.add_argument("--n-layer", type=int, default=2, help="the generated model's layers (tiny_gguf's default 2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("ONEBIT_CACHE", Path.home() / ".cache" / "onebit")),
                    help="the fetch cache to take the pinned llama.cpp from")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="onebit-bench-openmp-") as tmp:
        base = Path(tmp)
        model = args.model
        if model is None:
            from tiny_gguf import write_tiny_gguf

            model = write_tiny_gguf(base / f"tiny-{args.n_embd}x{args.n_layer}.gguf", n_embd=args.n_embd,
                                    n_layer=args.n_layer, n_ff=2 * args.n_embd)
        pool = build(base / "pool", args.cache, {})
        omp = build(base / "openmp", args.cache, {"cpu": {"GGML_OPENMP": "ON"}})
        # one after the other, alternating, so that a change of the machine's load falls on both
        a1, b1 = bench(pool, model, args.threads, args.reps), bench(omp, model, args.threads, args.reps)
        b2, a2 = bench(omp, model, args.threads, args.reps), bench(pool, model, args.threads, args.reps)
    for kind in ("pp", "tg"):
        p, o = (a1[kind] + a2[kind]) / 2, (b1[kind] + b2[kind]) / 2
        print(f"{kind}: thread pool {p:10.1f} t/s   OpenMP {o:10.1f} t/s   pool / OpenMP {p / o:6.2f}x"
              f"   (runs: {a1[kind]:.1f}, {a2[kind]:.1f} / {b1[kind]:.1f}, {b2[kind]:.1f})")
    print(f"model {model.name}, {args.threads} thread(s), llama-bench -p 128 -n 32 -r {args.reps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
