"""channels_check: the channels step of `nox -s fresh` (`--channels DIR`, repeatable; `--channels-only` leaves out the
checkout and the README's command): the channels built OUTSIDE the clean roots are proven to install and start in them.

1. Each channel's bundles are installed once, on the host, before any root, with the standard solve
   (install.py `install_bundle`: py-rattler with only the virtual packages it detects, as pixi does; every
   CONDA_OVERRIDE_* is dropped and named first) into `.onebit/fresh/prefix/<bundle>`. The install runs on the host
   because a minbase root has no solver (py-rattler would have to be fetched into it, and the root would no longer
   be clean), and the solve takes the host's glibc: the packages declare only the floor's `__glibc >=2.34`, below
   every suite these roots are made of;
2. in each root the prefix is bound read-only at the same path: conda's install writes the prefix's absolute path
   into what it links (entry points, prefix placeholders), so only that path is the installed bundle, and
   read-only keeps the runs from changing what was installed;
3. the root is shown to hold no C compiler and no OpenMP runtime (no cc, no gcc, no libgomp1: nothing a program
   could have picked up from a build machine), again after the host sets below are installed;
4. a prefix that declares the `rocm7` host set (its manifest's `host_libraries`) runs `1bit check` as installed, and
   it must name every missing SONAME (onebit/hostlibs.py); then each declared host set is provided as a user would:
   `vulkan` by Debian's libvulkan1 and a driver, mesa-vulkan-drivers (lavapipe is the device without a GPU), from
   the root's own apt; `rocm7` by stand-ins (scripts/rocm_stubs.py, generated on the host from the pinned strix-sid
   root's real libraries: the one place a stand-in is allowed), bound read-only and named by LD_LIBRARY_PATH for that
   prefix's runs only; then `1bit check` of every prefix;
5. every program of each prefix (each ELF executable with an interpreter under bin/ and libexec/) runs with
   `--version`, then `--help` if that is refused, with a timeout, the network cut: it started when the loader
   resolved everything (no exit 127, no "error while loading shared libraries"; one still running at the timeout
   had started);
6. one line per suite: programs started/total, checks ok, time.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..io import elf, runner
from ..roots import sandbox
from ..roots.clean import PATH

PREFIXES = ".onebit/fresh/prefix"  # where each channel's bundle is installed on the host (bound at the same path)
STUBS = ".onebit/fresh/rocm-stubs"  # scripts/rocm_stubs.py's stand-ins for the host's ROCm 7
MANIFEST = "share/onebit/manifest.json"
PROGRAM_DIRS = ("bin", "libexec")
PROGRAM_ARGS = ("--version", "--help")  # the first one a program accepts (exit 0) is its line's
PROGRAM_TIMEOUT = 30.0
LOADER_ERROR = "error while loading shared libraries"
# what a Debian user installs for a host set: the Vulkan loader floor.yaml names, and a driver (Mesa's: lavapipe is
# the device of a machine without a GPU, chosen as build-vulkan does)
HOST_SET_DEBS = {"vulkan": ("libvulkan1", "mesa-vulkan-drivers")}
PROGRAM_ENV = {"GGML_VK_VISIBLE_DEVICES": "0"}
STUBBED_SET = "rocm7"  # the host set only stand-ins can provide here (no AMD GPU, no ROCm)
COMPILER_PATHS = ("usr/bin/cc", "usr/bin/gcc", "usr/local/bin/cc", "usr/local/bin/gcc")
COMPILER_PACKAGES = re.compile(r"^(gcc(-\d+)?|cpp(-\d+)?|libgomp1)$")


def bundles_in(names: Sequence[str]) -> list[str]:
    """Pure: the bundles a channel's linux-64 folder holds, from its file names
    (onebit-bundle-<bundle>-<version>-<build>.conda)."""
    out = [n.removesuffix(".conda").rsplit("-", 2)[0].removeprefix("onebit-bundle-") for n in names
           if n.startswith("onebit-bundle-") and n.endswith(".conda") and n.count("-") >= 4]
    return sorted(set(out))


def installed_packages(status: str) -> set[str]:
    """Pure: the installed packages of a dpkg status file."""
    out = set()
    for para in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out.add(fields["Package"])
    return out


def compiler_found(installed: Collection[str], present: Collection[str]) -> list[str]:
    """Pure: what of a C compiler or its OpenMP runtime a root holds (empty: none): cc or gcc on its PATH, a gcc, cpp
    or libgomp1 package."""
    return sorted(present) + sorted(p for p in installed if COMPILER_PACKAGES.match(p))


def started(rc: int | None, output: str) -> bool:
    """Pure: did a program start, i.e. did the loader resolve everything? Not when the loader says so (exit 127,
    "error while loading shared libraries") or the sandbox could not even execute it; a program still running at the
    timeout (rc None) had started."""
    if rc is None:
        return True
    return rc != 127 and LOADER_ERROR not in output and "bwrap: execvp" not in output


def next_arg(tried: Sequence[tuple[str, int | None, str]]) -> str | None:
    """Pure: the argument to try next after (arg, rc, output) runs: none once one was accepted (exit 0), one timed
    out, or the loader refused the program; else the next of PROGRAM_ARGS."""
    if tried and (tried[-1][1] in (0, None) or not started(tried[-1][1], tried[-1][2])):
        return None
    return PROGRAM_ARGS[len(tried)] if len(tried) < len(PROGRAM_ARGS) else None


def host_sets(manifest: Mapping) -> dict[str, tuple[str, ...]]:
    """Pure: the host sets a prefix's manifest declares (its backends' host_libraries), in order, each with its
    SONAMEs (each once)."""
    out: dict[str, dict[str, None]] = {}
    for b in manifest.get("backends", {}).values():
        for h in b.get("host_libraries", ()):
            out.setdefault(h["set"], {})[h["soname"]] = None
    return {name: tuple(sonames) for name, sonames in out.items()}


def check_ok(rc: int, output: str, missing: Sequence[str]) -> bool:
    """Pure: `1bit check` did its job: exit 0 where nothing is missing; where SONAMEs are missing (the host set no one
    provided), it names every one of them, whatever it exits with."""
    return all(m in output for m in missing) if missing else rc == 0


@dataclass
class Program:
    path: str  # relative to the prefix
    arg: str = ""
    rc: int | None = None
    started: bool = False
    note: str = ""  # the loader's line, or "timed out"


@dataclass
class PrefixRun:
    bundle: str
    programs: list[Program] = field(default_factory=list)
    checks: list[tuple[str, bool]] = field(default_factory=list)  # (what was checked, ok)


@dataclass
class ChannelsRun:
    compiler: list[str] = field(default_factory=list)  # what of a compiler the root held (empty: none)
    provided: list[str] = field(default_factory=list)  # how declared host sets were provided
    prefixes: list[PrefixRun] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.error is None and not self.compiler and bool(self.prefixes)
                and all(p.started for r in self.prefixes for p in r.programs) and all(ok for r in self.prefixes
                                                                                       for _, ok in r.checks))


def channels_summary(c: ChannelsRun) -> str:
    """Pure: the channels step's part of a suite's line."""
    progs = [p for r in c.prefixes for p in r.programs]
    checks = [ok for r in c.prefixes for _, ok in r.checks]
    parts = [f"channels {'ok' if c.ok else 'FAILED'} {c.seconds:.1f}s",
             "no cc/gcc/libgomp1" if not c.compiler else f"compiler present: {', '.join(c.compiler)}",
             f"programs {sum(p.started for p in progs)}/{len(progs)} started",
             f"checks {sum(checks)}/{len(checks)} ok",
             "(" + ", ".join(f"{r.bundle} {sum(p.started for p in r.programs)}/{len(r.programs)}"
                             for r in c.prefixes) + ")"]
    if c.error:
        parts.append(c.error)
    return "  ".join(parts)


def channel_problem(name: str, listing: Sequence[str] | None) -> str | None:
    """Pure: why a --channels argument is no channel to install from (`listing`: its linux-64 folder's names, None
    when it has none), or None."""
    if listing is None or "repodata.json" not in listing:
        return f"--channels {name}: not a conda channel (no linux-64/repodata.json)"
    if not bundles_in(listing):
        return f"--channels {name}: holds no bundle (no linux-64/onebit-bundle-*.conda)"
    return None


@dataclass(frozen=True)
class Installed:
    bundle: str
    prefix: Path  # on the host, bound at the same path in each root
    sets: Mapping[str, tuple[str, ...]]  # the host sets its manifest declares, each with its SONAMEs
    seconds: float  # the standard solve and install


def install_channels(channels: Sequence[Path], project: Path, *, say: Callable[[str], None]) -> list[Installed]:
    """Each channel's bundles installed on the host with the standard solve (builders/ship/install.py), into PREFIXES."""
    from .install import install_bundle

    dropped = sorted(k for k in os.environ if k.startswith("CONDA_OVERRIDE_"))
    for k in dropped:
        del os.environ[k]
    say("the standard solve: only the virtual packages py-rattler detects on this host"
        + (f" ({', '.join(dropped)} dropped)" if dropped else " (no CONDA_OVERRIDE_* set)"))
    out = []
    for channel in channels:
        for bundle in bundles_in(sorted(os.listdir(channel / "linux-64"))):
            prefix = project / PREFIXES / bundle
            if prefix.exists():
                shutil.rmtree(prefix)
            t0 = time.monotonic()
            records = install_bundle(channel, prefix, bundle)
            seconds = time.monotonic() - t0
            doc = json.loads((prefix / MANIFEST).read_text())
            out.append(Installed(bundle, prefix, host_sets(doc), seconds))
            say(f"{bundle}: {len(records)} package(s) from {os.path.relpath(channel)} solved and installed in {seconds:.1f}s"
                f" (host sets: {', '.join(out[-1].sets) or 'none'})")
    return out


