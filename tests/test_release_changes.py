"""changes.json and the release notes from real local git repositories."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from builders.release import changes, notes

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e",
       "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z", "PATH": "/usr/bin:/bin"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True, env=ENV).stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str | None]) -> str:
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def pins_yaml(pins: dict[str, str]) -> str:
    body = "".join(f"  {n}:\n    url: {u}\n    commit: {c}\n    license: MIT\n" for n, (u, c) in pins.items())
    return "schema_version: 1\npins:\n" + body


@pytest.fixture
def world(tmp_path):
    up = tmp_path / "upstream"
    up.mkdir()
    git(up, "init", "-q", "-b", "main")
    c0 = commit(up, "initial", {"a.c": "0"})
    c1 = commit(up, "ggml: faster matmul", {"a.c": "1"})
    c2 = commit(up, "server: fix health", {"a.c": "2"})
    cache = tmp_path / "cache" / f"{c2}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(up), str(cache)], check=True)

    proj = tmp_path / "project"
    proj.mkdir()
    git(proj, "init", "-q", "-b", "main")
    gh = "https://github.com/ggml-org/llama.cpp.git"
    commit(proj, "release v2026.47", {
        "pins.yaml": pins_yaml({"llama.cpp": (gh, c0), "zinc": ("https://example.org/zinc.git", "b" * 40)}),
        "recipes/patches/cpu/0001-old.patch": "old", "recipes/patches/cpu/0002-keep.patch": "v1"})
    git(proj, "tag", "v2026.47")
    commit(proj, "bump", {
        "pins.yaml": pins_yaml({"llama.cpp": (gh, c2), "zinc": ("https://example.org/zinc.git", "b" * 40),
                                "ds4": ("git@github.com:antirez/ds4.git", "c" * 40)}),
        "recipes/patches/cpu/0001-old.patch": None, "recipes/patches/cpu/0002-keep.patch": "v2",
        "recipes/patches/cpu/0003-new.patch": "new", "recipes/patches/cpu/README": "not a patch"})
    return {"proj": proj, "cache": cache, "c0": c0, "c1": c1, "c2": c2}


def test_changes_from_real_repos(world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.tar.gz").write_bytes(b"abc")
    (out / "SHA256SUMS").write_text("skip me")
    doc = changes.make_changes(
        tag="v2026.48", previous_tag="v2026.47", date="2026-11-29", repo=world["proj"], prev_rev="v2026.47",
        git_dir_for=lambda name, c: world["cache"] if name == "llama.cpp" else None,
        bumps=[changes.BumpResult("bump/zinc-abc"), changes.BumpResult("bump/llama.cpp-123", "build:cpu",
                                                                         "\n".join(f"line {i}" for i in range(40)))],
        artifacts=changes.artifact_sums(out))
    llama = doc["pins"]["llama.cpp"]
    assert (llama["from"], llama["to"], llama["commits"]) == (world["c0"], world["c2"], 2)
    assert llama["titles"] == ["server: fix health", "ggml: faster matmul"]
    assert llama["compare"] == f"https://github.com/ggml-org/llama.cpp/compare/{world['c0']}...{world['c2']}"
    assert doc["pins"]["zinc"]["commits"] == 0 and doc["pins"]["zinc"]["compare"] is None
    assert doc["pins"]["ds4"]["from"] is None and doc["pins"]["ds4"]["to"] == "c" * 40
    assert doc["patches"] == {"added": ["cpu/0003-new.patch"], "dropped": ["cpu/0001-old.patch"],
                              "refreshed": ["cpu/0002-keep.patch"]}
    assert doc["bumps"][0]["branch"] == "bump/llama.cpp-123" and doc["bumps"][0]["result"] == "held"
    assert doc["bumps"][0]["why"]["step"] == "build:cpu"
    assert doc["bumps"][0]["why"]["log"] == [f"line {i}" for i in range(20, 40)]
    assert doc["bumps"][1] == {"branch": "bump/zinc-abc", "result": "merged", "why": None}
    assert doc["artifacts"] == {"a.tar.gz": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}
    json.loads(changes.dumps(doc))

    md = notes.render(doc)
    assert md.startswith("# 1bit engine v2026.48\n")
    assert f"- **llama.cpp**: `{world['c0'][:12]}` → `{world['c2'][:12]}`, 2 commits" in md
    assert "  - server: fix health" in md
    assert "## Held back" in md and "- `bump/llama.cpp-123`: failed at step `build:cpu`" in md and "line 39" in md
    assert "- added: `cpu/0003-new.patch`" in md
    assert "| `a.tar.gz` |" in md


def test_missing_cache_and_first_release(world):
    doc = changes.make_changes(tag="v2026.48", previous_tag=None, date="2026-11-29", repo=world["proj"], prev_rev=None)
    assert doc["pins"]["llama.cpp"]["from"] is None and doc["pins"]["llama.cpp"]["commits"] is None
    assert "cpu/0003-new.patch" in doc["patches"]["added"]
    md = notes.render(doc)
    assert "Nothing was held back." in md
    assert f"- **llama.cpp**: new, at `{world['c2'][:12]}`" in md


@pytest.mark.parametrize("url, expected", [
    ("https://github.com/ggml-org/llama.cpp.git", "https://github.com/ggml-org/llama.cpp/compare/a...b"),
    ("https://github.com/o/r", "https://github.com/o/r/compare/a...b"),
    ("git@github.com:o/r.git", "https://github.com/o/r/compare/a...b"),
    ("https://gitlab.com/o/r.git", None),
    ("", None),
])
def test_compare_url(url, expected):
    assert changes.compare_url(url, "a", "b") == expected


def test_commit_log_unknown_commit(world):
    assert changes.commit_log(world["cache"], "d" * 40, world["c2"]) is None
    assert changes.commit_log(None, world["c0"], world["c2"]) is None
