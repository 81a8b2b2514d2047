"""The pin bot's part for build roots: roots/<name>.yaml moves like any pin (newest in its suites).

Each root is resolved again against its suites' Packages indexes now (builders.roots.resolve_file); what changed is
the drift report (package by package: added, removed, another version or suite). A root is held, like a pin that
would move backwards, when a package would go to an older version (experimental dropped an upload, a suite rolled
back): the file stays as it is unless --allow-rollback with a --reason. A root that no longer resolves (a requested
package left its suite) is refused with the resolver's one line. Roots are weekly pins; `pins bump root:NAME` names one.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from debian.debian_support import Version

from ..errors import OnebitError
from ..root_pins import Change, RootPin, describe, load_roots
from .bump import Options, Outcome

PREFIX = "root:"
CADENCE = "weekly"


def split_names(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Pure: (pin names, root names) of the names given to `pins bump` (a root is named `root:NAME`)."""
    pins = [n for n in names if not n.startswith(PREFIX)]
    return pins, [n.removeprefix(PREFIX) for n in names if n.startswith(PREFIX)]


def selected(roots: Sequence[str], names: Sequence[str], given: bool, cadence: str | None) -> list[str]:
    """Pure: the roots a `pins bump` run moves: those named; with no name at all, every root unless --cadence asks
    for another cadence than the roots' (weekly)."""
    if given:
        return [r for r in roots if r in names]
    return list(roots) if cadence in (None, "all", CADENCE) else []


def backwards(changes: Sequence[Change], old: Sequence, new: Sequence) -> list[str]:
    """Pure: the packages a re-resolution would move to an older version, as report lines."""
    a = {d.package: d for d in old}
    b = {d.package: d for d in new}
    out = []
    for c in changes:
        if c.package in a and c.package in b and Version(b[c.package].version) < Version(a[c.package].version):
            out.append(f"{c.package}: {c.old} -> {c.new}")
    return out


def bump_root(pin: RootPin, opts: Options, *, resolve: Callable | None = None, log: Callable[[str], None] = lambda m: None) -> Outcome:
    """One root: resolve it now, report the drift, write it (unless dry run or held)."""
    from .. import roots

    resolve = resolve or roots.resolve_file
    name = PREFIX + pin.name
    try:
        resolved, changes = resolve(pin, write=False, log=log)
    except OnebitError as exc:
        return Outcome(name, "refused", exc.what)
    if not changes:
        return Outcome(name, "current", f"{len(resolved)} packages, snapshot {pin.snapshot}")
    report = describe(changes)
    older = backwards(changes, pin.resolved, resolved)
    if older and not (opts.allow_rollback and opts.reason):
        return Outcome(name, "held", "would move to an older version: " + "; ".join(older)
                       + " (pins bump --allow-rollback --reason TEXT moves it)")
    detail = f"{len(changes)} change(s), {len(resolved)} packages: " + "; ".join(report)
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
    _, wanted = split_names(opts.names)
    unknown = sorted(set(wanted) - set(found))
    out = [Outcome(PREFIX + n, "error", f"no build root named {n!r}; roots/ has: {', '.join(sorted(found))}")
           for n in unknown]
    for name in selected(sorted(found), wanted, names_given, opts.cadence):
        out.append(bump_root(found[name], opts, resolve=resolve, log=log))
    return out
