"""The project's import graph, drawn from its own imports (module level and inside functions alike).

    python scripts/import_graph.py            # each module's imports of project modules, then loops and climbs
    python scripts/import_graph.py --summary  # counts only

Layers, lowest first: the runtime side `onebit` (never imports builders); the build side's vocabulary
(`builders.errors`, `builders.plan_types`); its mechanisms, folder by folder: `builders.io` (processes, files, archives,
git, HTTP), `builders.project` (the declared inputs, loaded), `builders.roots` (where a command runs), `builders.inputs`
(sources, toolchain inputs, host facts), `builders.ship` (stage, packages, bundle); the build kinds (`builders.kinds`);
the step kinds on top of them (`builders.steps`); the composition that plans and runs steps (`builders.plan`,
`builders.execute`, `builders.build`, `builders.session`); the bot and the release (`builders.pins`, `builders.release`),
which use the build side; the fronts (`builders.cli`, `builders.fresh`, `builders.__main__`). An import from a lower
layer into a higher one "runs back up".
tests/test_layers.py asserts: no loop, no climb.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("builders", "onebit")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            out[module_name(path, root)] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest known module that `name` is or lies in (a.b.c.func -> a.b.c when a.b.c is a module)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in known:
            return cand
    return None


def imports_of(mod: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                r = _resolve(a.name, known)
                if r:
                    found.add(r)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for a in node.names:  # `from . import x` imports the module x when there is one
                r = _resolve(f"{prefix}.{a.name}", known) if prefix else None
                r = r or _resolve(prefix, known)
                if r:
                    found.add(r)
    found.discard(mod)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


VOCABULARY = ("builders", "builders.errors", "builders.plan_types")  # the words every layer of the build side uses
FOLDERS = ("io", "project", "roots", "inputs", "ship", "kinds", "steps")  # lowest first; a folder looks only down
COMPOSITION = ("builders.plan", "builders.execute", "builders.build", "builders.session")  # plans and runs the steps
FRONTS = ("builders.cli", "builders.fresh", "builders.__main__")


def layer(mod: str) -> int:
    if mod == "onebit" or mod.startswith("onebit."):
        return 0
    if mod in VOCABULARY:
        return 1
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return 2 + FOLDERS.index(parts[1])
    if mod in COMPOSITION:
        return 2 + len(FOLDERS)
    if len(parts) > 1 and parts[1] in ("pins", "release"):
        return 3 + len(FOLDERS)
    if mod in FRONTS:
        return 4 + len(FOLDERS)
    return 2 + FOLDERS.index("ship")  # a mechanism outside the folders sits with the highest of them


def climbs(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a lower layer into a higher one (onebit -> builders counts: the runtime ships alone)."""
    out = []
    for a, targets in g.items():
        for b in targets:
            if layer(b) > layer(a) or (a.startswith("onebit") and b.startswith("builders")):
                out.append((a, b))
    return sorted(out)


def loops(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted.

    A package importing its own submodules and a submodule importing a sibling through the package (`from . import x`
    resolves to the sibling module x, not to the package) is no loop."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            strong(v)
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args(argv)
    g = graph()
    if not args.summary:
        for m in sorted(g):
            print(f"{m}: {', '.join(sorted(g[m])) or '-'}")
        print()
    lp, up = loops(g), climbs(g)
    print(f"{len(g)} modules, {sum(len(v) for v in g.values())} imports of project modules, "
          f"{len(lp)} import loop(s), {len(up)} import(s) running back up")
    for comp in lp:
        print("loop: " + " <-> ".join(comp))
    for a, b in up:
        print(f"climb: {a} -> {b}")
    return 1 if lp or up else 0


if __name__ == "__main__":
    sys.exit(main())
