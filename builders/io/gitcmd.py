"""gitcmd: the one way this project runs git (the build, the pin bot, the release).

Every fetched repository is untrusted input, so git never runs anything from one or from a writable hook dir:
- `core.hooksPath=/dev/null` (no hook of any repository runs), `core.fsmonitor=false`;
- no system or global config (GIT_CONFIG_NOSYSTEM=1, GIT_CONFIG_GLOBAL=/dev/null): no filter driver, credential
  helper, `core.sshCommand`, `url.*.insteadOf` or alias of this host's users reaches our calls;
- filter drivers off: `core.attributesFile=/dev/null`, and no driver is configured anywhere git reads (the
  repositories' own config is written only by us), so a `.gitattributes` naming one runs nothing;
- protocols: https, http and ssh; `file` (and plain paths) only where the call names a local mirror
  (`allow_file`, by default: an argument of the call is a file:// URL or a directory's path); `ext` and every other protocol never.

Every call has a deadline and never waits on a special file:
- `deadline(args)`: TRANSFER_DEADLINE (30 min) for the calls that move a repository's history (fetch, clone, push,
  pack-objects ...), LOCAL_DEADLINE (5 min) for local plumbing; a call may name its own, and $ONEBIT_GIT_TIMEOUT
  (seconds) replaces every one. At the deadline git's whole process group is killed (builders/io/runner.py: it runs in its own
  session) and the call is refused in one line naming the command and the repository (GitError).
- `special_files(...)`: before git runs, every repository the call was given to read (its `--git-dir`, a local URL or
  folder among its arguments) has each file git reads at start (READS: config, HEAD, packed-refs,
  objects/info/alternates ...) and each pack file checked: a FIFO, device, socket or directory there, or a link out
  of the repository, would block git or send it elsewhere, so the call is refused in one line naming the file. Loose objects and refs are not walked
  (a repository holds too many): a FIFO among them is what the deadline is for.

`argv(args)`, `env(extra)`, `deadline(args)` and `repository(args)` are pure; `run(...)` is the thin effect. Callers
that run git through another runner (the plan's commands) wrap their argv with `bounded_argv` and check the
repositories with `refuse_special_files` first.
"""
from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import runner, treepath
from ..errors import FetchError

GIT = "git"
# the settings every call carries, in the order given on the command line
HARDENED = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.attributesFile", "/dev/null"),
    ("protocol.allow", "never"),
    ("protocol.https.allow", "always"),
    ("protocol.http.allow", "always"),
    ("protocol.ssh.allow", "always"),
    ("protocol.ext.allow", "never"),
)
# variables of the caller's environment that would change what git runs or which repository it works on
DROPPED = ("GIT_DIR", "GIT_INDEX_FILE", "GIT_WORK_TREE", "GIT_SSH_COMMAND", "GIT_SSH", "GIT_ASKPASS", "GIT_EXEC_PATH",
           "GIT_CONFIG", "GIT_CONFIG_PARAMETERS", "GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_TEMPLATE_DIR",
           "GIT_PROXY_COMMAND", "GIT_ALLOW_PROTOCOL", "GIT_PROTOCOL_FROM_USER", "GIT_ATTR_SOURCE")


TIMEOUT_ENV = "ONEBIT_GIT_TIMEOUT"  # seconds: replaces the deadline of every git call
TRANSFER_DEADLINE = 1800.0  # s: a fetch, clone or push of a big repository over a slow link
LOCAL_DEADLINE = 300.0  # s: local plumbing (cat-file, rev-list, worktree add, apply ...)
# the calls that move (or walk) a repository's whole history: the long deadline
TRANSFER = frozenset({"fetch", "clone", "pull", "push", "ls-remote", "fetch-pack", "send-pack", "pack-objects",
                      "index-pack", "unpack-objects", "bundle", "rebase", "merge", "repack", "gc"})
# global options that take a value (`git -C dir`, `--git-dir dir`): skipped when looking for the subcommand
_VALUED = ("-c", "-C", "--git-dir", "--work-tree", "--namespace", "--exec-path", "--config-env", "--super-prefix")
# the files git reads from a repository at start (or on a fetch from it), relative to its git dir
READS = ("HEAD", "config", "packed-refs", "shallow", "commondir", "FETCH_HEAD", "info/grafts", "objects/info/alternates",
         "objects/info/http-alternates", "objects/info/packs", "objects/info/commit-graph")
# folders whose every file git may open (pack indexes and packs, split commit-graphs)
READ_DIRS = ("objects/pack", "objects/info/commit-graphs")


class GitError(FetchError):
    """A git call refused: it did not finish by its deadline (killed), or a repository it names holds a special file
    that git would block on or be sent elsewhere by."""


