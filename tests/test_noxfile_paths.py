"""`nox -s tests` runs apt-get and dpkg-query (as root) by their absolute paths, never ones planted first on PATH."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def noxfile():
    pytest.importorskip("nox")
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Session:
    def __init__(self):
        self.ran = []

    def run(self, *args, **kw):
        self.ran.append(args)

    def log(self, *a):
        pass

    def warn(self, *a):
        pass

    def error(self, msg):
        raise SystemExit(msg)


def test_planted_apt_get_and_dpkg_query_never_run(tmp_path, monkeypatch, noxfile):
    planted = tmp_path / "bin"
    planted.mkdir()
    for name in ("apt-get", "dpkg-query"):
        (planted / name).write_text(f"#!/bin/sh\ntouch {tmp_path}/{name}-ran\n")
        (planted / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted}:{os.environ['PATH']}")
    if os.access("/usr/bin/dpkg-query", os.X_OK):
        noxfile.missing_debian_packages()
    monkeypatch.setattr(noxfile, "missing_debian_packages", lambda *a, **k: ["bubblewrap"])
    monkeypatch.setattr(noxfile.os, "geteuid", lambda: 0)
    monkeypatch.setattr(noxfile.os, "access", lambda p, m: str(p) in ("/usr/bin/apt-get", "/usr/bin/dpkg-query"))
    s = Session()
    noxfile.host_packages(s)
    assert [a[0] for a in s.ran] == ["/usr/bin/apt-get", "/usr/bin/apt-get"]
    assert not list(tmp_path.glob("*-ran"))


def test_a_planted_lock_link_of_the_nox_bootstrap_is_refused_and_its_victim_untouched(tmp_path):
    """scripts/nox.py takes its lock as builders/io/lock.py does (O_NOFOLLOW, a regular file): a link planted as
    .onebit/nox-venv.lock never truncates or writes what it points at."""
    import subprocess
    import sys

    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "nox.py").write_text((ROOT / "scripts" / "nox.py").read_text())
    (tmp_path / ".onebit").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / ".onebit" / "nox-venv.lock").symlink_to(victim)
    r = subprocess.run([sys.executable, str(tmp_path / "scripts" / "nox.py"), "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "nox-venv.lock" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert victim.read_text() == "keep me\n" and not (tmp_path / ".onebit" / "nox-venv").exists()
