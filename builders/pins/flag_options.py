"""flag_options: what upstream's CMake files (option(), cmake_dependent_option(), set(... CACHE ...) in every
CMakeLists.txt and *.cmake) and build.zig (b.option(...), the standard target/optimize options) declare, and the -D
options we pass compared with that at the old and the new commit (pure).
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from .flags import HOLD, Row

CMAKE_OWN = re.compile(r"^(CMAKE_\w*|BUILD_SHARED_LIBS)$")  # CMake's own variables: no project declares them


@dataclass(frozen=True)
class Decl:
    name: str
    where: str  # file:line


@dataclass(frozen=True)
class CMakeCommand:
    name: str  # lower case
    args: tuple[str, ...]
    line: int
    quoted: tuple[bool, ...] = ()  # per argument: was it quoted (a quoted CACHE is not the keyword)


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")


def _skip_bracket(text: str, i: int) -> int | None:
    """If a bracket [=*[ opens at i, the index after its closing ]=*] (or the end of text); else None."""
    m = _BRACKET_OPEN.match(text, i)
    if not m:
        return None
    end = text.find("]" + m.group(1) + "]", m.end())
    return len(text) if end < 0 else end + len(m.group(1)) + 2


def _skip_comment(text: str, i: int) -> int:
    """The index just after the comment whose '#' is at i: past a bracket comment, else at the end of its line."""
    end = _skip_bracket(text, i + 1)
    if end is None:
        nl = text.find("\n", i)
        end = len(text) if nl < 0 else nl
    return end


def cmake_commands(text: str) -> list[CMakeCommand]:
    """Every command invocation of a CMake file with its arguments (comments, quoted and bracket arguments handled;
    variable references are kept as written). A line that is not CMake (a stray word) is skipped, not fatal."""
    out: list[CMakeCommand] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if c == "#":
            i = _skip_comment(text, i)
            continue
        m = _IDENT.match(text, i)
        j = m.end() if m else i
        while j < n and text[j] in " \t":
            j += 1
        if not m or j >= n or text[j] != "(":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
            continue
        line = text.count("\n", 0, i) + 1
        args, quoted, i = _cmake_args(text, j + 1)
        out.append(CMakeCommand(m.group(0).lower(), tuple(args), line, tuple(quoted)))
    return out


def _cmake_args(text: str, i: int) -> tuple[list[str], list[bool], int]:
    """Arguments from just after '(' to the matching ')'; returns (args, quoted flags, index after ')')."""
    args: list[str] = []
    quoted: list[bool] = []
    n = len(text)
    depth = 0
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c == "#":
            i = _skip_comment(text, i)
        elif c == ")":
            if depth == 0:
                return args, quoted, i + 1
            depth -= 1
            i += 1
        elif c == "(":
            depth += 1
            i += 1
        elif c == '"':
            j, buf = i + 1, []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j:j + 2])
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            args.append("".join(buf))
            quoted.append(True)
            i = j + 1
        elif c == "[" and _BRACKET_OPEN.match(text, i):
            m = _BRACKET_OPEN.match(text, i)
            end = _skip_bracket(text, i) or n
            args.append(text[m.end(): max(m.end(), end - len(m.group(1)) - 2)])
            quoted.append(True)
            i = end
        else:
            j, buf = i, []
            while j < n and text[j] not in ' \t\r\n()#"':
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j:j + 2])
                    j += 2
                    continue
                if text[j] == "$" and j + 1 < n and text[j + 1] == "{":  # ${...} may hold anything but '}'
                    close = text.find("}", j)
                    close = n - 1 if close < 0 else close
                    buf.append(text[j:close + 1])
                    j = close + 1
                    continue
                buf.append(text[j])
                j += 1
            args.append("".join(buf))
            quoted.append(False)
            i = j
    return args, quoted, n


def _declared_name(cmd: CMakeCommand) -> str | None:
    if not cmd.args or "${" in cmd.args[0] or "$ENV{" in cmd.args[0]:
        return None
    if cmd.name in ("option", "cmake_dependent_option"):
        return cmd.args[0]
    if cmd.name == "set":
        for k, (arg, q) in enumerate(zip(cmd.args, cmd.quoted or (False,) * len(cmd.args))):
            if k > 0 and arg == "CACHE" and not q:
                kind = cmd.args[k + 1] if k + 1 < len(cmd.args) else ""
                return None if kind == "INTERNAL" else cmd.args[0]  # INTERNAL: not a user option (it implies FORCE)
    return None


def is_cmake_file(rel: str) -> bool:
    base = posixpath.basename(rel)
    return base == "CMakeLists.txt" or base.endswith(".cmake")


def tree_order(rel: str) -> tuple:
    return (rel.count("/"), rel)


def cmake_declarations(files: Mapping[str, str]) -> dict[str, Decl]:
    """name -> where it is first declared, over {relative path: text} of a source tree's CMake files (top-level
    files first)."""
    found: dict[str, Decl] = {}
    for rel in sorted(files, key=tree_order):
        if not is_cmake_file(rel):
            continue
        for cmd in cmake_commands(files[rel]):
            name = _declared_name(cmd)
            if name and name not in found:
                found[name] = Decl(name, f"{rel}:{cmd.line}")
    return found


# zig: b.option(T, "name", "description"); the standard options are declared by std.Build itself
_ZIG_OPTION = re.compile(r"\.option\(\s*(?:[^,(){}]|\([^()]*\)|\{[^{}]*\})+?,\s*\"((?:[^\"\\]|\\.)*)\"", re.S)
_ZIG_STANDARD = {
    "standardTargetOptions": ("target", "cpu", "ofmt", "dynamic-linker"),
    "standardOptimizeOption": ("optimize",),
}


def _zig_code(text: str) -> str:
    """build.zig with its // comments blanked (same length, so offsets keep their line numbers)."""
    out = []
    for line in text.split("\n"):
        k, in_str = 0, False
        while k < len(line):
            ch = line[k]
            if ch == "\\" and in_str:
                k += 2
                continue
            if ch == '"':
                in_str = not in_str
            elif not in_str and line.startswith("//", k):
                line = line[:k] + " " * (len(line) - k)
                break
            k += 1
        out.append(line)
    return "\n".join(out)


