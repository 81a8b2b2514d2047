"""sandbox: the one way to run a command isolated from the host (bubblewrap, Debian's `bubblewrap` package).

Used for everything that evaluates or builds content we do not trust or do not want the host to leak into:
the pin bot's `make -n` drift check on an upstream commit, and builds inside a pinned build root.

A `Sandbox` says what the command may see; `argv()` (pure) turns it into a bwrap command line:
- its own user, PID, IPC, UTS, cgroup, mount and (unless `network`) network namespaces; `--die-with-parent`;
- a new /proc (only its own processes: no ancestor's environ, cwd or fds), a minimal /dev, a private tmpfs /tmp
  and HOME; the environment is exactly `env` (nothing inherited);
- the file system is a root: the host's (`root=None`: /usr and /etc read-only, the usr-merge links as the host
  has them) or an assembled build root (`root=DIR`: DIR's usr/ and etc/ read-only); nothing else of the host,
  except `ro` paths (read-only) and `rw` paths (read-write), each bound at its own path, and `hide` directories
  inside them covered by an empty tmpfs;
- `root_rw=True` (with `root=DIR`) makes DIR itself the whole file system, writable: a complete system (a fresh
  Debian root made by mmdebstrap) whose /var, /root and /etc are its own, with its own package manager; /proc, /dev
  and a private /tmp (mode 1777) are still the sandbox's;
- `uid=0` runs the command as root inside: on a host where we are root, as the host's root with every capability
  but no user namespace (apt and dpkg need more than one uid: the _apt user, files of other owners); elsewhere as
  uid 0 of its own user namespace, where only that one uid exists. The default is nobody (65534), and the defaults
  give exactly the command line this module always gave (the API is backward compatible);
- `host_etc` (with `root=DIR`) shows these files of the host's /etc (resolved) at the same place over the root's own
  etc, which is then laid out entry by entry on a tmpfs: a root has no resolver configuration or CA bundle of its own,
  and a step that has the network (the crates step's `cargo vendor`) needs the host's.

`why_unavailable()` probes once whether this host can make such a sandbox; a caller that needs one refuses (one line
naming what to install) instead of running unsandboxed.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BWRAP = "bwrap"
INSIDE_UID = 65534  # nobody: the command runs as no user of the host, in its own user namespace
HOME = "/home/sandbox"
_USRMERGE = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class Sandbox:
    env: Mapping[str, str] = field(default_factory=dict)  # the whole environment inside
    cwd: str | None = None
    root: str | None = None  # an assembled build root; None: the host's /usr and /etc, read-only
    ro: tuple[str, ...] = ()  # host paths bound read-only at the same path
    rw: tuple[str, ...] = ()  # host paths bound read-write at the same path
    hide: tuple[str, ...] = ()  # directories inside ro/rw paths covered by an empty tmpfs (e.g. a checkout's .git)
    network: bool = False
    uid: int = INSIDE_UID  # who runs the command inside; 0: root (see the module's docstring)
    root_rw: bool = False  # with root: the root itself is /, writable
    memory: int | None = None  # bytes of address space (RLIMIT_AS), None: unbounded
    timeout: float | None = None  # seconds, enforced by run()
    host_etc: tuple[str, ...] = ()  # with root: host /etc files (relative names) shown over the root's etc


def _top_level(root: Path, name: str) -> list[str]:
    """bwrap arguments for /<name> as it is in `root` (a link kept as a link, a directory bound read-only)."""
    p = root / name
    if p.is_symlink():
        return ["--symlink", os.readlink(p), f"/{name}"]
    if p.is_dir():
        return ["--ro-bind", str(p), f"/{name}"]
    return []


def argv(sb: Sandbox, command: Sequence[str], *, bwrap: str = BWRAP,
         links: Mapping[str, str] | None = None) -> list[str]:
    """Pure apart from reading the root's top-level links: the bwrap command line running `command` in `sb`.

    links: the root's top-level links (name -> target) when the caller knows them, so nothing is read: a plan
    made before its build root is assembled prints the exact command (roots.TOP_LINKS); the root's etc/ is then
    taken to exist."""
    if sb.root_rw and not sb.root:
        raise ValueError("root_rw needs a root (root=DIR)")
    base = Path(sb.root) if sb.root else Path("/")
    if sb.uid == 0 and host_euid() == 0:  # the host's root, all capabilities, no user namespace
        out = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
               "--new-session", "--clearenv", "--cap-add", "ALL"]
        if not sb.network:
            out.append("--unshare-net")
    else:
        out = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
               "--unshare-user", "--uid", str(sb.uid), "--gid", str(sb.uid)]
        if sb.network:
            out.append("--share-net")
    home = "/root" if sb.uid == 0 and sb.root_rw else HOME
    if sb.root_rw:
        out += ["--bind", str(base), "/", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    else:
        out += ["--ro-bind", str(base / "usr"), "/usr"]
        if links is not None:
            for name, target in links.items():
                out += ["--symlink", target, f"/{name}"]
        else:
            for name in _USRMERGE:
                out += _top_level(base, name)
        if sb.host_etc and sb.root:
            out += _etc_with_host_files(base / "etc", sb.host_etc)
        elif links is not None or (base / "etc").is_dir():
            out += ["--ro-bind", str(base / "etc"), "/etc"]
        out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home", "--dir", HOME,
                "--tmpfs", "/var", "--dir", "/var/tmp"]
    for p in sb.ro:
        out += ["--ro-bind", p, p]
    for p in sb.rw:
        out += ["--bind", p, p]
    for p in sb.hide:
        out += ["--tmpfs", p]
    env = {"HOME": home, "TMPDIR": "/tmp", **sb.env}
    for k, v in sorted(env.items()):
        out += ["--setenv", k, v]
    if sb.cwd:
        out += ["--chdir", sb.cwd]
    return out + ["--", *command]


def _etc_with_host_files(etc: Path, names: Sequence[str]) -> list[str]:
    """bwrap arguments for /etc as the root's etc entry by entry on a tmpfs, with `names` (paths relative to /etc)
    taken from the host's /etc instead; a host file that does not exist is left out."""
    tops = {n.split("/", 1)[0] for n in names}
    out = ["--tmpfs", "/etc"]
    for entry in sorted(os.listdir(etc)) if etc.is_dir() else ():
        if entry in tops:
            continue
        p = etc / entry
        out += ["--symlink", os.readlink(p), f"/etc/{entry}"] if p.is_symlink() else ["--ro-bind", str(p), f"/etc/{entry}"]
    for name in names:
        src = os.path.realpath(os.path.join("/etc", name))
        if os.path.isfile(src):
            out += ["--ro-bind", src, f"/etc/{name}"]
    out += ["--remount-ro", "/etc"]
    return out


