"""Unpacking pinned wheels and capping downloads (issue 21): links and special members refused, no setuid bit
written, no write through a link, the download bounded before hashing."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile

import pytest

from builders.io import archives
from builders.inputs import fetch, toolchain
from builders.errors import FetchError


def make_wheel(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg-1.dist-info/METADATA", "Name: pkg\nLicense: MIT\n")
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)


def test_a_wheel_link_member_is_refused(tmp_path):
    whl = tmp_path / "pkg-1-py3-none-any.whl"
    make_wheel(whl, [("pkg/bin/ok", b"ok", stat.S_IFREG | 0o755), ("pkg/lib/evil", b"/etc/passwd", stat.S_IFLNK | 0o777)])
    with pytest.raises(FetchError, match="is a link or special file; refusing"):
        toolchain._unpack(whl, "pkg", "pkg", tmp_path / "root", {})


def test_a_wheel_member_loses_setuid_and_never_writes_through_a_link(tmp_path):
    whl = tmp_path / "pkg-1-py3-none-any.whl"
    make_wheel(whl, [("pkg/bin/tool", b"#!/bin/sh\n", stat.S_IFREG | 0o4755)])
    root = tmp_path / "root"
    toolchain._unpack(whl, "pkg", "pkg", root, {})
    assert (root / "bin" / "tool").stat().st_mode & 0o7777 == 0o755
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    (root / "bin" / "tool").unlink()
    os.symlink(victim, root / "bin" / "tool")  # a link left in the root is replaced, not written through
    toolchain._unpack(whl, "pkg", "pkg", root, {})
    assert victim.read_text() == "kept\n" and not (root / "bin" / "tool").is_symlink()
    os.symlink(tmp_path, root / "lib")
    with pytest.raises(archives.ArchiveError, match="lib is not a directory"):
        archives.write_member(root, "lib/x.so", b"x")
    assert not (tmp_path / "x.so").exists()


def test_pip_cannot_write_past_the_download_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "MAX_DOWNLOAD", 1 << 20)
    out = tmp_path / "big.whl"
    proc = subprocess.run([sys.executable, "-c", f"open({str(out)!r}, 'wb').write(b'x' * (3 << 20))"],
                          preexec_fn=fetch._capped_files, capture_output=True, text=True)
    assert proc.returncode != 0 and "File too large" in proc.stderr and out.stat().st_size <= 1 << 20
