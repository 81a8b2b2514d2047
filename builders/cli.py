"""`1bit-build`: validate, plan, fetch, build and install bundles; check patches; move pins."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .project import config
from .inputs import host
from .errors import OnebitError
from .plan import all_tools, make_plan, root_dirs
from .plan_types import Plan, Step
from .session import console, default_cache, layout_for, locked, parse_overrides, preflight, refuse


def _plan(args) -> tuple[config.Project, Plan]:
    project = config.load_project(args.root)
    lay = layout_for(args, args.bundle)
    facts = host.gather(all_tools(project, args.bundle), toolchains=lay.cache / "toolchains",
                        roots=root_dirs(project, lay.cache))
    only = set(args.only) if getattr(args, "only", None) else None
    plan = make_plan(project, args.bundle, facts, lay, build_number=args.build_number, only=only,
                     overrides=parse_overrides(getattr(args, "set", None) or []))
    return project, plan


WHAT_WIDTH = 60  # the table's `what` column; --verbose prints each step's full title


def env_lines(env: Mapping[str, str], shown: dict[str, str], caller: Mapping[str, str],
              unset: Sequence[str] = ()) -> list[str]:
    """Pure: the `export K=V` / `unset K` lines that take a shell whose environment is `shown` to what the executor
    gives this command (the caller's environment less `unset`, with `env` over it); `shown` is updated. Keys whose
    value is the caller's never print (cibuildwheel's way), so what prints is what the build changes."""
    want = {**{k: v for k, v in caller.items() if k not in unset}, **env}
    lines = []
    for k in sorted(set(shown) | set(want)):
        if k in want and shown.get(k) != want[k]:
            lines.append(f"export {k}={shlex.quote(want[k])}")
            shown[k] = want[k]
        elif k not in want and k in shown:
            lines.append(f"unset {k}")
            del shown[k]
    return lines


def format_plan(plan: Plan, *, cached: Callable[[Step], bool] | None = None, verbose: bool = False,
                caller_env: Mapping[str, str] | None = None) -> list[str]:
    """Pure: the plan for a person. Missing toolchains and refusals first, then one row per step (step, what, key,
    cached?); with `verbose`, each step's full title and commands, its environment as `export K=V` lines for only the
    keys that differ from the caller's, so a step pastes into a shell."""
    caller = dict(os.environ if caller_env is None else caller_env)
    out = [f"plan {plan.bundle} {plan.version} build {plan.build_number} ({plan.platform}): {len(plan.steps)} steps"
           + (f", {len(plan.to_fetch)} input(s) to fetch" if plan.to_fetch else "")
           + (f", {len(plan.missing)} toolchain(s) missing" if plan.missing else "")
           + (f", {len(plan.refusals)} variant(s) refused" if plan.refusals else "")]
    if plan.missing:
        out.append("missing on this host (a build stops before doing anything):")
        out += [f"  - {line}" for line in plan.missing]
    if plan.to_fetch:
        out.append(f"to fetch (the build does it first; `1bit-build fetch {plan.bundle}` does only that):")
        out += [f"  - {line}" for line in plan.to_fetch]
    if plan.refusals:
        out.append("refused (these variants are left out):")
        out += [f"  - {line}" for line in plan.refusals]
    width = max([len(s.id) for s in plan.steps] + [4])
    out.append(f"{'#':>3}  {'step':<{width}}  {'what':<{WHAT_WIDTH}}  {'key':<12}  cached")
    for i, step in enumerate(plan.steps, 1):
        what = step.title if len(step.title) <= WHAT_WIDTH else step.title[:WHAT_WIDTH - 1] + "…"
        state = "-" if cached is None else ("yes" if cached(step) else "no")
        out.append(f"{i:>3}  {step.id:<{width}}  {what:<{WHAT_WIDTH}}  {step.key[:12]}  {state}".rstrip())
        if verbose:
            out.append(f"     # {step.title}")
            out += [f"     #   {line}" for line in step.describe]  # what it does that is no command of its own
            shown = dict(caller)
            cwd = None
            for cmd in step.commands:
                if cmd.cwd and cmd.cwd != cwd:
                    out.append(f"     cd {shlex.quote(cmd.cwd)}")
                    cwd = cmd.cwd
                if cmd.clear:  # the host root's cleared environment: exactly what the command runs with, on its line
                    pairs = " ".join(f"{k}={shlex.quote(v)}" for k, v in cmd.env)
                    out.append(f"     env -i {pairs} {shlex.join(cmd.argv)}")
                    continue
                out += [f"     {line}" for line in env_lines(dict(cmd.env), shown, caller, cmd.unset)]
                out.append(f"     {shlex.join(cmd.argv)}")
    return out


