"""Build-flag drift, the pure half: what a recipe asks of upstream's build files, what those files declare, and
what `make -n` says upstream's build and ours would run. Text and argv in, findings out; nothing here runs a
program or touches a file (builders/pins/flagdrift.py does, thinly). Every function is tested by a table.

- cmake: the `-D` options of each configure command of the plan's build step, against the options the tree
  declares (option(), cmake_dependent_option(), set(... CACHE ...) in every CMakeLists.txt and *.cmake).
- zig: the `-D` options of `zig build`, against build.zig's b.option(...) (and the standard target/optimize options).
- make: the compile lines of `make -n` for upstream's own invocation (the recipe's goals, nothing else), for
  upstream's invocation plus the recipe's variables, and for our whole invocation (the plan's argv and environment).
  A flag that the first has and the second lacks is the recipe's deliberate override; a flag that the second has
  and ours lacks is dropped by how we invoke make, and holds the bump.
"""
from __future__ import annotations

import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

# ------------------------------------------------------------------------------------------------ findings

HOLD = "hold"
MAX_ROWS = 40  # per recipe variant in the PR body; the hold reasons are never cut


@dataclass(frozen=True)
class Row:
    """One line of the report. result: hold | override | upstream | new option | removed option | ours | info |
    not compared | matches."""

    result: str
    what: str
    where: str = ""  # upstream file:line
    detail: str = ""

    @property
    def holds(self) -> bool:
        return self.result == HOLD


@dataclass(frozen=True)
class VariantReport:
    variant: str  # the recipe variant's id (ds4, ds4-cuda, vulkan)
    how: str  # what was compared, in words
    rows: tuple[Row, ...]

    @property
    def held(self) -> bool:
        return any(r.holds for r in self.rows)

    def reasons(self) -> list[str]:
        return [f"{self.variant}: {r.what}: {r.detail}" + (f" ({r.where})" if r.where else "") for r in self.rows if r.holds]


def hold_reasons(reports: Iterable[VariantReport]) -> list[str]:
    return [reason for rep in reports for reason in rep.reasons()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rep: VariantReport) -> str:
    lines = [f"{rep.how}", ""]
    if not rep.rows:
        return lines[0] + ": matches (nothing dropped, nothing gone, no new upstream option)."
    shown = sorted(rep.rows, key=lambda r: (not r.holds, r.result == "ours"))  # holds first, our own additions last
    lines += ["| result | what | upstream | detail |", "|---|---|---|---|"]
    for r in shown[:MAX_ROWS]:
        result = f"**{r.result.upper()}**" if r.holds else r.result
        lines.append(f"| {result} | `{_cell(r.what)}` | {_cell(r.where) or '—'} | {_cell(r.detail)} |")
    if len(shown) > MAX_ROWS:
        lines.append(f"| … | {len(shown) - MAX_ROWS} more rows | | |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ declarations


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


def _tree_order(rel: str) -> tuple:
    return (rel.count("/"), rel)


def cmake_declarations(files: Mapping[str, str]) -> dict[str, Decl]:
    """name -> where it is first declared, over {relative path: text} of a source tree's CMake files (top-level
    files first)."""
    found: dict[str, Decl] = {}
    for rel in sorted(files, key=_tree_order):
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


# ------------------------------------------------------------------------------------------------ our invocation


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


CMAKE_OWN = re.compile(r"^(CMAKE_\w*|BUILD_SHARED_LIBS)$")  # CMake's own variables: no project declares them
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


# ------------------------------------------------------------------------------------------------ options


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


# ------------------------------------------------------------------------------------------------ make -n


_COMPILER = re.compile(r"^(?:[\w.+-]*-)?(?:cc|gcc|g\+\+|c\+\+|clang|clang\+\+|nvcc|hipcc|amdclang|amdclang\+\+|icx|icpx|icc|icpc)"
                       r"(?:-\d+(?:\.\d+)*)?$")
_LAUNCHERS = {"ccache", "sccache", "distcc"}
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}
_WITH_ARG = {"-Xcompiler", "-Xlinker", "-Xptxas", "-Xcudafe", "-Xarch_device", "-Xarch_host", "-Xclang", "-I", "-L", "-D",
             "-U", "-include", "-imacros", "-isystem", "-iquote", "-idirafter", "-x", "-arch", "-MF", "-MT", "-MQ", "-ccbin",
             "-gencode", "--compiler-options", "--linker-options", "--offload-arch"}
_SOURCE = re.compile(r"\.(c|cc|cpp|cxx|c\+\+|cu|hip|m|mm|s|S)$")


