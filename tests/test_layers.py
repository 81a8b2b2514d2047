"""The import graph, drawn from the project's own imports: no import loop, and no import running back up a layer
(onebit never imports builders; no mechanism imports a step kind (builders/steps/), and no step kind the plan or the
executor that compose them; the build side never imports the release or the bot; nothing imports the front)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
ig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ig)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "builders"
    (pkg / "release").mkdir(parents=True)
    (tmp_path / "onebit").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "release" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .release import b  # inside a function still counts\n")
    (pkg / "release" / "b.py").write_text("from ..a import f\nimport builders.c\n")
    (pkg / "c.py").write_text("from . import a\n")
    (tmp_path / "onebit" / "__init__.py").write_text("")
    (tmp_path / "onebit" / "x.py").write_text("from builders import c\n")
    g = ig.graph(tmp_path)
    assert g["builders.a"] == {"builders.release.b"}
    assert g["builders.release.b"] == {"builders.a", "builders.c"}
    assert ig.loops(g) == [["builders.a", "builders.c", "builders.release.b"]]  # a -> b -> c -> a
    assert ig.climbs(g) == [("builders.a", "builders.release.b"), ("onebit.x", "builders.c")]


def test_a_mechanism_importing_a_step_kind_runs_back_up(tmp_path):
    """The step kinds sit on the mechanisms and under the plan and the executor: stage.py importing its step kind, or
    a step kind importing the plan that calls it, is a climb; the plan importing a step kind and a step kind
    importing a mechanism are not."""
    pkg = tmp_path / "builders"
    (pkg / "steps").mkdir(parents=True)
    for f in ("__init__.py", "steps/__init__.py", "swap.py"):
        (pkg / f).write_text("")
    (pkg / "stage.py").write_text("from .steps import stage\n")
    (pkg / "steps" / "stage.py").write_text("from .. import swap\n")
    (pkg / "steps" / "build.py").write_text("from ..plan import make_plan\n")
    (pkg / "plan.py").write_text("from .steps import build, stage\n")
    (pkg / "execute.py").write_text("from .steps import stage\n")
    assert ig.climbs(ig.graph(tmp_path)) == [("builders.stage", "builders.steps.stage"),
                                             ("builders.steps.build", "builders.plan")]


def test_a_folder_looks_only_down(tmp_path):
    """builders/ is read bottom up: io, project, roots, inputs, ship, kinds, steps; then the composition, the bot and
    the release, the fronts. roots importing a ship module, or io importing the project, runs back up; the other way
    round does not, and the vocabulary (errors, plan_types) sits under every folder."""
    pkg = tmp_path / "builders"
    for d in ("io", "project", "roots", "ship"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "io" / "swap.py").write_text("from .. import errors\nfrom ..project import config\n")
    (pkg / "project" / "config.py").write_text("from ..io import swap\n")
    (pkg / "roots" / "root.py").write_text("from ..ship import stage\nfrom ..project import config\n")
    (pkg / "ship" / "stage.py").write_text("from ..roots import root\n")
    (pkg / "cli.py").write_text("from .ship import stage\n")
    assert ig.climbs(ig.graph(tmp_path)) == [("builders.io.swap", "builders.project.config"),
                                             ("builders.roots.root", "builders.ship.stage")]


def test_no_import_loop():
    assert ig.loops(ig.graph()) == []


def test_no_import_runs_back_up():
    assert ig.climbs(ig.graph()) == []
