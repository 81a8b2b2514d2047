"""movers: the registry of what the pin bot moves, so `pins bump` loops over kinds instead of pairing calls by hand.

Three kinds, in the order their outcomes are reported: the pins of pins.yaml (builders/pins/bump.py), the build roots
(roots/<name>.yaml, builders/pins/roots.py) and the toolchain inputs pinned in the recipes
(builders/pins/toolchains.py). A NAME given to `pins bump` picks its kind by prefix (`root:NAME`, `toolchain:NAME`);
a bare NAME is a pin. Every kind answers the `Mover` protocol, one method per mode of the bot:

  verify(run)             --open-pr / --from-report: its report read back (or evaluated here) and checked against
                          this checkout; every kind verifies before any kind pushes anything
  evaluate(run)           --report: evaluate only, its report file written into the report folder
  deliver(run, verified)  --open-pr / --from-report: a PR per move (or a line with --dry-run)
  local(run)              a local run: the files written in place

The roots and the toolchain inputs share one shape (`FileMover`: a report file of entries, moves checked against the
committed files, delivered by builders/pins/file_moves.py), so each is one entry of MOVERS naming its module's operations.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from . import bump as bumpmod
from . import file_moves
from . import roots as roots_bump
from . import toolchains as tc_bump
from .bump import Context, Options, Outcome

Log = Callable[[str], None]


@dataclass(frozen=True)
class Run:
    """One `pins bump`: the context, the options with every NAME given, the project root and the log."""

    ctx: Context
    opts: Options
    root: Path
    log: Log

    @property
    def names_given(self) -> bool:
        return bool(self.opts.names)


class Mover(Protocol):
    kind: str
    prefix: str  # a NAME with it picks this kind ("" for the pins: what no other kind's prefix picks)

    def verify(self, run: Run) -> Any: ...

    def evaluate(self, run: Run) -> list[Outcome]: ...

    def deliver(self, run: Run, verified: Any) -> list[Outcome]: ...

    def local(self, run: Run) -> list[Outcome]: ...


def picked(names: Sequence[str], prefix: str) -> list[str]:
    """Pure: the names of the kind whose prefix is `prefix` ("" for the pins), without it."""
    if prefix:
        return file_moves.picked(names, prefix)
    others = [m.prefix for m in MOVERS.values() if m.prefix]
    return [n for n in names if not n.startswith(tuple(others))]


@dataclass(frozen=True)
class PinMover:
    """The pins of pins.yaml: bump.bump does every mode itself (its evaluation is isolated, its report is
    report.json and drift-results.json). It runs when a pin is named, or when no name is given at all."""

    kind: str = "pins"
    prefix: str = ""

    def _bump(self, run: Run) -> list[Outcome]:
        names = picked(run.opts.names, self.prefix)
        if names or not run.names_given:
            return bumpmod.bump(run.ctx, replace(run.opts, names=names))
        return []

    def verify(self, run: Run) -> None:
        return None  # checked by bump.bump against the committed pins.yaml before its own pushes

    def evaluate(self, run: Run) -> list[Outcome]:
        return self._bump(run)

    def deliver(self, run: Run, verified: None) -> list[Outcome]:
        return self._bump(run)

    def local(self, run: Run) -> list[Outcome]:
        return self._bump(run)


@dataclass(frozen=True)
class FileMover:
    """A kind whose move is a file edit (a root's yaml, the recipes carrying a toolchain input), by its module's
    operations: each evaluates the selected names (`run.opts.names`, its prefix picking its own) into report entries."""

    kind: str
    prefix: str
    entries: Callable[..., list[dict]]  # (root, opts, names_given=, log=) -> the report's entries
    write_report: Callable[[Path, Sequence[dict]], Path]
    entry_outcome: Callable[[dict], Outcome]
    in_process: Callable[..., dict]  # (root, opts, names_given=, log=) -> the report's data, evaluated here
    load_report: Callable[[Path], Any]
    verified_moves: Callable[[Context, Options, Any], list]
    deliver_moves: Callable[[Context, Options, Sequence], list[Outcome]]
    bump_local: Callable[..., list[Outcome]]  # (root, opts, names_given=, log=) -> outcomes, files written

    def verify(self, run: Run) -> list:
        o = run.opts
        data = self.load_report(o.from_report) if o.from_report else \
            self.in_process(run.root, o, names_given=run.names_given, log=run.log)
        return self.verified_moves(run.ctx, o, data)

    def evaluate(self, run: Run) -> list[Outcome]:
        entries = self.entries(run.root, run.opts, names_given=run.names_given, log=run.log)
        self.write_report(run.opts.report, entries)
        return [self.entry_outcome(e) for e in entries]

    def deliver(self, run: Run, verified: list) -> list[Outcome]:
        return self.deliver_moves(run.ctx, run.opts, verified)

    def local(self, run: Run) -> list[Outcome]:
        return self.bump_local(run.root, run.opts, names_given=run.names_given, log=run.log)


MOVERS: dict[str, Mover] = {
    "pins": PinMover(),
    "roots": FileMover("roots", roots_bump.PREFIX, roots_bump.evaluate_roots, roots_bump.write_report,
                       roots_bump.entry_outcome, roots_bump.in_process, roots_bump.load_report,
                       roots_bump.verified_moves, roots_bump.deliver, roots_bump.bump_roots),
    "toolchains": FileMover("toolchains", tc_bump.PREFIX, tc_bump.evaluate_inputs, tc_bump.write_report,
                            tc_bump.entry_outcome, tc_bump.in_process, tc_bump.load_report,
                            tc_bump.verified_moves, tc_bump.deliver, tc_bump.bump_inputs),
}


def bump_all(run: Run) -> list[Outcome]:
    """Every kind in MOVERS order, in the run's mode: --report evaluates; --open-pr / --from-report verifies every
    kind first (a tampered roots.json stops the run before any pin's PR is pushed), then delivers; else a local run."""
    o = run.opts
    verified = {k: m.verify(run) for k, m in MOVERS.items()} if o.from_report or o.open_pr else None
    outcomes: list[Outcome] = []
    for kind, mover in MOVERS.items():
        if o.report:
            outcomes += mover.evaluate(run)
        elif verified is not None:
            outcomes += mover.deliver(run, verified[kind])
        else:
            outcomes += mover.local(run)
    return outcomes