@dataclass(frozen=True)
class CompileLine:
    key: str  # what it makes: the -o output, else the source of a -c
    compiler: str
    flags: tuple[str, ...]


def _simple_commands(line: str) -> list[list[str]]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: not a line we can read
        return []
    out, cur = [], []
    for t in tokens:
        if t in _SEPARATORS:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        out.append(cur)
    return out


def _compile_line(words: list[str]) -> CompileLine | None:
    while words and (make_variable(words[0]) and "=" in words[0] and not words[0].startswith("-")):
        words = words[1:]  # VAR=value prefix assignments
    while words and posixpath.basename(words[0]) in ({"env"} | _LAUNCHERS):
        words = words[1:]
    if not words or not _COMPILER.match(posixpath.basename(words[0])):
        return None
    flags: list[str] = []
    output = source = None
    k = 1
    while k < len(words):
        w = words[k]
        if w == "-o" and k + 1 < len(words):
            output = words[k + 1]
            k += 2
            continue
        if w.startswith("-o") and len(w) > 2 and not w.startswith("-obj"):
            output = w[2:]
        elif w == "-c":
            pass
        elif w in _WITH_ARG and k + 1 < len(words):
            flags.append(f"{w} {words[k + 1]}")
            k += 2
            continue
        elif w.startswith("-"):
            flags.append(w)
        elif source is None and _SOURCE.search(w):
            source = w
        k += 1
    key = output or (f"{source} (-c)" if source else posixpath.basename(words[0]))
    return CompileLine(key, posixpath.basename(words[0]), tuple(flags))


def compile_lines(output: str) -> dict[str, CompileLine]:
    """The compiler calls in `make -n` output, by what each makes (a repeated key gets #2, #3 ...)."""
    text = output.replace("\\\n", " ")
    found: dict[str, CompileLine] = {}
    for line in text.splitlines():
        if re.match(r"^\s*g?make(\[\d+\])?: ", line):
            continue
        for words in _simple_commands(line):
            cl = _compile_line(words)
            if cl is None:
                continue
            key, n = cl.key, 1
            while key in found:
                n += 1
                key = f"{cl.key} #{n}"
            found[key] = CompileLine(key, cl.compiler, cl.flags)
    return found


def _family(flag: str) -> str:
    """Flags of one family override each other, the last one wins (-O2 after -O3; -fno-x after -fx)."""
    if re.fullmatch(r"-O(\d|s|z|g|fast)?", flag):
        return "-O"
    m = re.fullmatch(r"-(march|mtune|mcpu|std|arch)=.*", flag)
    if m:
        return f"-{m.group(1)}="
    m = re.fullmatch(r"-([fWm])(?:no-)?([A-Za-z0-9][\w+.-]*)", flag)
    if m and "=" not in flag:
        return f"-{m.group(1)}{m.group(2)}"
    return flag


def effective(flags: Sequence[str]) -> tuple[str, ...]:
    """The flags that take effect, in order: of each family only the last."""
    last: dict[str, str] = {}
    for f in flags:
        fam = _family(f)
        last.pop(fam, None)
        last[fam] = f
    return tuple(last.values())


@dataclass(frozen=True)
class MakeRun:
    """One `make -n` run: its exit status and output (paths of this machine already replaced)."""

    rc: int | None  # None: timed out, or make could not be started
    out: str = ""
    err: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def problem(self) -> str:
        lines = [ln.strip() for ln in self.err.splitlines() if ln.strip()]
        errs = [ln for ln in lines if "***" in ln or ln.startswith(("make:", "Makefile", "error"))]
        return (errs or lines or [f"exit {self.rc}"])[0]


def missing_goal(run: MakeRun, goals: Sequence[str]) -> str | None:
    """The goal make says it has no rule for, if that is why it failed."""
    for g in goals:
        if re.search(rf"No rule to make target [`']{re.escape(g)}'\.", run.err):
            return g
    return None


def _word(word: str) -> re.Pattern:
    return re.compile(rf"(?<![\w=-]){re.escape(word)}(?![\w=.-])")


def find_in_files(word: str, files: Mapping[str, str]) -> str | None:
    """file:line of the first whole-word occurrence of `word` in the files (top-level first)."""
    rx = _word(word)
    for rel in sorted(files, key=_tree_order):
        for n, line in enumerate(files[rel].splitlines(), 1):
            if rx.search(line):
                return f"{rel}:{n}"
    return None


def flag_origin(flag: str, files: Mapping[str, str]) -> str:
    """Where upstream's build files spell a flag (for '-Xcompiler -pthread', the -pthread)."""
    return find_in_files(flag, files) or (find_in_files(flag.split()[-1], files) if " " in flag else None) or ""