def subcommand(args: Sequence[str]) -> str:
    """Pure: git's subcommand in `args` (after the global options), or "" when there is none."""
    i = 0
    while i < len(args):
        a = str(args[i])
        if a in _VALUED:
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return a
    return ""


def _option(args: Sequence[str], name: str) -> list[str]:
    """Pure: every value of a global option (`--git-dir X` or `--git-dir=X`) before the subcommand."""
    out, i = [], 0
    while i < len(args):
        a = str(args[i])
        if a == name and i + 1 < len(args):
            out.append(str(args[i + 1]))
        elif a.startswith(name + "="):
            out.append(a.split("=", 1)[1])
        if a in _VALUED:
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            break
    return out


def _looks_remote(arg: str) -> bool:
    return "://" in arg or arg.startswith("/") or ("@" in arg.split(":", 1)[0] and ":" in arg)


def repository(args: Sequence[str], cwd: str | os.PathLike | None = None) -> str:
    """Pure: the repository a call is about, for its refusal line: the remote of a transfer (its first URL or
    path argument), else the `--git-dir` or `-C` it names, else its working directory."""
    args = [str(a) for a in args]
    sub = subcommand(args)
    if sub in TRANSFER and sub in args:
        remote = next((a for a in args[args.index(sub) + 1:] if not a.startswith("-") and _looks_remote(a)), None)
        if remote:
            return remote
    named = _option(args, "--git-dir") or _option(args, "-C")
    if named:
        return str(Path(cwd or ".") / named[-1]) if cwd and not named[-1].startswith("/") else named[-1]
    return str(cwd) if cwd is not None else "."


def deadline(args: Sequence[str], timeout: float | None = None, environ: Mapping[str, str] | None = None) -> float:
    """Seconds a call may run: $ONEBIT_GIT_TIMEOUT when set (every call), else the call's own `timeout`, else
    TRANSFER_DEADLINE for a transfer and LOCAL_DEADLINE for local plumbing."""
    raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if not 0 < value < 1e7:
            raise GitError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds",
                           hint="set it to the deadline of every git call in seconds (e.g. 3600), or unset it")
        return value
    if timeout is not None:
        return float(timeout)
    return TRANSFER_DEADLINE if subcommand(args) in TRANSFER else LOCAL_DEADLINE


def _kind(mode: int) -> str | None:
    """Pure: what a file of this mode is, when git must not open it (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a directory" if stat.S_ISDIR(mode) else "an unknown kind of file")


def special_file(top: Path, rel: str, *, folder_ok: bool = False) -> str | None:
    """Why git must not read `top/rel` (one line naming it), or None: nothing there, or a regular file (a folder where
    `folder_ok`) reached through links that stay inside `top` (resolved by their text, builders/io/treepath.py)."""
    path = top / rel
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"

    def readlink(r: str) -> str | None:
        return os.readlink(top / r) if (top / r).is_symlink() else None

    if stat.S_ISLNK(st.st_mode) or treepath.resolve(rel, readlink, follow_last=False) != rel:
        if treepath.resolve(rel, readlink) is None:
            how = f"-> {os.readlink(path)}" if path.is_symlink() else "through a linked folder"
            return f"{path} is a link out of the repository ({how})"
        try:
            st = os.stat(path)
        except OSError:
            return None  # a dangling link: git finds nothing there, as with no file
    if folder_ok and stat.S_ISDIR(st.st_mode):
        return None
    kind = _kind(st.st_mode)
    return f"{path} is {kind}, not a regular file" if kind else None


def is_git_dir(path: Path) -> bool:
    """A folder git would take for a repository (its `objects` and `refs` folders and a HEAD of any kind), not
    just any folder with a `config` in it."""
    return (path / "objects").is_dir() and (path / "refs").is_dir() and os.path.lexists(path / "HEAD")


def special_files(repo: Path) -> list[str]:
    """Every reason git must not read the repository at `repo` (a git dir, or a checkout with its `.git`): each file
    of READS and the entries of READ_DIRS of every git dir there, and a checkout's `.git` (a folder, or the regular
    file of a worktree). A folder that is no repository has none."""
    problems = [p for p in (special_file(repo, ".git", folder_ok=True),) if p]
    tops = [t for t in (repo, repo / ".git") if not t.is_symlink() and t.is_dir() and is_git_dir(t)]
    for top in tops:
        problems += [p for p in (special_file(top, rel) for rel in READS) if p]
        for folder in READ_DIRS:
            if (top / folder).is_symlink() or not (top / folder).is_dir():
                continue
            try:
                names = sorted(os.listdir(top / folder))
            except OSError:
                continue
            problems += [p for p in (special_file(top, f"{folder}/{n}", folder_ok=True) for n in names) if p]
    return problems


def repositories(args: Sequence[str], cwd: str | os.PathLike | None = None) -> list[Path]:
    """Pure: the repositories a call was given to read: its `--git-dir`, and every local URL or folder among the
    arguments of its subcommand (a mirror, a remote). Not `-C` or its working directory: those are our own
    checkouts, the user's or ones we made."""
    args = [str(a) for a in args]
    base = Path(cwd) if cwd is not None else Path(".")
    out = [base / d for d in _option(args, "--git-dir")]
    sub = subcommand(args)
    for a in args[args.index(sub) + 1:] if sub else []:
        if a.startswith("file://"):
            out.append(Path(a[len("file://"):]))
        elif a.startswith("/"):
            out.append(Path(a))
    seen: list[Path] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen


