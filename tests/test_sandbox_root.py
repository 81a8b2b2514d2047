"""The sandbox when its caller is root (CI, containers, these machines), tried as an attacker through each real path:
the pin bot's drift check (a hostile upstream Makefile under `make -n`), a build command inside a build root (the
plan's own command line, run by the executor), the crates step's sandbox, ldconfig inside an assembled root, and
`nox -s fresh`'s clean roots, where the command is root. Nothing root-only of the host is read or written: no
/etc/shadow, no sysctl, no /proc file only root reads, no device node, no module, no host file but what is bound."""
from __future__ import annotations

import ctypes
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from builders.inputs import companions, host
from builders.project import config
from builders.roots import debs, sandbox
from builders import fresh
from builders.roots import clean
from builders.cli import main
from builders.execute import Executor
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout
from mini_project import add_rooted, make_mini
from pins_fixtures import Project, Upstream
from pins_fixtures import branch_pin, make_recipe
from test_flag_drift import MAKEFILE_OLD, SOURCES, drift
from test_roots import TINY_ROOT

ROOT = Path(__file__).resolve().parent.parent
AS_ROOT = os.geteuid() == 0
needs_sandbox = pytest.mark.skipif(sandbox.why_unavailable() is not None and not os.environ.get("ONEBIT_REQUIRE_TOOLCHAINS"),
                                   reason=f"no sandbox here: {sandbox.why_unavailable()}")
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the attacks are about a caller that is root")

# What a hostile command tries, in POSIX sh (busybox's too): one `name=result` line each. The sysctl is only opened
# for appending, nothing is written; a root-only sysctl and a root-only /proc file are read.
PROBE = ("s=$(head -c 4 /etc/shadow 2>/dev/null | tr -cd a-z); test -n \"$s\" || s=none; echo shadow=$s; "
         "(exec 3>>/proc/sys/vm/swappiness) 2>/dev/null && echo sysctl=open || echo sysctl=refused; "
         "head -c 1 /proc/sys/kernel/cad_pid >/dev/null 2>&1 && echo rootsysctl=read || echo rootsysctl=refused; "
         "head -c 1 /proc/timer_list >/dev/null 2>&1 && echo procfile=read || echo procfile=refused; ")
HELD = {"shadow": "none", "sysctl": "refused", "rootsysctl": "refused", "procfile": "refused"}


def results(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.split() if "=" in line)


# ---- the drift sandbox: a hostile upstream's `make -n` ------------------------------------------------------------
HOSTILE = MAKEFILE_OLD.replace("WARN = -Wall", textwrap.dedent("""\
    SHADOW := $(shell head -c 4 /etc/shadow 2>/dev/null | tr -cd a-z | grep . || echo none)
    SYSCTL := $(shell (exec 3>>/proc/sys/vm/swappiness) 2>/dev/null && echo open || echo refused)
    ROOTSYSCTL := $(shell head -c 1 /proc/sys/kernel/cad_pid >/dev/null 2>&1 && echo read || echo refused)
    PROCFILE := $(shell head -c 1 /proc/timer_list >/dev/null 2>&1 && echo read || echo refused)
    ETC := $(shell ls /etc | tr '\\n' ,)
    WARN = -Wall -DSHADOW=$(SHADOW) -DSYSCTL=$(SYSCTL) -DROOTSYSCTL=$(ROOTSYSCTL) -DPROCFILE=$(PROCFILE) -DETC=$(ETC)"""))


@needs_sandbox
@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is part of the build toolchain (apt make)")
def test_a_hostile_make_n_reads_no_root_only_file_of_the_host(tmp_path):
    """The bot's drift check (isolate.flag_reports, as `pins bump` runs it) on an upstream whose Makefile, under
    `make -n`, reads /etc/shadow, opens a sysctl for writing and reads a root-only sysctl and /proc file, carrying each
    result out in a compile flag. The sandbox's /etc holds only what a build needs."""
    up = Upstream(tmp_path / "up" / "dsx")
    old = up.commit("old", {"Makefile": MAKEFILE_OLD, **SOURCES})
    proj = Project(tmp_path, branch_pin("dsx", up.url, old), recipes={"dsx": make_recipe("dsx")})
    new = up.commit("hostile", {"Makefile": HOSTILE})
    [rep] = drift(proj, "dsx", up, old, new)
    seen = {r.what.split("=", 1)[0].removeprefix("-D"): r.what.split("=", 1)[1] for r in rep.rows
            if r.what.startswith("-D") and "=" in r.what}
    assert {k: seen.get(k.upper()) for k in HELD} == HELD, rep.rows
    etc = set(seen["ETC"].strip(",").split(","))
    assert "shadow" not in etc and "gshadow" not in etc and "sudoers" not in etc
    assert {"passwd", "group", "resolv.conf", "ld.so.cache"} <= etc <= {*sandbox.HOST_ETC, "passwd", "group", "mtab", "ssl",
                                                                       "pki"}


