"""Build and install the real CPU bundle for the end-to-end tests (used by conftest and by `nox -s build-cpu`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builders.project import config
from builders.inputs import host
from builders.execute import Executor, Report
from builders.ship.install import install_bundle
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout, Plan

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class BuiltBundle:
    root: Path
    layout: Layout
    plan: Plan
    report: Report
    prefix: Path
    installed: list[str]


def plan_cpu(base: Path, *, build_number: int | None = None) -> tuple[config.Project, Plan]:
    project = config.load_project(ROOT)
    facts = host.gather(all_tools(project, "cpu"))
    layout = Layout(root=ROOT, cache=base / "cache", work=base / "work", out=base / "out")
    return project, make_plan(project, "cpu", facts, layout, build_number=build_number)


def build_cpu_bundle(base: Path) -> BuiltBundle:
    project, plan = plan_cpu(base)
    assert not plan.missing, plan.missing
    report = Executor(plan, project).run()
    prefix = base / "prefix"
    installed = install_bundle(plan.layout.out / "channel", prefix, "cpu", cache_dir=base / "pkgs")
    return BuiltBundle(ROOT, plan.layout, plan, report, prefix, installed)
