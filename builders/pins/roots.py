"""The pin bot's part for build roots: roots/<name>.yaml moves like any pin (newest in its suites).

Each root is resolved again against its suites' Packages indexes now (builders.roots.assemble.resolve_file); what changed is
the drift report (package by package: added, removed, another version or suite). A root is held, like a pin that
would move backwards, when a package would go to an older version (experimental dropped an upload, a suite rolled
back): the file stays as it is unless --allow-rollback with a --reason. A root that no longer resolves (a requested
package left its suite) is refused with the resolver's one line. Roots are weekly pins; `pins bump root:NAME` names one.

A move is delivered like a pin's (docs/pins.md):
- a local run (no --open-pr, --report or --from-report) writes the file in place, as `roots resolve` does;
- `--report DIR` (the evaluating job, no token) writes nothing into the checkout: what each root would become goes
  into DIR/roots.json (name, state, detail, the sha256 of the checkout's file, the new file's text);
- `--from-report DIR` (the token holder), and `--open-pr` (which evaluates and delivers in one process), read that
  back strictly (`read_report`): a root of this checkout, made from its committed file, the new text exactly that
  file with another generated part, valid against schemas/root.schema.json. Each root that moves gets its own PR on
  onebit/bump-root-<name>-<sha12 of the new text>, committed without touching the working tree; older open PRs of
  the same root are superseded. A held root opens nothing.
"""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from debian.debian_support import Version

from ..errors import OnebitError
from ..project.root_pins import Change, RootPin, describe, diff, load_roots, moved_text
from . import decide, file_moves, report
from .bump import Options, Outcome
from .file_moves import (ENTRY_NAME, MAX_DETAIL, SHA256, claim, committed_reader, picked, read_strictly,
                         rollback_allowed, selected)

PREFIX = "root:"
REPORT = "roots.json"  # beside report.json in the evaluating job's artifact
VERSION = 1
MAX_FILE = 4 << 20  # bytes of one roots/<name>.yaml in the report (strix-sid is ~60 KiB)
MAX_REPORT = 64 << 20  # bytes of roots.json
BRANCH_PREFIX = "onebit/bump-root-"
BODY_LIMIT = 60_000  # GitHub refuses a PR body over 65536 characters
MARKER = "<!-- onebit-root-bump"


# ---- pure ------------------------------------------------------------------------------------------------------------
def backwards(changes: Sequence[Change], old: Sequence, new: Sequence) -> list[str]:
    """Pure: the packages a re-resolution would move to an older version, as report lines."""
    a = {d.package: d for d in old}
    b = {d.package: d for d in new}
    out = []
    for c in changes:
        if c.package in a and c.package in b and Version(b[c.package].version) < Version(a[c.package].version):
            out.append(f"{c.package}: {c.old} -> {c.new}")
    return out


def decision(changes: int, older: Sequence[str], allowed: bool) -> str:
    """Pure: what a re-resolution with `changes` changed packages does to the root: current (nothing moved), held
    (a package would go backwards and no --allow-rollback --reason allows it), else would-propose."""
    if not changes:
        return "current"
    if older and not allowed:
        return "held"
    return "would-propose"


def held_detail(older: Sequence[str]) -> str:
    return ("would move to an older version: " + "; ".join(older)
            + " (pins bump --allow-rollback --reason TEXT moves it)")


def move_detail(changes: Sequence[Change], packages: int) -> str:
    return f"{len(changes)} change(s), {packages} packages: " + "; ".join(describe(changes))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def branch_name(name: str, text: str) -> str:
    """Pure: the branch a root's move lives on; named by the root and the new file's content."""
    return decide.branch_name(name, digest(text), BRANCH_PREFIX)


def is_branch_of(name: str, ref: str) -> bool:
    """Pure: whether `ref` is a move branch of root `name` (not of a root whose name only starts the same)."""
    return decide.is_branch_of(name, ref, BRANCH_PREFIX)


def pr_title(name: str, changes: int) -> str:
    return f"roots: move {name} ({changes} packages changed)"


