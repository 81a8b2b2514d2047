"""The `pins` command: `status`, `bump`, `check`. register(subparsers) plugs it into `1bit-build`."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import OnebitError
from . import bump as bumpmod
from . import check as checkmod
from .decide import render_pr_body
from .secrets import redact


def _console() -> Console:
    return Console(width=200 if not sys.stdout.isatty() else None, highlight=False, soft_wrap=False)


def register(subparsers) -> argparse.ArgumentParser:
    pins = subparsers.add_parser("pins", help="track upstream pins: status, bump (the bot), check (the guard)",
                                 description="Track every upstream in pins.yaml.")
    sub = pins.add_subparsers(dest="pins_command", metavar="{status,bump,check}")
    sub.required = True

    st = sub.add_parser("status", help="each pin: policy, current commit, upstream now, behind or not")
    st.add_argument("names", nargs="*", metavar="NAME")
    st.set_defaults(func=cmd_status)

    bp = sub.add_parser("bump", help="move pins according to their policy (edit pins.yaml, or open one PR per pin)")
    bp.add_argument("names", nargs="*", metavar="NAME",
                    help="pins to bump, `root:NAME` for a build root, `toolchain:NAME` for a toolchain input (default: every "
                         "pin of --cadence, and the roots and toolchain inputs)")
    bp.add_argument("--cadence", choices=["daily", "weekly", "manual", "all"], default=None,
                    help="without NAME: only pins of this cadence (default: every pin that is not manual)")
    bp.add_argument("--open-pr", action="store_true", help="push a bump/<pin>-<sha12> branch and open a PR per pin")
    bp.add_argument("--allow-rollback", action="store_true", help="allow a backwards or sideways move (needs --reason)")
    bp.add_argument("--reason", metavar="TEXT", help="why the rollback is needed (goes into the PR)")
    bp.add_argument("--dry-run", action="store_true", help="resolve and report; change nothing, push nothing")
    bp.add_argument("--remote", default=os.environ.get("ONEBIT_PINS_REMOTE", "origin"),
                    help="git remote (name or URL) the bump branch is pushed to (env ONEBIT_PINS_REMOTE; default origin)")
    bp.add_argument("--repo", default=None, help="OWNER/NAME of this repository on GitHub (default: $GITHUB_REPOSITORY or the remote)")
    bp.add_argument("--base-branch", default=None, help="branch the PR targets (default: $GITHUB_REF_NAME or the current branch)")
    bp.add_argument("--show-body", action="store_true", help="print each proposal's PR body")
    bp.add_argument("--report", metavar="DIR", type=Path, default=None,
                    help="only evaluate (sandboxed, no token needed) and leave the plain-data report in DIR")
    bp.add_argument("--from-report", metavar="DIR", type=Path, default=None,
                    help="push and open PRs from a report --report made (never fetches or runs upstream content)")
    bp.set_defaults(func=cmd_bump)

    # the bot's isolated parts (builders/pins/isolate.py): started by `bump`, never by hand
    ev = sub.add_parser("evaluate", help=argparse.SUPPRESS)
    ev.add_argument("--out", required=True)
    ev.add_argument("--allow-rollback", action="store_true")
    ev.add_argument("--reason", default=None)
    ev.add_argument("names", nargs="*")
    ev.set_defaults(func=cmd_evaluate)
    dr = sub.add_parser("drift", help=argparse.SUPPRESS)
    dr.add_argument("--in", dest="in_dir", required=True)
    dr.add_argument("--no-make", default=None)
    dr.set_defaults(func=cmd_drift)

    ck = sub.add_parser("check", help="fail if a pin moved backwards or sideways since REF (unless labelled rollback)")
    ck.add_argument("--base", required=True, metavar="REF", help="the git ref to compare with, e.g. origin/main")
    ck.add_argument("--label", action="append", default=[], metavar="LABEL",
                    help="a PR label (repeatable); labels of $GITHUB_EVENT_PATH's pull request are added")
    ck.set_defaults(func=cmd_check)
    return pins


def _root(args) -> Path:
    return Path(getattr(args, "root", None) or ".")


def _guarded(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except OnebitError as exc:
            print(f"error: {redact(str(exc))}", file=sys.stderr)
            return 2
    run.__name__ = fn.__name__
    return run


@_guarded
def cmd_status(args) -> int:
    ctx = bumpmod.make_context(_root(args))
    rows = bumpmod.status(ctx, args.names)
    table = Table(title="pins")
    for col in ("pin", "policy", "current", "upstream now", "state"):
        table.add_column(col)
    for r in rows:
        style = {"current": "green", "behind": "yellow"}.get(r.state, "red" if r.failed else "")
        table.add_row(r.pin, r.policy, r.current, r.upstream, f"[{style}]{r.state}[/]" if style else r.state)
    _console().print(table)
    return 1 if any(r.failed for r in rows) else 0


def _summary(lines: list[str]) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


@_guarded
def cmd_bump(args) -> int:
    console = _console()
    log = lambda m: console.print(f"[dim]{redact(m)}[/]")  # noqa: E731
    ctx = bumpmod.make_context(_root(args), log=log)
    from .movers import Run, bump_all

    opts = bumpmod.Options(names=args.names, cadence=args.cadence, open_pr=args.open_pr, dry_run=args.dry_run,
                           allow_rollback=args.allow_rollback, reason=args.reason, remote=args.remote, repo=args.repo,
                           base_branch=args.base_branch, report=args.report, from_report=args.from_report)
    if args.report and (args.from_report or args.open_pr):
        raise OnebitError("--report only evaluates: it takes neither --from-report nor --open-pr")
    # every kind the bot moves (pins, roots, toolchain inputs: builders/pins/movers.py), in the run's mode
    outcomes = bump_all(Run(ctx, opts, _root(args), log))
    table = Table(title="pins bump" + (" (dry run)" if args.dry_run else ""))
    for col in ("pin", "outcome", "detail"):
        table.add_column(col, overflow="fold")
    md = ["## pins bump", "", "| pin | outcome | detail |", "|---|---|---|"]
    for o in outcomes:
        style = "red" if o.failed else ("green" if o.state in ("proposed", "edited", "would-propose") else "")
        detail = redact(o.detail + (f" {o.url}" if o.url else ""))
        table.add_row(o.pin, f"[{style}]{o.state}[/]" if style else o.state, detail)
        md.append(f"| {o.pin} | {o.state} | {detail.replace(chr(10), '<br>')} |")
    console.print(table)
    if args.show_body or args.dry_run:
        for o in outcomes:
            if o.proposal:
                console.rule(f"{o.pin}: {o.proposal.branch}")
                console.print(redact(render_pr_body(o.proposal)), markup=False)
            elif o.body:
                console.rule(o.pin)
                console.print(redact(o.body), markup=False)
    _summary(md)
    failed = [o for o in outcomes if o.failed]
    for o in failed:
        print(redact(f"error: {o.pin}: {o.state}: {o.detail}"), file=sys.stderr)
    if args.report:  # the failures are in the report: --from-report states them again and fails, after the others' PRs
        return 0
    return 1 if failed else 0


def cmd_evaluate(args) -> int:
    """The evaluating part: no token (its environment is cleared; any token variable is dropped all the same)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEBIT_BOT_TOKEN", "GITHUB_TOKEN", "HF_TOKEN")}
    try:
        ctx = bumpmod.make_context(_root(args), env=env, log=lambda m: print(f"log: {m}", file=sys.stderr, flush=True))
        opts = bumpmod.Options(names=args.names, allow_rollback=args.allow_rollback, reason=args.reason)
        data = bumpmod.evaluate(ctx, opts, args.names, Path(args.out))
    except OnebitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from . import report

    report.write_file(Path(args.out), "report.json", data)
    return 0


