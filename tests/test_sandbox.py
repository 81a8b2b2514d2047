"""builders.roots.sandbox: what a sandboxed command can and cannot see (real bwrap)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from builders.roots import sandbox

pytestmark = pytest.mark.skipif(sandbox.why_unavailable() is not None and not os.environ.get("ONEBIT_REQUIRE_TOOLCHAINS"),
                                reason=f"no sandbox here: {sandbox.why_unavailable()}")


def test_argv_is_data():
    a = sandbox.argv(sandbox.Sandbox(env={"A": "1"}, ro=("/x",), rw=("/y",), cwd="/y"), ["true"], bwrap="bwrap")
    assert a[0] == "bwrap" and a[-2:] == ["--", "true"]
    assert "--share-net" not in a and "--clearenv" in a and "--unshare-all" in a
    assert a[a.index("--chdir") + 1] == "/y"
    assert ["--ro-bind", "/x", "/x"] == a[a.index("/x") - 1:a.index("/x") + 2]
    assert "--share-net" in sandbox.argv(sandbox.Sandbox(network=True), ["true"])


def test_sees_only_what_it_is_given(tmp_path, monkeypatch):
    ro, rw, secret = tmp_path / "ro", tmp_path / "rw", tmp_path / "secret"
    for d in (ro, rw, secret):
        d.mkdir()
    (ro / "f").write_text("in\n")
    (secret / "s").write_text("nope\n")
    monkeypatch.setenv("ONEBIT_BOT_TOKEN", "tok-123")
    script = (f"cat {ro}/f; echo x > {rw}/out; touch {ro}/g 2>/dev/null || echo ro-refused; "
              f"cat {secret}/s 2>/dev/null || echo secret-hidden; id -u; "
              "for p in /proc/[0-9]*; do cat $p/environ 2>/dev/null; done | tr '\\0' '\\n' | grep -c TOKEN || true; "
              "env | grep -c TOKEN || true")
    r = sandbox.run(sandbox.Sandbox(env={"PATH": "/usr/bin:/bin"}, ro=(str(ro),), rw=(str(rw),), timeout=30),
                    ["/bin/sh", "-c", script])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[:4] == ["in", "ro-refused", "secret-hidden", str(sandbox.INSIDE_UID)]
    assert lines[4:] == ["0", "0"]
    assert (rw / "out").read_text() == "x\n" and not (ro / "g").exists()


def test_no_network_and_timeout_kills_the_group(tmp_path):
    # /proc/net/dev lists the interfaces of the command's own network namespace: only loopback
    r = sandbox.run(sandbox.Sandbox(env={"PATH": "/usr/bin:/bin"}, timeout=30), ["/bin/sh", "-c", "tail -n +3 /proc/net/dev"])
    assert [line.split(":")[0].strip() for line in r.stdout.splitlines()] == ["lo"]
    with pytest.raises(subprocess.TimeoutExpired):
        sandbox.run(sandbox.Sandbox(env={"PATH": "/usr/bin:/bin"}, timeout=1), ["/bin/sh", "-c", "sleep 60 & sleep 60"])


def test_root_rw_and_uid0_are_opt_in(monkeypatch):
    """The defaults keep the command line of before; root_rw makes the root itself / (writable); uid=0 is always uid 0
    of a user namespace: for a root caller one of the whole id range (bwrap run as its first id after the root's folder
    is bound at STAGE in a mount namespace of its own, the ids written from outside through --userns-block-fd), elsewhere
    its own single uid; never the host's root."""
    plain = sandbox.argv(sandbox.Sandbox(), ["true"], bwrap="bwrap")
    assert plain[plain.index("--uid") + 1] == str(sandbox.INSIDE_UID) and "--cap-add" not in plain
    assert ["--tmpfs", "/var"] == plain[plain.index("/var") - 1:plain.index("/var") + 1]
    with pytest.raises(ValueError):
        sandbox.argv(sandbox.Sandbox(root_rw=True), ["true"])
    for euid in (0, 1000):
        monkeypatch.setattr(sandbox, "host_euid", lambda euid=euid: euid)
        a = sandbox.argv(sandbox.Sandbox(root="/srv/r", root_rw=True, uid=0, network=True), ["true"], bwrap="bwrap",
                         fds=(7, 8))
        assert "/var" not in a and a[a.index("HOME") + 1] == "/root"
        assert "--unshare-user" in a and "--unshare-net" not in a and "--share-net" in a
        assert a[a.index("--uid") + 1] == "0"
        if euid == 0:
            bw = a.index("bwrap")
            stage = a[:bw]
            assert stage[:4] == ["unshare", "--mount", "--propagation", "private"]
            assert stage[stage.index("/srv/r") + 1] == sandbox.STAGE and f"--reuid={sandbox.ID_BASE}" in stage
            assert ["--bind", sandbox.STAGE, "/"] == a[a.index(sandbox.STAGE, bw) - 1:a.index(sandbox.STAGE, bw) + 2]
            assert a[a.index("--userns-block-fd") + 1] == "8" and a[a.index("--info-fd") + 1] == "7"
            assert a[a.index("--cap-add") + 1] == "ALL"  # every capability, over its own namespace only
        else:
            assert a[0] == "bwrap" and ["--bind", "/srv/r", "/"] == a[a.index("/srv/r") - 1:a.index("/srv/r") + 2]
            assert "--cap-add" not in a and "--userns-block-fd" not in a
    monkeypatch.setattr(sandbox, "host_euid", lambda: 0)
    with pytest.raises(ValueError, match="root_rw"):  # a root caller's uid 0 only for a root given to the range
        sandbox.argv(sandbox.Sandbox(root="/srv/r", uid=0), ["true"])


