"""JSON Schema validation that reports every problem at once, each with file:line and the YAML path."""
from __future__ import annotations

import json
import re
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


def key_problems(doc: Document) -> list[str]:
    """Every mapping key that is not a string (YAML reads `1:`, `null:`, `yes:` or `2020-01-01:` as int, None, bool,
    date): JSON Schema, the plan's cache keys and the manifest all need string keys. Quoting fixes it."""
    problems: list[tuple[int, str]] = []

    def walk(node, ypath: tuple) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    kind = "null" if key is None else type(key).__name__
                    problems.append((doc.line_of(ypath + (key,)),
                                     f"{doc.where(ypath + (key,))}: key {key!r} is read as {kind}, not text; quote it"))
                else:
                    walk(value, ypath + (key,))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, ypath + (i,))

    walk(doc.data, ())
    return [text for _, text in sorted(problems, key=lambda p: p[0])]


def validate(doc: Document, schema_name: str) -> list[str]:
    """Return human-readable problems ('file:line: path: message'), sorted by line."""
    keys = key_problems(doc)
    if keys:  # a non-text key breaks JSON Schema's messages (and everything after): these first
        return keys
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


def _source_paths(data: dict) -> list[tuple[tuple, str, str]]:
    """(YAML path, value, what it must stay inside) of every recipe field that names a path outside the prefix."""
    out: list[tuple[tuple, str, str]] = []
    source = data.get("source") if isinstance(data.get("source"), dict) else {}
    if isinstance(source.get("local"), str):
        out.append((("source", "local"), source["local"], "the project"))
    for i, extra in enumerate(source.get("extra") or []):
        if isinstance(extra, dict) and isinstance(extra.get("into"), str):
            out.append((("source", "extra", i, "into"), extra["into"], "the checkout"))
    for i, sub in enumerate(source.get("submodules") or []):
        if isinstance(sub, str) and sub != "*":
            out.append((("source", "submodules", i), sub, "the checkout"))
    crates = source.get("crates")
    if isinstance(crates, dict) and isinstance(crates.get("manifest"), str):
        out.append((("source", "crates", "manifest"), crates["manifest"], "the checkout"))

    def tools(items, base: tuple) -> None:
        for i, t in enumerate(items or []):
            if not isinstance(t, dict):
                continue
            if isinstance(t.get("path"), str):
                out.append((base + (i, "path"), t["path"], "the toolchain root"))
            for j, wheel in enumerate(t.get("wheels") or []):
                if isinstance(wheel, dict) and isinstance(wheel.get("root"), str):
                    out.append((base + (i, "wheels", j, "root"), wheel["root"], "the wheel"))

    def kind_options(options, base: tuple) -> None:
        """The path-naming options of the cargo and make kinds (builders/kinds/cargo.py, make.py)."""
        if not isinstance(options, dict):
            return
        if isinstance(options.get("manifest"), str):
            out.append((base + ("manifest",), options["manifest"], "the checkout"))
        if isinstance(options.get("install"), str):
            for pair in options["install"].split():
                src, _, dst = pair.rpartition(":")
                out.append((base + ("install",), src.removeprefix("source:"), "the checkout or build dir"))
                out.append((base + ("install",), dst, "the prefix"))
        if isinstance(options.get("programs"), str):
            for program in options["programs"].split():
                out.append((base + ("programs",), program, "the build tree"))

    tools(data.get("toolchain"), ("toolchain",))
    kind = (data.get("build") or {}).get("kind") if isinstance(data.get("build"), dict) else None
    if kind in ("cargo", "make"):
        kind_options((data.get("build") or {}).get("options"), ("build", "options"))
    for name, over in (data.get("variants") or {}).items():
        if isinstance(over, dict):
            tools(over.get("toolchain"), ("variants", name, "toolchain"))
            if kind in ("cargo", "make") and isinstance(over.get("build"), dict):
                kind_options(over["build"].get("options"), ("variants", name, "build", "options"))
    return out


def path_problem(rel: str, within: str = "the prefix") -> str | None:
    """Why a path (or glob) that must stay inside `within` does not, or None. Pure."""
    if not rel:
        return f"must name a path inside {within}"
    if rel.startswith(("/", "~")) or "\0" in rel or "\\" in rel:
        return f"must be relative to {within} (no leading / or ~, no backslash)"
    if ".." in rel.split("/"):
        return f"may not climb out of {within} with '..'"
    return None