def cmd_drift(args) -> int:
    from . import isolate

    return isolate.drift_main(_root(args), Path(args.in_dir), args.no_make)


@_guarded
def cmd_check(args) -> int:
    labels = list(args.label) + checkmod.event_labels()
    findings, ok = checkmod.check(_root(args), args.base, labels)
    table = Table(title=f"pins check against {args.base}")
    for col in ("pin", "field", "old", "new", "verdict", "detail"):
        table.add_column(col)
    for f in findings:
        table.add_row(f.pin, f.field, (f.old or "—")[:12], (f.new or "—")[:12], f.verdict if f.ok else f"[red]{f.verdict}[/]", f.detail)
    console = _console()
    if findings:
        console.print(table)
    else:
        console.print("pins check: no pin moved")
    bad = [f for f in findings if not f.ok]
    if bad and ok:
        console.print(f"{len(bad)} backwards/sideways move(s) allowed by the '{checkmod.decide.ROLLBACK_LABEL}' label")
    if not ok:
        if bad and checkmod.decide.ROLLBACK_LABEL not in labels:
            for f in bad:
                print(f"error: pins.{f.pin}.{f.field} moved {f.verdict}: {(f.old or '')[:12]} -> {(f.new or '')[:12]} {f.detail}".rstrip(),
                      file=sys.stderr)
            print("  hint: a pin must descend from its old commit; if the move is intended, label the PR 'rollback'", file=sys.stderr)
        if checkmod.decide.HELD_LABEL in labels:
            print(f"error: this change carries the '{checkmod.decide.HELD_LABEL}' label: the pin bot found that a recipe no "
                  "longer matches upstream's build at the new commit (the PR body's build-flag report says where)", file=sys.stderr)
            print("  hint: fix the recipe on this branch, then remove the label", file=sys.stderr)
        return 1
    return 0
