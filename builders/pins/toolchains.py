"""toolchains: the pin bot's mover for toolchain inputs: the wheels and Debian packages recipes pin by content move
like any pin (`pins bump toolchain:NAME`).

Its parts: which inputs the recipes pin and the edit of a recipe's text (builders/pins/toolchain_inputs.py), where each
entry moves (builders/pins/toolchain_moves.py, pure), what that is read from (builders/pins/toolchain_world.py: the
package index's JSON, the Debian suites' indexes). This module evaluates, writes and reads back the report, and delivers.

Delivery is the roots' (builders/pins/file_moves.py), generalized to several files per PR: a local run edits every recipe
carrying the input in place (a precise text edit of the changed entries: comments and layout are kept, the lists stay
identical); `--report DIR` writes toolchains.json (per input: state, detail, and each carrying file's base sha256 and new
text); the token holder reads it back strictly (`read_report`: every file is the committed one with only this input's
entries changed, and exactly the files that carry it) and opens one PR per input on
onebit/bump-toolchain-<name>-<sha12>.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import OnebitError
from . import decide as pin_decide, file_moves, report
from .bump import Options, Outcome
from .file_moves import (ENTRY_NAME, MAX_DETAIL, SHA256, claim, committed_reader, picked, read_strictly,
                         rollback_allowed, selected)
from .toolchain_inputs import Input, edit_text, entries_in, load_inputs
from .toolchain_moves import Step, decide, detail, new_entries, pick_deb, pick_wheel, pool_name
from .toolchain_world import Log, World, no_log

PREFIX = "toolchain:"
REPORT = "toolchains.json"  # beside report.json and roots.json in the evaluating job's artifact
VERSION = 1
MAX_FILE = 1 << 20
MAX_REPORT = 16 << 20
BRANCH_PREFIX = "onebit/bump-toolchain-"
MARKER = "<!-- onebit-toolchain-bump"


# ---- evaluating (no token) -------------------------------------------------------------------------------------------
def steps_of(inp: Input, world: World, allowed: bool) -> list[Step]:
    if inp.kind == "wheels":
        return [pick_wheel(e, world.releases(e["package"]), inp.version) for e in inp.entries]
    indexes = world.deb_indexes()
    return [pick_deb(e, indexes) for e in inp.entries]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def evaluate_input(root: Path, inp: Input, opts: Options, world: World) -> dict:
    """One input read now, nothing written: its toolchains.json entry (each carrying file's new text when it moves)."""
    allowed = rollback_allowed(opts)
    texts = {f: (Path(root) / f).read_text(encoding="utf-8") for f in inp.files}
    entry = {"name": inp.name, "state": "current", "detail": "", "files": []}
    try:
        steps = steps_of(inp, world, allowed)
    except OnebitError as exc:
        return {**entry, "state": "refused", "detail": exc.what[:MAX_DETAIL]}
    state = decide(steps, allowed)
    entry = {**entry, "state": state, "detail": detail(steps, state)}
    if state not in ("would-propose", "held"):
        return {**entry, "files": [{"path": f, "base_sha256": digest(t), "text": None} for f, t in texts.items()]}
    new = new_entries(inp.entries, steps, True)  # held: the file it would become, shown, never delivered
    try:
        files = [{"path": f, "base_sha256": digest(t), "text": edit_text(t, inp.entries, new, inp.kind, f)}
                 for f, t in texts.items()]
    except OnebitError as exc:
        return {**entry, "state": "error", "detail": exc.what[:MAX_DETAIL], "files": []}
    return {**entry, "files": files}


def evaluate_inputs(root: Path, opts: Options, *, names_given: bool, log: Log = no_log, world: World | None = None) -> list[dict]:
    """Every selected input of the project at `root`, in name order, as toolchains.json entries."""
    return list(each_input(root, opts, names_given=names_given, log=log, world=world))


def each_input(root: Path, opts: Options, *, names_given: bool, log: Log = no_log, world: World | None = None):
    """The entries one by one, each read from the files as they are when it is evaluated (a local run writes one
    input's edit before the next input that shares a recipe, zinc.yaml's zig and Vulkan SDK, is read)."""
    try:
        inputs = {i.name: i for i in load_inputs(root)}
    except OnebitError as exc:
        yield {"name": "*", "state": "error", "detail": exc.what[:MAX_DETAIL], "files": []}
        return
    wanted = picked(opts.names, PREFIX)
    for n in sorted(set(wanted) - set(inputs)):
        yield {"name": n if ENTRY_NAME.match(n) else "*", "state": "error", "files": [],
               "detail": f"no toolchain input named {n!r}; the recipes pin: {', '.join(sorted(inputs)) or 'none'}"[:MAX_DETAIL]}
    world = world or World(root, log=log)
    for name in selected(sorted(inputs), wanted, names_given, opts.cadence):
        yield evaluate_input(root, inputs[name], opts, world)


def write_report(work: Path, entries: Sequence[dict]) -> Path:
    """toolchains.json into `work`, written aside and swapped into place."""
    return report.write_file(work, REPORT, {"version": VERSION, "inputs": list(entries)})


def entry_outcome(e: dict) -> Outcome:
    return Outcome(PREFIX + e["name"], e["state"], e["detail"])


def bump_inputs(root: Path, opts: Options, *, names_given: bool, log: Log = no_log, world: World | None = None) -> list[Outcome]:
    """A local run: every selected input evaluated and, unless --dry-run or held, every carrying recipe edited in place."""
    from ..io.swap import write_text_atomic

    out = []
    for e in each_input(root, opts, names_given=names_given, log=log, world=world):
        if e["state"] != "would-propose" or opts.dry_run:
            out.append(entry_outcome(e))
            continue
        for f in e["files"]:
            write_text_atomic(Path(root) / f["path"], f["text"])
        out.append(Outcome(PREFIX + e["name"], "edited", e["detail"] + f" ({', '.join(f['path'] for f in e['files'])})"))
    return out


def in_process(root: Path, opts: Options, *, names_given: bool, log: Log = no_log, world: World | None = None) -> dict:
    return {"version": VERSION, "inputs": evaluate_inputs(root, opts, names_given=names_given, log=log, world=world)}


def load_report(work: Path):
    """toolchains.json of a downloaded artifact, as parsed JSON (bounded in size)."""
    return report.load_file(work, REPORT, MAX_REPORT)


# ---- the token holder: toolchains.json read back strictly ------------------------------------------------------------
@dataclass(frozen=True)
class InputMove:
    name: str
    state: str
    detail: str
    files: tuple[tuple[str, str], ...] = ()  # (path, new text)
    changes: tuple[str, ...] = ()  # "package: old -> new"
    older: tuple[str, ...] = ()


def read_report(data, inputs: Mapping[str, Input], committed: Callable[[str], str], allowed: bool) -> list[InputMove]:
    """toolchains.json checked against this checkout: `inputs` its inputs (from the committed recipes),
    `committed(path)` a committed file's text. Each moving input must carry exactly its files, each the committed one
    (base sha256) with only this input's entries rewritten (`edit_text` of the committed file gives the new text),
    the lists identical in every file. The state is decided again here from the entries, never taken from the report."""
    return read_strictly(REPORT, lambda: _read(data, inputs, committed, allowed))


def _line(label: str, o: Mapping, n: Mapping, kind: str) -> str:
    if kind == "debs":
        return f"{label}: {pool_name(o['path'])[1]} -> {pool_name(n['path'])[1]}"
    return f"{label}: {o['version']} -> {n['version']}"


def _read(data, inputs: Mapping[str, Input], committed: Callable[[str], str], allowed: bool) -> list[InputMove]:
    from debian.debian_support import Version as DebVersion
    from packaging.version import Version

    bad = report._bad
    out: list[InputMove] = []
    seen: set[str] = set()
    for w, e, name, state, det in file_moves.entries(data, "inputs", VERSION, ("files",)):
        files = report._list(e["files"], f"{w}.files")
        if state == "error":
            if not ENTRY_NAME.match(name) or files:
                raise bad(w, "an error entry names no file")
            out.append(InputMove(name, state, det))
            continue
        claim(name, w, inputs, seen, "a toolchain input")
        inp = inputs[name]
        got: dict[str, str | None] = {}
        for j, f in enumerate(files):
            fw = f"{w}.files[{j}]"
            f = report._obj(f, fw, {"path", "base_sha256", "text"}, {"path", "base_sha256", "text"})
            path = report._str(f["path"], f"{fw}.path", limit=300)
            base = report._str(f["base_sha256"], f"{fw}.base_sha256", limit=64)
            text = report._str(f["text"], f"{fw}.text", none=True, limit=MAX_FILE)
            if path in got:
                raise bad(f"{fw}.path", f"{path!r} comes twice")
            if path not in inp.files:
                raise bad(f"{fw}.path", f"{path!r} does not carry toolchain:{name}")
            if not SHA256.match(base or "") or base != digest(committed(path)):
                raise bad(f"{fw}.base_sha256", f"made from another {path} than this checkout's committed one")
            got[path] = text
        if state in ("current", "refused"):
            if any(t is not None for t in got.values()):
                raise bad(f"{w}.files", f"a {state} input carries no new file")
            out.append(InputMove(name, state, det))
            continue
        if set(got) != set(inp.files) or any(t is None for t in got.values()):
            raise bad(f"{w}.files", f"a {state} input carries the new text of exactly the files that carry it: "
                                    f"{', '.join(inp.files)}")
        new_list = None
        for path, text in got.items():
            lst = entries_in(text, path, inp)
            if lst is None:
                raise bad(f"{w}.files", f"the new {path} does not carry one {inp.tool} list where the committed one does")
            if new_list is not None and [dict(x) for x in lst] != [dict(x) for x in new_list]:
                raise bad(f"{w}.files", f"the new lists of toolchain:{name} differ between the files")
            new_list = lst
        old = [dict(x) for x in entries_in(committed(inp.files[0]), inp.files[0], inp) or ()]
        new = [dict(x) for x in new_list]
        if len(old) != len(new) or not old:
            raise bad(f"{w}.files", "the new list has other entries than the committed one")
        try:
            for path, text in got.items():
                if edit_text(committed(path), old, new, inp.kind, path) != text:
                    raise bad(f"{w}.files", f"{path} is not the committed file with only toolchain:{name}'s entries moved")
        except OnebitError as exc:
            raise bad(f"{w}.files", exc.what) from None
        changes, older = [], []
        for o, n in zip(old, new):
            if o == n:
                continue
            if {k for k in o if k not in ("path", "sha256", "version")} != {k for k in n if k not in ("path", "sha256", "version")} \
                    or any(o.get(k) != n.get(k) for k in o if k not in ("path", "sha256", "version")):
                raise bad(f"{w}.files", "an entry changed more than its version, path and sha256")
            label = o.get("package") or pool_name(o["path"])[0]
            if inp.kind == "debs":
                if pool_name(n["path"])[0] != label:
                    raise bad(f"{w}.files", f"{o['path']} is replaced by another package's file")
                back = DebVersion(pool_name(n["path"])[1]) < DebVersion(pool_name(o["path"])[1])
            else:
                back = Version(n["version"]) < Version(o["version"])
            line = _line(label, o, n, inp.kind)
            changes.append(line)
            if back:
                older.append(line)
        if not changes:
            raise bad(f"{w}.files", "moves no entry")
        st = "held" if older and not allowed else "would-propose"
        det = ("would move to an older version: " + "; ".join(older) + " (pins bump --allow-rollback --reason TEXT "
               "moves it)") if st == "held" else f"{len(changes)} change(s): " + "; ".join(changes)
        out.append(InputMove(name, st, det, tuple(sorted(got.items())), tuple(changes), tuple(older)))
    return out


def verified_moves(ctx, opts: Options, data) -> list[InputMove]:
    """toolchains.json read against this checkout: with --open-pr the committed files (HEAD), else the working tree's."""
    inputs = {i.name: i for i in load_inputs(ctx.root)}
    return read_report(data, inputs, committed_reader(ctx, opts), rollback_allowed(opts))


# ---- the token holder: delivery --------------------------------------------------------------------------------------
def branch_name(name: str, files: Sequence[tuple[str, str]]) -> str:
    """Pure: the branch an input's move lives on; named by the input and the new files' content."""
    h = hashlib.sha256("\0".join(f"{p}\0{t}" for p, t in sorted(files)).encode("utf-8")).hexdigest()
    return pin_decide.branch_name(name, h, BRANCH_PREFIX)


def is_branch_of(name: str, ref: str) -> bool:
    return pin_decide.is_branch_of(name, ref, BRANCH_PREFIX)


def pr_title(name: str, changes: int) -> str:
    return f"toolchains: move {name} ({changes} entries changed)"


def pr_body(m: InputMove, rollback: str | None = None) -> str:
    lines = [f"Automated move of the toolchain input **{m.name}**: the pinned entries (by version and sha256) moved "
             "to the newest in their suite or on the package index; only these entries change, in every recipe that "
             "carries them:", ""] + [f"- `{p}`" for p, _ in m.files] + [""]
    if rollback:
        lines += [f"> **Rollback**: {rollback}", ">", "> Entries that move to an older version:"]
        lines += [f"> - {o}" for o in m.older] + [""]
    lines += [f"### Changes ({len(m.changes)})", ""] + [f"- `{c}`" for c in m.changes]
    lines += ["", f"{MARKER} input={m.name} -->"]
    return "\n".join(lines)


def commit_message(m: InputMove, rollback: str | None) -> str:
    return "\n".join([pr_title(m.name, len(m.changes)), ""] + list(m.changes)
                     + (["", f"Rollback: {rollback}"] if rollback else [])) + "\n"


def proposal(m: InputMove, rollback: str | None) -> dict:
    """Pure: a moving input's PR: every file that carries it, the branch, title, body and commit message."""
    return {"files": dict(m.files), "branch": branch_name(m.name, m.files), "title": pr_title(m.name, len(m.changes)),
            "body": pr_body(m, rollback), "message": commit_message(m, rollback)}


def deliver(ctx, opts: Options, moves: Sequence[InputMove]) -> list[Outcome]:
    """Each verified move: a PR of its own (--open-pr), a line (--dry-run), or the files written in place
    (file_moves.deliver, shared with the build roots)."""
    return file_moves.deliver(ctx, opts, moves, prefix=PREFIX, branch_prefix=BRANCH_PREFIX, proposal=proposal)
