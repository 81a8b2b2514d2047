"""flag_calls: the plan's build step read as the build-system calls it makes (cmake configures, zig builds, make
calls), each as its root runs it, with the -D options, make variables, goals and directory it gives (pure).
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Invocation:
    """One build-system call of the plan's build step, read from its argv (network-cut prefix removed)."""

    tool: str  # cmake | zig | make
    argv: tuple[str, ...]
    defines: tuple[tuple[str, str], ...] = ()  # cmake / zig: -D name, value
    directory: str | None = None  # make: the directory in the source tree ('.' its root); None: outside it
    plan_dir: str = ""  # make: the directory as the plan names it
    makefile: str | None = None  # make: -f, as given
    goals: tuple[str, ...] = ()
    variables: tuple[str, ...] = ()  # make: command-line assignments, as given (NAME=value)
    options: tuple[str, ...] = ()  # make: other options, except -j (jobs do not change flags)
    env: tuple[tuple[str, str], ...] = ()

    def label(self) -> str:
        if self.tool == "make":
            return "make " + " ".join(self.goals or ("(default goal)",))
        return f"{self.tool} " + ("configure" if self.tool == "cmake" else "build")


_MAKE_VAR = re.compile(r"^([A-Za-z_.][A-Za-z0-9_.-]*)\s*(?:\+|\?|!|:{1,3})?=")
_MAKE_ARG_OPTS = {"-I", "-o", "-W", "--include-dir", "--old-file", "--new-file", "--what-if", "--assume-old", "--assume-new"}


def make_variable(assignment: str) -> str | None:
    m = _MAKE_VAR.match(assignment)
    return m.group(1) if m else None


def _defines(args: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    k = 0
    while k < len(args):
        a = args[k]
        if a == "-D" and k + 1 < len(args):
            a = "-D" + args[k + 1]
            k += 1
        if a.startswith("-D") and len(a) > 2:
            name, _, value = a[2:].partition("=")
            out.append((name.split(":", 1)[0], value))
        k += 1
    return tuple(out)


def unwrapped(commands: Sequence) -> list:
    """Each command as its root runs it (`inside`: without the host's network cut or a build root's bwrap;
    builders/roots/root.py)."""
    return [getattr(c, "inside", None) or c for c in commands]


def source_aliases(commands: Sequence, source_dir: str) -> tuple[str, ...]:
    """The source dir, and every directory the build step copies it into first (`cp -a SRC/. DST`)."""
    aliases = [source_dir.rstrip("/")]
    for c in unwrapped(commands):
        argv = list(c.argv)
        if argv and posixpath.basename(argv[0]) == "cp" and len(argv) >= 3:
            srcs = [a.rstrip("/").removesuffix("/.") for a in argv[1:-1] if not a.startswith("-")]
            if any(s in aliases for s in srcs):
                aliases.append(argv[-1].rstrip("/"))
    return tuple(aliases)


def in_source(path: str, aliases: Sequence[str]) -> str | None:
    """`path` relative to the source tree ('.' for its root), when it lies in one of its aliases."""
    path = posixpath.normpath(path)
    for a in aliases:
        a = posixpath.normpath(a)
        if path == a:
            return "."
        if path.startswith(a + "/"):
            return path[len(a) + 1:]
    return None


def parse_make(argv: Sequence[str], cwd: str | None, aliases: Sequence[str], env=()) -> Invocation:
    directory = cwd
    makefile = None
    goals: list[str] = []
    variables: list[str] = []
    options: list[str] = []
    k = 1
    while k < len(argv):
        a = argv[k]
        nxt = argv[k + 1] if k + 1 < len(argv) else None
        if a in ("-C", "--directory") and nxt is not None:
            directory = posixpath.join(directory or "", nxt)
            k += 2
            continue
        if a.startswith("--directory=") or (a.startswith("-C") and len(a) > 2):
            directory = posixpath.join(directory or "", a.split("=", 1)[1] if a.startswith("--") else a[2:])
        elif a in ("-f", "--file", "--makefile") and nxt is not None:
            makefile = nxt
            k += 2
            continue
        elif a.startswith(("--file=", "--makefile=")) or (a.startswith("-f") and len(a) > 2):
            makefile = a.split("=", 1)[1] if a.startswith("--") else a[2:]
        elif re.fullmatch(r"-j\d*|--jobs(=\d+)?|-l[\d.]*|--load-average(=[\d.]+)?", a):
            if a in ("-j", "--jobs", "-l", "--load-average") and nxt is not None and re.fullmatch(r"[\d.]+", nxt):
                k += 1
        elif a in _MAKE_ARG_OPTS and nxt is not None:
            options += [a, nxt]
            k += 2
            continue
        elif a.startswith("-"):
            options.append(a)
        elif make_variable(a):
            variables.append(a)
        else:
            goals.append(a)
        k += 1
    rel = in_source(directory, aliases) if directory else None
    return Invocation("make", tuple(argv), directory=rel, plan_dir=directory or "", makefile=makefile, goals=tuple(goals),
                      variables=tuple(variables), options=tuple(options), env=tuple(env))


def invocations(commands: Sequence, *, source_dir: str) -> list[Invocation]:
    """The cmake configures, zig builds and make calls of a build step's commands (Command objects: argv, cwd, env),
    each as its root runs it (`unwrapped`)."""
    commands = unwrapped(commands)
    aliases = source_aliases(commands, source_dir)
    out = []
    for c in commands:
        argv = tuple(c.argv)
        if not argv:
            continue
        prog = posixpath.basename(argv[0])
        env = tuple(c.env)
        if prog == "cmake" and not any(a in ("--build", "--install", "-E", "-P", "--open", "--workflow") for a in argv):
            out.append(Invocation("cmake", argv, defines=_defines(argv[1:]), env=env))
        elif prog == "zig" and len(argv) > 1 and argv[1] == "build":
            out.append(Invocation("zig", argv, defines=_defines(argv[2:]), env=env))
        elif prog in ("make", "gmake"):
            out.append(parse_make(argv, c.cwd, aliases, env))
    return out


def recipe_variables(inv: Invocation, option_names: Iterable[str]) -> tuple[str, ...]:
    """The make variables the recipe itself sets (its build.options), as the plan passes them: command-line
    assignments, else the environment of the call."""
    names = {n for n in option_names}
    out = [a for a in inv.variables if make_variable(a) in names]
    given = {make_variable(a) for a in out}
    out += [f"{k}={v}" for k, v in inv.env if k in names and k not in given]
    return tuple(out)
