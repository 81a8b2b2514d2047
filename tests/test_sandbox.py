"""builders.sandbox: what a sandboxed command can and cannot see (real bwrap)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from builders import sandbox

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
    """The defaults keep the command line of before; root_rw makes the root itself / (writable); uid=0 on a root
    host drops the user namespace and keeps every capability, elsewhere it is uid 0 of its own user namespace."""
    plain = sandbox.argv(sandbox.Sandbox(), ["true"], bwrap="bwrap")
    assert plain[plain.index("--uid") + 1] == str(sandbox.INSIDE_UID) and "--cap-add" not in plain
    assert ["--tmpfs", "/var"] == plain[plain.index("/var") - 1:plain.index("/var") + 1]
    with pytest.raises(ValueError):
        sandbox.argv(sandbox.Sandbox(root_rw=True), ["true"])
    for euid, caps in ((0, True), (1000, False)):
        monkeypatch.setattr(sandbox, "host_euid", lambda euid=euid: euid)
        a = sandbox.argv(sandbox.Sandbox(root="/srv/r", root_rw=True, uid=0, network=True), ["true"], bwrap="bwrap")
        assert ["--bind", "/srv/r", "/"] == a[a.index("/srv/r") - 1:a.index("/srv/r") + 2]
        assert "/var" not in a and a[a.index("HOME") + 1] == "/root"
        assert ("--cap-add" in a) is caps and ("--unshare-user" in a) is not caps
        assert "--unshare-net" not in a and ("--share-net" in a) is not caps


def test_root_rw_writes_into_the_root(tmp_path):
    """A writable root made of an empty tree plus the host's /usr bound read-only: what the command writes at /
    lands in the root's folder, and it runs as uid 0 (of its own user namespace, or the host's root)."""
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            (root / name).symlink_to(os.readlink(f"/{name}"))
    r = sandbox.run(sandbox.Sandbox(root=str(root), root_rw=True, uid=0, ro=("/usr",), env={"PATH": "/usr/bin:/bin"},
                                    timeout=30), ["/bin/sh", "-c", "echo made > /written; id -u; echo $HOME"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "/root"]
    assert (root / "written").read_text() == "made\n"


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