def pr_body(name: str, changes: Sequence[Change], snapshot: str | None, text: str, *, rollback: str | None = None,
            older: Sequence[str] = ()) -> str:
    """Pure: the PR body: what moved (package by package), the snapshot timestamp, the rollback reason if any."""
    lines = [f"Automated move of the build root **{name}** (`roots/{name}.yaml`): re-resolved against its suites' "
             "Packages indexes; only the generated part of the file (snapshot and resolved) changes.", "",
             f"Snapshot: `{snapshot}` (the timestamp at which Debian's snapshot archive still serves every pool path "
             "of the new closure).", ""]
    if rollback:
        lines += [f"> **Rollback**: {rollback}", ">", "> Packages that move to an older version:"]
        lines += [f"> - {o}" for o in older] + [""]
    lines += [f"### Changes ({len(changes)})", ""]
    lines += [f"- `{line}`" for line in describe(changes)]
    end = ["", f"{MARKER} root={name} sha256={digest(text)} -->"]
    body = "\n".join(lines + end)
    if len(body) > BODY_LIMIT:
        body = body[:BODY_LIMIT] + "\n\n… (truncated)" + "\n".join(end)
    return body


def commit_message(name: str, changes: Sequence[Change], snapshot: str | None, rollback: str | None) -> str:
    lines = [pr_title(name, len(changes)), ""] + describe(changes)[:500]
    if len(changes) > 500:
        lines.append(f"... and {len(changes) - 500} more")
    lines += ["", f"Snapshot: {snapshot}"] + ([f"Rollback: {rollback}"] if rollback else [])
    return "\n".join(lines) + "\n"


# ---- evaluating (no token) -------------------------------------------------------------------------------------------
def _resolver(resolve: Callable | None) -> Callable:
    if resolve is not None:
        return resolve
    from ..roots import assemble as roots

    return roots.resolve_file


def evaluate_root(pin: RootPin, opts: Options, *, resolve: Callable | None = None, stamp: str | None = None,
                  log: Callable[[str], None] = lambda m: None) -> dict:
    """One root resolved now, nothing written: its roots.json entry (the new file's text when it moves)."""
    from ..roots.assemble import snapshot_stamp

    text = pin.path.read_text(encoding="utf-8")
    entry = {"name": pin.name, "state": "current", "detail": "", "base_sha256": digest(text), "text": None}
    try:
        resolved, changes = _resolver(resolve)(pin, write=False, log=log)
    except OnebitError as exc:
        return {**entry, "state": "refused", "detail": exc.what}
    older = backwards(changes, pin.resolved, resolved)
    state = decision(len(changes), older, rollback_allowed(opts))
    if state == "current":
        return {**entry, "detail": f"{len(resolved)} packages, snapshot {pin.snapshot}"}
    new = moved_text(text, pin.snapshot, resolved, True, stamp or snapshot_stamp())
    return {**entry, "state": state, "text": new,
            "detail": held_detail(older) if state == "held" else move_detail(changes, len(resolved))}


def evaluate_roots(root: Path, opts: Options, *, names_given: bool, log: Callable[[str], None] = lambda m: None,
                   resolve: Callable | None = None, stamp: str | None = None) -> list[dict]:
    """Every selected root of the project at `root`, in name order, as roots.json entries (nothing is written)."""
    found, problems = load_roots(Path(root) / "roots")
    if problems:
        return [{"name": "*", "state": "error", "detail": "; ".join(problems)[:MAX_DETAIL], "base_sha256": None,
                 "text": None}]
    wanted = picked(opts.names, PREFIX)
    out = [{"name": n if ENTRY_NAME.match(n) else "*", "state": "error", "base_sha256": None, "text": None,
            "detail": f"no build root named {n!r}; roots/ has: {', '.join(sorted(found))}"[:MAX_DETAIL]}
           for n in sorted(set(wanted) - set(found))]
    for name in selected(sorted(found), wanted, names_given, opts.cadence):
        out.append(evaluate_root(found[name], opts, resolve=resolve, stamp=stamp, log=log))
    return out


