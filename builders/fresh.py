"""fresh: the README's first command on clean Debian roots, as a new user would type it (`nox -s fresh -- bookworm trixie`).

For each distribution (a Debian suite name):
1. mmdebstrap (Debian's own tool, run as root) makes a minbase root plus python3 and ca-certificates, nothing else,
   from the Debian archive of the host's apt sources (`$ONEBIT_DEBIAN_MIRROR` names another), in
   `.onebit/fresh/<suite>/root`;
2. the checkout is copied in (git's tracked files and the untracked ones it does not ignore: no `.onebit/`, no
   `.nox/`, no cache, no venv; nothing of the product);
3. the root's files are given to the sandbox's id range (sandbox.shift_ids), and inside the root (builders/roots/sandbox.py:
   the root itself as /, writable, with the host's network) it runs, as uid 0 of the root's own user namespace (root
   there, no one on the host: no device nodes, no modules, no sysctl, no host file but what is bound), the README's
   first command, then `1bit check` and one chat completion from the installed prefix;
4. it prints each step's result and time, one line per distribution, and removes the root (`--keep` keeps it; a
   root whose steps failed is kept for a look; its files then belong to the id range).

The channels step (`--channels DIR`, repeatable; `--channels-only` leaves out the checkout and the README's
command): the channels built OUTSIDE the roots are proven to install and start in them.
1. Each channel's bundles are installed once, on the host, before any root, with the standard solve
   (builders/ship/install.py `install_bundle`: py-rattler with only the virtual packages it detects, as pixi does; every
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

`--dry-run` (or ONEBIT_FRESH_DRY_RUN=1, how the release workflow's replay runs the job) prints the settings, the
mirror, each root's mmdebstrap command and the steps, and makes nothing. `--sudo` (a CI runner: passwordless sudo)
re-runs this command as root through `sudo -n`, keeping the environment-only settings above and nothing else.

Only the host's environment-only settings cross into the root, and each is named on the console: the apt mirror and
apt's own Acquire options (Check-Valid-Until, proxies) from the host's apt configuration, pip's environment (PIP_*)
and configuration files, the CA bundle variables, the proxy variables, DNS (/etc/resolv.conf). A host file such a
setting names is copied in at the same path; a folder is bound read-only at the same path unless the root has its own.
"""
from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .roots import debs, sandbox
from .io import elf, gitcmd, runner, treepath
from .errors import OnebitError

