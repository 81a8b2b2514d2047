"""builders/gitcmd.py: every git call of the bot and the release runs no hook, filter, fsmonitor or foreign config."""
from __future__ import annotations

import os
import subprocess

import pytest

from builders import gitcmd


@pytest.mark.parametrize("args, file_allowed", [
    (["fetch", "file:///srv/mirror.git", "main"], "always"),
    (["fetch", "https://example.invalid/x.git", "main"], "never"),
    (["ls-remote", "ext::sh -c touch% /tmp/pwned"], "never"),
    (["status"], "never"),
])
def test_argv_carries_the_hardened_settings(args, file_allowed):
    argv = gitcmd.argv(args)
    settings = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    assert settings["core.hooksPath"] == "/dev/null" and settings["core.fsmonitor"] == "false"
    assert settings["protocol.ext.allow"] == "never" and settings["protocol.allow"] == "never"
    assert settings["protocol.file.allow"] == file_allowed and argv[-len(args):] == args


def test_env_drops_what_redirects_git():
    env = gitcmd.env({"X": "1"}, base={"GIT_DIR": "/x", "GIT_SSH_COMMAND": "evil", "GIT_CONFIG_COUNT": "1", "PATH": "/usr/bin"})
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert "GIT_DIR" not in env and "GIT_SSH_COMMAND" not in env and "GIT_CONFIG_COUNT" not in env and env["X"] == "1"


def _plain_git(cwd, *args, env=None):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@x", **(env or {})})


def test_no_hook_no_filter_no_global_config_runs(tmp_path, monkeypatch):
    """A repository whose .git/hooks and local config name programs, and a global config with a filter driver: a
    checkout through gitcmd runs none of them (plain git does: the control)."""
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "ran"
    (home / ".gitconfig").write_text(f"[filter \"x\"]\n\tsmudge = sh -c 'echo global-filter >> {marker} && cat'\n")
    monkeypatch.setenv("HOME", str(home))
    repo = tmp_path / "repo"
    repo.mkdir()
    _plain_git(repo, "init", "-q", "-b", "main")
    (repo / ".gitattributes").write_text("*.txt filter=x\n")
    (repo / "a.txt").write_text("a\n")
    _plain_git(repo, "add", ".")
    _plain_git(repo, "commit", "-qm", "one")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\necho hook >> {marker}\n")
    hook.chmod(0o755)
    (repo / "a.txt").unlink()
    assert gitcmd.run(["checkout", "--", "a.txt"], cwd=repo).returncode == 0
    gitcmd.run(["checkout", "-q", "-b", "other"], cwd=repo, check=True)
    assert (repo / "a.txt").read_text() == "a\n" and not marker.exists()
    (repo / "a.txt").unlink()
    _plain_git(repo, "checkout", "--", "a.txt")  # the control: plain git runs the global filter and the hook
    assert marker.read_text().split() == ["global-filter", "hook"]


def test_a_file_url_is_refused_unless_named(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _plain_git(src, "init", "-q", "-b", "main")
    _plain_git(src, "commit", "-q", "--allow-empty", "-m", "x")
    dst = tmp_path / "dst"
    _plain_git(tmp_path, "init", "-q", "--bare", str(dst))
    _plain_git(dst, "remote", "add", "origin", src.as_uri())
    refused = gitcmd.run(["fetch", "-q", "origin", "main"], cwd=dst)  # the URL hides in config: not allowed
    assert refused.returncode != 0 and "transport 'file' not allowed" in refused.stderr
    assert gitcmd.run(["fetch", "-q", "origin", "main"], cwd=dst, allow_file=True).returncode == 0
    assert gitcmd.run(["fetch", "-q", src.as_uri(), "main"], cwd=dst).returncode == 0
