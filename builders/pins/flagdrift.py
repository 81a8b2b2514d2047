"""Build-flag drift, the effectful half: check out a pin's old and new commit, plan each recipe variant that builds
from it (builders.plan.make_plan, so our side is exactly what a build would run), read upstream's build files and
run `make -n`. Every decision is in builders/pins/flag_calls.py, flag_options.py and flag_make.py (the rows:
flags.py).

Two halves, run by builders/pins/isolate.py in two sandboxes, neither holding a secret:
- `checkout_trees` (the evaluating part, with network): the commits' trees into a scratch directory;
- `reports_from_trees` (the drift check, no network, the trees read-only, own /proc, private HOME and /tmp): reads
  the build files (never through a link out of the tree, sizes capped: builders/pins/readtree.py) and runs each
  `make -n` with a time and memory bound. Where the host cannot make the sandbox, make -n is not run at all and
  the comparison HOLDs the bump, saying why.
builders/pins/isolate.py's `flag_reports` does both for one pin.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..project.config import Bundle, Project, Recipe, Variant, load_project
from ..errors import OnebitError
from ..inputs.host import HostFacts, gather
from ..plan import make_plan
from ..plan_types import Layout, Step
from ..io import gitcmd, runner
from . import flag_calls, flag_make, flag_options, flags, gitops, readtree
from .flag_make import MakeRun, MakeSide
from .flags import Row, VariantReport

MAKE_TIMEOUT = 120.0  # seconds for one `make -n`: it runs nothing, but a Makefile's $(shell ...) could hang
MAKE_MEMORY = 2 << 30  # bytes of address space for one `make -n` (and what its $(shell ...) starts)
BUNDLE = "pins-flag-drift"  # the one-recipe bundle the plan is made for


class Tree:
    """A checkout of one commit, and the build files read from it (once)."""

    def __init__(self, path: Path, commit: str):
        self.path = path
        self.commit = commit
        self._cache: dict[str, dict[str, str]] = {}
        self.refused: list[str] = []  # one line per file not read (a link out of the tree, too large)

    def files(self, kind: str, pick: Callable[[str], bool]) -> dict[str, str]:
        if kind not in self._cache:
            self._cache[kind] = readtree.read_files(self.path, pick, refused=self.refused)
        return self._cache[kind]

    def cmake(self) -> dict[str, flag_options.Decl]:
        return flag_options.cmake_declarations(self.files("cmake", flag_options.is_cmake_file))

    def zig(self, build_file: str = "build.zig") -> dict[str, flag_options.Decl]:
        text = readtree.read_one(self.path, build_file, refused=self.refused)
        return flag_options.zig_declarations(text, build_file) if text is not None else {}

    def makefiles(self) -> dict[str, str]:
        return self.files("make", flag_make.is_makefile)


def is_build_file(rel: str) -> bool:
    """What the cmake and zig comparisons read; a make comparison needs the whole tree (make -n checks prerequisites)."""
    return flag_options.is_cmake_file(rel) or flag_make.is_makefile(rel) or rel == "build.zig"


class Source:
    """A scratch bare repository for one upstream: commits and trees at depth 1 without blobs (a partial fetch), then
    only the blobs a checkout needs, in one fetch. A server that cannot filter sends everything, which works too."""

    def __init__(self, url: str, where: str | None):
        self.url = url
        self.where = where
        self.scratch = gitops.Scratch()
        for key, value in (("remote.origin.url", url), ("remote.origin.promisor", "true"),
                           ("remote.origin.partialclonefilter", "blob:none"), ("extensions.partialClone", "origin"),
                           ("gc.auto", "0"), ("maintenance.auto", "false")):
            gitops.git(["config", key, value], cwd=self.scratch.dir)

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        self.scratch.close()

    def _git(self, args: Sequence[str], what: str, input: str | None = None, env: dict | None = None):
        return gitops.git(["-c", "protocol.version=2", *args], cwd=self.scratch.dir, what=what, where=self.where, input=input, env=env,
                          allow_file=gitcmd.is_local_url(self.url))

    def checkout(self, commit: str, dest: Path, pick: Callable[[str], bool] | None) -> Tree:
        """`commit` checked out into `dest`: every file, or those `pick` chooses."""
        self._git(["fetch", "--quiet", "--no-tags", "--depth=1", "--filter=blob:none", "origin", commit],
                  f"cannot fetch {commit[:12]} from {self.url}")
        listing = self._git(["ls-tree", "-r", "-z", commit], f"cannot list {commit[:12]}").stdout
        paths: list[str] = []
        oids: list[str] = []
        for entry in filter(None, listing.split("\0")):
            meta, path = entry.split("\t", 1)
            _mode, kind, oid = meta.split()
            if kind == "blob" and (pick is None or pick(path)):
                paths.append(path)
                oids.append(oid)
        # which of them are not here yet (listed as ?oid; --missing=print never fetches them one by one)
        have = self._git(["rev-list", "--objects", "--missing=print", "--no-object-names", commit], "cannot list objects").stdout
        missing = {line[1:] for line in have.splitlines() if line.startswith("?")}
        want = sorted(set(oids) & missing)
        if want:
            self._git(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--stdin", "origin"],
                      f"cannot fetch the build files of {commit[:12]} from {self.url}", input="\n".join(want) + "\n")
        dest.mkdir(parents=True)
        if paths:
            env = {"GIT_INDEX_FILE": str(dest.parent / f".{dest.name}.index"), "GIT_LITERAL_PATHSPECS": "1"}
            self._git(["--work-tree", str(dest), "checkout", "--quiet", commit, "--pathspec-from-file=-", "--pathspec-file-nul"],
                      f"cannot check out {commit[:12]}", input="\0".join(paths) + "\0", env=env)
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


@dataclass(frozen=True)
class MakeLimits:
    """How the drift check may run `make -n`: `blocked` says why it may not (no sandbox), else the bounds."""

    blocked: str | None = None
    timeout: float = MAKE_TIMEOUT
    memory: int = MAKE_MEMORY


def run_make(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], paths: Mapping[str, str],
             timeout: float = MAKE_TIMEOUT, memory: int = MAKE_MEMORY) -> MakeRun:
    """One `make -n` in a clean environment (PATH, HOME, LC_ALL=C and `env`), bounded in address space, its process
    group killed on timeout (builders/io/runner.py). Only ever called inside the drift check's sandbox
    (builders/pins/isolate.py)."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"), "LC_ALL": "C", **env}
    try:
        proc = runner.run(argv, cwd=cwd, env=full, timeout=timeout, memory=memory)
    except runner.TimedOut:
        return MakeRun(None, "", f"timed out after {timeout:.0f} s")
    except OSError as exc:
        return MakeRun(None, "", f"cannot run {argv[0]}: {exc.strerror}")
    return MakeRun(proc.returncode, flags.redact(proc.stdout, paths), flags.redact(proc.stderr, paths))