def zig_declarations(text: str, path: str = "build.zig") -> dict[str, Decl]:
    code = _zig_code(text)
    found: dict[str, Decl] = {}

    def add(name: str, pos: int) -> None:
        if name not in found:
            found[name] = Decl(name, f"{path}:{code.count(chr(10), 0, pos) + 1}")

    for m in _ZIG_OPTION.finditer(code):
        add(m.group(1), m.start())
    for call, names in _ZIG_STANDARD.items():
        for m in re.finditer(rf"\.{call}\(", code):
            for name in names:
                add(name, m.start())
    return found


def compare_options(tool: str, ours: Sequence[tuple[str, str]], old: Mapping[str, Decl] | None,
                    new: Mapping[str, Decl], *, commits: tuple[str, str] = ("old", "new")) -> list[Row]:
    """Rows for the -D options we pass and the options upstream declares at the old and the new commit.

    An option we set that the old tree declared and the new one does not is gone: hold. One that neither declares is
    only noted (a plain variable, or a hint like <Pkg>_ROOT; CMake's unused-variable check catches a stale one at
    build time). New upstream options are reported, never held. Without the old tree (not fetchable) nothing can be
    said to be gone; options missing at the new commit are then only noted."""
    old_c, new_c = commits
    rows: list[Row] = []
    seen: set[str] = set()
    for name, value in ours:
        if name in seen or (tool == "cmake" and CMAKE_OWN.match(name)):
            continue
        seen.add(name)
        flag = f"-D{name}={value}" if value != "" else f"-D{name}"
        if name in new:
            continue
        if old is not None and name in old:
            rows.append(Row(HOLD, flag, f"{old[name].where} at {old_c}",
                            f"the recipe sets it, but nothing at {new_c} declares it any more"))
        else:
            rows.append(Row("info", flag, "", "declared at neither commit; the build's own check decides"
                            if old is not None else f"not declared at {new_c} (the old commit could not be read)"))
    if old is not None:
        for name in sorted(set(new) - set(old)):
            rows.append(Row("new option", name, new[name].where, f"declared at {new_c}, not at {old_c}"))
        for name in sorted(set(old) - set(new) - seen):
            rows.append(Row("removed option", name, f"{old[name].where} at {old_c}", "removed upstream; the recipe does not set it"))
    return rows
