"""sandbox: the one way to run a command isolated from the host (bubblewrap, Debian's `bubblewrap` package).

Used for everything that evaluates or builds content we do not trust or do not want the host to leak into:
the pin bot's evaluation and `make -n` drift check on an upstream commit, builds and tool probes inside a pinned
build root, the crates step's `cargo vendor`, ldconfig inside an assembled root, and `nox -s fresh`'s clean roots.

A `Sandbox` says what the command may see; `argv()` turns it into a bwrap command line:
- its own user, PID, IPC, UTS, cgroup, mount and (unless `network`) network namespaces; `--die-with-parent`;
- a new /proc (only its own processes: no ancestor's environ, cwd or fds) whose /proc/sys is read-only and whose
  files the host keeps from unprivileged users (kmsg, kpageflags, timer_list, slabinfo, a 0600 sysctl like
  tcp_fastopen_key, ...) are covered; a minimal /dev, a private tmpfs /tmp and HOME; the environment is exactly
  `env` (nothing inherited);
- the file system is a root: the host's (`root=None`: /usr read-only, the usr-merge links as the host has them) or
  an assembled build root (`root=DIR`: DIR's usr/ and etc/ read-only); nothing else of the host, except `ro` paths
  (read-only) and `rw` paths (read-write), each bound at its own path, and `hide` directories inside them covered by
  an empty tmpfs;
- /etc: with the host's root, never the host's /etc but a read-only tmpfs holding only HOST_ETC (the resolver, the
  CA bundles, the loader's cache and configuration, the alternatives a compile calls cc and c++ through, os-release,
  the time zone), each only where an unprivileged user could read it, and a passwd/group made for the sandbox
  (root and nobody); with a build root, the root's own etc; `host_etc` (with `root=DIR`) lays the root's etc out
  entry by entry on a tmpfs and shows the named host files over it (a root has no resolver configuration or CA
  bundle of its own, and a step that has the network, the crates step's `cargo vendor`, needs the host's);
- the command runs as nobody (65534) of its own user namespace. When the caller is root, that nobody is the host's
  uid 0 to the kernel (bubblewrap maps the one id it has), so what holds the host's root-only files is that they are
  not there: no host /etc but the list above, /proc as above, and (with the host's /usr) every entry of the host's
  /usr, and of the /etc folders shown, that an unprivileged user could not read covered too. The rw binds stay
  writable (they are ours, owned by the caller);
- `root_rw=True` (with `root=DIR`) makes DIR itself the whole file system, writable: a complete system (a fresh
  Debian root made by mmdebstrap) whose /var, /root and /etc are its own, with its own package manager; /proc, /dev
  and a private /tmp (mode 1777) are still the sandbox's;
- `uid=0` runs the command as root inside. When the caller is not root: uid 0 of its own user namespace, where only
  that one uid exists. When the caller is root (only with `root_rw`): uid 0 of a user namespace mapping the whole
  range ID_BASE.. ID_BASE+ID_COUNT-1 (so apt and dpkg find their other users, _apt and the owners of the root's
  files), written by us from outside through bwrap's --userns-block-fd; root inside has every capability over that
  namespace and none over the host (no device nodes, no modules, no sysctl, no host file but the binds, as no one).
  The root's files must be in that range first (`shift_ids`), and bwrap itself runs as ID_BASE, with the root's
  folder bound at STAGE in a mount namespace of its own (its path may lie under a 0700 home).

`why_unavailable()` probes once whether this host can make such a sandbox, `why_ids_unavailable()` whether it can
run a root_rw root as root of its own id range; a caller that needs one refuses (one line naming what to install)
instead of running unsandboxed.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..io import runner

BWRAP = "bwrap"
INSIDE_UID = 65534  # nobody: the command runs as no user of the host, in its own user namespace
HOME = "/home/sandbox"
_USRMERGE = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# the ids a root_rw root run as uid 0 by a root caller owns: the last 64 Ki slot of the range systemd leaves to
# containers (0x80000-0x6FFFFFFF), ids no account of the host has
ID_BASE = 0x6FFF0000
ID_COUNT = 65536
STAGE = "/run/onebit-sandbox"  # where the root's folder is bound, in the sandbox's own mount namespace
# what a sandbox on the host's root sees of the host's /etc (relative names; each bound only where an unprivileged
# user could read it): the resolver, CA bundles and TLS configuration (never ssl/private), the loader, the
# alternatives (the host calls cc and c++ through them), what system this is, the time zone
HOST_ETC = ("resolv.conf", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "services", "protocols",
            "ssl/certs", "ssl/openssl.cnf", "ca-certificates.conf", "pki/tls/certs", "pki/ca-trust/extracted",
            "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
            "os-release", "debian_version", "lsb-release", "localtime", "timezone")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
_CAPS_XATTR = "security.capability"


@dataclass(frozen=True)
class Sandbox:
    env: Mapping[str, str] = field(default_factory=dict)  # the whole environment inside
    cwd: str | None = None
    root: str | None = None  # an assembled build root; None: the host's /usr and HOST_ETC, read-only
    ro: tuple[str, ...] = ()  # host paths bound read-only at the same path
    rw: tuple[str, ...] = ()  # host paths bound read-write at the same path
    hide: tuple[str, ...] = ()  # directories inside ro/rw paths covered by an empty tmpfs (e.g. a checkout's .git)
    network: bool = False
    uid: int = INSIDE_UID  # who runs the command inside; 0: root (see the module's docstring)
    root_rw: bool = False  # with root: the root itself is /, writable
    memory: int | None = None  # bytes of address space (RLIMIT_AS), None: unbounded
    timeout: float | None = None  # seconds, enforced by run()
    host_etc: tuple[str, ...] = ()  # with root: host /etc files (relative names) shown over the root's etc


# ---- what the host keeps from unprivileged users ----------------------------------------------------------------
def kept_from_others(mode: int) -> bool:
    """Pure: whether an unprivileged user of the host may not read an entry of this mode: a file without read for
    others, a folder without read or search for others (a link is judged by where it leads)."""
    if stat.S_ISLNK(mode):
        return False
    if stat.S_ISDIR(mode):
        return mode & 0o005 != 0o005
    return not mode & 0o004


def reachable(path: str) -> bool:
    """Whether an unprivileged user of the host can read `path` (resolved): itself readable, every folder above it
    searchable."""
    real = os.path.realpath(path)
    try:
        if kept_from_others(os.stat(real).st_mode):
            return False
        parent = os.path.dirname(real)
        while parent != "/":
            if not os.stat(parent).st_mode & 0o001:
                return False
            parent = os.path.dirname(parent)
    except OSError:
        return False
    return True


def kept_under(top: str, *, skip: Callable[[str], bool] = lambda p: False) -> list[str]:
    """The topmost entries under the folder `top` that an unprivileged user could not read (none of what is below
    them listed, links not followed, other file systems not entered), in walk order."""
    out: list[str] = []
    try:
        dev = os.lstat(top).st_dev
    except OSError:
        return out
    stack = [top]
    while stack:
        try:
            entries = sorted(os.scandir(stack.pop()), key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for e in entries:
            if skip(e.path):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if kept_from_others(st.st_mode):
                out.append(e.path)
            elif stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                stack.append(e.path)
    return out


@functools.lru_cache(maxsize=None)
def _kept_cached(top: str) -> tuple[str, ...]:
    return tuple(kept_under(top))


def _covers(paths: Sequence[str], dest: Callable[[str], str] = lambda p: p) -> list[str]:
    """bwrap arguments covering each path: a folder by an empty read-only tmpfs, a file by /dev/null (bound without
    devices: opening it is refused, as it is to an unprivileged user)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            out += ["--tmpfs", dest(p), "--remount-ro", dest(p)]
        else:
            out += ["--ro-bind", "/dev/null", dest(p)]
    return out


