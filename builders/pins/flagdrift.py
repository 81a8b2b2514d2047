"""Build-flag drift, the effectful half: check out a pin's old and new commit, plan each recipe variant that builds
from it (builders.plan.make_plan, so our side is exactly what a build would run), read upstream's build files and
run `make -n` (network cut like builds, with a timeout). Every decision is in builders/pins/flags.py.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..config import Bundle, Project, Recipe, Variant, load_project
from ..errors import OnebitError
from ..host import HostFacts, gather
from ..plan import make_plan
from ..plan_types import Layout, Step
from . import flags, gitops
from .flags import MakeRun, MakeSide, Row, VariantReport

MAKE_TIMEOUT = 120.0  # seconds for one `make -n`: it runs nothing, but a Makefile's $(shell ...) could hang
BUNDLE = "pins-flag-drift"  # the one-recipe bundle the plan is made for


class Tree:
    """A checkout of one commit, and the build files read from it (once)."""

    def __init__(self, path: Path, commit: str):
        self.path = path
        self.commit = commit
        self._cache: dict[str, dict[str, str]] = {}

    def files(self, kind: str, pick: Callable[[str], bool]) -> dict[str, str]:
        if kind not in self._cache:
            found: dict[str, str] = {}
            for d, dirs, names in os.walk(self.path):
                dirs[:] = sorted(x for x in dirs if x != ".git")
                for n in names:
                    rel = os.path.relpath(os.path.join(d, n), self.path).replace(os.sep, "/")
                    if pick(rel):
                        try:
                            found[rel] = Path(d, n).read_text(encoding="utf-8", errors="replace")
                        except OSError:
                            continue
            self._cache[kind] = found
        return self._cache[kind]

    def cmake(self) -> dict[str, flags.Decl]:
        return flags.cmake_declarations(self.files("cmake", flags.is_cmake_file))

    def zig(self, build_file: str = "build.zig") -> dict[str, flags.Decl]:
        path = self.path / build_file
        return flags.zig_declarations(path.read_text(encoding="utf-8", errors="replace"), build_file) if path.is_file() else {}

    def makefiles(self) -> dict[str, str]:
        return self.files("make", flags.is_makefile)


def _checkout(scratch: gitops.Scratch, url: str, commit: str, dest: Path, where: str | None) -> Tree:
    scratch.fetch_tree(url, commit, where=where)
    gitops.git(["worktree", "add", "--quiet", "--detach", str(dest), commit], cwd=scratch.dir,
               what=f"cannot check out {commit[:12]}", where=where)
    return Tree(dest, commit)


def build_step(project: Project, recipe: Recipe, variant: Variant, pin: str, commit: str, host: HostFacts,
               layout: Layout) -> Step:
    """The build step the plan makes for `variant` with `pin` at `commit` (in a bundle of that variant alone)."""
    moved = dataclasses.replace(project.pins[pin], commit=commit, unresolved=None)
    bundle = Bundle(name=BUNDLE, path=recipe.path, version="0", build_number=0, platform="linux-64",
                    summary="build-flag drift", components=((recipe.name, (variant.name,)),))
    plan = make_plan(dataclasses.replace(project, pins={**project.pins, pin: moved}, bundles={BUNDLE: bundle}),
                     BUNDLE, host, layout)
    if plan.refusals:
        raise OnebitError("; ".join(plan.refusals))
    return plan.step(f"build:{variant.id}")


def run_make(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], net_cut: Sequence[str],
             paths: Mapping[str, str], timeout: float = MAKE_TIMEOUT) -> MakeRun:
    """One `make -n` in a clean environment (PATH, HOME, LC_ALL=C and `env`), its process group killed on timeout."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"), "LC_ALL": "C", **env}
    try:
        proc = subprocess.Popen([*net_cut, *argv], cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as exc:
        return MakeRun(None, "", f"cannot run {argv[0]}: {exc.strerror}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return MakeRun(None, "", f"timed out after {timeout:.0f} s")
    return MakeRun(proc.returncode, flags.redact(out, paths), flags.redact(err, paths))


def _make_rows(inv: flags.Invocation, variant: Variant, recipe: Recipe, trees: tuple[Tree | None, Tree], aliases: Sequence[str],
               host: HostFacts, paths: Mapping[str, str], commits: tuple[str, str]) -> list[Row]:
    rvars = flags.recipe_variables(inv, [k for k in variant.options if k != "programs"])

    def into(tree: Tree, text: str) -> str:  # the plan's source paths, in this checkout
        for a in sorted(aliases, key=len, reverse=True):
            text = text.replace(a, str(tree.path))
        return text

    def side(tree: Tree) -> MakeSide:
        d = tree.path / inv.directory
        base = ["make", "-n", "--no-print-directory", "-C", str(d)] + (["-f", into(tree, inv.makefile)] if inv.makefile else [])
        up = base + list(inv.goals)

        def run(argv, env=None) -> MakeRun:
            return run_make(argv, cwd=d, env=env or {}, net_cut=host.net_cut, paths=paths)

        upstream = run(up)
        recipe_run = run(up + list(rvars)) if rvars else upstream
        ours = run(base + [into(tree, a) for a in inv.options] + list(inv.goals) + [into(tree, a) for a in inv.variables],
                   {k: into(tree, v) for k, v in inv.env})
        return MakeSide(upstream, recipe_run, ours)

    old_tree, new_tree = trees
    if not (new_tree.path / inv.directory).is_dir():
        return [Row(flags.HOLD, f"make -C {inv.directory}", "", f"the directory is gone at {commits[1]}")]
    old = side(old_tree) if old_tree is not None and (old_tree.path / inv.directory).is_dir() else None
    return flags.compare_make(inv, side(new_tree), old, new_files=new_tree.makefiles(),
                              old_files=old_tree.makefiles() if old_tree else None, recipe_vars=rvars,
                              recipe_where={flags.make_variable(v) or "": option_where(recipe, variant.name, flags.make_variable(v) or "")
                                            for v in rvars}, commits=commits)


def option_where(recipe: Recipe, vname: str, key: str) -> str:
    """recipes/<name>.yaml:line of a build option (the variant's own, else the recipe's)."""
    for ypath in (("variants", vname, "build", "options", key), ("build", "options", key), ("build", "env", key)):
        if ypath in recipe.doc.lines:
            return f"recipes/{recipe.path.name}:{recipe.doc.lines[ypath]}"
    return f"recipes/{recipe.path.name}"


def _variant_report(project: Project, recipe: Recipe, vname: str, pin: str, trees: tuple[Tree | None, Tree],
                    host: HostFacts, tmp: Path, commits: tuple[str, str]) -> VariantReport:
    variant = recipe.variant(vname)
    layout = Layout(root=project.root, cache=tmp / "plan" / "cache", work=tmp / "plan" / "work", out=tmp / "plan" / "out")
    span = f"`{commits[0]}` → `{commits[1]}`"
    try:
        step = build_step(project, recipe, variant, pin, trees[1].commit, host, layout)
    except (OnebitError, KeyError) as exc:
        why = exc.what if isinstance(exc, OnebitError) else f"no build step {exc}"
        return VariantReport(variant.id, f"**{variant.id}**", (Row("not compared", "plan", "", f"the plan cannot be made: {why}"),))
    invs = flags.invocations(step.commands, source_dir=step.data.source_dir, net_cut=host.net_cut)
    aliases = flags.source_aliases(step.commands, step.data.source_dir)
    old_tree, new_tree = trees
    paths = {str(new_tree.path): "<src>", str(layout.work): "<work>", str(layout.cache): "<cache>", host.home: "~"}
    if old_tree is not None:
        paths[str(old_tree.path)] = "<src>"
    rows: list[Row] = []
    labels: list[str] = []
    for tool, decls in (("cmake", lambda t: t.cmake()), ("zig", lambda t: t.zig())):
        ours = [d for inv in invs if inv.tool == tool for d in inv.defines]
        if any(inv.tool == tool for inv in invs):
            labels.append(f"{tool} -D options ({len({n for n, _ in ours if not (tool == 'cmake' and flags.CMAKE_OWN.match(n))})})")
            rows += flags.compare_options(tool, ours, decls(old_tree) if old_tree else None, decls(new_tree), commits=commits)
    for inv in (i for i in invs if i.tool == "make"):
        labels.append(f"`{inv.label()}`")
        if inv.directory is None:
            rows.append(Row("info", inv.label(), "", f"runs in {flags.redact(inv.plan_dir, paths)}, outside the source tree "
                            "(a generated build tree): not compared; its configure is"))
        elif not shutil.which("make"):
            rows.append(Row("not compared", inv.label(), "", "make is not installed where the bot runs"))
        else:
            rows += _make_rows(inv, variant, recipe, trees, aliases, host, paths, commits)
    if not invs:
        rows.append(Row("not compared", variant.kind, "", f"the build step has no cmake, zig or make call (a {variant.kind} build)"))
    cut = "" if host.net_cut else "; this host cannot cut the network for make -n"
    how = f"**{variant.id}**: {', '.join(labels) or variant.kind} at {span}{cut}"
    return VariantReport(variant.id, how, tuple(rows))


def flag_reports(root: Path, pin: str, url: str, old: str | None, new: str, recipes: Sequence[str], *,
                 where: str | None = None) -> list[VariantReport]:
    """One report per variant of each recipe (by name) that builds from `pin`, comparing it with upstream's build at
    `new` (and, where it can be fetched, `old`)."""
    if not recipes:
        return []
    project = load_project(root, strict=False)
    commits = ((old or "unresolved")[:12], new[:12])
    out: list[VariantReport] = []
    with tempfile.TemporaryDirectory(prefix="onebit-flags-") as tmp_name, gitops.Scratch() as scratch:
        tmp = Path(tmp_name)
        try:
            new_tree = _checkout(scratch, url, new, tmp / "new", where)
        except OnebitError as exc:
            return [VariantReport(r, f"**{r}**", (Row("not compared", new[:12], "", f"cannot check out the new commit: {exc.what}"),))
                    for r in recipes]
        old_tree = None
        note = None
        if old and old != new:
            try:
                old_tree = _checkout(scratch, url, old, tmp / "old", where)
            except OnebitError as exc:
                note = Row("info", old[:12], "", f"the old commit cannot be checked out ({exc.what}): new-side checks only")
        for name in recipes:
            recipe = project.recipes.get(name)
            if recipe is None:
                out.append(VariantReport(name, f"**{name}**", (Row("not compared", f"recipes/{name}.yaml", "",
                                                                   "the recipe does not pass its schema (`1bit-build validate`)"),)))
                continue
            host = gather([t for v in recipe.variant_names() for t in recipe.variant(v).toolchain])
            for vname in recipe.variant_names():
                rep = _variant_report(project, recipe, vname, pin, (old_tree, new_tree), host, tmp, commits)
                out.append(dataclasses.replace(rep, rows=rep.rows + ((note,) if note else ())))
    return out