def _make_rows(inv: flag_calls.Invocation, variant: Variant, recipe: Recipe, trees: tuple[Tree | None, Tree], aliases: Sequence[str],
               limits: MakeLimits, paths: Mapping[str, str], commits: tuple[str, str]) -> list[Row]:
    rvars = flag_calls.recipe_variables(inv, [k for k in variant.options if k != "programs"])

    def into(tree: Tree, text: str) -> str:  # the plan's source paths, in this checkout
        for a in sorted(aliases, key=len, reverse=True):
            text = text.replace(a, str(tree.path))
        return text

    def side(tree: Tree) -> MakeSide:
        d = tree.path / inv.directory
        base = ["make", "-n", "--no-print-directory", "-C", str(d)] + (["-f", into(tree, inv.makefile)] if inv.makefile else [])
        up = base + list(inv.goals)

        def run(argv, env=None) -> MakeRun:
            return run_make(argv, cwd=d, env=env or {}, paths=paths, timeout=limits.timeout, memory=limits.memory)

        upstream = run(up)
        recipe_run = run(up + list(rvars)) if rvars else upstream
        ours = run(base + [into(tree, a) for a in inv.options] + list(inv.goals) + [into(tree, a) for a in inv.variables],
                   {k: into(tree, v) for k, v in inv.env})
        return MakeSide(upstream, recipe_run, ours)

    old_tree, new_tree = trees
    if not (new_tree.path / inv.directory).is_dir():
        return [Row(flags.HOLD, f"make -C {inv.directory}", "", f"the directory is gone at {commits[1]}")]
    old = side(old_tree) if old_tree is not None and (old_tree.path / inv.directory).is_dir() else None
    return flag_make.compare_make(inv, side(new_tree), old, new_files=new_tree.makefiles(),
                              old_files=old_tree.makefiles() if old_tree else None, recipe_vars=rvars,
                              recipe_where={flag_calls.make_variable(v) or "": option_where(recipe, variant.name, flag_calls.make_variable(v) or "")
                                            for v in rvars}, commits=commits)


