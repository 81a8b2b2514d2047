"""Load YAML with a line number for every path, so errors can say file:line and the YAML path."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import OnebitError

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


def _walk(node: yaml.Node, ypath: tuple, lines: dict, loader: _Loader) -> Any:
    lines[ypath] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in out:
                raise OnebitError(
                    f"duplicate key {key!r}",
                    where=f"{display(Path(loader.name))}:{key_node.start_mark.line + 1}",
                    hint="each key may appear once; remove or rename one of them",
                )
            child = ypath + (key,)
            lines[child] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, child, lines, loader)
            lines[child] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, ypath + (i,), lines, loader) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_text(text: str, path: Path | str) -> Document:
    path = Path(path)
    loader = _Loader(text)
    loader.name = str(path)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise OnebitError(
            f"malformed YAML: {exc.problem or exc}",
            where=f"{display(path)}:{line}",
            hint="fix the syntax at that line (indentation, a missing colon or quote)",
        ) from None
    except yaml.YAMLError as exc:
        raise OnebitError(f"malformed YAML: {exc}", where=str(path)) from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    data = _walk(node, (), lines, loader) if node is not None else None
    return Document(path=path, data=data, lines=lines)


def load(path: Path | str) -> Document:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OnebitError("file not found", where=display(path),
                          hint="run from the project root or pass --root DIR") from None
    return load_text(text, path)
