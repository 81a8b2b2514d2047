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

from builders import config, host  # noqa: E402
from builders.execute import Executor  # noqa: E402
from builders.plan import all_tools, make_plan  # noqa: E402
from builders.plan_types import Layout  # noqa: E402


def build(root: Path, base: Path, bundle: str, only: set[str] | None) -> tuple[float, object]:
    project = config.load_project(root)
    facts = host.gather(all_tools(project, bundle))
    plan = make_plan(project, bundle, facts, Layout(root, base / "cache", base / "work", base / "out"), only=only)
    t = time.monotonic()
    report = Executor(plan, project).run()
    return time.monotonic() - t, report


def project_copy(base: Path) -> Path:
    """A copy of the project's declarative inputs, so the bench may edit a patch without touching the checkout."""
    root = base / "project"
    for name in ("pins.yaml", "recipes", "bundles", "schemas", "onebit", "builders"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / name)
    return root


def bench_patch(args, base: Path) -> None:
    root = project_copy(base)
    only = {args.variant, "serve"}
    cold, _ = build(root, base, args.bundle, only)
    patch = root / "recipes" / "patches" / "llama.cpp" / "0001-ggml-find-backends-in-exe-lib.patch"
    text = patch.read_text()
    marker = next(line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++"))
    patch.write_text(_fix_hunk_counts(text.replace(marker, "+// onebit: a refreshed patch (bench)\n" + marker, 1)))
    rebuild, report = build(root, base, args.bundle, only)
    ran = [s for s in report.ran if s.startswith(("source:", "build:"))]
    print(f"cold build of {args.variant} (+serve)          {cold:8.1f} s")
    print(f"rebuild after one changed patch       {rebuild:8.1f} s   ({', '.join(ran)})")
    print(f"patch rebuild / cold                  {rebuild / cold:8.1%}   (goal <= 15%)")


def _fix_hunk_counts(text: str) -> str:
    """The inserted '+' line grows the first hunk by one new line: bump its +len."""
    import re

    def bump(m: re.Match) -> str:
        return f"@@ -{m.group(1)} +{m.group(2)},{int(m.group(3)) + 1} @@"

    return re.sub(r"@@ -(\S+) \+(\d+),(\d+) @@", bump, text, count=1)


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
    args = ap.parse_args()
    args.bundle = args.bundle or ("cpu" if args.what == "patch" else "vulkan")
    with tempfile.TemporaryDirectory(prefix="onebit-bench-") as tmp:
        base = Path(tmp)
        os.environ["CCACHE_DIR"] = str(base / "ccache")  # an empty compiler cache: a cold start
        (bench_patch if args.what == "patch" else bench_bundle)(args, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