def prefix_path_problems(doc: Document) -> list[str]:
    """Every path a recipe names must stay inside what it is relative to: keep globs, binaries, stage roots, links and
    test programs inside the prefix; the local source inside the project; extra checkouts, submodules, the crates
    manifest and the cargo/make kinds' files inside the checkout; a tool inside its toolchain root."""
    if not isinstance(doc.data, dict):
        return []
    problems = []
    found = [(p, v, "the prefix") for p, v in _prefix_paths(doc.data)] + _source_paths(doc.data)
    for ypath, value, within in found:
        why = path_problem(value, within)
        if why:
            problems.append(f"{doc.where(ypath)}: {value!r} {why}")
    source = doc.data.get("source")
    if isinstance(source, dict) and source.get("patch_dir") in (".", ".."):
        problems.append(f"{doc.where(('source', 'patch_dir'))}: {source['patch_dir']!r} must name a folder of "
                        "recipes/patches/, not climb out of it")
    return problems


def pin_path_problems(doc: Document) -> list[str]:
    """pins.yaml: the git dir inside an sdist mirror, the Hugging Face file names (each becomes a file in the cache)
    and a tested pair's path must stay inside what they name."""
    pins = doc.data.get("pins") if isinstance(doc.data, dict) else None
    if not isinstance(pins, dict):
        return []
    found = []
    for name, pin in pins.items():
        if not isinstance(pin, dict):
            continue
        for i, mirror in enumerate(pin.get("mirrors") or []):
            sdist = mirror.get("pypi_sdist") if isinstance(mirror, dict) else None
            if isinstance(sdist, dict) and isinstance(sdist.get("git_dir"), str):
                found.append((("pins", name, "mirrors", i, "pypi_sdist", "git_dir"), sdist["git_dir"], "the sdist"))
        hf = ((pin.get("companions") or {}).get("huggingface") or {}) if isinstance(pin.get("companions"), dict) else {}
        for file in (hf.get("files") or {}) if isinstance(hf, dict) and isinstance(hf.get("files"), dict) else {}:
            if isinstance(file, str):
                found.append((("pins", name, "companions", "huggingface", "files", file), file, "the checkpoint folder"))
        pair = pin.get("tested_pair")
        if isinstance(pair, dict) and isinstance(pair.get("path"), str):
            found.append((("pins", name, "tested_pair", "path"), pair["path"], "the repository"))
    return [f"{doc.where(p)}: {v!r} {why}" for p, v, within in found if (why := path_problem(v, within))]


def regex_problems(doc: Document) -> list[str]:
    """Regular expressions compiled now, not when a build reaches them: a recipe test's `expect` (with {commit7} and
    {commit} filled in as the runner does) and a pin's `tag_pattern`."""
    data = doc.data if isinstance(doc.data, dict) else {}
    found: list[tuple[tuple, str]] = []
    for base, items in [(("tests",), data.get("tests"))] + [
            (("variants", n, "tests"), v.get("tests")) for n, v in (data.get("variants") or {}).items() if isinstance(v, dict)]:
        for i, t in enumerate(items or []):
            if isinstance(t, dict) and isinstance(t.get("expect"), str):
                found.append((base + (i, "expect"), t["expect"].replace("{commit7}", "0" * 7).replace("{commit}", "0" * 40)))
    for name, pin in (data.get("pins") or {}).items() if isinstance(data.get("pins"), dict) else ():
        if isinstance(pin, dict) and isinstance(pin.get("tag_pattern"), str):
            found.append((("pins", name, "tag_pattern"), pin["tag_pattern"]))
    problems = []
    for ypath, pattern in found:
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            problems.append(f"{doc.where(ypath)}: not a regular expression: {exc}")
    return problems


def backend_problems(doc: Document) -> list[str]:
    """A recipe's backend names must be ones the manifest accepts (schemas/manifest.schema.json), or the bundle
    would fail at its last step, when the manifest is written."""
    known = schema("manifest")["properties"]["backends"]["propertyNames"]["enum"]
    data = doc.data if isinstance(doc.data, dict) else {}
    found = [(("provides", "backend"), (data.get("provides") or {}).get("backend"))]
    for name, over in (data.get("variants") or {}).items():
        if isinstance(over, dict) and isinstance(over.get("provides"), dict) and "backend" in over["provides"]:
            found.append((("variants", name, "provides", "backend"), over["provides"]["backend"]))
    return [f"{doc.where(p)}: backend {b!r} is not one the manifest knows ({', '.join(known)}); add it to "
            "schemas/manifest.schema.json or use one of those" for p, b in found if b is not None and b not in known]