def host_euid() -> int:
    return os.geteuid()


@functools.lru_cache(maxsize=None)
def why_unavailable(bwrap: str = BWRAP) -> str | None:
    """None when this host can make the sandbox; else one line saying why and what to install."""
    exe = shutil.which(bwrap)
    if exe is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        proc = subprocess.run(argv(Sandbox(), ["/bin/sh", "-c", "exit 0"], bwrap=exe), capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"this host refuses the namespaces bwrap needs ({why}); allow unprivileged user namespaces or run as root"
    return None


def _limits(memory: int | None):
    def apply() -> None:
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return apply


def popen(sb: Sandbox, command: Sequence[str], **kwargs) -> subprocess.Popen:
    """Start `command` in the sandbox (its own session: run() kills the whole group on timeout)."""
    return subprocess.Popen(argv(sb, command), env={"PATH": os.defpath}, preexec_fn=_limits(sb.memory),
                            start_new_session=True, **kwargs)


def run(sb: Sandbox, command: Sequence[str], *, input: str | None = None) -> subprocess.CompletedProcess:
    """Run `command` in the sandbox, capturing text output; on timeout the process group is killed and
    subprocess.TimeoutExpired raised."""
    proc = popen(sb, command, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    try:
        out, err = proc.communicate(input, timeout=sb.timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def probe_net_cut() -> tuple[str, ...]:
    """The argv prefix that runs a host command in a new, empty network namespace (the host root's network cut,
    builders/root.py), or () where the host forbids it: as root, `unshare --net`; elsewhere with the caller mapped to
    root of its own user namespace."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    for prefix in (("unshare", "--net", "--"), ("unshare", "--net", "--map-root-user", "--")):
        try:
            proc = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return prefix
    return ()
