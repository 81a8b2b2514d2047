"""`1bit-build release` on the mini project: two clones in two work dirs give byte-identical artifacts."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mini_project import git, make_mini

from builders.cli import main
from builders.release import repro

TAG = "v2026.48"


def clone(mini, dest: Path) -> Path:
    """A separate checkout of the mini project (its own path), committed like a real clone."""
    shutil.copytree(mini.root, dest)
    (dest / "LICENSE").write_text("Apache-2.0\n")
    (dest / "NOTICE").write_text("mini\n")
    (dest / "release.yaml").write_text("repo: 1bit-MONSTER/mini\n")
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", ".")
    git(dest, "commit", "-qm", "mini")
    return dest


def release(root: Path, base: Path) -> Path:
    rel = base / "release"
    code = main(["--root", str(root), "--cache", str(base / "cache"), "--work", str(base / "w"), "--out", str(base / "o"),
                 "release", "mini", "--tag", TAG, "--date", "2026-11-29", "--out", str(rel), "--offline"])
    assert code == 0
    return rel


@pytest.fixture
def mini(tmp_path):
    m = make_mini(tmp_path / "mini")
    shutil.copy(Path(__file__).resolve().parent.parent / "LICENSE", m.upstream / "LICENSE")
    # __FILE__ is an absolute path under the work dir unless the build maps it away
    main_c = (m.upstream / "main.c").read_text().replace('greet();', 'greet(); if (argc > 2) puts(__FILE__);')
    (m.upstream / "main.c").write_text(main_c)
    git(m.upstream, "add", "LICENSE", "main.c")
    git(m.upstream, "commit", "-qm", "license")
    commit = git(m.upstream, "rev-parse", "HEAD")
    git(m.upstream, "tag", "-f", "v1.0")
    m.set_pin(commit=commit)
    recipe = m.recipe()
    recipe["build"]["build_type"] = "RelWithDebInfo"  # debug info records the build dir
    m.write_recipe(recipe)
    m.commit = commit
    return m


def test_two_release_builds_are_byte_identical(mini, tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("ONEBIT_RELEASE_REPO", raising=False)
    monkeypatch.setenv("CCACHE_DISABLE", "1")  # ccache's base_dir would hide absolute paths
    a = release(clone(mini, tmp_path / "clone-a"), tmp_path / "a")
    b = release(clone(mini, tmp_path / "clone-b-with-a-longer-path"), tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert f"1bit-{TAG}-linux-x86_64.tar.zst" in names
    assert any(n.endswith(".conda") for n in names)
    shipped = [n for n in names if n.endswith((".conda", ".tar.zst", ".tar.gz", ".tar.xz"))]
    assert repro.compare_dirs(a, b, shipped) == []
    assert (a / "SHA256SUMS").read_text() == (b / "SHA256SUMS").read_text()
    assert os.path.getsize(a / "sbom.cdx.json") > 0