def write_report(work: Path, entries: Sequence[dict]) -> Path:
    """roots.json into `work`, written aside and swapped into place."""
    return report.write_file(work, REPORT, {"version": VERSION, "roots": list(entries)})


def entry_outcome(e: dict) -> Outcome:
    """How an evaluated entry shows in `pins bump`'s table."""
    return Outcome(PREFIX + e["name"], e["state"], e["detail"])


# ---- the local run: the file written in place (as `roots resolve`) ---------------------------------------------------------
def bump_root(pin: RootPin, opts: Options, *, resolve: Callable | None = None, log: Callable[[str], None] = lambda m: None) -> Outcome:
    """One root: resolve it now, report the drift, write it (unless dry run or held)."""
    resolve = _resolver(resolve)
    name = PREFIX + pin.name
    try:
        resolved, changes = resolve(pin, write=False, log=log)
    except OnebitError as exc:
        return Outcome(name, "refused", exc.what)
    older = backwards(changes, pin.resolved, resolved)
    state = decision(len(changes), older, rollback_allowed(opts))
    if state == "current":
        return Outcome(name, "current", f"{len(resolved)} packages, snapshot {pin.snapshot}")
    if state == "held":
        return Outcome(name, "held", held_detail(older))
    detail = move_detail(changes, len(resolved))
    if opts.dry_run:
        return Outcome(name, "would-propose", detail)
    resolve(pin, write=True, log=log)
    return Outcome(name, "edited", detail)


def bump_roots(root: Path, opts: Options, *, names_given: bool, log: Callable[[str], None] = lambda m: None,
               resolve: Callable | None = None) -> list[Outcome]:
    """Every selected root of the project at `root`, in name order."""
    found, problems = load_roots(Path(root) / "roots")
    if problems:
        return [Outcome(PREFIX + "*", "error", "; ".join(problems))]
    wanted = picked(opts.names, PREFIX)
    unknown = sorted(set(wanted) - set(found))
    out = [Outcome(PREFIX + n, "error", f"no build root named {n!r}; roots/ has: {', '.join(sorted(found))}")
           for n in unknown]
    for name in selected(sorted(found), wanted, names_given, opts.cadence):
        out.append(bump_root(found[name], opts, resolve=resolve, log=log))
    return out


# ---- the token holder: roots.json read back strictly -----------------------------------------------------------------
@dataclass(frozen=True)
class RootMove:
    name: str
    state: str  # STATES
    detail: str
    text: str | None = None  # the new roots/<name>.yaml (would-propose, held)
    changes: tuple[Change, ...] = ()
    older: tuple[str, ...] = ()
    snapshot: str | None = None


def parse_root_text(name: str, text: str, where: str) -> RootPin:
    """`text` read as roots/<name>.yaml by the project's loader (builders.project.root_pins.load_roots: YAML, the schema, the
    name matching the file, the package requests); its first problem as a ReportError naming `where`."""
    with tempfile.TemporaryDirectory(prefix="onebit-root-check-") as tmp:
        f = Path(tmp) / f"{name}.yaml"
        f.write_text(text, encoding="utf-8")
        found, problems = load_roots(Path(tmp))
    if problems or name not in found:
        first = (problems or ["not a build root"])[0]
        for p in (str(f.resolve()), str(f)):
            first = first.replace(p, where)
        raise report.ReportError(first.splitlines()[0])
    return found[name]


def read_report(data, known: Collection[str], committed: Callable[[str], str], allowed: bool) -> list[RootMove]:
    """roots.json (as parsed JSON) checked against this checkout: `known` its roots, `committed(name)` the text of its
    committed roots/<name>.yaml; the state of each move decided again here from the two files (`decision`), never
    taken from the report. Anything else than what `evaluate_roots` writes is one ReportError."""
    return read_strictly(REPORT, lambda: _read(data, known, committed, allowed))