def print_plan(plan: Plan, project: config.Project, *, verbose: bool = False) -> None:
    from .execute import Executor

    executor = Executor(plan, project, console=console)  # its own cache check, read-only
    sys.stdout.write("\n".join(format_plan(plan, cached=executor.is_cached, verbose=verbose)) + "\n")


def unbuildable(plan: Plan) -> int:
    """Exit status of `plan` and `build --dry-run`: 1, with one line, when this host cannot build the bundle."""
    if not (plan.missing or plan.refusals):
        return 0
    why = ", ".join(x for x in (f"{len(plan.missing)} toolchain(s) missing" if plan.missing else "",
                                f"{len(plan.refusals)} variant(s) refused" if plan.refusals else "") if x)
    console.print(f"error: this host cannot build bundle {plan.bundle!r}: {why} (listed first above); build a subset "
                  f"with `1bit-build build {plan.bundle} --only RECIPE`", style="bold red", highlight=False,
                  soft_wrap=True, markup=False)
    return 1


def cmd_validate(args) -> int:
    project = config.load_project(args.root)
    console.print(f"[green]ok[/]: {len(project.pins)} pins, {len(project.recipes)} recipes, {len(project.bundles)} bundles")
    return 0


def cmd_plan(args) -> int:
    project, plan = _plan(args)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print_plan(plan, project, verbose=args.verbose)
    return unbuildable(plan)


def cmd_fetch(args) -> int:
    from .execute import Executor
    from .steps import fetch_only

    project, plan = _plan(args)
    preflight(plan.layout, out=False)
    refuse(plan, tools=False)
    plan.steps = fetch_only(plan.steps)  # crates are vendored from a checkout: its source step runs too
    with locked(plan.layout, out=False):
        report = Executor(plan, project, offline=args.offline, console=console).run()
    console.print(f"[green]fetched[/] {len(report.ran)} source(s), {len(report.cached)} already cached")
    return 0


def cmd_build(args) -> int:
    from .build import build

    if args.dry_run:
        project, plan = _plan(args)
        print_plan(plan, project, verbose=args.verbose)
        return unbuildable(plan)
    plan, report = build(lambda: _plan(args), offline=args.offline, force=args.force, console=console)
    built = sum(1 for s in report.ran if s.startswith("build:"))
    console.print(f"[green]done[/]: {len(report.ran)} step(s) ran ({built} build), {len(report.cached)} cached; "
                  f"output in {plan.layout.out}")
    return 0


def cmd_install(args) -> int:
    from .ship.install import install_bundle

    installed = install_bundle(Path(args.channel), Path(args.prefix).resolve(), args.bundle,
                               cache_dir=default_cache() / "pkgs")
    console.print(f"[green]installed[/] into {args.prefix}: " + ", ".join(installed))
    return 0


