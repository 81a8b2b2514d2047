"""Thin git effects for the pin bot: ls-remote, a scratch repository for ancestry checks, fork rebase/merge.

Resolution never clones: `ls-remote` names the candidate, and the ancestry check fetches only commits
(`--filter=tree:0`, no trees or blobs) of the refs involved into a throw-away bare repository.
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..io import gitcmd
from ..errors import OnebitError
from . import secrets

SHA = re.compile(r"^[0-9a-f]{40}$")
BOT_NAME = "1bit pin bot"
BOT_EMAIL = "pins-bot@1bit.invalid"


def _identity(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The bot's identity unless the caller set one, and `extra`: what git gets on top of the hardened environment
    (builders/io/gitcmd.py)."""
    ident = {"GIT_AUTHOR_NAME": os.environ.get("GIT_AUTHOR_NAME", BOT_NAME),
             "GIT_AUTHOR_EMAIL": os.environ.get("GIT_AUTHOR_EMAIL", BOT_EMAIL)}
    ident["GIT_COMMITTER_NAME"] = os.environ.get("GIT_COMMITTER_NAME", ident["GIT_AUTHOR_NAME"])
    ident["GIT_COMMITTER_EMAIL"] = os.environ.get("GIT_COMMITTER_EMAIL", ident["GIT_AUTHOR_EMAIL"])
    return {**ident, **(extra or {})}


LOOPBACK_HTTP = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?/")


def may_send_token(url: str) -> bool:
    """The token goes only to https remotes (and plain http on loopback, for local test servers)."""
    return url.startswith("https://") or bool(LOOPBACK_HTTP.match(url))


def auth_env(url: str, token: str | None) -> dict[str, str]:
    """Environment that gives git an `http.<url>.extraheader` with the bot token (GIT_CONFIG_COUNT/KEY/VALUE).

    Never on the command line: any local user can read a process's argv in /proc, but only its owner its environment.
    Never in the URL either."""
    if not token or not may_send_token(url):
        return {}
    secrets.register(token)
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    n = 0  # gitcmd.env drops the caller's GIT_CONFIG_* variables: this is the only one
    return {"GIT_CONFIG_COUNT": str(n + 1), f"GIT_CONFIG_KEY_{n}": f"http.{url}.extraheader",
            f"GIT_CONFIG_VALUE_{n}": f"AUTHORIZATION: basic {basic}"}


def git(args: Sequence[str], *, cwd: Path | str | None = None, check: bool = True, input: str | None = None,
        what: str = "", where: str | None = None, hint: str | None = None, timeout: float | None = None,
        env: dict[str, str] | None = None, allow_file: bool | None = None) -> subprocess.CompletedProcess:
    """Run git (builders/io/gitcmd.py: hardened, with a deadline, `timeout` or gitcmd's); on failure raise an
    OnebitError that names the command's purpose and git's own message."""
    try:
        proc = gitcmd.run(args, cwd=cwd, input=input, timeout=timeout, extra_env=_identity(env), allow_file=allow_file)
    except gitcmd.GitError as exc:  # past its deadline, or a repository it reads holds a special file
        raise OnebitError(secrets.redact(f"{what}: {exc.what}" if what else exc.what), where=where,
                          hint=hint or exc.hint) from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        msg = [secrets.redact(m) for m in msg if "extraheader" not in m]
        detail = " / ".join(msg[-3:]) or f"exit {proc.returncode}"
        raise OnebitError(f"{what}: {detail}" if what else f"git {args[0]} failed: {detail}", where=where, hint=hint)
    return proc


