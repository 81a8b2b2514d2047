"""flag_make: what `make -n` says upstream's build and ours would compile, compared: the compile lines of upstream's
own invocation (the recipe's goals, nothing else), of upstream's plus the recipe's variables, and of our whole
invocation (the plan's argv and environment). A flag that the first has and the second lacks is the recipe's
deliberate override; a flag that the second has and ours lacks is dropped by how we invoke make, and holds the bump
(pure).
"""
from __future__ import annotations

import os
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from .flag_calls import Invocation, make_variable
from .flag_options import tree_order
from .flags import HOLD, Row

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
    for rel in sorted(files, key=tree_order):
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
    for rel in sorted(files, key=tree_order):
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


def is_makefile(rel: str) -> bool:
    base = posixpath.basename(rel)
    return base in ("Makefile", "makefile", "GNUmakefile") or os.path.splitext(base)[1] in (".mk", ".mak")