_ASSIGN = re.compile(r"^\s*(?:override\s+|export\s+)*([A-Za-z_][\w.-]*)\s*(?:\+|\?|!|:{1,3})?=")


def _setter(where: str, files: Mapping[str, str]) -> str | None:
    """The make variable assigned on the line `file:line` names, if that line is an assignment."""
    rel, _, n = where.rpartition(":")
    if not rel or not n.isdigit():
        return None
    lines = files.get(rel, "").splitlines()
    m = _ASSIGN.match(lines[int(n) - 1]) if 0 < int(n) <= len(lines) else None
    return m.group(1) if m else None


def _recipe_var(recipe_vars: Sequence[str], *, setter: str | None = None, inside: str | None = None) -> str | None:
    """The recipe's assignment that explains a flag: the variable upstream sets it in, or the one whose value it holds."""
    for v in recipe_vars:
        name, value = make_variable(v), v.split("=", 1)[1]
        if (setter and name == setter) or (inside and value and value in inside):
            return v
    return None


def find_target(goal: str, files: Mapping[str, str]) -> str | None:
    rx = re.compile(rf"^(?:[^\s:#=]+\s+)*{re.escape(goal)}(?:\s+[^\s:#=]+)*\s*::?(?!=)")
    for rel in sorted(files, key=_tree_order):
        for n, line in enumerate(files[rel].splitlines(), 1):
            if rx.match(line):
                return f"{rel}:{n}"
    return None


@dataclass(frozen=True)
class MakeSide:
    """make -n at one commit: upstream's invocation, upstream's with the recipe's variables, ours."""

    upstream: MakeRun
    recipe: MakeRun
    ours: MakeRun


def _drops(recipe: Mapping[str, CompileLine], ours: Mapping[str, CompileLine]) -> tuple[dict[str, list[str]], list[str]]:
    """flag -> the lines (keys) that lose it in ours; and the lines ours does not make at all."""
    lost: dict[str, list[str]] = {}
    for key, line in recipe.items():
        if key not in ours:
            continue
        mine = set(effective(ours[key].flags))
        for f in effective(line.flags):
            if f not in mine:
                lost.setdefault(f, []).append(key)
    return lost, [k for k in recipe if k not in ours]


def _with_flag(lines: Mapping[str, CompileLine], flag: str) -> int:
    return sum(1 for cl in lines.values() if flag in effective(cl.flags))


