"""builders/io/gitcmd.py: every git call of the bot and the release runs no hook, filter, fsmonitor or foreign config."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from builders.io import gitcmd


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


# ---- deadlines, and the files git must not open ---------------------------------------------------------------------
@pytest.mark.parametrize("args, sub, long", [
    (["fetch", "-q", "file:///m.git", "main"], "fetch", True),
    (["-c", "a=b", "--git-dir", "/c.git", "pack-objects", "--stdout"], "pack-objects", True),
    (["-C", "/src", "worktree", "add", "/wt"], "worktree", False),
    (["--git-dir=/c.git", "cat-file", "-t", "HEAD"], "cat-file", False),
    (["ls-remote", "--tags", "https://example.invalid/x.git"], "ls-remote", True),
    (["-c", "x=y"], "", False),
])
def test_subcommand_and_default_deadline(args, sub, long):
    assert gitcmd.subcommand(args) == sub
    want = gitcmd.TRANSFER_DEADLINE if long else gitcmd.LOCAL_DEADLINE
    assert gitcmd.deadline(args, environ={}) == want
    assert gitcmd.deadline(args, 7, environ={}) == 7  # the call's own
    assert gitcmd.deadline(args, 7, environ={gitcmd.TIMEOUT_ENV: "2.5"}) == 2.5  # the variable replaces every one


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "nan"])
def test_a_bad_timeout_variable_is_one_line(raw):
    with pytest.raises(gitcmd.GitError, match=f"ONEBIT_GIT_TIMEOUT='{raw}' is not a number of seconds"):
        gitcmd.deadline(["status"], environ={gitcmd.TIMEOUT_ENV: raw})


@pytest.mark.parametrize("args, cwd, want", [
    (["--git-dir", "/c.git", "fetch", "--depth=1", "https://h.invalid/x.git", "abc"], None, "https://h.invalid/x.git"),
    (["-c", "k=v", "--git-dir", "/m.git", "cat-file", "-t", "abc"], None, "/m.git"),
    (["-C", "src", "reset", "--hard"], "/w", "/w/src"),
    (["apply", "--check", "/p.patch"], "/w/src", "/w/src"),
    (["clone", "git@h.invalid:o/r.git", "/tmp/x"], None, "git@h.invalid:o/r.git"),
])
def test_the_repository_a_refusal_names(args, cwd, want):
    assert gitcmd.repository(args, cwd) == want


def _bare(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    _plain_git(path.parent, "init", "-q", "--bare", str(path))
    return path


def _socket(path):
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


@pytest.mark.parametrize("rel, make, want", [
    ("objects/info/alternates", os.mkfifo, "objects/info/alternates is a FIFO, not a regular file"),
    ("config", os.mkfifo, "config is a FIFO, not a regular file"),
    ("HEAD", os.mkfifo, "HEAD is a FIFO, not a regular file"),
    ("packed-refs", lambda p: p.symlink_to("/dev/zero"), "packed-refs is a link out of the repository (-> /dev/zero)"),
    ("shallow", _socket, "shallow is a socket, not a regular file"),
    ("info/grafts", lambda p: p.mkdir(), "info/grafts is a directory, not a regular file"),
    ("objects/pack/pack-1.idx", os.mkfifo, "objects/pack/pack-1.idx is a FIFO, not a regular file"),
    ("objects/info/http-alternates", lambda p: p.symlink_to("../../config.fifo"), "is a FIFO, not a regular file"),
    ("FETCH_HEAD", lambda p: p.symlink_to("../../elsewhere"), "FETCH_HEAD is a link out of the repository (-> ../../elsewhere)"),
    ("commondir", lambda p: (p.write_text("x\n"), os.replace(p, p.with_name("c2")), p.symlink_to("c2")), None),  # inside: fine
])
def test_special_files_of_a_repository(tmp_path, rel, make, want):
    repo = _bare(tmp_path / "r" / "m.git")
    os.mkfifo(repo / "config.fifo")  # a FIFO nobody names: only what git reads counts
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).unlink(missing_ok=True)
    make(repo / rel)
    problems = gitcmd.special_files(repo)
    if want is None:
        assert problems == []
        return
    assert len(problems) == 1 and problems[0].endswith(want) and str(repo) in problems[0], problems


def test_a_checkout_and_a_folder_that_is_no_repository(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    _plain_git(work, "init", "-q")
    os.mkfifo(work / ".git" / "config.lock")
    assert gitcmd.special_files(work) == []
    (work / ".git" / "config").unlink()
    os.mkfifo(work / ".git" / "config")
    assert gitcmd.special_files(work) == [f"{work / '.git' / 'config'} is a FIFO, not a regular file"]
    plain = tmp_path / "plain"  # a folder with a `config` FIFO that git would not take for a repository
    plain.mkdir()
    os.mkfifo(plain / "config")
    assert gitcmd.special_files(plain) == []


def _run_bounded(args, limit=60, **kw):
    """gitcmd.run in a child process with a test-level timeout (the old gitcmd.run waited forever)."""
    code = ("import sys, json; from builders import errors; from builders.io import gitcmd\n"
            "try:\n    p = gitcmd.run(json.loads(sys.argv[1]), **json.loads(sys.argv[2])); print('rc', p.returncode)\n"
            "except errors.OnebitError as e:\n    print('refused', e.what)\n")
    import json
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([str(a) for a in args]), json.dumps(kw)],
                          capture_output=True, text=True, timeout=limit, start_new_session=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout.strip()


def test_a_mirror_with_a_fifo_is_refused_before_git_runs(tmp_path):
    repo = _bare(tmp_path / "m.git")
    os.makedirs(repo / "objects" / "info", exist_ok=True)
    os.mkfifo(repo / "objects" / "info" / "alternates")
    out = _run_bounded(["--git-dir", repo, "cat-file", "-t", "HEAD"])
    assert out == f"refused refused before git cat-file ran: {repo}/objects/info/alternates is a FIFO, not a regular file"
    dst = _bare(tmp_path / "dst.git")  # the same repository as a remote, by file:// URL or by path
    for url in (repo.as_uri(), str(repo)):
        out = _run_bounded(["--git-dir", dst, "fetch", "-q", url, "main"])
        assert out.startswith("refused refused before git fetch ran: ") and "alternates is a FIFO" in out


def _commit_behind_a_fifo(src: Path) -> tuple[Path, str]:
    """A repository whose one commit is a loose object served through a FIFO: git blocks reading it. (src, commit)"""
    src.mkdir()
    _plain_git(src, "init", "-q", "-b", "main")
    _plain_git(src, "commit", "-q", "--allow-empty", "-m", "x")
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    loose = src / ".git" / "objects" / head[:2] / head[2:]
    loose.unlink()
    os.mkfifo(loose)
    return src, head


def test_a_git_past_its_deadline_is_killed_with_its_whole_group(tmp_path):
    """A fetch from a repository whose commit is a loose object served through a FIFO (where the check before git
    runs does not look): git and the upload-pack it started block on it; at the deadline both are killed and the
    call is refused in one line."""
    src, head = _commit_behind_a_fifo(tmp_path / "src")
    dst = _bare(tmp_path / "dst.git")
    out = _run_bounded(["--git-dir", dst, "fetch", "-q", src.as_uri(), "main"], timeout=2)
    assert out == (f"refused git fetch on {src.as_uri()} did not finish within 2 s: killed with every process it "
                   "started")
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).find(str(src)) >= 0]
    assert left == []


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_the_plan_commands_git_runs_under_its_deadline(tmp_path):
    """The executor's argv for a plan's git command: at the deadline coreutils' timeout kills the group (exit 124)."""
    src, head = _commit_behind_a_fifo(tmp_path / "src")
    argv = gitcmd.bounded_argv(["--git-dir", str(src / ".git"), "worktree", "add", "--detach", str(tmp_path / "wt"), head],
                               timeout=2)
    assert argv[:3] == ["timeout", "--kill-after=10", "2"]
    proc = subprocess.run(argv, capture_output=True, env=gitcmd.env(), timeout=60)
    assert proc.returncode == 124
    assert [p for p in os.listdir("/proc") if p.isdigit() and str(src) in _cmdline(p)] == []
