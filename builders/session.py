"""What every command that works on a bundle shares: where its cache, work and out dirs are, the refusal when the host
cannot build, the directory locks, and the console and log lines it writes. The `1bit-build` front (cli.py), the
executor and the release command all use it, so the release command registers without importing the front."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from .errors import OnebitError
from .plan_types import Layout, Plan



def new_console(**kw) -> Console:
    """The console every command writes to (stderr): no source location on log lines (`execute.py:217`) and, off a
    terminal, no wrapping at 80 columns (CI logs, pipes)."""
    return Console(**{"stderr": True, "log_path": False, "soft_wrap": True, **kw})


def log_to(out: Console) -> Callable[[str], None]:
    """A log function: rich's timed log lines on a terminal; off one, `[HH:MM:SS] message` on one line (rich's log
    would lay the message out in a table 80 columns wide, wrapping it mid-word)."""
    def log(message: str) -> None:
        if out.is_terminal:
            out.log(message)
        else:
            out.print(f"[{time.strftime('%H:%M:%S')}] {message}", highlight=False, soft_wrap=True)
    return log


console = new_console()


def default_cache() -> Path:
    return Path(os.environ.get("ONEBIT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "onebit")


def layout_for(args, bundle: str) -> Layout:
    root = Path(args.root).resolve()
    work = Path(args.work).resolve() if args.work else root / ".onebit" / "work" / bundle
    out = Path(args.out).resolve() if args.out else root / ".onebit" / "out" / bundle
    from .inputs.fetch import mirror_dirs

    dirs = mirror_dirs([Path(d).resolve() for d in getattr(args, "mirror_dir", None) or []], os.environ)
    return Layout(root=root, cache=Path(args.cache).resolve() if args.cache else default_cache(), work=work, out=out,
                  mirror_dirs=dirs)


def refuse(plan: Plan, *, tools: bool = True, fetched: bool = False) -> None:
    """Raise the one refusal naming every problem; `fetched`: the pinned toolchain inputs and build roots were fetched
    and assembled into the cache first (they decide what is missing), and nothing was built."""
    problems = []
    if plan.refusals:
        problems.append("these recipes use unresolved pins:\n  - " + "\n  - ".join(plan.refusals))
    if tools and plan.missing:
        problems.append("missing toolchains:\n  - " + "\n  - ".join(plan.missing))
    if problems:
        done = ("its pinned toolchain inputs and build roots are in the cache now; nothing was built" if fetched
                else "nothing was done")
        raise OnebitError(f"cannot build bundle {plan.bundle!r}; {done}.\n" + "\n".join(problems),
                          hint="set the variables above (or install the tools), or build a subset with --only")


def _writable_problem(path: Path) -> str | None:
    """Why this process cannot create or write `path` (checked at its nearest existing ancestor), or None."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"permission denied on {probe}"
    return None


def _dirs(lay: Layout, out: bool) -> list[tuple[Path, str]]:
    return [(lay.cache, "cache"), (lay.work, "work")] + ([(lay.out, "out")] if out else [])


def preflight(lay: Layout, *, out: bool = True) -> None:
    """Refuse unwritable cache/work/out directories before anything is written."""
    for d, what in _dirs(lay, out):
        problem = _writable_problem(d if what != "out" else d.parent)
        if problem:
            raise OnebitError(f"cannot write the {what} directory {d}: {problem}",
                              hint=f"fix its permissions or choose another with --{what}; nothing was changed")


def locked(lay: Layout, *, out: bool = True):
    """Hold the cache, work (and out) locks: a second run on the same directories says so and waits."""
    from .io import lock

    preflight(lay, out=out)
    return lock.hold_all(_dirs(lay, out), say=lambda m: console.print(f"[yellow]{m}[/]", highlight=False))


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """`--set RECIPE.OPTION=VALUE` (or VARIANT.OPTION=VALUE), repeatable -> {target: {option: value}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        target, dot, rest = item.partition(".")
        option, eq, value = rest.partition("=")
        if not (dot and eq and target and option):
            raise OnebitError(f"--set {item!r}: expected RECIPE.OPTION=VALUE, e.g. cuda.CMAKE_CUDA_ARCHITECTURES=90-real")
        out.setdefault(target, {})[option] = value
    return out
