"""fresh: the README's first command on clean Debian roots, as a new user would type it (`nox -s fresh -- bookworm trixie`).

For each distribution (a Debian suite name):
1. mmdebstrap (Debian's own tool, run as root) makes a minbase root plus python3 and ca-certificates, nothing else,
   from the Debian archive of the host's apt sources (`$ONEBIT_DEBIAN_MIRROR` names another), in
   `.onebit/fresh/<suite>/root`;
2. the checkout is copied in (git's tracked files and the untracked ones it does not ignore: no `.onebit/`, no
   `.nox/`, no cache, no venv; nothing of the product);
3. the root's files are given to the sandbox's id range (sandbox.shift_ids), and inside the root (builders/sandbox.py:
   the root itself as /, writable, with the host's network) it runs, as uid 0 of the root's own user namespace (root
   there, no one on the host: no device nodes, no modules, no sysctl, no host file but what is bound), the README's
   first command, then `1bit check` and one chat completion from the installed prefix;
4. it prints each step's result and time, one line per distribution, and removes the root (`--keep` keeps it; a
   root whose steps failed is kept for a look; its files then belong to the id range).

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
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import debs, gitcmd, sandbox, treepath

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

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.steps) and all(s.rc == 0 for s in self.steps)


def steps(readme_first: str) -> list[Step]:
    """Pure: what runs inside the root, in order: the README's first command, `1bit check`, one chat completion (the
    build session's own environment has the smoke script's requirements; `1bit serve` runs on the root's python3)."""
    return [Step("readme", readme_first), Step("check", f"{PREFIX}/bin/1bit check"),
            Step("chat", f".nox/build-cpu/bin/python scripts/serve_smoke.py {PREFIX}")]


def summary(r: Result) -> str:
    """Pure: one line per distribution."""
    def mmss(s: float) -> str:
        return f"{int(s) // 60}m{int(s) % 60:02d}s"
    parts = [f"{r.suite:<10} {'ok' if r.ok else 'FAILED':<6} total {mmss(r.seconds)}"]
    parts += [f"{s.name} {'ok' if s.rc == 0 else 'not run' if s.rc is None else f'rc={s.rc}'} {mmss(s.seconds)}"
              for s in r.steps]
    if r.error:
        parts.append(r.error)
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
    builders/treepath.py: a relative link, or a chain of them, that stays inside) is copied as written; one that leads
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


def run_suite(suite: str, project: Path, *, mirror: str, aptopts: list[str], env: dict[str, str], keep: bool) -> Result:
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
        hidden = [p for p in ro if not sandbox.reachable(p)]
        if hidden:
            result.error = (f"{', '.join(hidden)} cannot be shown in the root: the root's sandbox is set up as an "
                            "unprivileged id, which cannot read it (make it readable by others, or name a copy)")
            return result
        moved = sandbox.shift_ids(root)
        _say(f"{suite}: {moved} files of the root given to the ids {sandbox.ID_BASE}-"
             f"{sandbox.ID_BASE + sandbox.ID_COUNT - 1}: its root is no one on the host")
        sb_env = {"PATH": PATH, "LANG": "C.UTF-8", **env}
        for step in steps(readme_commands((project / "README.md").read_text())[0]):
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
        return result
    finally:
        result.seconds = time.monotonic() - t0
        if not keep and result.ok:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nox -s fresh --", description=__doc__.split("\n\n")[0])
    ap.add_argument("suites", nargs="*", default=["bookworm", "trixie"], help="Debian suites (default: bookworm trixie)")
    ap.add_argument("--keep", action="store_true", help="keep each root under .onebit/fresh/<suite>/root")
    ap.add_argument("--dry-run", action="store_true", help="print what would run (also ONEBIT_FRESH_DRY_RUN=1)")
    ap.add_argument("--sudo", action="store_true", help="not root: re-run as root with `sudo -n`, keeping the settings")
    a = ap.parse_args(argv)
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
        for suite in a.suites:
            root = str(project / ".onebit" / "fresh" / suite / "root")
            _say(f"{suite}: would run {' '.join(mmdebstrap_argv(suite, root, mirror, aptopts))}")
            for step in steps(first):
                _say(f"{suite}: would run, as root in the root at {INSIDE}: {step.command}")
        return 0
    results = [run_suite(s, project, mirror=mirror, aptopts=aptopts, env=env, keep=a.keep) for s in a.suites]
    for r in results:
        _say(summary(r))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