@functools.lru_cache(maxsize=None)
def _proc_kept() -> tuple[str, ...]:
    """The host's /proc files and sysctls (but the network's) that unprivileged users may not read: the kernel's,
    the same for every sandbox of this process."""
    top: list[str] = []
    try:
        for e in sorted(os.scandir("/proc"), key=lambda e: e.name):
            if e.name.isdigit() or e.name in ("self", "thread-self", "sys"):
                continue
            try:
                if kept_from_others(e.stat(follow_symlinks=False).st_mode):
                    top.append(e.path)
            except OSError:
                continue
    except OSError:
        pass
    return tuple(top + kept_under("/proc/sys", skip=lambda p: p == "/proc/sys/net"))


def _proc(network: bool) -> list[str]:
    """bwrap arguments for /proc: a new one, its sys read-only (the caller may be uid 0 to the kernel, which writes a
    sysctl by its owner bits), and what the host keeps from unprivileged users in it covered: its top-level files
    (kmsg, kpageflags, timer_list, ...) and the sysctls only root reads, the network's (read now: interfaces come and
    go) only where the command shares the host's network (a new network namespace has its own)."""
    out = ["--proc", "/proc"]
    if not os.path.isdir("/proc/sys"):
        return out
    net = kept_under("/proc/sys/net") if network else []
    return out + ["--ro-bind", "/proc/sys", "/proc/sys"] + _covers([*_proc_kept(), *net])


