"""The commit a release points at is the one it was assembled from: `release --target` checked against the checkout's
HEAD when building here, and against the commit the parts recorded (toolchain.json's `project`) with --from."""
from __future__ import annotations

import pytest
from mini_project import git
from test_release_build import TAG, clone, mini  # noqa: F401  (the mini fixture)

from builders.cli import main
from builders.release.target import Built, TargetError, decide, resolve
from builders.ship.toolchain_record import checkout

A, B, C = "a" * 40, "b" * 40, "c" * 40


@pytest.mark.parametrize("kw, expected", [
    # building here: HEAD, when the release points anywhere
    ({"given": None, "head": A}, None),
    ({"given": None, "head": A, "publish": True}, A),
    ({"given": A, "head": A}, A),
    ({"given": A, "head": A, "publish": True}, A),
    # --from: the commit every part recorded; parts from before builds recorded it take the checkout's word
    ({"given": None, "head": A, "parts": [Built("p1", A), Built("p2", A)], "publish": True}, A),
    ({"given": A, "head": A, "parts": [Built("p1", A), Built("old", None)]}, A),
    ({"given": A, "head": None, "parts": [Built("p1", A)]}, A),
    ({"given": A, "head": A, "parts": [Built("old", None)]}, A),
    ({"given": None, "head": A, "parts": [Built("p1", A), Built("p2", B)]}, None),  # points nowhere: nothing to check
])
def test_the_target_is_what_was_built(kw, expected):
    assert decide(**kw) == expected


@pytest.mark.parametrize("kw, message", [
    ({"given": B, "head": A}, f"--target {B} is not the commit this release is built from: the checkout is at {A}"),
    ({"given": A, "head": None}, "is not a git checkout with a commit"),
    ({"given": None, "head": None, "publish": True}, "is not a git checkout with a commit"),
    ({"given": A, "head": A, "modified": ["recipes/cpu.yaml"]}, "has uncommitted changes (recipes/cpu.yaml): what was built"),
    ({"given": B, "head": A, "parts": [Built("built/cpu", A)]},
     f"--target {B} is not the commit the parts were built from: {A} (the `project` of built/cpu/toolchain.json)"),
    ({"given": None, "head": A, "parts": [Built("built/cpu", A), Built("built/cuda", B)], "publish": True},
     f"the parts were built from 2 commits: {A} (built/cpu); {B} (built/cuda)"),
    ({"given": A, "head": A, "parts": [Built("built/cuda", A, ("recipes/cuda.yaml",))]},
     f"built/cuda was built from uncommitted changes on top of {A} (recipes/cuda.yaml)"),
    ({"given": A, "head": C, "parts": [Built("built/cpu", A)]}, f"this checkout is at {C}, the parts were built from {A}"),
    ({"given": B, "head": A, "parts": [Built("old", None)]},
     f"--target {B} is not the commit this release is assembled from: the checkout is at {A}"),
    ({"given": A, "head": A, "modified": ["pins.yaml"], "parts": [Built("built/cpu", A)]},
     "has uncommitted changes (pins.yaml): what assembles the release is not a commit"),
])
def test_a_target_other_than_what_was_built_is_refused(kw, message):
    with pytest.raises(TargetError) as e:
        decide(**kw)
    assert message in str(e.value)


def test_resolve_and_checkout(tmp_path, mini):  # noqa: F811
    root = clone(mini, tmp_path / "clone")
    head = git(root, "rev-parse", "HEAD")
    assert resolve(root, head[:9]) == resolve(root, "HEAD") == resolve(root, "main") == head
    assert resolve(root, C) == C  # a full id this clone lacks is taken as written (and then compared)
    with pytest.raises(TargetError, match="--target nope: no such commit"):
        resolve(root, "nope")
    assert checkout(root) == {"commit": head, "modified": []}
    (root / "pins.yaml").write_text((root / "pins.yaml").read_text() + "# edited\n")
    (root / "untracked.txt").write_text("not part of any build\n")
    assert checkout(root) == {"commit": head, "modified": ["pins.yaml"]}
    assert checkout(tmp_path / "nowhere-near-git") is None


def test_building_here_refuses_a_target_other_than_head_before_building(tmp_path, mini, capsys):  # noqa: F811
    root = clone(mini, tmp_path / "clone")
    head = git(root, "rev-parse", "HEAD")
    (root / "NOTICE").write_text("mini, later\n")
    git(root, "commit", "-qam", "later")
    base = tmp_path / "b"
    argv = ["--root", str(root), "--cache", str(base / "cache"), "--work", str(base / "w"), "--out", str(base / "o"),
            "release", "mini", "--tag", TAG, "--date", "2026-11-29", "--offline", "--out", str(base / "r")]
    assert main([*argv, "--target", head[:12]]) == 2
    err = capsys.readouterr().err
    assert f"--target {head} is not the commit this release is built from: the checkout is at " \
           f"{git(root, 'rev-parse', 'HEAD')}" in err
    assert "Traceback" not in err and not (base / "w").exists() and not (base / "r").exists()  # nothing was built