def ls_remote(url: str, *patterns: str, where: str | None = None, tags: bool = False) -> dict[str, str]:
    """ref -> commit of a remote, peeled (an annotated tag maps to the commit it names)."""
    patterns = tuple(patterns) + tuple(f"{p}^{{}}" for p in patterns if p.startswith("refs/tags/") and not p.endswith("^{}"))
    args = ["ls-remote", *(["--tags"] if tags else []), url, *patterns]
    proc = git(args, what=f"cannot reach {url}", where=where, hint="check the url in pins.yaml and the network; nothing was changed", timeout=120)
    refs: dict[str, str] = {}
    peeled: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if "\t" not in line:
            continue
        sha, ref = line.split("\t", 1)
        if ref.endswith("^{}"):
            peeled[ref[:-3]] = sha
        else:
            refs[ref] = sha
    refs.update(peeled)
    return refs


def branch_head(url: str, branch: str, *, where: str | None = None) -> str:
    refs = ls_remote(url, f"refs/heads/{branch}", where=where)
    sha = refs.get(f"refs/heads/{branch}")
    if not sha:
        raise OnebitError(f"{url} has no branch {branch!r}", where=where, hint="check `branch:` in pins.yaml (was it renamed?)")
    return sha


def tag_commits(url: str, *, where: str | None = None) -> dict[str, str]:
    """tag name -> commit (peeled)."""
    return {ref[len("refs/tags/"):]: sha for ref, sha in ls_remote(url, tags=True, where=where).items() if ref.startswith("refs/tags/")}