def test_root_rw_writes_into_the_root(tmp_path):
    """A writable root made of an empty tree plus the host's /usr bound read-only: what the command writes at /
    lands in the root's folder, and it runs as uid 0 of its own user namespace (for a root caller, once the tree is
    given to the id range: then the files it makes belong to the range on the host)."""
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            (root / name).symlink_to(os.readlink(f"/{name}"))
    if os.geteuid() == 0:
        assert sandbox.shift_ids(root) == 1 + sum(os.path.islink(f"/{n}") for n in ("bin", "lib", "lib64", "sbin")) + 1
    r = sandbox.run(sandbox.Sandbox(root=str(root), root_rw=True, uid=0, ro=("/usr",), env={"PATH": "/usr/bin:/bin"},
                                    timeout=30), ["/bin/sh", "-c", "echo made > /written; id -u; echo $HOME"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "/root"]
    assert (root / "written").read_text() == "made\n"
    if os.geteuid() == 0:
        assert (root / "written").stat().st_uid == sandbox.ID_BASE


def test_host_etc_lays_the_roots_etc_out_with_the_hosts_files_over_it(tmp_path):
    """host_etc (with a root): a tmpfs /etc with each entry of the root's etc bound (a link kept as a link), the named
    host files bound over it (a missing one left out), then /etc read-only again; without host_etc, one bind."""
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    (root / "etc" / "ssl").mkdir(parents=True)
    (root / "etc" / "debian_version").write_text("forky/sid\n")
    (root / "etc" / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    (root / "etc" / "mtab").symlink_to("../proc/self/mounts")
    plain = sandbox.argv(sandbox.Sandbox(root=str(root)), ["true"], bwrap="bwrap")
    assert ["--ro-bind", str(root / "etc"), "/etc"] == plain[plain.index("/etc") - 2:plain.index("/etc") + 1]
    a = sandbox.argv(sandbox.Sandbox(root=str(root), host_etc=("resolv.conf", "ssl/certs/none-such.crt")), ["true"],
                     bwrap="bwrap")
    start = next(i for i in range(len(a) - 1) if a[i:i + 2] == ["--tmpfs", "/etc"])
    etc = a[start:a.index("--remount-ro") + 2]
    want = ["--tmpfs", "/etc", "--ro-bind", str(root / "etc" / "debian_version"), "/etc/debian_version",
            "--symlink", "../proc/self/mounts", "/etc/mtab"]
    if Path("/etc/resolv.conf").resolve().is_file():
        want += ["--ro-bind", str(Path("/etc/resolv.conf").resolve()), "/etc/resolv.conf"]
    assert etc[-2:] == ["--remount-ro", "/etc"]
    # the root's resolv.conf and ssl/ are the host's names: left out
    assert etc[:-2] == want, etc


@pytest.mark.parametrize("mode, kept", [
    (0o100644, False), (0o100600, True), (0o100640, True), (0o100604, False), (0o100200, True),  # files
    (0o040755, False), (0o040700, True), (0o040711, True), (0o040750, True), (0o040705, False),  # folders
    (0o120777, False),  # a link: judged by where it leads
])
def test_what_the_host_keeps_from_unprivileged_users(mode, kept):
    assert sandbox.kept_from_others(mode) is kept


def test_a_host_rooted_sandbox_sees_no_host_etc_but_its_list(tmp_path, monkeypatch):
    """With the host's root, /etc is a tmpfs of HOST_ETC's files (each resolved, only where an unprivileged user
    could read it) and the sandbox's own passwd and group; never a bind of the host's /etc, never shadow; /proc/sys
    read-only; for a root caller the host /usr's root-only entries covered."""
    for euid in (0, 1000):
        monkeypatch.setattr(sandbox, "host_euid", lambda euid=euid: euid)
        a = sandbox.argv(sandbox.Sandbox(), ["true"], bwrap="bwrap")
        pairs = [tuple(a[i:i + 3]) for i in range(len(a) - 2) if a[i] in ("--ro-bind", "--bind", "--symlink")]
        assert not [p for p in pairs if p[1] == "/etc" or p[2] == "/etc"]
        etc = {p[2].removeprefix("/etc/") for p in pairs if p[2].startswith("/etc/")}
        assert etc <= {*sandbox.HOST_ETC, "passwd", "group", "mtab"} and {"passwd", "group"} <= etc
        assert not [p for p in pairs if "shadow" in p[1] or "sudoers" in p[1] or "ssl/private" in p[1]]
        assert ("--ro-bind", "/proc/sys", "/proc/sys") in pairs
        own = next(p[1] for p in pairs if p[2] == "/etc/passwd")
        assert Path(own).read_text() == sandbox.PASSWD
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (tmp_path / "open.txt").write_text("x")
    (private / "inner.txt").write_text("x")
    assert sandbox.kept_under(str(tmp_path)) == [str(private)]
    assert not sandbox.reachable(str(private / "inner.txt"))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a tree to other ids needs root")
def test_shift_ids_gives_a_tree_to_the_range_once(tmp_path):
    """Every owner moved into the range once (a hard link is one inode), links not followed (the file a link names
    outside the tree keeps its owner), set-id bits kept, a file capability rewritten for the range's root, and a
    second run changes nothing."""
    outside = tmp_path / "outside"
    outside.write_text("host\n")
    tree = tmp_path / "tree"
    (tree / "usr" / "bin").mkdir(parents=True)
    tool = tree / "usr" / "bin" / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o4755)
    os.link(tool, tree / "usr" / "bin" / "tool-again")
    (tree / "usr" / "bin" / "out").symlink_to(outside)
    staff = tree / "staff"
    staff.write_text("x")
    os.chown(staff, 42, 50)
    caps = tree / "capped"
    caps.write_text("x")
    v2 = (0x02000001).to_bytes(4, "little") + (1 << 13).to_bytes(4, "little") + bytes(12)  # cap_net_raw+ep, v2
    os.setxattr(caps, "security.capability", v2)
    assert sandbox.shift_ids(tree) == 7  # tree, usr, bin, tool (and its hard link), out, staff, capped
    base = sandbox.ID_BASE
    assert os.lstat(tree).st_uid == base and (tool.stat().st_uid, tool.stat().st_mode & 0o7777) == (base, 0o4755)
    assert (staff.stat().st_uid, staff.stat().st_gid) == (base + 42, base + 50)
    assert os.lstat(tree / "usr" / "bin" / "out").st_uid == base and outside.stat().st_uid == 0
    raw = os.getxattr(caps, "security.capability")
    assert raw[:4] == (0x03000001).to_bytes(4, "little") and raw[4:20] == v2[4:20]
    assert int.from_bytes(raw[20:24], "little") == base
    assert sandbox.shift_ids(tree) == 0
