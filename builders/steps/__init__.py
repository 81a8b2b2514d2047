"""Step kinds behind one small Protocol and a registry, the way builders/kinds/ keeps one module per build kind.

Each module holds one step kind whole: its data (what its planner hands its run), its planner (plan.py's
make_plan/variant_steps call them in order), `run(ctx, step)` (what the executor does for it), `holds(ctx, step)`
(whether its output is there and trusted, by the mechanism's own trust check) and `describe(step)` (what it does
that is no command of its own, in words: the plan's `--verbose` lines), and flags: `fetches` (`1bit-build fetch`
runs it), `replans` (a build runs it first and plans again), `bundle` (a bundle step). Adding a step kind: one new
module and one line in STEPS below. The executor loops over the plan asking STEPS; nothing else lists the actions.
"""
from __future__ import annotations

from typing import Sequence

from ..plan_types import Step
from . import build, bundle, crates, fetch, hf, package, root, source, stage, submodules, toolchain, wheels
from .base import StepContext, StepKind  # noqa: F401  (the step kinds' shared API)

STEPS: dict[str, StepKind] = {kind.action: kind for kind in (
    fetch.STEP,
    submodules.STEP,
    source.STEP,
    crates.STEP,
    hf.STEP,
    toolchain.STEP,
    root.STEP,
    wheels.STEP,
    build.STEP,
    stage.STEP,
    package.STEP,
    *bundle.STEPS,  # metapackage, channel, tarball, checksums, publish
)}


def fetch_only(steps: Sequence[Step]) -> list[Step]:
    """`1bit-build fetch`: the steps that fetch into the cache, and the checkouts crates are vendored from (their
    source step runs too)."""
    return [s for s in steps if STEPS[s.action].fetches
            or (s.action == "source" and any(c.needs == (s.id,) for c in steps if c.action == "crates"))]
