"""Step kinds as modules (builders/steps/): each action is one kind whose module holds its data, planner, `run`,
`holds` and `describe`; the executor asks the registry and names no step kind; nothing outside kinds/ asks which
build kind a variant has."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from builders.inputs import host
from builders.kinds import KINDS
from builders.plan import all_tools, make_plan, root_dirs
from builders.plan_types import Layout
from builders.steps import STEPS
from test_plan import LAYOUT, PROJECT, facts

ROOT = Path(__file__).resolve().parent.parent


def test_each_planned_step_is_described_by_its_kind_from_its_own_module(tmp_path):
    """Every step of every bundle's plan, on the tests' host facts and on this host's with a fresh cache (where the
    build fetches its pinned toolchains first): its kind is a module of builders/steps/, its data class is that
    module's (the stage step's lives in plan_types.py, below builders/ship/stage.py which takes it whole), and the words
    the plan prints for it (--verbose, the JSON's `describe`) are its kind's describe(step)."""
    fresh = Layout(root=ROOT, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")
    plans = [make_plan(PROJECT, b, facts(), LAYOUT) for b in sorted(PROJECT.bundles)]
    plans += [make_plan(PROJECT, b, host.gather(all_tools(PROJECT, b), toolchains=fresh.cache / "toolchains",
                                                roots=root_dirs(PROJECT, fresh.cache)), fresh)
              for b in sorted(PROJECT.bundles)]
    seen = set()
    for step in (s for plan in plans for s in plan.steps):
        kind = STEPS[step.action]
        module = type(kind).__module__
        assert module.startswith("builders.steps."), (step.id, module)
        want = "builders.plan_types" if step.action == "stage" else module
        assert type(step.data).__module__ == want, (step.id, type(step.data))
        assert kind.describe(step) == list(step.describe), step.id
        assert callable(kind.run) and callable(kind.holds)
        seen.add(step.action)
    assert seen == set(STEPS), sorted(set(STEPS) - seen)  # every kind is planned by some bundle


@pytest.mark.parametrize("flag, actions", [
    ("fetches", {"fetch", "wheels", "toolchain", "root", "submodules", "hf", "crates"}),  # what `1bit-build fetch` runs
    ("bundle", {"metapackage", "channel", "tarball", "checksums", "publish"}),  # no stamp: done with the bundle
    ("replans", {"toolchain", "root"}),  # a build assembles them first, then plans again
])
def test_the_kinds_flags_say_what_the_hand_kept_tables_said(flag, actions):
    assert {a for a, k in STEPS.items() if getattr(k, flag)} == actions


def _strings(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_the_executor_names_no_step_kind_and_tests_no_payload_type():
    """The executor loops over the plan asking STEPS: no action table, no isinstance chain over the step data."""
    path = ROOT / "builders" / "execute.py"
    tree = ast.parse(path.read_text())
    assert not (_strings(path) & set(STEPS)), sorted(_strings(path) & set(STEPS))
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "isinstance"]


def test_no_build_kind_is_asked_for_by_name_outside_kinds():
    """A build kind's differences (a fresh build dir, strict options, what it reads in its output) are its own
    attributes; `variant.kind == "cmake"` outside builders/kinds/ is a kind leaking out."""
    found = []
    for path in sorted((ROOT / "builders").rglob("*.py")):
        if "kinds" in path.relative_to(ROOT / "builders").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides) and any(
                    isinstance(s, ast.Constant) and s.value in KINDS for s in sides):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
