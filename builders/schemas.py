"""JSON Schema validation that reports every problem at once, each with file:line and the YAML path."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import jsonschema

from .yamlio import Document

# builders/schema_files links to the project's schemas/, so a checkout and an installed wheel read the same files.
SCHEMA_DIR = Path(__file__).resolve().parent / "schema_files"


@lru_cache(maxsize=None)
def schema(name: str) -> dict:
    path = SCHEMA_DIR / f"{name}.schema.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _leaf_errors(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """oneOf/anyOf errors hide the useful message in their context; pick the branch that got furthest."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        best_depth = max(len(e.absolute_path) for e in error.context)
        deepest = [e for e in error.context if len(e.absolute_path) == best_depth]
        out: list[jsonschema.ValidationError] = []
        for sub in deepest:
            out.extend(_leaf_errors(sub))
        return out
    return [error]


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(k for k in error.instance if k not in allowed)
        if unknown and allowed:
            return f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
    if error.validator == "oneOf" and not error.context:
        return f"{error.message} (exactly one of the alternatives must match)"
    return error.message


def validate(doc: Document, schema_name: str) -> list[str]:
    """Return human-readable problems ('file:line: path: message'), sorted by line."""
    validator = jsonschema.Draft202012Validator(schema(schema_name))
    problems: list[tuple[int, str]] = []
    seen: set[str] = set()
    for error in validator.iter_errors(doc.data):
        for leaf in _leaf_errors(error):
            ypath = tuple(leaf.absolute_path)
            if leaf.validator == "additionalProperties" and isinstance(leaf.instance, dict):
                allowed = set(leaf.schema.get("properties", {}))
                unknown = [k for k in leaf.instance if k not in allowed]
                if len(unknown) == 1:
                    ypath = ypath + (unknown[0],)
            text = f"{doc.where(ypath)}: {_message(leaf)}"
            if text not in seen:
                seen.add(text)
                problems.append((doc.line_of(ypath), text))
    return [text for _, text in sorted(problems)]


def _prefix_paths(data: dict) -> list[tuple[tuple, str]]:
    """(YAML path, value) of every recipe field that names a path inside the installed prefix."""
    out: list[tuple[tuple, str]] = []

    def stage_paths(stage, base: tuple) -> None:
        if not isinstance(stage, dict):
            return
        for i, glob in enumerate(stage.get("keep") or []):
            out.append((base + ("keep", i), glob))
        for name, rel in (stage.get("binaries") or {}).items():
            out.append((base + ("binaries", name), rel))
        if isinstance(stage.get("root"), str):
            out.append((base + ("root",), stage["root"]))
        links = stage.get("links")
        if isinstance(links, dict):
            for k, v in links.items():
                out.extend([(base + ("links", k), k), (base + ("links", k), v)])

    def tests(items, base: tuple) -> None:
        for i, t in enumerate(items or []):
            if isinstance(t, dict) and isinstance(t.get("run"), list) and t["run"]:
                out.append((base + (i, "run", 0), t["run"][0]))

    stage_paths(data.get("stage"), ("stage",))
    tests(data.get("tests"), ("tests",))
    for name, over in (data.get("variants") or {}).items():
        if isinstance(over, dict):
            stage_paths(over.get("stage"), ("variants", name, "stage"))
            tests(over.get("tests"), ("variants", name, "tests"))
    return [(p, v) for p, v in out if isinstance(v, str)]


def path_problem(rel: str) -> str | None:
    """Why a path (or glob) that must stay inside the prefix does not, or None. Pure."""
    if rel.startswith(("/", "~")) or "\0" in rel or "\\" in rel:
        return "must be relative to the prefix (no leading / or ~, no backslash)"
    if ".." in rel.split("/"):
        return "may not climb out of the prefix with '..'"
    return None


def prefix_path_problems(doc: Document) -> list[str]:
    """A recipe's keep globs, binaries, stage paths and test programs must stay inside the prefix."""
    if not isinstance(doc.data, dict):
        return []
    problems = []
    for ypath, value in _prefix_paths(doc.data):
        why = path_problem(value)
        if why:
            problems.append(f"{doc.where(ypath)}: {value!r} {why}")
    return problems