class Scratch:
    """A throw-away bare repository that holds just enough history to answer ancestry questions."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="onebit-pins-"))
        git(["init", "--quiet", "--bare", str(self.dir)])

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def has(self, sha: str) -> bool:
        return git(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=self.dir, check=False).returncode == 0

    def fetch(self, url: str, wants: Sequence[str], *, where: str | None = None, filter: str = "tree:0") -> None:
        """Fetch commits (and their history) of refs or SHAs. A SHA the server will not serve is left out quietly;
        `has` tells what arrived."""
        base = ["-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", f"--filter={filter}", url]
        refs = [w for w in wants if not SHA.match(w)]
        shas = [w for w in wants if SHA.match(w) and not self.has(w)]
        if refs:
            git(base + [f"+{r}:refs/onebit/{i}/{r.split('/')[-1]}" for i, r in enumerate(refs)], cwd=self.dir,
                what=f"cannot fetch {', '.join(refs)} from {url}", where=where)
        for sha in shas:
            if not self.has(sha):
                git(base + [f"{sha}:refs/onebit/sha/{sha}"], cwd=self.dir, check=False)

    def fetch_everything(self, url: str, *, where: str | None = None) -> None:
        """Commits of every branch and tag (the fallback when a server refuses to serve a SHA)."""
        git(["fetch", "--quiet", "--no-tags", "--filter=tree:0", url, "+refs/heads/*:refs/onebit/all/heads/*",
             "+refs/tags/*:refs/onebit/all/tags/*"], cwd=self.dir, what=f"cannot fetch from {url}", where=where)

    def fetch_tree(self, url: str, want: str, *, where: str | None = None) -> None:
        """One commit with its whole tree (depth 1), for checking patches on it."""
        git(["fetch", "--quiet", "--no-tags", "--depth=1", url, want], cwd=self.dir,
            what=f"cannot fetch {want[:12]} from {url}", where=where)

    def is_ancestor(self, old: str, new: str) -> bool:
        if not (self.has(old) and self.has(new)):
            return False
        return git(["merge-base", "--is-ancestor", old, new], cwd=self.dir, check=False).returncode == 0

    def count(self, old: str, new: str) -> int | None:
        if not (self.has(old) and self.has(new)):
            return None
        proc = git(["rev-list", "--count", f"{old}..{new}"], cwd=self.dir, check=False)
        return int(proc.stdout.strip()) if proc.returncode == 0 else None


@dataclass(frozen=True)
class Ancestry:
    old_in_new: bool
    new_in_old: bool
    count: int | None


def ancestry(url: str, old: str, new: str, *, new_ref: str | None = None, old_ref: str | None = None,
             where: str | None = None) -> Ancestry:
    """Whether `old` is an ancestor of `new` (and the reverse), from a commits-only fetch of `url`.

    The full commit history of `new` is fetched, so an `old` that is absent from it is not its ancestor even when
    the server no longer serves `old` (force-pushed away)."""
    with Scratch() as s:
        s.fetch(url, [r for r in (new_ref, old_ref) if r] + [new, old], where=where)
        if not s.has(new):
            s.fetch_everything(url, where=where)
        if not s.has(new):
            raise OnebitError(f"commit {new[:12]} is not available from {url}", where=where,
                              hint="the ref may have moved while the bot ran; run the bump again")
        return Ancestry(s.is_ancestor(old, new), s.is_ancestor(new, old), s.count(old, new))


# ------------------------------------------------------------------------------------------------ forks


class ForkConflict(OnebitError):
    def __init__(self, pin: str, mode: str, files: list[str], commit: str | None, where: str | None = None):
        self.pin, self.mode, self.files, self.commit = pin, mode, files, commit
        what = f"{mode} of {pin} onto the new upstream stopped on a conflict"
        if commit:
            what += f" while applying {commit}"
        what += ": " + (", ".join(files) if files else "(git named no file)")
        super().__init__(what, where=where, hint="resolve it by hand in the fork branch, or wait for upstream; the pin and the fork branch are unchanged")


@dataclass(frozen=True)
class ForkResult:
    old_tip: str  # the fork branch tip before the operation
    new_tip: str
    operated: bool  # False when the fork already contained the new upstream commit
    count: int | None  # upstream commits old_up..new_up
    upstream_forward: Ancestry | None
    tip_forward: bool  # the pinned commit is an ancestor of the fork tip before the operation
    kept_tag: str | None = None  # the tag that keeps old_tip (pushed only when the tip was rewritten or moved)
    bundle: Path | None = None  # the new tip's commits not in old_tip, for the token holder to push (push_fork)


def _conflicts(clone: Path, g=None) -> list[str]:
    proc = (g or git)(["diff", "--name-only", "--diff-filter=U"], cwd=clone, check=False)
    return sorted(set(proc.stdout.split()))


def update_fork(*, pin: str, mode: str, fork_url: str, branch: str, pinned: str, upstream_url: str, upstream_branch: str,
                old_up: str | None, new_up: str, push: bool, token: str | None = None,
                where: str | None = None, check_tip=None, check_upstream=None, bundle: Path | None = None) -> ForkResult:
    """Rebase (mode 'rebase') or merge ('merge') the fork branch onto `new_up` in a temporary clone.

    `check_tip(tip_forward, head)` / `check_upstream(ancestry)` are called before anything is changed and may raise to
    stop (the guard rails). With `push`, the old tip is tagged <pin>-<sha12> and the branch is pushed (a rebase with
    --force-with-lease on the old tip), atomically. With `bundle` (the bot's evaluating part, which holds no token),
    the new commits are written to that git bundle instead, for push_fork."""
    local = gitcmd.is_local_url(fork_url) or gitcmd.is_local_url(upstream_url)  # the clone's promisor may be a mirror

    def g(args, **kw):
        return git(args, allow_file=local, **kw)

    work = Path(tempfile.mkdtemp(prefix="onebit-fork-"))
    clone = work / "fork"
    try:
        g(["clone", "--quiet", "--filter=blob:none", "--single-branch", "--branch", branch, fork_url, str(clone)],
            what=f"cannot clone fork {fork_url} ({branch})", where=where)
        g(["-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", upstream_url,
             f"+refs/heads/{upstream_branch}:refs/remotes/upstream/{upstream_branch}"], cwd=clone,
            what=f"cannot fetch {upstream_url} ({upstream_branch})", where=where)
        for sha in (new_up, old_up, pinned):
            if sha and g(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=clone, check=False).returncode != 0:
                src = fork_url if sha == pinned else upstream_url
                g(["fetch", "--quiet", "--no-tags", src, sha], cwd=clone, check=False)
        head = g(["rev-parse", "HEAD"], cwd=clone).stdout.strip()

        def anc(a: str, b: str) -> bool:
            return g(["merge-base", "--is-ancestor", a, b], cwd=clone, check=False).returncode == 0

        def has(sha: str) -> bool:
            return g(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=clone, check=False).returncode == 0

        if not has(new_up):
            raise OnebitError(f"upstream commit {new_up[:12]} is not available from {upstream_url}", where=where)
        up_anc = None
        count = None
        if old_up and has(old_up):
            up_anc = Ancestry(anc(old_up, new_up), anc(new_up, old_up), None)
            proc = g(["rev-list", "--count", f"{old_up}..{new_up}"], cwd=clone, check=False)
            count = int(proc.stdout.strip()) if proc.returncode == 0 else None
            up_anc = Ancestry(up_anc.old_in_new, up_anc.new_in_old, count)
        elif old_up:
            up_anc = Ancestry(False, False, None)
        tip_forward = has(pinned) and anc(pinned, head)
        if check_upstream:
            check_upstream(up_anc)
        if check_tip:
            check_tip(tip_forward, head)
        if anc(new_up, head):
            return ForkResult(head, head, False, count, up_anc, tip_forward)
        g(["checkout", "--quiet", "-B", branch, head], cwd=clone)
        if mode == "rebase":
            base = ["rebase", "--onto", new_up, old_up] if old_up and has(old_up) and anc(old_up, head) else ["rebase", new_up]
            proc = g(base, cwd=clone, check=False)
            if proc.returncode != 0:
                files = _conflicts(clone, g)
                stopped = g(["rev-parse", "--verify", "--quiet", "REBASE_HEAD"], cwd=clone, check=False).stdout.strip()
                subject = None
                if stopped:
                    subject = g(["log", "-1", "--format=%h %s", stopped], cwd=clone, check=False).stdout.strip()
                g(["rebase", "--abort"], cwd=clone, check=False)
                if not files and not stopped:
                    raise OnebitError(f"rebase of {pin} failed: {proc.stderr.strip()[-400:]}", where=where)
                raise ForkConflict(pin, "rebase", files, subject, where=where)
        else:
            proc = g(["merge", "--no-ff", "--no-edit", "-m", f"Merge upstream {upstream_branch} {new_up[:12]} into {branch}", new_up],
                       cwd=clone, check=False)
            if proc.returncode != 0:
                files = _conflicts(clone, g)
                g(["merge", "--abort"], cwd=clone, check=False)
                if not files:
                    raise OnebitError(f"merge of {pin} failed: {proc.stderr.strip()[-400:]}", where=where)
                raise ForkConflict(pin, "merge", files, None, where=where)
        new_tip = g(["rev-parse", "HEAD"], cwd=clone).stdout.strip()
        tag = f"{pin}-{head[:12]}"
        if bundle is not None:
            g(["bundle", "create", "--quiet", str(bundle), f"refs/heads/{branch}", f"^{head}"], cwd=clone,
              what=f"cannot bundle the update of {branch}", where=where)
        if push:
            g(["tag", "-f", tag, head], cwd=clone)
            lease = [f"--force-with-lease=refs/heads/{branch}:{head}"] if mode == "rebase" else []
            g(["push", "--quiet", "--atomic", *lease, fork_url,
                 f"refs/tags/{tag}:refs/tags/{tag}", f"{'+' if mode == 'rebase' else ''}HEAD:refs/heads/{branch}"],
                cwd=clone, env=auth_env(fork_url, token), what=f"cannot push {branch} and tag {tag} to {fork_url}", where=where,
                hint="the bot token needs write access to the fork; nothing else was changed")
        return ForkResult(head, new_tip, True, count, up_anc, tip_forward, tag, bundle)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bundle_header(path: Path, limit: int = 1 << 20) -> tuple[list[tuple[str, str]], list[str]]:
    """Pure reading of a v2 git bundle's header: its (commit, ref) heads and its prerequisite commits."""
    with open(path, "rb") as fh:
        head = fh.read(limit)
    text, sep, _ = head.partition(b"\n\n")
    lines = text.decode("utf-8", "replace").split("\n")
    if not sep or lines[0] != "# v2 git bundle":
        raise OnebitError(f"{path.name} is not a v2 git bundle")
    heads, prereqs = [], []
    for line in lines[1:]:
        sha, _, rest = line.lstrip("-").partition(" ")
        if not SHA.match(sha):
            raise OnebitError(f"{path.name}: a malformed bundle header line")
        if line.startswith("-"):
            prereqs.append(sha)
        else:
            heads.append((sha, rest))
    return heads, prereqs


def push_fork(*, pin: str, fork_url: str, branch: str, bundle: Path, old_tip: str, new_tip: str, mode: str,
              token: str | None, where: str | None = None) -> None:
    """(The token holder) push a fork update the evaluating part left as a bundle: the old tip kept by the tag
    <pin>-<sha12>, the branch moved to `new_tip` (a rebase with --force-with-lease on the old tip), atomically.
    Nothing is checked out: a bare scratch repository gets the fork's tip (depth 1) and the bundle's commits."""
    if not (SHA.match(old_tip) and SHA.match(new_tip)):
        raise OnebitError(f"push of {pin}: not commit ids: {old_tip!r} {new_tip!r}", where=where)
    local = gitcmd.is_local_url(fork_url)
    with Scratch() as s:
        git(["fetch", "--quiet", "--no-tags", "--depth=1", fork_url, f"+refs/heads/{branch}:refs/onebit/tip"], cwd=s.dir,
            what=f"cannot fetch {branch} from {fork_url}", where=where, allow_file=local)
        tip = git(["rev-parse", "refs/onebit/tip"], cwd=s.dir).stdout.strip()
        if tip != old_tip:
            raise OnebitError(f"{branch} of {fork_url} moved to {tip[:12]} while the bot ran (it was {old_tip[:12]})",
                              where=where, hint="run the bump again; nothing was pushed")
        heads, prereqs = bundle_header(bundle)
        if heads != [(new_tip, f"refs/heads/{branch}")]:
            raise OnebitError(f"the update of {branch} holds other refs than {new_tip[:12]}", where=where)
        if prereqs:  # the commits the bundle builds on (the fork has them): their trees are the deltas' bases
            git(["fetch", "--quiet", "--no-tags", "--depth=1", fork_url, *prereqs], cwd=s.dir, allow_file=local,
                what=f"cannot fetch the base of the update of {branch} from {fork_url}", where=where)
        git(["fetch", "--quiet", "--no-tags", str(bundle), f"refs/heads/{branch}:refs/onebit/new"], cwd=s.dir, allow_file=True,
            what=f"cannot read the update of {branch}", where=where)
        if git(["rev-parse", "refs/onebit/new"], cwd=s.dir).stdout.strip() != new_tip:
            raise OnebitError(f"the update of {branch} is not {new_tip[:12]}", where=where)
        tag = f"{pin}-{old_tip[:12]}"
        lease = [f"--force-with-lease=refs/heads/{branch}:{old_tip}"] if mode == "rebase" else []
        git(["push", "--quiet", "--atomic", *lease, fork_url, f"{old_tip}:refs/tags/{tag}",
             f"{'+' if mode == 'rebase' else ''}{new_tip}:refs/heads/{branch}"], cwd=s.dir, allow_file=local,
            env=auth_env(fork_url, token), what=f"cannot push {branch} and tag {tag} to {fork_url}", where=where,
            hint="the bot token needs write access to the fork; nothing else was changed")