@functools.lru_cache(maxsize=None)
def _own_etc() -> str:
    """A folder (this process's, removed at its exit) holding the passwd and group made for the sandbox."""
    import atexit

    folder = tempfile.mkdtemp(prefix="onebit-sandbox-etc-")
    os.chmod(folder, 0o755)
    for name, text in (("passwd", PASSWD), ("group", GROUP)):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _etc(root_etc: Path | None, names: Sequence[str], *, own: bool, cover: bool) -> list[str]:
    """bwrap arguments for /etc as a read-only tmpfs: the root's etc entry by entry (root_etc; a link kept as a link),
    with `names` (paths relative to /etc) taken from the host's /etc instead, each resolved and only where an
    unprivileged user could read it (a folder with what it keeps from them covered when `cover`); `own`: the
    sandbox's passwd and group, and mtab."""
    tops = {n.split("/", 1)[0] for n in names} | ({"passwd", "group", "mtab"} if own else set())
    out = ["--tmpfs", "/etc"]
    for entry in sorted(os.listdir(root_etc)) if root_etc is not None and root_etc.is_dir() else ():
        if entry in tops:
            continue
        p = root_etc / entry
        out += ["--symlink", os.readlink(p), f"/etc/{entry}"] if p.is_symlink() else ["--ro-bind", str(p), f"/etc/{entry}"]
    for name in names:
        src = os.path.realpath(os.path.join("/etc", name))
        if not os.path.exists(src) or not reachable(src):
            continue
        out += ["--ro-bind", src, f"/etc/{name}"]
        if cover and os.path.isdir(src):
            out += _covers(_kept_cached(src), lambda p, src=src, name=name: f"/etc/{name}{p[len(src):]}")
    if own:
        folder = _own_etc()
        out += ["--ro-bind", f"{folder}/passwd", "/etc/passwd", "--ro-bind", f"{folder}/group", "/etc/group",
                "--symlink", "../proc/self/mounts", "/etc/mtab"]
    return out + ["--remount-ro", "/etc"]


def _top_level(root: Path, name: str, cover: bool) -> list[str]:
    """bwrap arguments for /<name> as it is in `root` (a link kept as a link, a directory bound read-only, with what
    it keeps from unprivileged users covered when `cover`)."""
    p = root / name
    if p.is_symlink():
        return ["--symlink", os.readlink(p), f"/{name}"]
    if p.is_dir():
        return ["--ro-bind", str(p), f"/{name}", *(_covers(_kept_cached(str(p))) if cover else [])]
    return []


# ---- the command line --------------------------------------------------------------------------------------------
def host_euid() -> int:
    return os.geteuid()


def id_ranged(sb: Sandbox) -> bool:
    """Whether `sb` runs as root of its own id range (uid 0 asked by a root caller): see the module's docstring."""
    return sb.uid == 0 and host_euid() == 0


def _staged(tree: str) -> list[str]:
    """The commands before bwrap for an id-ranged sandbox: a mount namespace of its own where the root's folder is
    bound at STAGE (bwrap resolves its sources as the id it runs as, which may not search a 0700 folder above it),
    then that id (util-linux's unshare, mount and setpriv)."""
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-euc",
            'mount --bind -- "$1" "$2"; shift 2; exec "$@"', "onebit-stage", tree, STAGE,
            "setpriv", f"--reuid={ID_BASE}", f"--regid={ID_BASE}", "--clear-groups", "--"]