def programs_of(prefix: Path) -> list[str]:
    """The programs of a prefix: each executable ELF file with an interpreter (not a shared library, not a module)
    under bin/ and libexec/, relative to the prefix, sorted (builders/io/elf.py reads them)."""
    out = []
    for top in PROGRAM_DIRS:
        for dirpath, _, files in os.walk(prefix / top):
            for name in files:
                path = Path(dirpath) / name
                if path.is_symlink() or not os.access(path, os.X_OK) or not elf.is_elf(path):
                    continue
                if elf.read(path).interpreter:
                    out.append(path.relative_to(prefix).as_posix())
    return sorted(out)


def _in_root(root: Path, command: Sequence[str], *, env: Mapping[str, str], ro: tuple[str, ...] = (),
             network: bool = False, timeout: float | None = None) -> tuple[int | None, str]:
    """(exit status or None at the timeout, stdout and stderr) of `command` as root in the root."""
    sb = sandbox.Sandbox(env={"PATH": PATH, "LANG": "C.UTF-8", **env}, cwd="/", root=str(root), root_rw=True, uid=0,
                         network=network, ro=ro, timeout=timeout)
    try:
        proc = sandbox.run(sb, list(command))
    except runner.TimedOut as exc:
        return None, f"{exc.stdout or ''}{exc.stderr or ''}"
    return proc.returncode, proc.stdout + proc.stderr