def compare_make(inv: Invocation, new: MakeSide, old: MakeSide | None, *, new_files: Mapping[str, str],
                 old_files: Mapping[str, str] | None, recipe_vars: Sequence[str], recipe_where: Mapping[str, str] | str,
                 commits: tuple[str, str] = ("old", "new")) -> list[Row]:
    """Rows for one make call: held when the goal is gone, when make fails, or when our invocation drops a flag
    that upstream's build (with the recipe's own variables) uses. recipe_where: where the recipe sets each of its
    variables (name -> recipes/x.yaml:line), or one place for all."""

    def at(assignment: str | None) -> str:
        if isinstance(recipe_where, str):
            return recipe_where
        return recipe_where.get(make_variable(assignment) or "", "") if assignment else ""

    old_c, new_c = commits
    goals = " ".join(inv.goals) or "(default goal)"
    rows: list[Row] = []
    def same_failure(label: str, run: MakeRun) -> bool:
        """make fails the same way at the old commit: this host cannot run it (a $(error) on a missing tool), not drift."""
        before = {"upstream": old.upstream, "recipe": old.recipe, "ours": old.ours}[label] if old is not None else None
        return before is not None and before.rc is not None and not before.ok and before.problem() == run.problem()

    if new.upstream.rc is None:
        # a commit that makes `make -n` hang (or die) cannot dodge the check that way: the bump is held
        return [Row(HOLD, f"make -n {goals}", "", f"make did not finish at {new_c}: {new.upstream.err.strip() or 'timed out'}")]
    if not new.upstream.ok:
        gone = missing_goal(new.upstream, inv.goals)
        if gone:
            was = find_target(gone, old_files) if old_files else None
            rows.append(Row(HOLD, f"make target {gone}", f"{was} at {old_c}" if was else "",
                            f"gone at {new_c}: {new.upstream.problem()}"))
        elif same_failure("upstream", new.upstream):
            rows.append(Row("not compared", f"make -n {goals}", "", f"upstream's invocation fails here at both commits: "
                            f"{new.upstream.problem()}"))
        else:
            rows.append(Row(HOLD, f"make -n {goals}", "", f"upstream's own invocation fails at {new_c}: {new.upstream.problem()}"))
        return rows
    for key, label, run in (("recipe", "with the recipe's variables", new.recipe), ("ours", "our invocation", new.ours)):
        if run.rc is None:
            return rows + [Row(HOLD, f"make -n {goals}", "", f"{label}: make did not finish at {new_c}: {run.err.strip() or 'timed out'}")]
        if not run.ok and same_failure(key, run):
            return rows + [Row("not compared", f"make -n {goals}", "", f"{label} fails here at both commits: {run.problem()}")]
        if not run.ok:
            return rows + [Row(HOLD, f"make -n {goals}", "", f"{label} fails at {new_c} where upstream's succeeds: {run.problem()}")]

    up, rec, ours = (compile_lines(r.out) for r in (new.upstream, new.recipe, new.ours))
    if not up:
        rows.append(Row("info", f"make -n {goals}", "", "upstream's invocation prints no compiler call (nothing to compare)"))
    # the recipe's deliberate overrides: upstream's flags its variables replace
    overridden: dict[str, int] = {}
    added: dict[str, int] = {}
    for key, line in up.items():
        if key in rec:
            mine = set(effective(rec[key].flags))
            theirs = set(effective(line.flags))
            for f in theirs - mine:
                overridden[f] = overridden.get(f, 0) + 1
            for f in mine - theirs:
                added[f] = added.get(f, 0) + 1
    for f in sorted(overridden):
        origin = flag_origin(f, new_files)
        by = _recipe_var(recipe_vars, setter=_setter(origin, new_files)) or ", ".join(recipe_vars)
        rows.append(Row("override", f, origin, f"replaced by the recipe's {by}"))
    for f in sorted(added):
        var = _recipe_var(recipe_vars, inside=f)
        rows.append(Row("override", f, at(var), f"added by the recipe's {var or ', '.join(recipe_vars)}"))
    # what our invocation drops of that
    lost, missing = _drops(rec, ours)
    old_lost: dict[str, list[str]] = {}
    if old is not None and old.recipe.ok and old.ours.ok:
        old_lost, _ = _drops(compile_lines(old.recipe.out), compile_lines(old.ours.out))
    for f in sorted(lost):
        keys = lost[f]
        var = _recipe_var(recipe_vars, inside=f)
        origin = at(var) if var else flag_origin(f, new_files)
        already = " (already so at the old commit)" if f in old_lost else ""
        rows.append(Row(HOLD, f, origin, f"dropped by our `{inv.label()}`: missing from {len(keys)} of "
                        f"{_with_flag(rec, f)} compile lines (e.g. {keys[0]}){already}"))
    for key in missing:
        rows.append(Row(HOLD, key, "", f"upstream's build with the recipe's variables compiles it; our `{inv.label()}` does not"))
    extra = sorted({f for key, line in ours.items() if key in rec for f in set(effective(line.flags)) - set(effective(rec[key].flags))})
    if extra:
        rows.append(Row("ours", " ".join(extra), "", "added by our invocation (the plan's environment and arguments)"))
    # how upstream's own invocation changed between the two commits
    if old is not None and old.upstream.ok:
        before = compile_lines(old.upstream.out)
        flags_before = {f for cl in before.values() for f in effective(cl.flags)}
        flags_now = {f for cl in up.values() for f in effective(cl.flags)}
        for f in sorted(flags_now - flags_before):
            rows.append(Row("upstream", f, flag_origin(f, new_files), f"new in upstream's compile lines at {new_c}"))
        for f in sorted(flags_before - flags_now):
            rows.append(Row("upstream", f, flag_origin(f, old_files or {}) + (f" at {old_c}" if old_files else ""),
                            f"no longer in upstream's compile lines at {new_c}"))
        for key in sorted(set(up) - set(before)):
            rows.append(Row("upstream", key, "", f"compiled by upstream's `{inv.label()}` at {new_c}, not at {old_c}"))
        for key in sorted(set(before) - set(up)):
            rows.append(Row("upstream", key, "", f"compiled at {old_c}, no longer at {new_c}"))
    return rows


# ------------------------------------------------------------------------------------------------ small helpers


def redact(text: str, paths: Mapping[str, str]) -> str:
    """Replace this machine's paths (checkouts, work dirs, $HOME) by stable labels, longest first."""
    for path in sorted((p for p in paths if p and p != "/"), key=len, reverse=True):
        text = text.replace(path.rstrip("/"), paths[path])
    return text


def is_makefile(rel: str) -> bool:
    base = posixpath.basename(rel)
    return base in ("Makefile", "makefile", "GNUmakefile") or os.path.splitext(base)[1] in (".mk", ".mak")