def option_where(recipe: Recipe, vname: str, key: str) -> str:
    """recipes/<name>.yaml:line of a build option (the variant's own, else the recipe's)."""
    for ypath in (("variants", vname, "build", "options", key), ("build", "options", key), ("build", "env", key)):
        if ypath in recipe.doc.lines:
            return f"recipes/{recipe.path.name}:{recipe.doc.lines[ypath]}"
    return f"recipes/{recipe.path.name}"


@dataclass
class Planned:
    """One recipe variant as the plan builds it: its build step's calls, or why there is no plan."""

    recipe: Recipe
    variant: Variant
    host: HostFacts
    invs: list = field(default_factory=list)
    aliases: tuple[str, ...] = ()
    error: str | None = None

    @property
    def needs_tree(self) -> bool:
        return any(inv.tool == "make" and inv.directory is not None for inv in self.invs)


def _plan(project: Project, recipe: Recipe, vname: str, pin: str, commit: str, host: HostFacts, layout: Layout) -> Planned:
    variant = recipe.variant(vname)
    try:
        step = build_step(project, recipe, variant, pin, commit, host, layout)
    except (OnebitError, KeyError) as exc:
        return Planned(recipe, variant, host, error=exc.what if isinstance(exc, OnebitError) else f"no build step {exc}")
    return Planned(recipe, variant, host, flag_calls.invocations(step.commands, source_dir=step.data.source_dir),
                   flag_calls.source_aliases(step.commands, step.data.source_dir))


def _variant_report(p: Planned, trees: tuple[Tree | None, Tree], layout: Layout, commits: tuple[str, str],
                    limits: MakeLimits) -> VariantReport:
    variant, recipe, host = p.variant, p.recipe, p.host
    if p.error:
        return VariantReport(variant.id, f"**{variant.id}**", (Row("not compared", "plan", "", f"the plan cannot be made: {p.error}"),))
    old_tree, new_tree = trees
    paths = {str(new_tree.path): "<src>", str(layout.work): "<work>", str(layout.cache): "<cache>", host.home: "~"}
    if old_tree is not None:
        paths[str(old_tree.path)] = "<src>"
    rows: list[Row] = []
    labels: list[str] = []
    for tool, decls in (("cmake", lambda t: t.cmake()), ("zig", lambda t: t.zig())):
        ours = [d for inv in p.invs if inv.tool == tool for d in inv.defines]
        if any(inv.tool == tool for inv in p.invs):
            labels.append(f"{tool} -D options ({len({n for n, _ in ours if not (tool == 'cmake' and flag_options.CMAKE_OWN.match(n))})})")
            rows += flag_options.compare_options(tool, ours, decls(old_tree) if old_tree else None, decls(new_tree), commits=commits)
    for inv in (i for i in p.invs if i.tool == "make"):
        labels.append(f"`{inv.label()}`")
        if inv.directory is None:
            rows.append(Row("info", inv.label(), "", f"runs in {flags.redact(inv.plan_dir, paths)}, outside the source tree "
                            "(a generated build tree): not compared; its configure is"))
        elif limits.blocked:
            rows.append(Row(flags.HOLD, inv.label(), "", f"make -n not run: {limits.blocked}"))
        elif not shutil.which("make"):
            rows.append(Row("not compared", inv.label(), "", "make is not installed where the bot runs"))
        else:
            rows += _make_rows(inv, variant, recipe, trees, p.aliases, limits, paths, commits)
    if not p.invs:
        rows.append(Row("not compared", variant.kind, "", f"the build step has no cmake, zig or make call (a {variant.kind} build)"))
    for tree in (t for t in trees if t is not None):
        rows += [Row("not compared", line, "", "not read") for line in dict.fromkeys(tree.refused)]
    how = f"**{variant.id}**: {', '.join(labels) or variant.kind} at `{commits[0]}` → `{commits[1]}`"
    return VariantReport(variant.id, how, tuple(rows))


