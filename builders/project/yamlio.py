"""Load YAML with a line number for every path, so errors can say file:line and the YAML path."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import OnebitError

Path_ = tuple  # a YAML path: a tuple of keys and indexes


@dataclass
class Document:
    """A parsed YAML file: its data and the 1-based line where each path starts."""

    path: Path
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)

    def line_of(self, ypath: tuple) -> int:
        """The line of the deepest known node on ypath (an unknown key reports its parent)."""
        ypath = tuple(ypath)
        while ypath not in self.lines and ypath:
            ypath = ypath[:-1]
        return self.lines.get(ypath, 1)

    def where(self, ypath: tuple) -> str:
        return f"{display(self.path)}:{self.line_of(ypath)}: {format_ypath(ypath)}"


def display(path: Path) -> str:
    """A path as the user should see it: relative to the current directory when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def format_ypath(ypath: tuple) -> str:
    out = ""
    for part in ypath:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class _Loader(yaml.SafeLoader):
    pass


MAX_DEPTH = 64  # no input of ours nests deeper than about 8; deeper is a mistake or an attack
MAX_NODES = 100_000  # anchors and aliases may not expand a small file into a huge one ("billion laughs")


class _Budget:
    def __init__(self) -> None:
        self.nodes = 0


def _where(loader: _Loader, node: yaml.Node) -> str:
    return f"{display(Path(loader.name))}:{node.start_mark.line + 1}"


def _walk(node: yaml.Node, ypath: tuple, lines: dict, loader: _Loader, budget: _Budget | None = None) -> Any:
    budget = budget or _Budget()
    budget.nodes += 1
    if budget.nodes > MAX_NODES:
        raise OnebitError(f"the document expands to more than {MAX_NODES} nodes (anchors and aliases?)",
                          where=_where(loader, node), hint="write the values out instead of nesting aliases")
    if len(ypath) > MAX_DEPTH:
        raise OnebitError(f"nested deeper than {MAX_DEPTH} levels", where=_where(loader, node),
                          hint="check the indentation and brackets at that line")
    lines.setdefault(ypath, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise OnebitError("a mapping key must be a plain value, not a list or mapping", where=_where(loader, key_node),
                                  hint="check the indentation and the `?` or brackets at that line")
            key = _construct(key_node, loader)
            if key in out:
                raise OnebitError(
                    f"duplicate key {key!r}",
                    where=_where(loader, key_node),
                    hint="each key may appear once; remove or rename one of them",
                )
            child = ypath + (key,)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, child, lines, loader, budget)
            lines[child] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, ypath + (i,), lines, loader, budget) for i, item in enumerate(node.value)]
    return _construct(node, loader)


def _construct(node: yaml.Node, loader: _Loader) -> Any:
    """A scalar's value; a tag or value YAML cannot construct safely (a bad date, !!python/...) is an error with its line."""
    try:
        value = loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise OnebitError(f"cannot read this value: {getattr(exc, 'problem', None) or exc}", where=_where(loader, node),
                          hint="quote the value to make it a string") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp with month 13
        raise OnebitError(f"cannot read value {node.value!r}: {exc}", where=_where(loader, node),
                          hint="quote the value to make it a string") from None
    try:
        hash(value)
    except TypeError:
        raise OnebitError("a mapping key must be a plain value", where=_where(loader, node)) from None
    return value


def _control_char(text: str) -> tuple[int, str] | None:
    """The line and name of the first character YAML refuses (NUL and other controls), if any."""
    m = _UNPRINTABLE.search(text)
    if not m:
        return None
    return text.count("\n", 0, m.start()) + 1, f"U+{ord(m.group()):04X}"


_UNPRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


def load_text(text: str, path: Path | str) -> Document:
    """Parse YAML; anything wrong with it is one OnebitError naming file:line, never a parser exception."""
    path = Path(path)
    bad = _control_char(text)
    if bad:
        raise OnebitError(f"control character {bad[1]} is not allowed in YAML", where=f"{display(path)}:{bad[0]}",
                          hint="remove it (a NUL or other control byte usually means a corrupt or binary file)")
    loader = None
    try:
        loader = _Loader(text)
        loader.name = str(path)
        node = loader.get_single_node()
        lines: dict[tuple, int] = {}
        data = _walk(node, (), lines, loader) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise OnebitError(
            f"malformed YAML: {exc.problem or exc.context or 'syntax error'}",
            where=f"{display(path)}:{line}",
            hint="fix the syntax at that line (indentation, a missing colon or quote)",
        ) from None
    except yaml.YAMLError as exc:  # ReaderError and friends: no mark, maybe a position
        pos = getattr(exc, "position", None)
        line = text.count("\n", 0, pos) + 1 if isinstance(pos, int) else 1
        raise OnebitError(f"malformed YAML: {str(exc).splitlines()[0]}", where=f"{display(path)}:{line}") from None
    except RecursionError:
        line = (loader.line + 1) if loader is not None else 1
        raise OnebitError("nested too deeply to read", where=f"{display(path)}:{line}",
                          hint="check the brackets and indentation near that line") from None
    finally:
        if loader is not None:
            loader.dispose()
    return Document(path=path, data=data, lines=lines)


def load(path: Path | str) -> Document:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OnebitError("file not found", where=display(path),
                          hint="run from the project root or pass --root DIR") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise OnebitError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})", where=f"{display(path)}:{line}",
                          hint="save the file as UTF-8") from None
    except OSError as exc:
        raise OnebitError(f"cannot read: {exc.strerror or exc}", where=display(path)) from None
    return load_text(text, path)
