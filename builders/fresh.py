"""fresh: the README's first command on clean Debian roots, as a new user would type it (`nox -s fresh -- bookworm trixie`).

For each distribution (a Debian suite name):
1. mmdebstrap (Debian's own tool, run as root: builders/roots/clean.py) makes a minbase root plus python3 and
   ca-certificates, nothing else, from the Debian archive of the host's apt sources (`$ONEBIT_DEBIAN_MIRROR` names
   another), in `.onebit/fresh/<suite>/root`;
2. the checkout is copied in (builders/roots/checkout.py: git's tracked files and the untracked ones it does not
   ignore: no `.onebit/`, no `.nox/`, no cache, no venv; nothing of the product);
3. the root's files are given to the sandbox's id range (sandbox.shift_ids), and inside the root (builders/roots/sandbox.py:
   the root itself as /, writable, with the host's network) it runs, as uid 0 of the root's own user namespace (root
   there, no one on the host: no device nodes, no modules, no sysctl, no host file but what is bound), the README's
   first command, then `1bit check` and one chat completion from the installed prefix;
4. it prints each step's result and time, one line per distribution, and removes the root (`--keep` keeps it; a
   root whose steps failed is kept for a look; its files then belong to the id range).

The channels step (`--channels DIR`, repeatable; `--channels-only` leaves out the checkout and the README's
command): the channels built OUTSIDE the roots are proven to install and start in them (builders/ship/channels_check.py
has its steps).

`--dry-run` (or ONEBIT_FRESH_DRY_RUN=1, how the release workflow's replay runs the job) prints the settings, the
mirror, each root's mmdebstrap command and the steps, and makes nothing. `--sudo` (a CI runner: passwordless sudo)
re-runs this command as root through `sudo -n`, keeping the environment-only settings above and nothing else.

Only the host's environment-only settings cross into the root, and each is named on the console: the apt mirror and
apt's own Acquire options (Check-Valid-Until, proxies) from the host's apt configuration, pip's environment (PIP_*)
and configuration files, the CA bundle variables, the proxy variables, DNS (/etc/resolv.conf). A host file such a
setting names is copied in at the same path; a folder is bound read-only at the same path unless the root has its own
(builders/roots/passthrough.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import OnebitError
from .roots import clean, debs, passthrough, sandbox
from .roots.checkout import copy_checkout
from .ship import channels_check

INSIDE = "/src/onebit-build"  # where the checkout lands in the root
PREFIX = ".onebit/prefix/cpu"  # where the README's first command installs the CPU bundle


def readme_commands(text: str) -> list[str]:
    """Pure: the README's two commands, its first two lines without their `# ...` comments."""
    lines = text.splitlines()[:2]
    return [line.split("#", 1)[0].strip() for line in lines if line.strip()]


def sudo_argv(env: Mapping[str, str], python: str, args: Sequence[str]) -> list[str]:
    """Pure: this command again, as root through passwordless sudo, keeping only the settings that cross into a root
    (sudo's own policy resets the rest, PATH included: hence the interpreter by its path)."""
    keep = ",".join(passthrough.passed_env(env))
    return ["sudo", "-n", *([f"--preserve-env={keep}"] if keep else []), "--", python, "-m", "builders.fresh", *args]


@dataclass
class Step:
    name: str
    command: str
    rc: int | None = None
    seconds: float = 0.0


@dataclass
class Result:
    suite: str
    steps: list[Step] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    channels: channels_check.ChannelsRun | None = None

    @property
    def ok(self) -> bool:
        return (self.error is None and (bool(self.steps) or self.channels is not None)
                and all(s.rc == 0 for s in self.steps) and (self.channels is None or self.channels.ok))


def steps(readme_first: str) -> list[Step]:
    """Pure: what runs inside the root, in order: the README's first command, `1bit check`, one chat completion (the
    build session's own environment has the smoke script's requirements; `1bit serve` runs on the root's python3)."""
    return [Step("readme", readme_first), Step("check", f"{PREFIX}/bin/1bit check"),
            Step("chat", f".nox/build-cpu/bin/python scripts/serve_smoke.py {PREFIX}")]


