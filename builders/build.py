"""build: plan a bundle and run the plan, the one way `1bit-build build`, a release part and the end-to-end tests do it.

Toolchain inputs the fetch step provides (the CUDA toolkit and zig from pinned wheels, the Vulkan SDK from pinned
Debian packages) are fetched (offline: taken from the download cache) and assembled first when they are all that is
missing, and the bundle is planned again, so the build's keys see the assembled tools. A host that lacks anything else
is refused before any download. The directories are locked while steps run."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from rich.console import Console

from .project.config import Project
from .execute import Executor, Report
from .plan_types import Plan
from .session import locked, preflight, refuse
from .steps import STEPS


def build(planned: Callable[[], tuple[Project, Plan]], *, offline: bool = False, force: bool = False,
          console: Console | None = None) -> tuple[Plan, Report]:
    """planned(): the project and its plan, asked again once pinned toolchains are assembled. Returns what ran."""
    project, plan = planned()
    preflight(plan.layout)
    toolchains = [s for s in plan.steps if STEPS[s.action].replans]
    fetched = False
    if plan.to_fetch and toolchains:
        refuse(plan)  # what the host must bring is said before anything is downloaded
        with locked(plan.layout, out=False):
            Executor(replace(plan, steps=toolchains), project, offline=offline, console=console).run()
        project, plan = planned()
        fetched = True
    refuse(plan, fetched=fetched)
    with locked(plan.layout):
        report = Executor(plan, project, offline=offline, force=force, console=console).run()
    return plan, report