def cmd_patches(args) -> int:
    from .inputs import fetch, patch

    project = config.load_project(args.root)
    lay = layout_for(args, "patches")
    table = Table("recipe", "patch", "result", "where")
    failed = False
    for recipe in project.recipes.values():
        if args.recipe and recipe.name not in args.recipe:
            continue
        patches = recipe.patches(project.root)
        if not patches:
            continue
        pin = project.pins[recipe.pin_name]
        dest = lay.git_cache(pin.commit)
        fetch.fetch_pin(pin, dest, lay.downloads(), offline=args.offline, mirror_dirs=lay.mirror_dirs or ())
        for r in patch.drift_report(dest, pin.commit, [p.path for p in patches]):
            failed |= not r.ok
            table.add_row(recipe.name, r.patch, r.status, " ".join(x for x in (r.file or "", r.hunk or "") if x) or r.detail)
    Console().print(table)
    return 1 if failed else 0


def _root_pin(args):
    from .roots import assemble as roots

    found, problems = roots.load_roots(Path(args.root) / "roots")
    if problems:
        from .errors import ValidationError
        raise ValidationError(problems)
    if args.name not in found:
        raise OnebitError(f"no build root named {args.name!r}", hint=f"roots/ has: {', '.join(sorted(found)) or 'nothing'}")
    return found[args.name]