def _read(data, known: Collection[str], committed: Callable[[str], str], allowed: bool) -> list[RootMove]:
    bad = report._bad
    out: list[RootMove] = []
    seen: set[str] = set()
    for w, e, name, state, detail in file_moves.entries(data, "roots", VERSION, ("base_sha256", "text")):
        base = report._str(e["base_sha256"], f"{w}.base_sha256", none=True, limit=64)
        text = report._str(e["text"], f"{w}.text", none=True, limit=MAX_FILE)
        if state == "error":  # the evaluating side's failure (an unknown name, a roots/ that does not load): told again
            if not ENTRY_NAME.match(name) or base is not None or text is not None:
                raise bad(w, "an error entry names no file and carries no text")
            out.append(RootMove(name, state, detail))
            continue
        claim(name, w, known, seen, "a build root")
        head = committed(name)
        if not SHA256.match(base or "") or base != digest(head):
            raise bad(f"{w}.base_sha256", f"made from another roots/{name}.yaml than this checkout's committed one")
        if state in ("current", "refused"):
            if text is not None:
                raise bad(f"{w}.text", f"a {state} root carries no new file")
            out.append(RootMove(name, state, detail))
            continue
        if text is None:
            raise bad(f"{w}.text", f"a {state} root carries its new file")
        if len(text.encode("utf-8")) > MAX_FILE:
            raise bad(f"{w}.text", f"larger than {MAX_FILE} bytes")
        old = parse_root_text(name, head, f"roots/{name}.yaml")
        new = parse_root_text(name, text, f"{w}.text")
        if not new.snapshot or moved_text(head, old.snapshot, new.resolved, True, new.snapshot) != text:
            raise bad(f"{w}.text", f"not the committed roots/{name}.yaml with another closure (the bot changes only the "
                                   "generated snapshot and resolved part)")
        changes = diff(old.resolved, new.resolved)
        if not changes:
            raise bad(f"{w}.text", "moves no package")
        older = backwards(changes, old.resolved, new.resolved)
        state = decision(len(changes), older, allowed)
        detail = held_detail(older) if state == "held" else move_detail(changes, len(new.resolved))
        out.append(RootMove(name, state, detail, text, tuple(changes), tuple(older), new.snapshot))
    return out


def load_report(work: Path):
    """roots.json of a downloaded artifact, as parsed JSON (bounded in size)."""
    return report.load_file(work, REPORT, MAX_REPORT)


# ---- the token holder: delivery --------------------------------------------------------------------------------------
def root_file(name: str) -> str:
    return f"roots/{name}.yaml"


def verified_moves(ctx, opts: Options, data) -> list[RootMove]:
    """roots.json read against this checkout: with --open-pr the committed files (HEAD), else the working tree's."""
    known, _problems = load_roots(Path(ctx.root) / "roots")  # a root that does not load is the report's error entry
    committed = committed_reader(ctx, opts)
    return read_report(data, set(known), lambda name: committed(root_file(name)), rollback_allowed(opts))


def proposal(m: RootMove, rollback: str | None) -> dict:
    """Pure: a moving root's PR: its one file, branch, title, body and commit message."""
    return {"files": {root_file(m.name): m.text}, "branch": branch_name(m.name, m.text),
            "title": pr_title(m.name, len(m.changes)),
            "body": pr_body(m.name, m.changes, m.snapshot, m.text, rollback=rollback, older=m.older),
            "message": commit_message(m.name, m.changes, m.snapshot, rollback)}


def deliver(ctx, opts: Options, moves: Sequence[RootMove]) -> list[Outcome]:
    """Each verified move: a PR of its own (--open-pr), a line (--dry-run), or the file written in place
    (file_moves.deliver, shared with the toolchain inputs)."""
    return file_moves.deliver(ctx, opts, moves, prefix=PREFIX, branch_prefix=BRANCH_PREFIX, proposal=proposal)


def in_process(root: Path, opts: Options, *, names_given: bool, log: Callable[[str], None] = lambda m: None,
               resolve: Callable | None = None) -> dict:
    """`--open-pr` without a report: the roots evaluated here (Debian's indexes only, no upstream content), as the
    roots.json data the token holder then reads back like a downloaded one."""
    return {"version": VERSION, "roots": evaluate_roots(root, opts, names_given=names_given, log=log, resolve=resolve)}