# ---- a build root: the plan's command, run by the executor; ldconfig inside the assembled root -------------------
EVIL_CONF_DIR = "/usr/libexec/coreutils"  # holds libstdbuf.so in the root, and is in no ld.so.conf of it
ATTACK = "mkdir -p {prefix}/bin && cp /usr/bin/busybox {prefix}/bin/ && (" + PROBE + ") > {build}/probe"


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """The mini project with roots/tiny.yaml (busybox, coreutils, libc-bin from Debian 13) and a recipe whose build
    command probes the host; the root assembled by the real `1bit-build fetch`, in a mount namespace whose host
    /etc/ld.so.conf.d names a folder of the root that holds a library and no conf of the root names."""
    if sandbox.why_unavailable():
        pytest.fail(f"this test needs bubblewrap: {sandbox.why_unavailable()}")
    base = tmp_path_factory.mktemp("tinyroot")
    mini = make_mini(base)
    add_rooted(mini, "tiny", TINY_ROOT, summary="a build command that attacks the host",
               toolchain=[{"tool": "busybox", "in_root": "/usr/bin/busybox"}],
               build={"kind": "script", "root": "tiny", "network": "none", "commands": [["busybox", "sh", "-c", ATTACK]]},
               stage={"keep": ["bin/busybox"], "binaries": {"busybox": "bin/busybox"}}, tests=[])
    assert main(["--root", str(mini.root), "roots", "resolve", "tiny"]) == 0
    cache = base / "cache"
    fetch = [sys.executable, "-m", "builders.cli", "--root", str(mini.root), "--cache", str(cache), "--work",
             str(base / "work"), "--out", str(base / "out"), "fetch", "mini"]
    planted = None
    if AS_ROOT:  # the host's conf dir, as the assembly sees it: the real one plus an entry naming the root's folder
        planted = base / "ld.so.conf.d"
        shutil.copytree("/etc/ld.so.conf.d", planted) if os.path.isdir("/etc/ld.so.conf.d") else planted.mkdir()
        (planted / "zz-onebit-attack.conf").write_text(EVIL_CONF_DIR + "\n")
        fetch = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec",
                 'mount --bind -- "$1" /etc/ld.so.conf.d; grep -q libexec /etc/ld.so.conf.d/zz-onebit-attack.conf; '
                 'shift; exec "$@"', "plant", str(planted), *fetch]
    proc = subprocess.run(fetch, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dest = config.load_project(mini.root).roots["tiny"].dest(cache)
    assert (dest / ".complete").is_file()
    return mini, cache, dest, planted


@needs_root
def test_ldconfig_inside_an_assembled_root_never_reads_the_hosts_conf(tiny_root):
    """The root's ld.so.cache (made by the root's ldconfig, in the sandbox, at assembly) lists what the root's own
    conf names, never a folder a host-side /etc/ld.so.conf.d entry names; the same ldconfig told that folder does
    list its library (the check can see a leak)."""
    _, _, dest, planted = tiny_root
    assert planted is not None and (dest / EVIL_CONF_DIR.lstrip("/") / "libstdbuf.so").is_file()
    cache = subprocess.run(["ldconfig", "-p", "-C", str(dest / "etc" / "ld.so.cache")], capture_output=True, text=True,
                           check=True).stdout
    assert "libc.so.6" in cache and EVIL_CONF_DIR not in cache, cache
    told = sandbox.run(sandbox.Sandbox(root=str(dest), timeout=60),
                       ["/usr/bin/busybox", "sh", "-c",
                        f"/usr/sbin/ldconfig -X -C /tmp/c {EVIL_CONF_DIR} && /usr/sbin/ldconfig -p -C /tmp/c"])
    assert told.returncode == 0 and f"{EVIL_CONF_DIR}/libstdbuf.so" in told.stdout, told.stderr


@needs_sandbox
def test_a_build_command_in_a_build_root_reads_no_root_only_file_of_the_host(tiny_root, tmp_path):
    """The plan's build command for a rooted variant (Root.wrap's bwrap line), run by the executor: it cannot open
    a sysctl for writing or read what the host's /proc keeps for root; /etc is the root's."""
    mini, cache, dest, _ = tiny_root
    project = config.load_project(mini.root)
    lay = Layout(root=mini.root, cache=cache, work=tmp_path / "work", out=tmp_path / "out")
    facts = host.gather(all_tools(project, "mini"), toolchains=cache / "toolchains", roots={"tiny": str(dest)})
    plan = make_plan(project, "mini", facts, lay)
    assert plan.missing == []
    plan.steps = [s for s in plan.steps if s.action in ("fetch", "source", "root", "build")]
    [cmd] = plan.step("build:rooted").commands
    assert cmd.argv[0] == sandbox.BWRAP and "--ro-bind" in cmd.argv  # the command really is the sandbox's
    Executor(plan, project, console=Console(file=io.StringIO())).run()
    got = results((Path(plan.step("build:rooted").data.build_dir) / "probe").read_text())
    assert got == HELD


# ---- the crates sandbox --------------------------------------------------------------------------------------------
@needs_sandbox
def test_the_crates_sandbox_reads_no_root_only_file_of_the_host(tmp_path):
    """The crates step's sandbox without a build root (the host's /usr and cargo, the network on): no host /etc but
    the resolver and CA files, no sysctl, and the host network's root-only sysctl (the TCP Fast Open key) not read."""
    src, work = tmp_path / "src", tmp_path / "work"
    src.mkdir()
    work.mkdir()
    exe, ro, env = companions.host_cargo(os.environ)
    sb = companions.crates_sandbox(src, work, None, os.environ, (ro, env))
    key = "/proc/sys/net/ipv4/tcp_fastopen_key"
    proc = sandbox.run(sb, ["/bin/sh", "-c", PROBE + f"head -c 1 {key} >/dev/null 2>&1 && echo netkey=read || "
                                                     "echo netkey=refused; test -s /etc/ssl/certs/ca-certificates.crt "
                                                     "&& echo ca=ok; ls /etc"])
    got = results(proc.stdout)
    assert {k: got.get(k) for k in HELD} == HELD, proc.stdout + proc.stderr
    if os.path.exists(key):
        assert got["netkey"] == "refused"
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        assert got["ca"] == "ok"  # what cargo needs is still there
    assert "shadow" not in proc.stdout.split()


# ---- fresh roots: root inside is no one outside ------------------------------------------------------------------
# Run as uid 0 inside a root_rw root, by python3: each attack's result as JSON. The host file handles come from
# outside (name_to_handle_at of files the sandbox does not bind); open_by_handle_at is how a process with the host's
# CAP_DAC_READ_SEARCH reads a file of the same file system that is not bound.
FRESH_ATTACK = r'''
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def why(e):
    return errno.errorcode.get(e, str(e))
try:
    os.mknod("/blk-probe", 0o600 | 0o060000, os.makedev(8, 0))
    os.unlink("/blk-probe")
    out["mknod"] = "ok"
except OSError as e:
    out["mknod"] = why(e.errno)
for name, nr, args in (("init_module", 175, (None, 0, b"")), ("finit_module", 313, (-1, b"", 0))):
    r = libc.syscall(nr, *args)
    out[name] = "ok" if r == 0 else why(ctypes.get_errno())
for name, path, flags in (("sysctl", "/proc/sys/vm/swappiness", os.O_WRONLY | os.O_APPEND),
                          ("sysrq", "/proc/sysrq-trigger", os.O_WRONLY), ("kcore", "/proc/kcore", os.O_RDONLY)):
    try:
        os.close(os.open(path, flags))
        out[name] = "ok"
    except OSError as e:
        out[name] = why(e.errno)
class FH(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("handle", ctypes.c_ubyte * 128)]
handles = json.loads(sys.argv[2])
mount = os.open("/", os.O_RDONLY)
for name, (kind, raw) in handles.items():
    fh = FH(len(bytes.fromhex(raw)), kind)
    ctypes.memmove(fh.handle, bytes.fromhex(raw), len(bytes.fromhex(raw)))
    fd = libc.open_by_handle_at(mount, ctypes.byref(fh), os.O_RDONLY)
    out[name] = why(ctypes.get_errno()) if fd < 0 else "read:" + os.read(fd, 4).decode(errors="replace")
for name, path in json.loads(sys.argv[3]).items():
    try:
        out[name] = "read:" + open(path).read(4)
    except OSError as e:
        out[name] = why(e.errno)
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
'''


def host_handles(paths: dict[str, str]) -> dict[str, tuple[int, str]]:
    """name_to_handle_at of host files: (handle type, handle bytes) by name."""
    class FH(ctypes.Structure):
        _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("handle", ctypes.c_ubyte * 128)]
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for name, path in paths.items():
        fh, mount = FH(128), ctypes.c_int()
        assert libc.name_to_handle_at(-100, path.encode(), ctypes.byref(fh), ctypes.byref(mount), 0) == 0, path
        out[name] = (fh.type, bytes(fh.handle[:fh.bytes]).hex())
    return out


