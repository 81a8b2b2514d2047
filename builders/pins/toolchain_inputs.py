"""toolchain_inputs: the toolchain inputs the recipes pin, found in the project's recipes (one input per distinct
pinned list, wherever it is carried), read back from a recipe's text, and rewritten in it entry by entry.

A toolchain input is one distinct pinned list of a recipe's `toolchain:` entry (`wheels:` or `debs:`): the Vulkan
SDK's eight packages, carried by recipes/vulkan.yaml, zinc.yaml, lean.yaml (variant vulkan) and hrx.yaml, are ONE
input, `vulkan-sdk`; zig's wheel is `zig`; NVIDIA's CUDA wheels `nvcc`. Pure but for `load_inputs`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import OnebitError


@dataclass(frozen=True)
class Place:
    recipe: str  # recipes/<name>.yaml (or floor.yaml), relative to the project root
    where: str  # where in it: "toolchain" or "variants.<v>.toolchain"


@dataclass(frozen=True)
class Input:
    name: str  # zig, nvcc, vulkan-sdk
    kind: str  # wheels | debs
    tool: str
    version: str | None  # the tool's version constraint
    entries: tuple[Mapping, ...]  # the pinned list, as in the recipe
    places: tuple[Place, ...]

    @property
    def files(self) -> list[str]:
        return sorted({p.recipe for p in self.places})


def _key(entry: Mapping, kind: str) -> tuple:
    if kind == "wheels":
        return (entry.get("package"), str(entry.get("version")), entry.get("sha256"))
    return (entry.get("path"), entry.get("sha256"))


def tool_lists(data: Mapping) -> list[tuple[str, Mapping]]:
    """Pure: the toolchain entries of a recipe's data, each with where it is (other shapes are skipped)."""
    def entries(v) -> list:
        return [t for t in v if isinstance(t, Mapping)] if isinstance(v, list) else []

    out = [("toolchain", t) for t in entries(data.get("toolchain"))]
    variants = data.get("variants")
    for vname, v in sorted(variants.items() if isinstance(variants, Mapping) else [], key=lambda kv: str(kv[0])):
        if isinstance(v, Mapping):
            out += [(f"variants.{vname}.toolchain", t) for t in entries(v.get("toolchain"))]
    return out


def find_inputs(recipes: Mapping[str, Mapping]) -> list[Input]:
    """Pure: the distinct pinned toolchain inputs of `recipes` (recipe file -> its parsed YAML), each with the places
    that carry it; one input per distinct list, named by its tool (a tool with two different lists: `tool-<recipe>`)."""
    groups: dict[tuple, dict] = {}
    for recipe in sorted(recipes):
        for where, t in tool_lists(recipes[recipe] or {}):
            if not isinstance(t, Mapping):
                continue
            for kind in ("wheels", "debs"):
                entries = t.get(kind)
                if not entries or not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                    continue
                key = (t.get("tool"), kind, tuple(_key(e, kind) for e in entries))
                g = groups.setdefault(key, {"tool": t.get("tool"), "kind": kind, "version": t.get("version"),
                                            "entries": tuple(dict(e) for e in entries), "places": []})
                g["places"].append(Place(recipe, where))
    by_tool: dict[str, int] = {}
    for g in groups.values():
        by_tool[g["tool"]] = by_tool.get(g["tool"], 0) + 1
    out = []
    for g in groups.values():
        name = g["tool"] if by_tool[g["tool"]] == 1 else f"{g['tool']}-{Path(g['places'][0].recipe).stem}"
        out.append(Input(name, g["kind"], g["tool"], None if g["version"] is None else str(g["version"]),
                         g["entries"], tuple(g["places"])))
    return sorted(out, key=lambda i: i.name)


def load_inputs(root: Path) -> list[Input]:
    """The inputs of the project at `root`: recipes/*.yaml, and floor.yaml's toolchain (the sysroot every compiled
    variant builds against: moved within its suite like any Debian input, so never past the floor)."""
    recipes = {}
    for f in sorted((Path(root) / "recipes").glob("*.yaml")):
        recipes[f"recipes/{f.name}"] = plain(_load(f))
    floor = Path(root) / "floor.yaml"
    if floor.is_file():
        recipes["floor.yaml"] = plain(_load(floor))
    return find_inputs(recipes)


def _load(f: Path):
    import yaml

    try:
        return yaml.safe_load(f.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise OnebitError(f"cannot read {f.parent.name}/{f.name}: {str(exc).splitlines()[0]}") from None


def plain(data):
    return data if isinstance(data, Mapping) else {}



def _normal(e: Mapping) -> tuple:
    """Pure: an entry as comparable data (its scalars as text, `ship` as a tuple)."""
    return tuple(sorted((k, tuple(map(str, v)) if k == "ship" and isinstance(v, list) else str(v)) for k, v in e.items()))


def entries_in(text: str, path: str, inp: Input) -> tuple[dict, ...] | None:
    """The list of `inp`'s tool at its places in `path`'s text (None unless every place carries the same one)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    places = {p.where for p in inp.places if p.recipe == path}
    lists = set()
    for where, t in tool_lists(plain(data)):
        if isinstance(t, Mapping) and t.get("tool") == inp.tool and where in places:
            entries = t.get(inp.kind)
            if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                return None
            lists.add(tuple(_normal(e) for e in entries))
    if len(lists) != 1:
        return None
    return tuple(dict(e) for e in next(iter(lists)))



# ---- the recipe edit -------------------------------------------------------------------------------------------------
def _scalar(v) -> str:
    return re.escape(str(v))


def edit_text(text: str, old: Sequence[Mapping], new: Sequence[Mapping], kind: str, where: str = "recipe") -> str:
    """Pure: `text` with each changed entry rewritten in place: every line naming the old sha256 gets the new one, and
    the old pool path (debs) or `version: OLD` (wheels) on that line the new; comments and layout are kept. A changed
    entry whose old sha256 is on no line, or whose line does not name its path or version, is a OnebitError."""
    lines = text.splitlines(keepends=True)
    for o, n in zip(old, new):
        if dict(o) == dict(n):
            continue
        hit = [i for i, ln in enumerate(lines) if o["sha256"] in ln]
        if not hit:
            raise OnebitError(f"{where}: no line pins {o['sha256']}", hint="edit the entry by hand, or re-run")
        for i in hit:
            ln = lines[i].replace(o["sha256"], n["sha256"])
            if kind == "debs":
                if o["path"] not in ln:
                    raise OnebitError(f"{where}:{i + 1}: the line of {o['sha256'][:12]} does not name {o['path']}")
                ln = ln.replace(o["path"], n["path"])
            else:
                pat = re.compile(r"(\bversion:\s*)([\"']?)" + _scalar(o["version"]) + r"\2(?=\s*[,}\n])")
                ln, count = pat.subn(lambda m: m.group(1) + m.group(2) + str(n["version"]) + m.group(2), ln)
                if count != 1:
                    raise OnebitError(f"{where}:{i + 1}: the line of {o['sha256'][:12]} does not say version: {o['version']}")
            lines[i] = ln
    return "".join(lines)