def mmss(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


def summary(r: Result) -> str:
    """Pure: one line per distribution."""
    parts = [f"{r.suite:<10} {'ok' if r.ok else 'FAILED':<6} total {mmss(r.seconds)}"]
    parts += [f"{s.name} {'ok' if s.rc == 0 else 'not run' if s.rc is None else f'rc={s.rc}'} {mmss(s.seconds)}"
              for s in r.steps]
    if r.channels is not None:
        parts.append(channels_check.channels_summary(r.channels))
    if r.error:
        parts.append(r.error)
    return "  ".join(parts)


def say(msg: str) -> None:
    """A line of fresh's on the console."""
    print(f"fresh: {msg}", flush=True)


def run_suite(suite: str, project: Path, *, mirror: str, aptopts: list[str], env: dict[str, str], keep: bool,
              installed: Sequence[channels_check.Installed] = (), stubs: Path | None = None, readme: bool = True) -> Result:
    t0 = time.monotonic()
    result = Result(suite)
    work = project / ".onebit" / "fresh" / suite
    root = work / "root"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        say(f"{suite}: mmdebstrap minbase + {', '.join(clean.INCLUDE)}")
        rc = clean.make(suite, root, mirror, aptopts)
        if rc != 0:
            result.error = f"mmdebstrap failed (exit {rc})"
            return result
        c = passthrough.Carry()
        if readme:
            n = copy_checkout(project, root / INSIDE.lstrip("/"), say=say)
            say(f"{suite}: copied {n} files of the checkout to {INSIDE}")
            c = passthrough.carry_into(root, env, os.environ, os.path.expanduser("~"))
            say(f"{suite}: host files copied in: {', '.join(h for h, _ in c.copy) or 'none'}; folders bound read-only: "
                f"{', '.join(c.bind) or 'none'}; the root's own: {', '.join(c.own) or 'none'}"
                + (f"; named but absent on the host: {', '.join(c.missing)}" if c.missing else ""))
        ro = tuple(p for p in ("/etc/resolv.conf",) if os.path.exists(p)) + c.bind
        hidden = [p for p in ro + tuple(str(i.prefix) for i in installed) + ((str(stubs),) if stubs else ())
                  if not sandbox.reachable(p)]
        if hidden:
            result.error = (f"{', '.join(hidden)} cannot be shown in the root: the root's sandbox is set up as an "
                            "unprivileged id, which cannot read it (make it readable by others, or name a copy)")
            return result
        moved = sandbox.shift_ids(root)
        say(f"{suite}: {moved} files of the root given to the ids {sandbox.ID_BASE}-"
            f"{sandbox.ID_BASE + sandbox.ID_COUNT - 1}: its root is no one on the host")
        sb_env = {"PATH": clean.PATH, "LANG": "C.UTF-8", **env}
        for step in steps(readme_commands((project / "README.md").read_text())[0]) if readme else ():
            result.steps.append(step)
            say(f"{suite}: {step.command}")
            s0 = time.monotonic()
            try:
                proc = sandbox.popen(sandbox.Sandbox(env=sb_env, cwd=INSIDE, root=str(root), root_rw=True, uid=0,
                                                     network=True, ro=ro), ["/bin/sh", "-c", step.command])
            except OSError as exc:
                result.error = f"the root's sandbox could not start: {exc}"
                break
            step.rc = proc.wait()
            step.seconds = time.monotonic() - s0
            if step.rc != 0:
                break
        if installed and result.error is None:
            result.channels = channels_check.run_channels(suite, root, installed, stubs=stubs, env=env, ro=ro, say=say)
        return result
    finally:
        result.seconds = time.monotonic() - t0
        if not keep and result.ok:
            shutil.rmtree(work, ignore_errors=True)


class BadArgs(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (and no usage dump)."""

    def error(self, message: str):
        raise BadArgs(f"{message} (see {self.prog} -h)")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Pure: the command line; BadArgs (one line) for a mistake."""
    ap = _Parser(prog="nox -s fresh --", description=__doc__.split("\n\n")[0])
    ap.add_argument("suites", nargs="*", default=["bookworm", "trixie"], help="Debian suites (default: bookworm trixie)")
    ap.add_argument("--keep", action="store_true", help="keep each root under .onebit/fresh/<suite>/root")
    ap.add_argument("--dry-run", action="store_true", help="print what would run (also ONEBIT_FRESH_DRY_RUN=1)")
    ap.add_argument("--sudo", action="store_true", help="not root: re-run as root with `sudo -n`, keeping the settings")
    ap.add_argument("--channels", action="append", default=[], metavar="DIR",
                    help="a conda channel built outside the roots: install its bundles, start every program in each "
                         "root (repeatable)")
    ap.add_argument("--channels-only", action="store_true", help="only the channels step: no checkout, no README")
    a = ap.parse_args(list(argv))
    if a.channels_only and not a.channels:
        raise BadArgs("--channels-only needs at least one --channels DIR")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
        for ch in a.channels:
            sub = Path(ch) / "linux-64"
            why = channels_check.channel_problem(ch, sorted(os.listdir(sub)) if sub.is_dir() else None)
            if why:
                raise BadArgs(why)
    except BadArgs as exc:
        print(f"fresh: {exc}", file=sys.stderr)
        return 2
    channels = [Path(ch).resolve() for ch in a.channels]
    dry = a.dry_run or os.environ.get("ONEBIT_FRESH_DRY_RUN") == "1"
    project = Path(__file__).resolve().parent.parent
    if a.sudo and not dry and os.geteuid() != 0:
        os.execvp("sudo", sudo_argv(os.environ, sys.executable, [x for x in (argv if argv is not None else sys.argv[1:])
                                                                 if x != "--sudo"]))
    if dry:
        pass
    elif os.geteuid() != 0:
        print("fresh: needs root (mmdebstrap makes the roots, and the README's command installs packages inside them "
              "as root): run it as root", file=sys.stderr)
        return 2
    why = None if dry else sandbox.why_ids_unavailable()
    if not dry and (why or shutil.which("mmdebstrap") is None):
        print(f"fresh: {why or 'mmdebstrap is not installed: apt-get install mmdebstrap'}", file=sys.stderr)
        return 2
    mirror = clean.debian_mirror(os.environ, debs.host_sources())
    if mirror is None:
        print(f"fresh: no Debian archive in this host's apt sources: set {debs.MIRROR_ENV} to one", file=sys.stderr)
        return 2
    aptopts = clean.host_apt_options()
    env = passthrough.passed_env(os.environ)
    kinds = passthrough.setting_kinds(os.environ)
    say("the host's environment-only settings passed through (names; values as on the host):")
    say(f"  apt: the mirror ({'$' + debs.MIRROR_ENV if os.environ.get(debs.MIRROR_ENV) else 'the host apt sources'})"
        + "".join(f", {o.split(' ', 1)[0]}" for o in aptopts))
    for kind, names in kinds.items():
        say(f"  {kind}: {', '.join(names) or 'none'}")
    configs = [h for h, _ in passthrough.pip_config_files(os.environ, os.path.expanduser("~")) if os.path.isfile(h)]
    say(f"  pip configuration files: {', '.join(configs) or 'none'}")
    say("  DNS: /etc/resolv.conf")
    if dry:
        first = readme_commands((project / "README.md").read_text())[0]
        for ch in channels:
            for bundle in channels_check.bundles_in(sorted(os.listdir(ch / "linux-64"))):
                say(f"would install onebit-bundle-{bundle} from {os.path.relpath(ch)} with the standard solve into "
                    f"{channels_check.PREFIXES}/{bundle}")
        for suite in a.suites:
            root = str(project / ".onebit" / "fresh" / suite / "root")
            say(f"{suite}: would run {' '.join(clean.mmdebstrap_argv(suite, root, mirror, aptopts))}")
            for step in steps(first) if not a.channels_only else ():
                say(f"{suite}: would run, as root in the root at {INSIDE}: {step.command}")
            if channels:
                say(f"{suite}: would check the root holds no compiler, provide the declared host sets, run `1bit "
                    f"check` and start every program of each prefix with {' or '.join(channels_check.PROGRAM_ARGS)}")
        return 0
    try:
        installed = channels_check.install_channels(channels, project, say=say) if channels else []
    except OnebitError as exc:
        print(f"fresh: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:  # a prefix without a readable manifest
        print(f"fresh: an installed bundle has no readable {channels_check.MANIFEST}: {exc}", file=sys.stderr)
        return 1
    stubs = channels_check.make_stubs(project, say=say) \
        if any(channels_check.STUBBED_SET in i.sets for i in installed) else None
    results = [run_suite(s, project, mirror=mirror, aptopts=aptopts, env=env, keep=a.keep, installed=installed,
                         stubs=stubs, readme=not a.channels_only) for s in a.suites]
    for i in installed:
        say(f"{i.bundle}: the standard solve and install on this host took {i.seconds:.1f}s")
    for r in results:
        say(summary(r))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