def held_by_root_inside(got: dict[str, str]) -> list[str]:
    """The attacks that got through (empty when root inside is powerless over the host)."""
    return [k for k, v in got.items() if v == "ok" or v.startswith("read:")]


def fresh_attack_args(tmp_path: Path, where: str) -> tuple[str, str, str]:
    secret = tmp_path / "host-secret"
    secret.write_text("topsecret\n")
    secret.chmod(0o600)
    paths = {"handle_shadow": "/etc/shadow", "handle_secret": str(secret)}
    handles = json.dumps(host_handles({k: v for k, v in paths.items() if os.path.exists(v)}))
    return where, handles, json.dumps({"path_secret": str(secret)})  # (a fresh root has an /etc/shadow of its own)


@needs_sandbox
@needs_root
def test_root_inside_a_root_rw_sandbox_is_powerless_over_the_host(tmp_path):
    """The sandbox `nox -s fresh` runs the README in (Sandbox(root_rw=True, uid=0)), on a root given to the id range:
    uid 0 there makes no block device, loads no module, opens no sysctl for writing, and reads no host file it is
    not shown, by path or by handle; it still owns its root (writes there, chowns to other ids of the range)."""
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            (root / name).symlink_to(os.readlink(f"/{name}"))
    (root / "attack.py").write_text(FRESH_ATTACK)
    sandbox.shift_ids(root)
    where, handles, paths = fresh_attack_args(tmp_path, "/out.json")
    r = sandbox.run(sandbox.Sandbox(root=str(root), root_rw=True, uid=0, ro=("/usr",), env={"PATH": "/usr/bin:/bin"},
                                    network=True, timeout=60),
                    ["/bin/sh", "-c", 'python3 /attack.py "$@" && touch /mine && chown 42:42 /mine && id -u', "sh",
                     where, handles, paths])
    assert r.returncode == 0, r.stderr
    got = json.loads((root / "out.json").read_text())
    assert held_by_root_inside(got) == [], got
    assert r.stdout.split() == ["0"] and (root / "mine").stat().st_uid == sandbox.ID_BASE + 42


