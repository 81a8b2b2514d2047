"""Targeted line edits of pins.yaml: only the lines of the values that move change; comments and key order stay.

Positions come from ruamel.yaml's round-trip parser. After editing, the new text is parsed again and must hold
exactly the expected data and pass the schema; otherwise nothing is written. Files are written aside and renamed.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from ..project import schemas, yamlio
from ..errors import OnebitError
from .decide import Edit, apply_edits


def render_scalar(value: Any) -> str:
    """A YAML scalar that reads back as `value`: plain when safe, else double-quoted."""
    if value is None:
        return "null"
    text = str(value)
    if text and "\n" not in text and text == text.strip() and not text.startswith(("#", "'", '"', "&", "*", "!", "|", ">", "%", "@", "`", "{", "[", "-", "?", ":", ",")):
        try:
            if yaml.safe_load(f"k: {text}") == {"k": text}:
                return text
        except yaml.YAMLError:
            pass
    return json.dumps(text)


def _scalar_end(line: str, col: int) -> int:
    """Where the single-line scalar starting at `col` ends (before a comment or the line end)."""
    if col < len(line) and line[col] in "'\"":
        quote = line[col]
        i = col + 1
        while i < len(line):
            if line[i] == quote:
                if quote == "'" and i + 1 < len(line) and line[i + 1] == "'":
                    i += 2
                    continue
                return i + 1
            if quote == '"' and line[i] == "\\":
                i += 2
                continue
            i += 1
        raise ValueError("unterminated quoted scalar")
    i = line.find(" #", col)
    end = len(line) if i < 0 else i
    return len(line[:end].rstrip())


def _node(root: Any, path: tuple) -> Any:
    node = root
    for part in path:
        node = node[part]
    return node


def _key_span(lines: list[str], mapping: CommentedMap, key: str) -> tuple[int, int]:
    """Lines [start, end) taken by `key` and its value, not counting trailing blank or comment lines."""
    start, col = mapping.lc.key(key)
    keys = list(mapping)
    i = keys.index(key)
    if i + 1 < len(keys):
        end = mapping.lc.key(keys[i + 1])[0]
    else:
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > col):
            end += 1
    while end - 1 > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return start, end


def edit_text(text: str, edits: Iterable[Edit]) -> str:
    """Apply `edits` to pins.yaml text by replacing, replacing-a-sibling or inserting single lines."""
    edits = list(edits)
    lines = text.splitlines(keepends=True)
    for e in edits:
        root = YAML(typ="rt").load("".join(lines))
        parent = _node(root, e.path[:-1])
        key = e.path[-1]
        rendered = render_scalar(e.value)
        if not isinstance(parent, CommentedMap):
            raise OnebitError(f"cannot edit {'.'.join(map(str, e.path))}: its parent is not a mapping")
        if key in parent:
            vline, vcol = parent.lc.value(key)
            kline = parent.lc.key(key)[0]
            if vline != kline or isinstance(parent[key], (dict, list)):
                raise OnebitError(
                    f"cannot edit {'.'.join(map(str, e.path))} in place: its value is not a one-line scalar",
                    hint="write the value on the same line as its key",
                )
            raw = lines[vline]
            body = raw.rstrip("\r\n")
            nl = raw[len(body):]
            end = _scalar_end(body, vcol)
            lines[vline] = body[:vcol] + rendered + body[end:] + nl
            if e.replaces and e.replaces in parent:
                start, stop = _key_span(lines, parent, e.replaces)
                del lines[start:stop]
            continue
        if e.replaces and e.replaces in parent:
            start, stop = _key_span(lines, parent, e.replaces)
            col = parent.lc.key(e.replaces)[1]
            nl = "\r\n" if lines[start].endswith("\r\n") else "\n"
            lines[start:stop] = [" " * col + f"{key}: {rendered}{nl}"]
            continue
        present = [a for a in e.after if a in parent]
        anchor = present[0] if present else list(parent)[-1]
        start, stop = _key_span(lines, parent, anchor)
        col = parent.lc.key(anchor)[1]
        nl = "\r\n" if lines[start].endswith("\r\n") else "\n"
        if not lines[stop - 1].endswith(("\n", "\r")):
            lines[stop - 1] += nl
        lines.insert(stop, " " * col + f"{key}: {rendered}{nl}")
    return "".join(lines)


def edit_pins(text: str, edits: Iterable[Edit], *, where: Path | str = "pins.yaml") -> str:
    """The edited text, verified: it parses to exactly the expected data and passes the pins schema."""
    edits = list(edits)
    before = yamlio.load_text(text, where)
    expected = apply_edits(before.data, edits)
    try:
        new = edit_text(text, edits)
        after = yamlio.load_text(new, where)
    except (OnebitError, ValueError, KeyError) as exc:
        raise OnebitError(f"could not edit pins.yaml: {exc}", where=str(where), hint="nothing was written; edit the pin by hand") from None
    if json.loads(json.dumps(after.data)) != expected:
        raise OnebitError(
            "editing pins.yaml in place gave an unexpected result; nothing was written",
            where=str(where),
            hint="the entry may use a YAML layout the line editor does not handle; edit the pin by hand and report this",
        )
    problems = schemas.validate(after, "pins")
    if problems:
        raise OnebitError("the edited pins.yaml would not be valid:\n  " + "\n  ".join(problems), where=str(where))
    return new


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename into place (the file is either old or new, never half-written)."""
    path = Path(path)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


__all__ = ["edit_pins", "edit_text", "render_scalar", "write_atomic"]
