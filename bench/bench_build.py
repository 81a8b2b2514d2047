"""Builder overhead and the no-op rebuild, measured side by side in one run on the same machine.

    python bench/bench_build.py [--variant cpu]

Three measurements of the same variant, ccache disabled for all of them so the compiler does the same work:
  bare     cmake -S src -B build -G Ninja <the recipe's options> && cmake --build build   (no builder at all)
  cold     1bit-build's whole pipeline for the bundle from an empty cache and work dir
           (pip download of the sdist, fetch, patch, configure, build, stage, package, channel, tarball, checksums)
  no-op    the same pipeline again with nothing changed
Goals: no-op <= 1% of cold; builder overhead (cold - bare) / bare <= 3%.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builders.project import config  # noqa: E402
from builders.inputs import host  # noqa: E402
from builders.execute import Executor  # noqa: E402
from builders.plan import all_tools, make_plan  # noqa: E402
from builders.plan_types import Layout  # noqa: E402


def pipeline(base: Path, bundle: str, only: set[str] | None):
    project = config.load_project(ROOT)
    facts = host.gather(all_tools(project, bundle))
    plan = make_plan(project, bundle, facts, Layout(ROOT, base / "cache", base / "work", base / "out"), only=only)
    t = time.monotonic()
    report = Executor(plan, project).run()
    return time.monotonic() - t, plan, report


def bare(plan, variant: str, base: Path) -> float:
    """The same configure+build commands the plan holds, run by hand on a plain checkout of the patched source."""
    build = plan.step(f"build:{variant}")
    source = next(s for s in plan.steps if s.action == "source")
    src = Path(source.data.dir)
    copy = base / "bare-src"
    for cmd in source.commands:  # git worktree add + git apply, into our own directory
        subprocess.run([a.replace(str(src), str(copy)) for a in cmd.argv], check=True, capture_output=True)
    out = base / "bare-build"
    t = time.monotonic()
    for cmd in build.commands:
        argv = [a.replace(str(src), str(copy)).replace(build.data.build_dir, str(out)) for a in cmd.argv]
        argv = [a for a in argv if "COMPILER_LAUNCHER" not in a]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **dict(cmd.env)})
    return time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="cpu")
    ap.add_argument("--bundle", default="cpu")
    args = ap.parse_args()
    os.environ["CCACHE_DISABLE"] = "1"
    with tempfile.TemporaryDirectory(prefix="onebit-bench-") as tmp:
        base = Path(tmp)
        only = {args.variant}
        # fetch once so the bare build has a checkout; the bare build runs first, then the builder from scratch
        project = config.load_project(ROOT)
        facts = host.gather(all_tools(project, args.bundle))
        warm = make_plan(project, args.bundle, facts, Layout(ROOT, base / "w" / "cache", base / "w" / "work", base / "w" / "out"),
                         only=only)
        full = list(warm.steps)
        warm.steps = [s for s in full if s.action in ("fetch", "source")]
        Executor(warm, project).run()
        warm.steps = full
        bare_s = bare(warm, args.variant, base)
        cold, plan, report = pipeline(base / "b", args.bundle, only)
        noop, _, again = pipeline(base / "b", args.bundle, only)
        assert again.ran == [], again.ran
    print(f"\n{'measurement':<32}{'seconds':>10}")
    print(f"{'bare cmake && ninja':<32}{bare_s:>10.2f}")
    print(f"{'1bit-build cold (whole bundle)':<32}{cold:>10.2f}")
    print(f"{'1bit-build no-op rebuild':<32}{noop:>10.3f}")
    print(f"\nno-op / cold          = {noop / cold:.4%}   (goal <= 1%)")
    build_s = report.seconds[f"build:{args.variant}"]
    print(f"builder overhead      = {(cold - bare_s) / bare_s:+.2%}   (whole pipeline incl. download and packaging; goal <= 3%)")
    print(f"build step vs bare    = {(build_s - bare_s) / bare_s:+.2%}   (the same configure+build under the builder)")
    steps = sorted(report.seconds.items(), key=lambda kv: -kv[1])[:6]
    print("slowest steps: " + ", ".join(f"{k} {v:.1f}s" for k, v in steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
