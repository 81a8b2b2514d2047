"""Serve recipes: measured argument/environment additions matched on the route's facts.

A recipe file is JSON: {"schema_version": 1, "recipes": [{name, match, args, env, measured}, ...]}.
`match` keys (all optional, all must hold): device, architecture, moe (bool), drafter ("dflash"|"mtp"|"none"),
rotated (bool). A recipe adds its args and env only where the user did not already give them (child.py applies them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping

from .errors import RecipeError

MATCH_KEYS = ("device", "architecture", "moe", "drafter", "rotated")


@dataclass(frozen=True)
class RecipeFacts:
    """What a recipe can match on, for one backend child."""

    device: str
    architecture: str | None
    moe: bool
    drafter: str  # "dflash" | "mtp" | "none"
    rotated: bool


@dataclass(frozen=True)
class Recipe:
    name: str
    match: Mapping[str, object]
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    measured: object = None

    def matches(self, facts: RecipeFacts) -> bool:
        for key, want in self.match.items():
            have = getattr(facts, key)
            if isinstance(want, list):
                if have not in want:
                    return False
            elif have != want:
                return False
        return True


def default_recipes_path() -> Path:
    return Path(str(resources.files("onebit").joinpath("data/serve-recipes.json")))


def parse_recipes(data: object, where: str) -> tuple[Recipe, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("recipes"), list):
        raise RecipeError(f'{where}: expected an object with a "recipes" list')
    out = []
    names = set()
    for i, r in enumerate(data["recipes"]):
        at = f"{where}: recipes[{i}]"
        if not isinstance(r, dict):
            raise RecipeError(f"{at}: expected an object")
        name = r.get("name")
        if not isinstance(name, str) or not name:
            raise RecipeError(f'{at}: missing "name"')
        at = f"{where}: recipe {name}"
        if name in names:
            raise RecipeError(f"{at}: duplicate name")
        names.add(name)
        if not r.get("measured"):
            raise RecipeError(f'{at}: missing "measured" (every recipe must say what measurement chose it)')
        unknown = set(r) - {"name", "match", "args", "env", "measured", "description"}
        if unknown:
            raise RecipeError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
        match = r.get("match", {})
        if not isinstance(match, dict) or set(match) - set(MATCH_KEYS):
            raise RecipeError(f"{at}: match keys must be among {', '.join(MATCH_KEYS)}")
        args = r.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RecipeError(f"{at}: args must be a list of strings")
        if args and not args[0].startswith("-"):
            raise RecipeError(f"{at}: args must start with a flag, got {args[0]!r}")
        env = r.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise RecipeError(f"{at}: env must map names to strings")
        out.append(Recipe(name=name, match=dict(match), args=tuple(args), env=dict(env), measured=r["measured"]))
    return tuple(out)


def load_recipes(path: str | os.PathLike) -> tuple[Recipe, ...]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"serve recipes file not found: {path}") from None
    except OSError as e:
        raise RecipeError(f"cannot read serve recipes {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise RecipeError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    return parse_recipes(data, str(path))