@pytest.mark.e2e
@needs_root
def test_nox_fresh_runs_the_readme_as_a_root_that_is_no_one_on_the_host(tmp_path):
    """`nox -s fresh`'s run of one suite (fresh.run_suite: mmdebstrap, the checkout copied in, the README's first
    command run in the root) for a checkout whose README's first command attacks the host and then installs a
    package with apt (which needs its _apt user and other owners): the attacks all fail, apt works."""
    if shutil.which("mmdebstrap") is None or sandbox.why_ids_unavailable():
        pytest.fail(f"this test needs mmdebstrap and the id-ranged sandbox: {sandbox.why_ids_unavailable()}")
    mirror = clean.debian_mirror(os.environ, debs.host_sources())
    if mirror is None:
        pytest.skip(f"no Debian archive in this host's apt sources and no {debs.MIRROR_ENV}")
    project = tmp_path / "checkout"
    project.mkdir()
    where, handles, paths = fresh_attack_args(tmp_path, f"{fresh.INSIDE}/attack.json")
    (project / "attack.py").write_text(FRESH_ATTACK)
    (project / ".gitignore").write_text(".onebit/\n")
    (project / "README.md").write_text(
        f"python3 attack.py '{where}' '{handles}' '{paths}' && apt-get update -qq && apt-get install -y -qq "
        "--no-install-recommends hello 2>&1 | grep -v debconf; hello  # the attack, then apt\n"
        "python3 scripts/nox.py -s tests  # not run\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "."], cwd=project, check=True)
    result = fresh.run_suite("bookworm", project, mirror=mirror, aptopts=[], env={}, keep=True)
    root = project / ".onebit" / "fresh" / "bookworm" / "root"
    try:
        assert result.steps and result.steps[0].rc == 0, fresh.summary(result)
        got = json.loads((root / fresh.INSIDE.lstrip("/") / "attack.json").read_text())
        assert held_by_root_inside(got) == [], got
        assert (root / "usr" / "bin" / "hello").is_file()
        assert (root / "usr" / "bin" / "hello").stat().st_uid == sandbox.ID_BASE  # root inside is the range's
    finally:
        shutil.rmtree(project / ".onebit", ignore_errors=True)
