"""Two build-time ratios, each measured side by side in one run with its own empty ccache:

    python bench/bench_rebuild.py patch  [--variant cpu] [--bundle cpu]
    python bench/bench_rebuild.py bundle [--bundle vulkan] [--longest vulkan]

patch   the rebuild after one changed patch, as a share of the cold build (goal <= 15% with ccache). The patch is
        our 0001 with one more comment line in its hunk: the checkout is reset and re-patched in place, so ninja
        recompiles what the patch touches and relinks what depends on it.
bundle  the cold build of a whole bundle (e.g. cpu + vulkan + serve) against the cold build of its longest variant
        alone (goal <= 1.3x). Both variants come from one checkout of one commit and share the compiler cache.
"""
from __future__ import annotations

import argparse
import os
import shutil
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


CACHE: Path | None = None  # the fetch cache (sources, wheels): shared, so a machine without network can run this


def build(root: Path, base: Path, bundle: str, only: set[str] | None) -> tuple[float, object]:
    project = config.load_project(root)
    facts = host.gather(all_tools(project, bundle))
    # a fresh work dir and step stamps of their own: every build step here is cold unless the bench says otherwise
    plan = make_plan(project, bundle, facts, Layout(root, CACHE or base / "cache", base / "work", base / "out"), only=only)
    t = time.monotonic()
    report = Executor(plan, project).run()
    return time.monotonic() - t, report


def project_copy(base: Path) -> Path:
    """A copy of the project's declarative inputs, so the bench may edit a patch without touching the checkout."""
    root = base / "project"
    root.mkdir(parents=True)
    for name in ("pins.yaml", "recipes", "bundles", "schemas", "onebit", "builders"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / name)
    return root


def bench_patch(args, base: Path) -> None:
    root = project_copy(base)
    only = {args.variant, "serve"}
    cold, _ = build(root, base, args.bundle, only)
    patch = root / "recipes" / "patches" / "llama.cpp" / "0001-ggml-find-backends-in-exe-lib.patch"
    patch.write_text(refreshed(patch.read_text()))
    rebuild, report = build(root, base, args.bundle, only)
    ran = [s for s in report.ran if s.startswith(("source:", "build:"))]
    print(f"cold build of {args.variant} (+serve)          {cold:8.1f} s")
    print(f"rebuild after one changed patch       {rebuild:8.1f} s   ({', '.join(ran)})")
    print(f"patch rebuild / cold                  {rebuild / cold:8.1%}   (goal <= 15%)")


def refreshed(text: str) -> str:
    """The patch with one more C++ comment line in its first hunk on a .cpp file (a realistic refresh: the build
    recompiles that file and relinks what depends on it). That hunk's new-line count grows by one."""
    import re

    lines = text.splitlines(keepends=True)
    in_cpp, out, done = False, [], False
    for line in lines:
        if line.startswith("+++ "):
            in_cpp = line.rstrip().endswith(".cpp")
        elif in_cpp and not done and line.startswith("@@ "):
            m = re.match(r"@@ -(\S+) \+(\d+),(\d+) @@(.*)", line, re.S)
            out.append(f"@@ -{m.group(1)} +{m.group(2)},{int(m.group(3)) + 1} @@{m.group(4)}")
            out.append("+// onebit: a refreshed patch (bench)\n")
            done = True
            continue
        out.append(line)
    if not done:
        raise SystemExit("bench: the patch has no hunk on a .cpp file to refresh")
    return "".join(out)


def bench_bundle(args, base: Path) -> None:
    os.environ["CCACHE_DIR"] = str(base / "ccache-longest")
    longest, _ = build(ROOT, base / "longest", args.bundle, {args.longest, "serve"})
    os.environ["CCACHE_DIR"] = str(base / "ccache-bundle")
    whole, report = build(ROOT, base / "whole", args.bundle, None)
    steps = {k: round(v, 1) for k, v in report.seconds.items() if k.startswith("build:")}
    print(f"cold build of {args.longest} alone (+serve)     {longest:8.1f} s")
    print(f"cold build of bundle {args.bundle}            {whole:8.1f} s   {steps}")
    print(f"bundle / longest variant              {whole / longest:8.2f}x   (goal <= 1.3x)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["patch", "bundle"])
    ap.add_argument("--variant", default="cpu")
    ap.add_argument("--bundle")
    ap.add_argument("--longest", default="vulkan")
    ap.add_argument("--cache", type=Path, help="an existing fetch cache to take sources from (e.g. ~/.cache/onebit)")
    args = ap.parse_args()
    global CACHE
    CACHE = args.cache
    args.bundle = args.bundle or ("cpu" if args.what == "patch" else "vulkan")
    with tempfile.TemporaryDirectory(prefix="onebit-bench-") as tmp:
        base = Path(tmp)
        os.environ["CCACHE_DIR"] = str(base / "ccache")  # an empty compiler cache: a cold start
        (bench_patch if args.what == "patch" else bench_bundle)(args, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