def run_channels(suite: str, root: Path, installed: Sequence[Installed], *, stubs: Path | None,
                 env: Mapping[str, str], ro: tuple[str, ...], say: Callable[[str], None]) -> ChannelsRun:
    """The channels step in one root (the module's docstring, 3-5)."""
    t0 = time.monotonic()
    c = ChannelsRun()

    def check(i: Installed, what: str, penv: Mapping[str, str], missing: Sequence[str] = ()) -> tuple[str, bool]:
        rc, out = _in_root(root, [f"{i.prefix}/bin/1bit", "check"], env=penv, ro=binds + extra(penv), timeout=600)
        ok = rc is not None and check_ok(rc, out, missing)
        named = f"; names {', '.join(m for m in missing if m in out) or 'none'} of {len(missing)}" if missing else ""
        say(f"{suite}: {i.bundle}: {what}: exit {rc}{named}: {'ok' if ok else 'FAILED'}")
        print(out.rstrip(), flush=True)
        return what, ok

    def extra(penv: Mapping[str, str]) -> tuple[str, ...]:
        return (str(stubs),) if stubs is not None and "LD_LIBRARY_PATH" in penv else ()

    def compiler() -> list[str]:
        status = root / "var/lib/dpkg/status"
        return compiler_found(installed_packages(status.read_text() if status.is_file() else ""),
                              [p for p in COMPILER_PATHS if os.path.lexists(root / p)])

    binds = ro + tuple(str(i.prefix) for i in installed)
    try:
        c.compiler = compiler()
        say(f"{suite}: " + (f"a compiler is in the root: {', '.join(c.compiler)}" if c.compiler else
                            "no cc, no gcc, no libgomp1 in the root"))
        c.prefixes = [PrefixRun(i.bundle) for i in installed]
        for i, pr in zip(installed, c.prefixes):  # the ROCm prefix first as installed: its check names what lacks
            missing = i.sets.get(STUBBED_SET, ())
            if missing:
                pr.checks.append(check(i, f"1bit check without the {STUBBED_SET} stand-ins", env, missing))
        debs_ = sorted({d for i in installed for x in i.sets for d in HOST_SET_DEBS.get(x, ())})
        if debs_:
            rc, out = _in_root(root, ["/bin/sh", "-c", "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get "
                                      f"install -y -q --no-install-recommends {' '.join(debs_)}"],
                               env=env, ro=ro, network=True, timeout=900)
            if rc != 0:
                print(out.rstrip(), flush=True)
                c.error = f"apt-get install {' '.join(debs_)} failed (exit {rc})"
                return c
            c.provided.append(f"apt-get install {' '.join(debs_)}")
            brought = [f"{x} (with {' '.join(debs_)})" for x in compiler() if x not in c.compiler]
            c.compiler += brought
            say(f"{suite}: host sets provided as a user would: apt-get install {' '.join(debs_)}; "
                + (f"it brought {', '.join(brought)}" if brought else "still no cc, gcc or libgomp1"))
        for i, pr in zip(installed, c.prefixes):
            penv = {**env, **PROGRAM_ENV}
            if STUBBED_SET in i.sets and stubs is not None:
                penv["LD_LIBRARY_PATH"] = str(stubs)
            pr.checks.append(check(i, "1bit check" + (f" with the {STUBBED_SET} stand-ins" if extra(penv) else ""),
                                   penv))
            for rel in programs_of(i.prefix):
                tried: list[tuple[str, int | None, str]] = []
                while (arg := next_arg(tried)) is not None:
                    rc, out = _in_root(root, [f"{i.prefix}/{rel}", arg], env=penv, ro=binds + extra(penv),
                                       timeout=PROGRAM_TIMEOUT)
                    tried.append((arg, rc, out))
                arg, rc, out = next((t for t in tried if t[1] in (0, None)), tried[-1])
                note = "timed out" if rc is None else next(
                    (ln.strip() for ln in out.splitlines() if LOADER_ERROR in ln or "bwrap: execvp" in ln), "")
                prog = Program(rel, arg, rc, started(rc, out), note)
                pr.programs.append(prog)
                say(f"{suite}: {i.bundle}: {rel} {arg}: {'started' if prog.started else 'DID NOT START'}"
                    f" (exit {'-' if rc is None else rc}){': ' + note if note else ''}")
    finally:
        c.seconds = time.monotonic() - t0
    return c


def make_stubs(project: Path, *, say: Callable[[str], None]) -> Path | None:
    """scripts/rocm_stubs.py's stand-ins for the host's ROCm 7, generated on the host into STUBS; None when that fails
    (the ROCm programs then run without stand-ins)."""
    stubs = project / STUBS
    say(f"the {STUBBED_SET} stand-ins: scripts/rocm_stubs.py {STUBS}")
    made = runner.run([sys.executable, str(project / "scripts" / "rocm_stubs.py"), str(stubs)], timeout=3600,
                      stdout=None, stderr=None)
    if made.returncode != 0:
        say(f"scripts/rocm_stubs.py failed (exit {made.returncode}): the ROCm programs run without stand-ins")
        return None
    return stubs