INCLUDE = ("python3", "ca-certificates")
INSIDE = "/src/onebit-build"  # where the checkout lands in the root
PREFIX = ".onebit/prefix/cpu"  # where the README's first command installs the CPU bundle
DEBIAN_SUITES = frozenset({"buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid", "oldoldstable",
                           "oldstable", "stable", "testing", "unstable", "experimental"})
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# the host's environment-only settings, by kind: exact names, and prefixes
CA_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
PROXY_VARS = tuple(n for v in ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy") for n in (v, v.upper()))
MIRROR_VARS = (debs.MIRROR_ENV,)
PIP_PREFIX = "PIP_"
# pip settings whose values may name host paths (a CA bundle, a wheel folder, a file: index)
PIP_PATH_KEYS = ("cert", "client-cert", "find-links", "index-url", "extra-index-url")
# the channels step
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
APT_KEYS = re.compile(r"^Acquire::(Check-Valid-Until|Check-Date|(https?|ftp)::Proxy(::[^ ]+)?|ForceIPv4|ForceIPv6) ")


# ---- pure decisions ------------------------------------------------------------------------------------------------
def readme_commands(text: str) -> list[str]:
    """Pure: the README's two commands, its first two lines without their `# ...` comments."""
    lines = text.splitlines()[:2]
    return [line.split("#", 1)[0].strip() for line in lines if line.strip()]


def debian_mirror(env: Mapping[str, str], sources: Sequence[tuple[str, tuple[str, ...]]]) -> str | None:
    """Pure: the Debian archive to make roots from: $ONEBIT_DEBIAN_MIRROR's first, else the first archive of the host's
    apt sources that serves a Debian suite (an Ubuntu host's archive does not)."""
    given = env.get(debs.MIRROR_ENV, "").split()
    if given:
        return given[0].rstrip("/")
    debian = [(uri, suites) for uri, suites in sources
              if any(s.split("-")[0].split("/")[0] in DEBIAN_SUITES for s in suites)]
    archives = debs.debian_archives(debian)
    return archives[0] if archives else None


def apt_options(dump: str) -> list[str]:
    """Pure: the host's apt options that are about reaching its archive (`apt-config dump` lines): whether an expired
    Release file is accepted, proxies; each as an apt.conf line for mmdebstrap's --aptopt, which also keeps them in
    the root for its own apt."""
    return [line.strip() for line in dump.splitlines() if APT_KEYS.match(line.strip())]


def passed_env(env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the host's environment-only variables that cross into the root (pip's, CA bundles, proxies, the Debian
    mirror), and nothing else (no ONEBIT_CACHE, no PATH, no VIRTUAL_ENV: nothing of the product)."""
    names = set(CA_VARS) | set(PROXY_VARS) | set(MIRROR_VARS)
    return {k: v for k, v in sorted(env.items()) if v and (k in names or k.startswith(PIP_PREFIX))}


def setting_kinds(env: Mapping[str, str]) -> dict[str, list[str]]:
    """Pure: the names of the passed variables, by kind (what the console says)."""
    out: dict[str, list[str]] = {"pip": [], "CA bundle": [], "proxy": [], "Debian mirror": []}
    for k in passed_env(env):
        kind = ("pip" if k.startswith(PIP_PREFIX) else "CA bundle" if k in CA_VARS else "proxy" if k in PROXY_VARS
                else "Debian mirror")
        out[kind].append(k)
    return out


def named_paths(values: Sequence[str]) -> list[str]:
    """Pure: the absolute host paths that settings' values name (whitespace-separated lists, file: URLs). A local
    package index (a PEP 503 `simple/` folder) links to its files relative to itself (`../files/...`), so its parent
    folder is named instead."""
    out: list[str] = []
    for value in values:
        for word in value.split():
            path = word[len("file://"):] if word.startswith("file://") else word[len("file:"):] \
                if word.startswith("file:") else word
            path = path.rstrip("/") or "/"
            if path.endswith("/simple"):
                path = path.rsplit("/", 1)[0] or "/"
            if path.startswith("/") and path not in out:
                out.append(path)
    return out


def pip_config_files(env: Mapping[str, str], home: str) -> list[tuple[str, str]]:
    """Pure: (host path, path in the root) of every file pip would read its configuration from, global and user
    (pip's own order); a user's file lands under the root's /root."""
    xdg = env.get("XDG_CONFIG_HOME") or f"{home}/.config"
    out = [("/etc/xdg/pip/pip.conf", "/etc/xdg/pip/pip.conf"), ("/etc/pip.conf", "/etc/pip.conf"),
           (f"{home}/.pip/pip.conf", "/root/.pip/pip.conf"), (f"{xdg}/pip/pip.conf", "/root/.config/pip/pip.conf")]
    if env.get("PIP_CONFIG_FILE") and env["PIP_CONFIG_FILE"] != os.devnull:
        out.append((env["PIP_CONFIG_FILE"], env["PIP_CONFIG_FILE"]))
    return out


def pip_config_values(text: str) -> list[str]:
    """Pure: the values of a pip configuration file's settings that may name host paths."""
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string(text)
    except configparser.Error:
        return []
    return [cp[s][k] for s in cp.sections() for k in PIP_PATH_KEYS if k in cp[s]]


@dataclass(frozen=True)
class Carry:
    copy: tuple[tuple[str, str], ...] = ()  # (host file, path in the root)
    bind: tuple[str, ...] = ()  # host folders bound read-only at the same path
    own: tuple[str, ...] = ()  # named folders the root has itself: the root's are used
    missing: tuple[str, ...] = ()  # named paths the host does not have


def carry(paths: Sequence[str], *, is_file: Callable[[str], bool], is_dir: Callable[[str], bool],
          in_root: Callable[[str], bool], configs: Sequence[tuple[str, str]] = ()) -> Carry:
    """Pure given the predicates: how each host path a setting names reaches the root. A file is copied (a CA bundle:
    the root's apt may rewrite its own, so it is no mount); a folder is bound read-only unless the root has one."""
    copy, bind, own, missing = [(h, r) for h, r in configs if is_file(h)], [], [], []
    for p in paths:
        if is_file(p):
            copy.append((p, p))
        elif is_dir(p):
            (own if in_root(p) else bind).append(p)
        else:
            missing.append(p)
    return Carry(tuple(dict.fromkeys(copy)), tuple(bind), tuple(own), tuple(missing))


def sudo_argv(env: Mapping[str, str], python: str, args: Sequence[str]) -> list[str]:
    """Pure: this command again, as root through passwordless sudo, keeping only the settings that cross into a root
    (sudo's own policy resets the rest, PATH included: hence the interpreter by its path)."""
    keep = ",".join(passed_env(env))
    return ["sudo", "-n", *([f"--preserve-env={keep}"] if keep else []), "--", python, "-m", "builders.fresh", *args]


def mmdebstrap_argv(suite: str, root: str, mirror: str, aptopts: Sequence[str]) -> list[str]:
    """Pure: Debian's own tool making the minbase root with python3 and ca-certificates (run as root)."""
    return ["mmdebstrap", "--mode=root", "--variant=minbase", f"--include={','.join(INCLUDE)}",
            *(f"--aptopt={o}" for o in aptopts), suite, root, mirror]


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
    channels: ChannelsRun | None = None

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
        parts.append(channels_summary(r.channels))
    if r.error:
        parts.append(r.error)
    return "  ".join(parts)


# ---- the channels step: pure decisions ------------------------------------------------------------------------------
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


# ---- effects -------------------------------------------------------------------------------------------------------
def checkout_files(root: Path) -> list[str]:
    """git's tracked files and the untracked ones it does not ignore (our own checkout, read through builders/gitcmd)."""
    out = gitcmd.run(["-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--deduplicate"],
                     text=False, check=True).stdout
    return [f for f in out.decode().split("\0") if f]


def copy_checkout(src: Path, dest: Path, say: Callable[[str], None] | None = None) -> int:
    """Copy git's files of the checkout at `src` (checkout_files) into `dest`, a folder this copy makes; returns how
    many entries it copied and says in one line which links it skipped.

    Links are copied as links, never followed: one that leads inside the checkout (resolved by its text,
    builders/io/treepath.py: a relative link, or a chain of them, that stays inside) is copied as written; one that leads
    out (absolute, climbing above the top, into a loop) is skipped. A path under a linked folder (a tracked folder
    replaced by a link) is left to that link: nothing is read or written through it. Every folder on the way is one
    this copy made, and each file is created anew (O_EXCL, O_NOFOLLOW), so no byte lands outside `dest`."""
    say = say or _say

    def readlink(rel: str) -> str | None:
        p = src / rel
        return os.readlink(p) if p.is_symlink() else None

    made: set[str] = set()

    def folder(rel: str) -> Path:
        """dest/rel, each missing folder on the way made; a folder that is not a real one (a link) is an error."""
        at = dest
        parts = [p for p in rel.split("/") if p]
        for i, part in enumerate(parts):
            at = at / part
            key = "/".join(parts[:i + 1])
            if key in made:
                continue
            try:
                os.mkdir(at, 0o755)
            except FileExistsError:
                if at.is_symlink() or not at.is_dir():
                    raise OSError(f"{at} is not a folder this copy made") from None
            made.add(key)
        return at

    dest.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():
        raise OSError(f"{dest} is a link")
    n = 0
    links: set[str] = set()
    skipped: dict[str, str] = {}
    for rel in checkout_files(src):
        parts = rel.split("/")
        link = next(("/".join(parts[:i]) for i in range(1, len(parts) + 1)
                     if (src / "/".join(parts[:i])).is_symlink()), None)
        if link is not None:  # the entry is a link, or lies under one: the link stands for it
            if link in links or link in skipped:
                continue
            target = os.readlink(src / link)
            if target.startswith("/") or treepath.resolve(link, readlink) is None:
                skipped[link] = target
                continue
            links.add(link)
            parent, _, name = link.rpartition("/")
            os.symlink(target, folder(parent) / name)
            n += 1
            continue
        s = src / rel
        st = os.lstat(s) if os.path.lexists(s) else None
        if st is None or not stat.S_ISREG(st.st_mode):  # deleted but still tracked, a submodule, a special file
            continue
        parent, _, name = rel.rpartition("/")
        fd = os.open(folder(parent) / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     stat.S_IMODE(st.st_mode))
        with open(fd, "wb") as out, open(s, "rb") as ins:
            shutil.copyfileobj(ins, out)
            os.fchmod(out.fileno(), stat.S_IMODE(st.st_mode))
            os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        n += 1
    if skipped:
        shown = sorted(skipped.items())
        say(f"skipped {len(shown)} link(s) of the checkout that lead out of it or loop (not copied): "
            + ", ".join(f"{k} -> {v}" for k, v in shown[:10]) + (f" and {len(shown) - 10} more" if len(shown) > 10 else ""))
    return n


def _say(msg: str) -> None:
    print(f"fresh: {msg}", flush=True)


@dataclass(frozen=True)
class Installed:
    bundle: str
    prefix: Path  # on the host, bound at the same path in each root
    sets: Mapping[str, tuple[str, ...]]  # the host sets its manifest declares, each with its SONAMEs
    seconds: float  # the standard solve and install


def install_channels(channels: Sequence[Path], project: Path) -> list[Installed]:
    """Each channel's bundles installed on the host with the standard solve (builders/ship/install.py), into PREFIXES."""
    from .ship.install import install_bundle

    dropped = sorted(k for k in os.environ if k.startswith("CONDA_OVERRIDE_"))
    for k in dropped:
        del os.environ[k]
    _say("the standard solve: only the virtual packages py-rattler detects on this host"
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
            _say(f"{bundle}: {len(records)} package(s) from {os.path.relpath(channel)} solved and installed in {seconds:.1f}s"
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
                 env: Mapping[str, str], ro: tuple[str, ...]) -> ChannelsRun:
    """The channels step in one root (the module's docstring, 3-5)."""
    t0 = time.monotonic()
    c = ChannelsRun()

    def check(i: Installed, what: str, penv: Mapping[str, str], missing: Sequence[str] = ()) -> tuple[str, bool]:
        rc, out = _in_root(root, [f"{i.prefix}/bin/1bit", "check"], env=penv, ro=binds + extra(penv), timeout=600)
        ok = rc is not None and check_ok(rc, out, missing)
        named = f"; names {', '.join(m for m in missing if m in out) or 'none'} of {len(missing)}" if missing else ""
        _say(f"{suite}: {i.bundle}: {what}: exit {rc}{named}: {'ok' if ok else 'FAILED'}")
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
        _say(f"{suite}: " + (f"a compiler is in the root: {', '.join(c.compiler)}" if c.compiler else
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
            _say(f"{suite}: host sets provided as a user would: apt-get install {' '.join(debs_)}; "
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
                _say(f"{suite}: {i.bundle}: {rel} {arg}: {'started' if prog.started else 'DID NOT START'}"
                     f" (exit {'-' if rc is None else rc}){': ' + note if note else ''}")
    finally:
        c.seconds = time.monotonic() - t0
    return c


def run_suite(suite: str, project: Path, *, mirror: str, aptopts: list[str], env: dict[str, str], keep: bool,
              installed: Sequence[Installed] = (), stubs: Path | None = None, readme: bool = True) -> Result:
    t0 = time.monotonic()
    result = Result(suite)
    work = project / ".onebit" / "fresh" / suite
    root = work / "root"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        _say(f"{suite}: mmdebstrap minbase + {', '.join(INCLUDE)}")
        made = subprocess.run(mmdebstrap_argv(suite, str(root), mirror, aptopts))
        if made.returncode != 0:
            result.error = f"mmdebstrap failed (exit {made.returncode})"
            return result
        c = Carry()
        if readme:
            n = copy_checkout(project, root / INSIDE.lstrip("/"))
            _say(f"{suite}: copied {n} files of the checkout to {INSIDE}")
            home = os.path.expanduser("~")
            configs = pip_config_files(os.environ, home)
            values = list(env.values()) + [v for h, _ in configs if os.path.isfile(h)
                                           for v in pip_config_values(Path(h).read_text(errors="replace"))]
            c = carry(named_paths(values), is_file=os.path.isfile, is_dir=os.path.isdir,
                      in_root=lambda p: (root / p.lstrip("/")).is_dir(), configs=configs)
            for host, inside in c.copy:
                target = root / inside.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(host, target)
            _say(f"{suite}: host files copied in: {', '.join(h for h, _ in c.copy) or 'none'}; folders bound read-only: "
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
        _say(f"{suite}: {moved} files of the root given to the ids {sandbox.ID_BASE}-"
             f"{sandbox.ID_BASE + sandbox.ID_COUNT - 1}: its root is no one on the host")
        sb_env = {"PATH": PATH, "LANG": "C.UTF-8", **env}
        for step in steps(readme_commands((project / "README.md").read_text())[0]) if readme else ():
            result.steps.append(step)
            _say(f"{suite}: {step.command}")
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
            result.channels = run_channels(suite, root, installed, stubs=stubs, env=env, ro=ro)
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


def channel_problem(name: str, listing: Sequence[str] | None) -> str | None:
    """Pure: why a --channels argument is no channel to install from (`listing`: its linux-64 folder's names, None
    when it has none), or None."""
    if listing is None or "repodata.json" not in listing:
        return f"--channels {name}: not a conda channel (no linux-64/repodata.json)"
    if not bundles_in(listing):
        return f"--channels {name}: holds no bundle (no linux-64/onebit-bundle-*.conda)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        a = parse_args(sys.argv[1:] if argv is None else argv)
        for ch in a.channels:
            sub = Path(ch) / "linux-64"
            why = channel_problem(ch, sorted(os.listdir(sub)) if sub.is_dir() else None)
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
    mirror = debian_mirror(os.environ, debs.host_sources())
    if mirror is None:
        print(f"fresh: no Debian archive in this host's apt sources: set {debs.MIRROR_ENV} to one", file=sys.stderr)
        return 2
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True).stdout \
        if shutil.which("apt-config") else ""
    aptopts = apt_options(dump)
    env = passed_env(os.environ)
    kinds = setting_kinds(os.environ)
    _say("the host's environment-only settings passed through (names; values as on the host):")
    _say(f"  apt: the mirror ({'$' + debs.MIRROR_ENV if os.environ.get(debs.MIRROR_ENV) else 'the host apt sources'})"
         + "".join(f", {o.split(' ', 1)[0]}" for o in aptopts))
    for kind, names in kinds.items():
        _say(f"  {kind}: {', '.join(names) or 'none'}")
    configs = [h for h, _ in pip_config_files(os.environ, os.path.expanduser("~")) if os.path.isfile(h)]
    _say(f"  pip configuration files: {', '.join(configs) or 'none'}")
    _say("  DNS: /etc/resolv.conf")
    if dry:
        first = readme_commands((project / "README.md").read_text())[0]
        for ch in channels:
            for bundle in bundles_in(sorted(os.listdir(ch / "linux-64"))):
                _say(f"would install onebit-bundle-{bundle} from {os.path.relpath(ch)} with the standard solve into "
                     f"{PREFIXES}/{bundle}")
        for suite in a.suites:
            root = str(project / ".onebit" / "fresh" / suite / "root")
            _say(f"{suite}: would run {' '.join(mmdebstrap_argv(suite, root, mirror, aptopts))}")
            for step in steps(first) if not a.channels_only else ():
                _say(f"{suite}: would run, as root in the root at {INSIDE}: {step.command}")
            if channels:
                _say(f"{suite}: would check the root holds no compiler, provide the declared host sets, run `1bit "
                     f"check` and start every program of each prefix with {' or '.join(PROGRAM_ARGS)}")
        return 0
    try:
        installed = install_channels(channels, project) if channels else []
    except OnebitError as exc:
        print(f"fresh: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:  # a prefix without a readable manifest
        print(f"fresh: an installed bundle has no readable {MANIFEST}: {exc}", file=sys.stderr)
        return 1
    stubs = None
    if any(STUBBED_SET in i.sets for i in installed):
        stubs = project / STUBS
        _say(f"the {STUBBED_SET} stand-ins: scripts/rocm_stubs.py {STUBS}")
        made = runner.run([sys.executable, str(project / "scripts" / "rocm_stubs.py"), str(stubs)], timeout=3600,
                          stdout=None, stderr=None)
        if made.returncode != 0:
            _say(f"scripts/rocm_stubs.py failed (exit {made.returncode}): the ROCm programs run without stand-ins")
            stubs = None
    results = [run_suite(s, project, mirror=mirror, aptopts=aptopts, env=env, keep=a.keep, installed=installed,
                         stubs=stubs, readme=not a.channels_only) for s in a.suites]
    for i in installed:
        _say(f"{i.bundle}: the standard solve and install on this host took {i.seconds:.1f}s")
    for r in results:
        _say(summary(r))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