def _items(project: Project, pin: str, new: str, recipes: Sequence[str], layout: Layout) -> list[Planned | VariantReport]:
    items: list[Planned | VariantReport] = []
    for name in recipes:
        recipe = project.recipes.get(name)
        if recipe is None:
            items.append(VariantReport(name, f"**{name}**", (Row("not compared", f"recipes/{name}.yaml", "",
                                                                 "the recipe does not pass its schema (`1bit-build validate`)"),)))
            continue
        host = gather([t for v in recipe.variant_names() for t in recipe.variant(v).toolchain])
        items += [_plan(project, recipe, v, pin, new, host, layout) for v in recipe.variant_names()]
    return items


def _layout(project: Project, tmp: Path) -> Layout:
    return Layout(root=project.root, cache=tmp / "plan" / "cache", work=tmp / "plan" / "work", out=tmp / "plan" / "out")


def checkout_trees(root: Path, pin: str, url: str, old: str | None, new: str, recipes: Sequence[str], dest: Path, *,
                   where: str | None = None) -> dict:
    """The evaluating half: `new` (and `old`) checked out into dest/new and dest/old, every file where a variant runs
    make, else only the build files. Returns what the drift check needs to know: {"new": bool, "old": bool,
    "new_error": str|None, "old_error": str|None}."""
    info: dict = {"new": False, "old": False, "new_error": None, "old_error": None}
    project = load_project(root, strict=False)
    with tempfile.TemporaryDirectory(prefix="onebit-flags-") as tmp_name:
        planned = [i for i in _items(project, pin, new, recipes, _layout(project, Path(tmp_name))) if isinstance(i, Planned)]
    if not planned:
        return info
    pick = None if any(p.needs_tree for p in planned) else is_build_file
    dest.mkdir(parents=True, exist_ok=True)
    with Source(url, where) as src:
        for side, commit in (("new", new), ("old", old if old != new else None)):
            if not commit:
                break
            try:
                src.checkout(commit, dest / side, pick)
                info[side] = True
            except OnebitError as exc:  # no old tree without the new one
                info[f"{side}_error"] = exc.what
                break
    return info


def reports_from_trees(root: Path, pin: str, old: str | None, new: str, recipes: Sequence[str], dest: Path, info: Mapping,
                       limits: MakeLimits = MakeLimits()) -> list[VariantReport]:
    """The drift check: one report per variant of each recipe (by name) that builds from `pin`, comparing it with
    upstream's build at `new` (and `old`, where it was checked out) in the trees `checkout_trees` left in `dest`."""
    if not recipes:
        return []
    project = load_project(root, strict=False)
    commits = ((old or "unresolved")[:12], new[:12])
    with tempfile.TemporaryDirectory(prefix="onebit-flags-") as tmp_name:
        layout = _layout(project, Path(tmp_name))
        items = _items(project, pin, new, recipes, layout)
        if not any(isinstance(i, Planned) for i in items):
            return [i for i in items if isinstance(i, VariantReport)]
        if not info.get("new"):
            why = info.get("new_error") or "it was not checked out"
            row = Row("not compared", new[:12], "", f"cannot check out the new commit: {why}")
            return [i if isinstance(i, VariantReport) else VariantReport(i.variant.id, f"**{i.variant.id}**", (row,)) for i in items]
        new_tree = Tree(dest / "new", new)
        old_tree, note = None, ()
        if info.get("old"):
            old_tree = Tree(dest / "old", old)
        elif info.get("old_error"):
            note = (Row("info", (old or "")[:12], "", f"the old commit cannot be checked out ({info['old_error']}): new-side checks only"),)
        out = []
        for i in items:
            rep = i if isinstance(i, VariantReport) else _variant_report(i, (old_tree, new_tree), layout, commits, limits)
            out.append(dataclasses.replace(rep, rows=rep.rows + note) if isinstance(i, Planned) else rep)
        return out