def refuse_special_files(args: Sequence[str], cwd: str | os.PathLike | None = None) -> None:
    """Raise GitError (one line naming the file) when a repository the call reads holds a file git must not open."""
    for repo in repositories(args, cwd):
        problems = special_files(repo) if repo.is_dir() else []
        if problems:
            raise GitError(f"refused before git {subcommand(args) or ''} ran: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                           hint="git would block reading it, or read another repository's files through it: "
                                "replace it with a regular file (or remove the repository), then run again")


def timed_out(args: Sequence[str], cwd, seconds: float) -> GitError:
    """The one-line refusal of a call that ran past its deadline."""
    return GitError(f"git {subcommand(args) or ' '.join(str(a) for a in args)[:60]} on {repository(args, cwd)} did not "
                    f"finish within {seconds:g} s: killed with every process it started",
                    hint="a repository or server that never answers (a FIFO among a mirror's files, a stalled "
                         f"connection): check it, or give git longer with {TIMEOUT_ENV}=SECONDS")


def is_local_url(arg: str) -> bool:
    """A local mirror: a file:// URL or an absolute path of a directory (git's local transport)."""
    return arg.startswith("file://") or (arg.startswith("/") and os.path.isdir(arg))


def argv(args: Sequence[str], *, allow_file: bool | None = None) -> list[str]:
    """`git -c ... <args>` with the hardened settings; `allow_file` None: allowed when an argument is a local mirror."""
    if allow_file is None:
        allow_file = any(is_local_url(str(a)) for a in args)
    out = [GIT]
    for key, value in HARDENED + (("protocol.file.allow", "always" if allow_file else "never"),):
        out += ["-c", f"{key}={value}"]
    return out + [str(a) for a in args]


def env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without what redirects git, plus no system/global config, no prompt, and `extra`."""
    out = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in DROPPED and not k.startswith("GIT_CONFIG_")}
    out.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
                "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0"})
    out.update(extra or {})
    return out


def bounded_argv(args: Sequence[str], *, timeout: float | None = None, allow_file: bool | None = None) -> list[str]:
    """`argv(args)` under coreutils' timeout, for a runner of its own (the plan's commands): at the deadline the
    whole group gets TERM, then KILL 10 s later, and the command exits 124."""
    return ["timeout", "--kill-after=10", f"{deadline(args, timeout):g}", *argv(args, allow_file=allow_file)]


def run(args: Sequence[str], *, cwd=None, input: str | bytes | None = None, text: bool = True, check: bool = False,
        timeout: float | None = None, extra_env: Mapping[str, str] | None = None, allow_file: bool | None = None,
        user_config: bool = False, stdin=None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    """A hardened git call with a deadline (`deadline`), capturing its output (stdout to a file where one is given).

    Refused (GitError, one line) before git runs when a repository it reads holds a special file, and when it runs
    past its deadline (its process group killed). `user_config`: keep the system and global config (only for reading
    the user's own settings, `ls-remote --get-url`'s insteadOf rules; never for a call that reads a repository)."""
    args = [str(a) for a in args]
    refuse_special_files(args, cwd)
    seconds = deadline(args, timeout)
    environ = env(extra_env)
    if user_config:  # the caller's own config, as plain git reads it
        for k in ("GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL"):
            environ.pop(k, None)
        environ.update({k: v for k, v in os.environ.items() if k.startswith("GIT_CONFIG")})
    try:
        return runner.run(argv(args, allow_file=allow_file), cwd=cwd, input=input, text=text, errors=None, check=check,
                          timeout=seconds, env=environ, stdin=stdin, stdout=stdout)
    except runner.TimedOut:
        raise timed_out(args, cwd, seconds) from None