def cmd_roots(args) -> int:
    """`roots resolve NAME`: the closure from the suites' Packages indexes, written into roots/NAME.yaml;
    `roots assemble NAME`: fetch, verify and assemble it into the cache; `roots show NAME`: what it holds."""
    import time

    from .roots import assemble as roots
    from .io.lock import hold

    pin = _root_pin(args)
    say = lambda m: console.print(m, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    if args.action == "resolve":
        started = time.monotonic()
        with hold(pin.path, "root pin file"):
            resolved, changes = roots.resolve_file(pin, write=not args.dry_run, log=say)
        for line in roots.describe(changes):
            say(f"  {line}")
        size = sum(d.size for d in resolved)
        say(f"{pin.name}: {len(resolved)} packages, {size / 2**20:.1f} MiB to download; {len(changes)} change(s)"
            f"{' (not written: --dry-run)' if args.dry_run and changes else ''} in {time.monotonic() - started:.0f} s")
        return 0
    cache = Path(args.cache) if args.cache else default_cache()
    dest = pin.dest(cache)
    if args.action == "assemble":
        started = time.monotonic()
        how = roots.assemble(pin, cache / "downloads", dest, offline=args.offline, log=say)
        say(f"{pin.name}: {how} at {dest} in {time.monotonic() - started:.0f} s")
        return 0
    meta = roots.metadata(dest)
    say(f"{pin.name}: {len(pin.resolved)} packages, {pin.download_size / 2**20:.1f} MiB, snapshot {pin.snapshot}, "
        f"key {pin.key[:16]}, {'assembled at ' + str(dest) if meta else 'not assembled'}"
        + (f", glibc {meta['glibc']}" if meta else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="1bit-build", description="Build, package and install 1bit engine bundles.")
    p.add_argument("--root", default=".", help="project root holding pins.yaml, recipes/, bundles/ (default: .)")
    p.add_argument("--cache", help="source/download/step cache (default: $ONEBIT_CACHE or ~/.cache/onebit)")
    p.add_argument("--work", help="work dir for this bundle (default: ROOT/.onebit/work/BUNDLE)")
    p.add_argument("--out", help="where the finished bundle goes (default: ROOT/.onebit/out/BUNDLE)")
    p.add_argument("--mirror-dir", action="append", metavar="DIR",
                   help="a local mirror directory of git repositories (<name>.git), consulted before every pin's own "
                        "mirrors (repeatable; then $ONEBIT_GIT_MIRRORS); see docs/mirrors.md")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("validate", help="check pins.yaml, recipes and bundles against their schemas; report every error")
    s.set_defaults(func=cmd_validate)

    def bundle_args(s, *, offline=True):
        s.add_argument("bundle", metavar="BUNDLE")
        s.add_argument("--only", action="append", metavar="RECIPE", help="only this recipe or variant (repeatable)")
        s.add_argument("--build-number", type=int, help="override the bundle's build number")
        s.add_argument("--set", action="append", metavar="RECIPE.OPTION=VALUE",
                       help="override one build option for this run (repeatable); recorded in the build string and the "
                            "manifest, so such a bundle never passes for the release one")
        if offline:
            s.add_argument("--offline", action="store_true", help="use only the caches and local mirrors; never download")

    s = sub.add_parser("plan", help="print the ordered steps with exact commands and cache keys (runs nothing)")
    bundle_args(s, offline=False)
    s.add_argument("--dry-run", action="store_true", help="accepted for symmetry with build; plan never runs anything")
    s.add_argument("--json", action="store_true", help="print the whole plan as JSON (every command and environment)")
    s.add_argument("-v", "--verbose", action="store_true",
                   help="under each step, its commands and the environment they add to yours, ready to paste")
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("fetch", help="fetch and verify every source of a bundle into the cache")
    bundle_args(s)
    s.set_defaults(func=cmd_fetch)

    s = sub.add_parser("build", help="fetch, patch, build, stage and package a bundle")
    bundle_args(s)
    s.add_argument("--dry-run", action="store_true", help="print the plan and stop (non-zero when this host cannot build it)")
    s.add_argument("-v", "--verbose", action="store_true", help="with --dry-run: each step's commands and environment")
    s.add_argument("--force", action="store_true", help="ignore the step cache")
    s.set_defaults(func=cmd_build)

    s = sub.add_parser("install", help="install a bundle from a local channel into a prefix (offline, py-rattler)")
    s.add_argument("bundle", metavar="BUNDLE")
    s.add_argument("--channel", required=True, metavar="DIR")
    s.add_argument("--prefix", required=True, metavar="P")
    s.set_defaults(func=cmd_install)

    s = sub.add_parser("patches", help="check the recipes' patch files against their pinned commits (drift report)")
    s.add_argument("action", choices=["check"])
    s.add_argument("recipe", nargs="*")
    s.add_argument("--offline", action="store_true")
    s.set_defaults(func=cmd_patches)

    s = sub.add_parser("roots", help="pinned build roots (roots/NAME.yaml): resolve the closure, assemble, show")
    s.add_argument("action", choices=["resolve", "assemble", "show"])
    s.add_argument("name", metavar="NAME")
    s.add_argument("--dry-run", action="store_true", help="resolve: print what would change, write nothing")
    s.add_argument("--offline", action="store_true", help="assemble: only from the download cache")
    s.set_defaults(func=cmd_roots)

    from .release.cli import register as register_release
    register_release(sub)
    from .release.lemonade_cli import register as register_lemonade
    register_lemonade(sub)

    try:
        from .pins.cli import register
    except ImportError:
        register = None
    if register is not None:
        register(sub)
    return p


def describe_os_error(exc: OSError) -> str:
    what = exc.strerror or str(exc) or type(exc).__name__
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p)
    hint = {"PermissionError": "fix the permissions of that path or choose another directory (--cache, --work, --out)",
            "FileNotFoundError": "that path (or program) does not exist: check it, or run again if a file vanished mid-build",
            }.get(type(exc).__name__, "check the disk and the directories given; run again when fixed")
    return f"{what}{': ' + paths if paths else ''}\n  hint: {hint}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except OnebitError as exc:
        # the message is text, not markup or emoji codes: a C++ symbol's [abi:cxx11], a YAML list [vulkan] and a
        # file's line 100 (`vulkan.yaml:100:`, rich's :100: emoji) are printed as they are
        console.print(f"[bold red]error[/]: {escape(str(exc))}", highlight=False, soft_wrap=True, emoji=False)
        return 2
    except OSError as exc:  # a host fault (permissions, disk full, another filesystem): one line, no traceback
        console.print(f"error: {describe_os_error(exc)}", style="bold red", highlight=False, soft_wrap=True, markup=False)
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]: finished outputs are intact; run again to continue")
        return 130


if __name__ == "__main__":
    sys.exit(main())