def argv(sb: Sandbox, command: Sequence[str], *, bwrap: str = BWRAP, links: Mapping[str, str] | None = None,
         fds: tuple[int, int] = (3, 4), cover: bool = True) -> list[str]:
    """Pure apart from reading the host (its /etc, /proc, what it keeps from others) and the root's top-level links:
    the command line running `command` in `sb`.

    links: the root's top-level links (name -> target) when the caller knows them, so nothing of the root is read: a
    plan made before its build root is assembled prints the exact command (roots.TOP_LINKS); the root's etc/ is then
    taken to exist. fds: (info, block) for an id-ranged sandbox, the descriptors popen() gives bwrap. cover=False
    leaves out walking the host's /usr for what it keeps from others (the availability probe runs `exit 0`)."""
    if sb.root_rw and not sb.root:
        raise ValueError("root_rw needs a root (root=DIR)")
    base = Path(sb.root) if sb.root else Path("/")
    as_root = host_euid() == 0
    if id_ranged(sb):
        if not sb.root_rw:
            raise ValueError("uid 0 for a root caller needs root_rw: a complete system whose files are in the "
                             "sandbox's id range (shift_ids)")
        out = [*_staged(str(base)), bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
               "--unshare-user", "--userns-block-fd", str(fds[1]), "--info-fd", str(fds[0]), "--uid", "0", "--gid", "0",
               "--cap-add", "ALL"]
        top = STAGE
    else:
        out = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
               "--unshare-user", "--uid", str(sb.uid), "--gid", str(sb.uid)]
        top = str(base)
    if sb.network:
        out.append("--share-net")
    home = "/root" if sb.uid == 0 and sb.root_rw else HOME
    if sb.root_rw:
        out += ["--bind", top, "/", *_proc(sb.network), "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    else:
        host = cover and as_root and sb.root is None  # the host's own folders: cover what it keeps from others
        out += ["--ro-bind", str(base / "usr"), "/usr", *(_covers(_kept_cached("/usr")) if host else [])]
        if links is not None:
            for name, target in links.items():
                out += ["--symlink", target, f"/{name}"]
        else:
            for name in _USRMERGE:
                out += _top_level(base, name, host)
        if sb.root is None:
            out += _etc(None, HOST_ETC, own=True, cover=host)
        elif sb.host_etc:
            out += _etc(base / "etc", sb.host_etc, own=False, cover=cover and as_root)
        elif links is not None or (base / "etc").is_dir():
            out += ["--ro-bind", str(base / "etc"), "/etc"]
        out += [*_proc(sb.network), "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/home", "--dir", HOME,
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


# ---- a root given to the id range ----------------------------------------------------------------------------------
def shifted(ident: int) -> int:
    """Pure: where an owner (uid or gid) of a root lands in the id range: n below ID_COUNT -> ID_BASE + n; one already
    in the range stays; any other -> the range's nobody."""
    if ID_BASE <= ident < ID_BASE + ID_COUNT:
        return ident
    return ID_BASE + (ident if ident < ID_COUNT else INSIDE_UID)


def ns_caps(raw: bytes, rootid: int) -> bytes | None:
    """Pure: a file capability (the security.capability attribute, revision 2 or 3) as revision 3 owned by `rootid`,
    the kernel's form for a file capability honoured in a user namespace whose root is `rootid`; None for another."""
    if len(raw) < 20:
        return None
    magic = int.from_bytes(raw[:4], "little")
    if magic & 0xFF000000 not in (0x02000000, 0x03000000):
        return None
    return (0x03000000 | (magic & 1)).to_bytes(4, "little") + raw[4:20] + rootid.to_bytes(4, "little")


def shift_ids(tree: str | os.PathLike) -> int:
    """Give a complete system (a root_rw root, e.g. one mmdebstrap made as root) to the sandbox's id range, so that
    root inside an id-ranged sandbox owns it and the host's root owns nothing there: every owner moved (shifted()),
    each inode once (hard links), links themselves not followed, nothing on another file system; the set-id bits chown
    clears set again, a file capability rewritten for the range's root. Run as root. Returns how many entries moved."""
    tree = os.fspath(tree)
    dev = os.lstat(tree).st_dev
    seen: set[int] = set()
    moved = 0

    def one(path: str) -> bool:
        nonlocal moved
        st = os.lstat(path)
        if st.st_dev != dev:
            return False
        if st.st_ino in seen:
            return True
        seen.add(st.st_ino)
        uid, gid = shifted(st.st_uid), shifted(st.st_gid)
        if (uid, gid) == (st.st_uid, st.st_gid):
            return True
        regular = stat.S_ISREG(st.st_mode)
        caps = None
        if regular:
            try:
                caps = os.getxattr(path, _CAPS_XATTR, follow_symlinks=False)
            except OSError:
                caps = None
        os.chown(path, uid, gid, follow_symlinks=False)
        if regular and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(path, stat.S_IMODE(st.st_mode))
        new = ns_caps(caps, ID_BASE) if caps else None
        if new:
            os.setxattr(path, _CAPS_XATTR, new, follow_symlinks=False)
        moved += 1
        return True

    one(tree)
    for folder, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if one(os.path.join(folder, d)) and not os.path.islink(os.path.join(folder, d))]
        for name in files:
            one(os.path.join(folder, name))
    return moved


# ---- running -------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def why_unavailable(bwrap: str = BWRAP) -> str | None:
    """None when this host can make the sandbox; else one line saying why and what to install."""
    exe = shutil.which(bwrap)
    if exe is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        proc = runner.run(argv(Sandbox(), ["/bin/sh", "-c", "exit 0"], bwrap=exe, cover=False), timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"this host refuses the namespaces bwrap needs ({why}); allow unprivileged user namespaces or run as root"
    return None


@functools.lru_cache(maxsize=None)
def why_ids_unavailable(bwrap: str = BWRAP) -> str | None:
    """None when a root caller can run a root_rw root as root of its own id range here (or the caller is not root: its
    uid 0 is then its own user namespace's); else one line saying why."""
    why = why_unavailable(bwrap)
    if why or host_euid() != 0:
        return why
    missing = [t for t in ("unshare", "setpriv", "mount") if shutil.which(t, path=os.defpath) is None]
    if missing:
        return f"util-linux's {', '.join(missing)} not found: apt-get install util-linux mount"
    tmp = tempfile.mkdtemp(prefix="onebit-ids-")
    try:
        tree = Path(tmp) / "root"
        (tree / "usr").mkdir(parents=True)
        for name in _USRMERGE:
            if os.path.islink(f"/{name}"):
                (tree / name).symlink_to(os.readlink(f"/{name}"))
        shift_ids(tree)
        proc = run(Sandbox(root=str(tree), root_rw=True, uid=0, ro=("/usr",), env={"PATH": "/usr/bin:/bin"},
                           timeout=30), ["/bin/sh", "-c", "exit 0"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a root of its own id range could not run: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return (f"this host refuses a user namespace of {ID_COUNT} ids run by an unprivileged id ({why}); allow "
                "unprivileged user namespaces (sysctl kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu)")
    return None


def _stage_folder() -> None:
    """STAGE, made once: a folder root owns that no one else may write (the mount point of an id-ranged root)."""
    os.makedirs(STAGE, mode=0o755, exist_ok=True)
    st = os.lstat(STAGE)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise OSError(f"{STAGE} is not a folder only root may write: remove it")


def _child_pid(fd: int) -> int | None:
    """The sandbox's pid from bwrap's --info-fd (read to the end of its JSON object, so bwrap never writes into a
    closed pipe); None when bwrap stopped before saying it."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
        try:
            info = json.loads(data)
        except ValueError:
            continue
        pid = info.get("child-pid") if isinstance(info, dict) else None
        return pid if isinstance(pid, int) and pid > 0 else None


def map_ids(pid: int) -> None:
    """Write the id range into the user namespace of the waiting sandbox `pid` (root may map any ids)."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {ID_BASE} {ID_COUNT}\n")


def popen(sb: Sandbox, command: Sequence[str], *, stdin=subprocess.DEVNULL, stdout=None,
          stderr=None) -> subprocess.Popen:
    """Start `command` in the sandbox, text in and out, its output where the caller's goes unless piped
    (builders/io/runner.py: its own session, so run() kills the whole group on timeout; bounded by the sandbox's
    `memory`). An id-ranged sandbox waits, before anything of it runs, until its ids are mapped here."""
    def start(fds: tuple[int, ...] = ()) -> subprocess.Popen:
        return runner.start(argv(sb, command, **({"fds": fds} if fds else {})), env={"PATH": os.defpath}, stdin=stdin,
                            stdout=stdout, stderr=stderr, memory=sb.memory, pass_fds=fds)

    if not id_ranged(sb):
        return start()
    _stage_folder()
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    try:
        proc = start((info_w, block_r))
    except BaseException:
        for fd in (info_r, block_w):
            os.close(fd)
        raise
    finally:
        os.close(info_w)
        os.close(block_r)
    try:
        pid = _child_pid(info_r)
        if pid is not None:
            map_ids(pid)
    except OSError as exc:
        runner.stop(proc)
        proc.wait()
        raise OSError(f"the sandbox's ids could not be mapped: {exc}") from None
    finally:
        os.close(info_r)
        os.close(block_w)  # the sandbox goes on (bwrap reads end of file as the go-ahead)
    return proc


def run(sb: Sandbox, command: Sequence[str], *, input: str | None = None) -> subprocess.CompletedProcess:
    """Run `command` in the sandbox, capturing text output; on timeout the process group is killed and runner.TimedOut
    (a subprocess.TimeoutExpired) raised."""
    proc = popen(sb, command, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return runner.wait(proc, input=input, timeout=sb.timeout)


def probe_net_cut() -> tuple[str, ...]:
    """The argv prefix that runs a host command in a new, empty network namespace (the host root's network cut,
    builders/roots/root.py), or () where the host forbids it: as root, `unshare --net`; elsewhere with the caller mapped to
    root of its own user namespace."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    for prefix in (("unshare", "--net", "--"), ("unshare", "--net", "--map-root-user", "--")):
        try:
            proc = runner.run([*prefix, "true"], timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0:
            return prefix
    return ()
