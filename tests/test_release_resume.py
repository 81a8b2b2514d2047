"""`1bit-build release --publish` on the mini project against the fake GitHub API: an interrupted publish is resumed by
the next run under the same tag and draft, the release points at the commit that was built, and `--merge-bumps`
merges a passing bump branch before the build (and pushes it before the release points at it)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from github_fake import REPO, TOKEN, Fake
from mini_project import git
from test_release_build import TAG, clone, mini  # noqa: F401  (the mini fixture)

from builders.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(monkeypatch):
    f = Fake()
    monkeypatch.setenv("ONEBIT_GITHUB_API", f.url)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("ONEBIT_RELEASE_REPO", REPO)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    for var in ("GITHUB_REF_NAME", "ONEBIT_PINS_BASE", "ONEBIT_PINS_REMOTE"):
        monkeypatch.delenv(var, raising=False)
    yield f
    f.close()


def argv(root, base, *extra):
    return ["--root", str(root), "--cache", str(base / "cache"), "--work", str(base / "w"), "--out", str(base / "o"),
            "release", "mini", "--date", "2026-11-29", "--offline", "--publish", *extra]


def test_a_release_killed_while_publishing_is_resumed_under_the_same_tag(mini, tmp_path, fake, capsys):  # noqa: F811
    root = clone(mini, tmp_path / "clone")
    built = git(root, "rev-parse", "HEAD")
    base = tmp_path / "b"
    # the last asset: the uploader is killed while it is sent
    fake.kill_mid_upload("SHA256SUMS", [sys.executable, "-c", "import sys; from builders.cli import main; "
                                        "sys.exit(main(sys.argv[1:]))", *argv(root, base, "--out", str(base / "r1"))],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, wait=300)
    [rel] = fake.releases.values()
    assert (rel["tag_name"], rel["draft"], rel["target_commitish"]) == (TAG, True, built)

    # the re-run: this week's draft is this run's, so the same tag (not a respin), and the same draft, finished
    assert main(argv(root, base, "--out", str(base / "r2"))) == 0
    assert "(resumed draft)" in capsys.readouterr().err
    assert list(fake.releases) == [rel["id"]]
    assert (fake.releases[rel["id"]]["tag_name"], fake.releases[rel["id"]]["draft"]) == (TAG, False)
    names = sorted(a["name"] for a in fake.assets.values())
    assert names == sorted(p.name for p in (base / "r2").iterdir())  # every asset exactly once
    for a in fake.assets.values():
        assert a["state"] == "uploaded" and a["_data"] == (base / "r2" / a["name"]).read_bytes()
    # a later run of the same week: the published release's tag is taken, so a respin
    assert main(argv(root, base, "--out", str(base / "r3"))) == 0
    assert fake.releases[max(fake.releases)]["tag_name"] == f"{TAG}.1"


def test_a_draft_of_another_commit_is_not_resumed(mini, tmp_path, fake, capsys):  # noqa: F811
    root = clone(mini, tmp_path / "clone")
    fake.add_release(TAG, draft=True, target="0" * 40)
    assert main(argv(root, tmp_path / "b")) == 2
    err = capsys.readouterr().err
    assert f"the draft {TAG}" in err and f"this run built {git(root, 'rev-parse', 'HEAD')}" in err


def test_a_dirty_checkout_is_not_published(mini, tmp_path, fake, capsys):  # noqa: F811
    root = clone(mini, tmp_path / "clone")
    (root / "recipes" / "hello.yaml").write_text((root / "recipes" / "hello.yaml").read_text() + "# edited\n")
    assert main(argv(root, tmp_path / "b")) == 2
    assert "uncommitted changes (recipes/hello.yaml)" in capsys.readouterr().err
    assert fake.releases == {}


def test_merge_bumps_builds_the_merged_commit_and_points_the_release_at_it(mini, tmp_path, fake):  # noqa: F811
    root = clone(mini, tmp_path / "clone")
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    git(root, "remote", "add", "origin", origin.as_uri())
    git(root, "push", "-q", "origin", "main")
    old = mini.commit
    new = mini.commit_upstream("main.c", (mini.upstream / "main.c").read_text() + "/* 1.1 */\n", "hello 1.1")
    git(mini.upstream, "tag", "v1.1")
    branch = f"bump/hello-{new[:12]}"  # what the pin bot pushes: pins.yaml moved on top of main
    git(root, "checkout", "-q", "-b", branch)
    text = (root / "pins.yaml").read_text()
    assert "tag: v1.0" in text
    (root / "pins.yaml").write_text(text.replace(old, new).replace("tag: v1.0", "tag: v1.1"))
    git(root, "commit", "-qam", f"Bump hello to {new[:12]}")
    head = git(root, "rev-parse", "HEAD")
    git(root, "push", "-q", "origin", branch)
    git(root, "checkout", "-q", "main")
    fake.pull(branch, head)
    fake.check(head, "tests", "success")

    base = tmp_path / "b"
    assert main(argv(root, base, "--merge-bumps", "--out", str(base / "r"))) == 0
    merged = git(root, "rev-parse", "HEAD")
    assert git(root, "rev-parse", "HEAD^2") == head  # a merge commit of the bump
    assert git(origin, "rev-parse", "refs/heads/main") == merged  # pushed before the release pointed at it
    [rel] = fake.releases.values()
    assert (rel["tag_name"], rel["draft"], rel["target_commitish"]) == (TAG, False, merged)
    doc = json.loads((base / "r" / "changes.json").read_text())
    assert doc["bumps"] == [{"branch": branch, "result": "merged", "why": None}]
    assert doc["pins"]["hello"]["to"] == new  # built from the bumped pin (the first release: no "from")
    assert f"- `{branch}`" in (base / "r" / "notes.md").read_text()
    manifest = base / "o" / "manifest.json"  # the bundle that was built records the bumped commit
    assert new in manifest.read_text()
