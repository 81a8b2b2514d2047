"""file_moves: what the pin bot's two file movers (the build roots, the toolchain inputs) share: the names a run
picks, the committed text a report is checked against, and a verified move delivered (bump.deliver_files).

Each mover's module keeps what is its own (what it evaluates, its report's entries, its PR's words); builders/pins/movers.py
registers both.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from . import bump as bumpmod
from . import decide, report
from .bump import Context, Options, Outcome

CADENCE = "weekly"  # the roots' and the toolchain inputs' cadence
STATES = ("current", "would-propose", "held", "refused", "error")  # of a report's entry
MAX_DETAIL = 20_000
SHA256 = re.compile(r"^[0-9a-f]{64}$")
ENTRY_NAME = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,99})$")  # "*": an error entry of no one name
T = TypeVar("T")


def picked(names: Sequence[str], prefix: str) -> list[str]:
    """Pure: the names given to `pins bump` that carry `prefix` (`root:`, `toolchain:`), without it."""
    return [n.removeprefix(prefix) for n in names if n.startswith(prefix)]


def selected(items: Sequence[str], names: Sequence[str], given: bool, cadence: str | None) -> list[str]:
    """Pure: the items a run moves: those named; with no name at all, every item unless --cadence asks for another
    cadence than theirs (weekly)."""
    if given:
        return [i for i in items if i in names]
    return list(items) if cadence in (None, "all", CADENCE) else []


def rollback_allowed(opts: Options) -> bool:
    """Whether a move to an older version may go: --allow-rollback with a --reason."""
    return bool(opts.allow_rollback and opts.reason)


def committed_reader(ctx: Context, opts: Options) -> Callable[[str], str]:
    """The text a report's file is checked against: with --open-pr the committed file (HEAD), else the working tree's."""
    if opts.open_pr and not opts.dry_run:
        repo = bumpmod.Repo(ctx.root, opts.remote, ctx.token)
        return repo.head_text
    return lambda path: (Path(ctx.root) / path).read_text(encoding="utf-8")


def read_strictly(report_name: str, read: Callable[[], T]) -> T:
    """`read()` of a report file's data, its ReportError told as one line naming the file."""
    try:
        return read()
    except report.ReportError as exc:
        raise report.ReportError(f"{report_name}: {exc.what}; nothing was pushed or opened") from None


def entries(data, key: str, version: int, fields: Collection[str]) -> Iterator[tuple[str, dict, str, str, str]]:
    """A mover's report (as parsed JSON: {"version", key: [entry...]}) entry by entry, each an object of exactly name,
    state, detail and `fields`, its head checked: (where, the entry, name, state, detail). Any other shape is one
    ReportError."""
    top = report._obj(data, "the top level", {"version", key}, {"version", key})
    if report._int(top["version"], "version") != version:
        raise report._bad("version", f"{top['version']!r}, not {version}")
    keys = {"name", "state", "detail", *fields}
    for i, e in enumerate(report._list(top[key], key)):
        w = f"{key}[{i}]"
        e = report._obj(e, w, keys, keys)
        name = report._str(e["name"], f"{w}.name", limit=100)
        state = report._str(e["state"], f"{w}.state", limit=40)
        detail = report._str(e["detail"], f"{w}.detail", limit=MAX_DETAIL)
        if state not in STATES:
            raise report._bad(f"{w}.state", f"unknown state {state!r}")
        yield w, e, name, state, detail


def claim(name: str, where: str, known: Collection[str], seen: set[str], what: str) -> None:
    """A report's entry names one of this checkout's `what`s (`known`), once."""
    if name not in known:
        raise report._bad(f"{where}.name", f"{name!r} is not {what} of this checkout")
    if name in seen:
        raise report._bad(f"{where}.name", f"{name!r} comes twice")
    seen.add(name)


def deliver(ctx: Context, opts: Options, moves: Sequence[Any], *, prefix: str, branch_prefix: str,
            proposal: Callable[[Any, str | None], Mapping[str, Any]]) -> list[Outcome]:
    """Each verified move (name, state, detail, older): a PR of its own (--open-pr), a line (--dry-run), or its files
    written in place. `proposal(move, rollback reason or None)` gives a moving one's files, branch, title, body and
    message; a move whose `older` names entries going back carries --reason as its rollback."""
    def move(m) -> bumpmod.FileMove:
        if m.state != "would-propose":
            return bumpmod.FileMove(prefix + m.name, m.state, m.detail)
        rollback = opts.reason if m.older else None
        return bumpmod.FileMove(prefix + m.name, m.state, m.detail, rollback=bool(rollback),
                                older=lambda ref, n=m.name: decide.is_branch_of(n, ref, branch_prefix),
                                **proposal(m, rollback))
    return bumpmod.deliver_files(ctx, opts, [move(m) for m in moves])
