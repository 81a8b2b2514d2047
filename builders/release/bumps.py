"""The release merges the pin bot's passing bump branches before it builds, and records the held ones.

A candidate is an open pull request whose head is a bump branch `bump/<pin>-<sha12>` of this repository (the bot closes
the PRs it supersedes, so an open one is the current proposal). Its head commit is judged from what CI recorded on it:

- every check run (GitHub Actions jobs among them) and every commit status must have succeeded. A failed one holds the
  bump with the failing step (for an Actions job, the job and its first failed step) and the last lines of its log;
  one still running, or none at all, holds it as pending;
- a bump that moves a pin built by a recipe carrying a `hardware_checklist` also needs that checklist to have passed
  on its runner: a success commit status `onebit/hardware-checklist/<recipe>` on the bump's head commit, which the
  gate job posts (`python -m builders.release.bumps gate`). Until then the bump is held, and the notes say it waits.

Why a commit status: it belongs to the exact commit that was tested (a new push to the branch has no pass until the
checklist runs again), it shows in the pull request beside the other checks and can be made a required check, it needs
no commit of its own (a file in the branch would change the commit it certifies; a workflow artifact expires and lives
in another run), and the release reads it with the client it already holds.

Passing bumps are merged (`git merge --no-ff`, one merge commit each, branch order) into the release checkout; one
that conflicts is held. `--push` (and `release --merge-bumps --publish`) pushes the result to the base branch, so the
commit the release is built from, and points at, is on GitHub and the merged pull requests close.

In CI (release.yml's first job) the command also says which commit every later job builds (`--output`, GitHub's
$GITHUB_OUTPUT: commit=, pushed=, merged=, held=). That commit is always one the remote has:

- the pushed merge, when passing bumps were merged and the push went through;
- the commit checked out, when no bump pull request is open or none passed;
- the commit checked out, when the push is refused (a protected branch, the branch moved meanwhile): the merges are
  undone and the bumps that passed are held as `unpushed`, with git's answer, so the release still runs and its notes
  say why they are not in it (the job log carries a warning);
- the commit checked out, with `--dry-run` (a release run that does not publish pushes nothing): the merges are tried,
  to judge them, then undone, and the passing bumps are held as `unpushed`.

    python -m builders.release.bumps merge [--root DIR] [--push | --dry-run] [--json OUT] [--output FILE]
    python -m builders.release.bumps gate --sha SHA --recipe NAME [--state success|failure] [--url RUN_URL]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OnebitError
from ..io.github import GitHub
from ..pins import gitops, secrets
from ..pins.bump import recipes_for
from ..pins.decide import repo_slug
from ..io.swap import write_text_atomic
from .changes import BumpResult, pins_at

BRANCH = re.compile(r"^bump/(?P<pin>.+)-(?P<sha>[0-9a-f]{12})$")
GATE = "onebit/hardware-checklist/"
KEEP_LOG = 200  # lines of a failed job's log kept (the notes show the last LOG_TAIL)
STAMP = re.compile(r"^\ufeff?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z ")
IDENTITY = {"GIT_AUTHOR_NAME": "1bit release", "GIT_AUTHOR_EMAIL": "release@1bit.invalid",
            "GIT_COMMITTER_NAME": "1bit release", "GIT_COMMITTER_EMAIL": "release@1bit.invalid"}
Log = Callable[[str], None]


# ------------------------------------------------------------------------------------------------ pure decisions


@dataclass(frozen=True)
class Check:
    """One thing CI recorded on a commit: a check run or a commit status."""
    name: str
    state: str  # success | failure | pending
    step: str | None = None  # the failed step, where the check can say
    log: str = ""


def run_state(run: Mapping) -> str:
    """Pure: a check run's state. Not completed, or waiting for approval: pending; success, neutral, skipped: success."""
    if run.get("status") != "completed" or run.get("conclusion") in (None, "action_required"):
        return "pending"
    return "success" if run.get("conclusion") in ("success", "neutral", "skipped") else "failure"


def status_state(state: str) -> str:
    """Pure: a commit status's state (error counts as failure)."""
    return {"success": "success", "pending": "pending"}.get(state, "failure")


def log_tail(text: str, n: int = KEEP_LOG) -> str:
    """Pure: the last `n` non-empty lines of a CI log, without the Actions timestamps."""
    lines = [STAMP.sub("", line).rstrip() for line in text.splitlines()]
    return "\n".join([line for line in lines if line.strip()][-n:])


def moved_pins(old: Mapping[str, dict], new: Mapping[str, dict]) -> list[str]:
    """Pure: pins whose entry differs between two pins.yaml `pins` maps (commit, upstream, companions, anything)."""
    return sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))


def judge(branch: str, head: str, checks: Sequence[Check], gates: Mapping[str, Check], needs: Sequence[str]) -> BumpResult:
    """Pure: merge the bump (a BumpResult without failed_step) or hold it, saying why.

    `checks`: what CI recorded on `head` (hardware gates excluded); `gates`: recipe -> its hardware checklist's status;
    `needs`: the recipes whose hardware checklist must have passed."""
    failed = [c for c in checks if c.state == "failure"]
    if failed:
        c = failed[0]
        return BumpResult(branch, f"{c.name}: {c.step}" if c.step else c.name, c.log, held_for="failure")
    if not checks:
        return BumpResult(branch, "CI", f"no CI result on {head[:12]} yet", held_for="pending")
    running = [c.name for c in checks if c.state != "success"]
    if running:
        return BumpResult(branch, ", ".join(running), f"CI has not finished on {head[:12]}", held_for="pending")
    for recipe in needs:
        gate = gates.get(recipe)
        if gate is not None and gate.state == "failure":
            return BumpResult(branch, f"hardware checklist of {recipe}", gate.log, held_for="failure")
    waiting = [r for r in needs if r not in gates or gates[r].state != "success"]
    if waiting:
        return BumpResult(branch, "hardware checklist of " + ", ".join(waiting),
                          f"waits for the hardware checklist of {', '.join(waiting)} to pass on its runner: no success "
                          f"status {', '.join(GATE + r for r in waiting)} on {head[:12]} yet", held_for="hardware")
    return BumpResult(branch)


def unpushed(results: Sequence[BumpResult], merged: Iterable[str], step: str, why: str) -> list[BumpResult]:
    """Pure: the results with every merged bump held as `unpushed` (it passed, but is not in what the release builds)."""
    merged = set(merged)
    return [BumpResult(r.branch, step, why, held_for="unpushed") if r.failed_step is None and r.branch in merged else r
            for r in results]


def push_refusal(stderr: str) -> list[str]:
    """Pure: what a refused `git push` said that matters: the remote's lines (a protected branch's GH006), the rejected
    ref and git's errors; not progress, the `To <url>` line or git's long hints."""
    keep = ("remote:", "!", "error:", "fatal:")
    lines = [line.strip() for line in stderr.splitlines()]
    return [secrets.redact(line) for line in lines if line.startswith(keep) and "extraheader" not in line
            and line != "remote:"] or [secrets.redact(stderr.strip()) or "git push failed"]


class PushRefused(OnebitError):
    def __init__(self, base: str, lines: Sequence[str]):
        super().__init__(f"cannot push the merged bumps to {base}: " + " / ".join(lines),
                         hint=f"{base} may be protected against pushes, or have moved while the release ran")
        self.lines = list(lines)


# ------------------------------------------------------------------------------------------------ what CI recorded


def ci_facts(gh: GitHub, slug: str, sha: str) -> tuple[list[Check], dict[str, Check]]:
    """(checks, hardware gates by recipe) recorded on a commit, with the failing step and log tail of failed jobs."""
    checks: list[Check] = []
    for run in gh.check_runs(slug, sha):
        state = run_state(run)
        step, text = None, ""
        if state == "failure":
            job_id = gh.actions_job(slug, run)
            if job_id is not None:
                job = gh.job(slug, job_id)
                step = next((s.get("name") for s in job.get("steps") or [] if s.get("conclusion") == "failure"), None)
                text = gh.job_log(slug, job_id)
            else:
                out = run.get("output") or {}
                text = out.get("text") or out.get("summary") or out.get("title") or ""
        checks.append(Check(str(run.get("name")), state, step, log_tail(text)))
    gates: dict[str, Check] = {}
    for st in gh.statuses(slug, sha):
        context = str(st.get("context"))
        c = Check(context, status_state(str(st.get("state"))), None, str(st.get("description") or ""))
        if context.startswith(GATE):
            gates[context[len(GATE):]] = c
        else:
            checks.append(c)
    return checks, gates


# ------------------------------------------------------------------------------------------------ the merge


@dataclass
class Merge:
    """What merge_passing did: the results for changes.json, and where to push them."""
    root: Path
    remote: str
    base: str
    results: list[BumpResult] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    token: str | None = None
    base_commit: str = ""  # the base branch on the remote when the merge began

    def ahead(self) -> bool:
        """Whether the checkout holds merges the remote base branch has not got yet."""
        return _git(self.root, "rev-parse", "HEAD").stdout.strip() != self.base_commit

    def push(self) -> str:
        """Push the merged HEAD to the base branch (a fast-forward, never a force); returns the commit. A refusal
        raises PushRefused with the remote's own words (a protected branch: GitHub's GH006 lines)."""
        head = _git(self.root, "rev-parse", "HEAD").stdout.strip()
        url = remote_url(self.root, self.remote)
        proc = gitops.git(["push", "--quiet", url, f"{head}:refs/heads/{self.base}"], cwd=self.root, check=False,
                          env=gitops.auth_env(url, self.token))
        if proc.returncode != 0:
            raise PushRefused(self.base, push_refusal(proc.stderr or proc.stdout))
        return head

    def undo(self, start: str, step: str, why: str) -> None:
        """Take the merges back (the checkout returns to `start`); the bumps that passed are held as `unpushed`."""
        _git(self.root, "reset", "--quiet", "--hard", start, what="cannot undo the merges")
        self.results = unpushed(self.results, self.merged, step, why)
        self.merged = []

    def on_remote(self, commit: str) -> bool:
        """Whether the base branch on the remote holds `commit` (so later jobs can check it out)."""
        return _git(self.root, "merge-base", "--is-ancestor", commit, self.base_commit, check=False).returncode == 0


def _git(root: Path, *args: str, check: bool = True, what: str = "", env: dict | None = None):
    return gitops.git(list(args), cwd=root, check=check, what=what, where=str(root), env=env)


def remote_url(root: Path, remote: str) -> str:
    if "://" in remote or remote.startswith("/"):
        return remote
    return _git(root, "remote", "get-url", remote, what=f"no git remote {remote!r}").stdout.strip()


def _base_branch(root: Path, env: Mapping[str, str]) -> str:
    name = env.get("ONEBIT_PINS_BASE") or env.get("GITHUB_REF_NAME") or _git(root, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
    if name in ("", "HEAD"):
        raise OnebitError("the release checkout is on no branch, so the bumps' base is unknown", where=str(root),
                          hint="check out the release branch, or set ONEBIT_PINS_BASE")
    return name


def needs_for(root: Path, moved: Iterable[str]) -> list[str]:
    """The recipes building from any moved pin (its main source or an extra one) that carry a hardware checklist."""
    return sorted({r.name for pin in moved for r, _main in recipes_for(root, pin) if r.data.get("hardware_checklist")})


def merge_passing(root: Path | str, *, github: GitHub | None = None, slug: str | None = None, remote: str = "origin",
                  base: str | None = None, env: Mapping[str, str] | None = None, log: Log = lambda m: None) -> Merge:
    """Merge every passing bump branch into the checkout at `root` (its current branch), hold the others."""
    env = os.environ if env is None else env
    root = Path(root)
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if dirty:
        raise OnebitError("the release checkout has uncommitted changes; bumps are merged only into a clean one",
                          where=str(root), hint="commit or stash them first")
    github = github or GitHub.from_env(env)
    url = remote_url(root, remote)
    slug = slug or env.get("GITHUB_REPOSITORY") or repo_slug(url)
    if not slug:
        raise OnebitError(f"cannot tell the GitHub repository of {url}", hint="set GITHUB_REPOSITORY=OWNER/NAME")
    base = base or _base_branch(root, env)
    merge = Merge(root, remote, base, token=github.token)
    merge.base_commit = _fetch(root, url, base, github.token) or ""
    if not merge.base_commit:
        raise OnebitError(f"cannot fetch the base branch {base} from {remote}", where=str(root),
                          hint="check the remote and the token (contents: read)")
    prs = [p for p in github.pulls(slug, state="open", base=base)
           if BRANCH.match((p.get("head") or {}).get("ref") or "")
           and ((p.get("head") or {}).get("repo") or {}).get("full_name", slug) == slug]
    for pr in sorted(prs, key=lambda p: p["head"]["ref"]):
        branch, head = pr["head"]["ref"], pr["head"].get("sha") or ""
        fetched = _fetch(root, url, branch, github.token)
        if fetched is None or fetched != head:
            merge.results.append(BumpResult(branch, "fetch", f"{branch} is at {(fetched or 'nothing')[:12]} on {remote}, "
                                            f"the pull request at {head[:12]}: it moved while the release ran",
                                            held_for="pending"))
            continue
        if _git(root, "merge-base", "--is-ancestor", head, merge.base_commit, check=False).returncode == 0:
            continue  # merged by an earlier release
        if _git(root, "merge-base", "--is-ancestor", head, "HEAD", check=False).returncode == 0:
            merge.results.append(BumpResult(branch))  # merged here by an interrupted run of this release, not pushed yet
            merge.merged.append(branch)
            continue
        fork_point = _git(root, "merge-base", "HEAD", head, check=False).stdout.strip()
        needs = needs_for(root, moved_pins(pins_at(root, fork_point) if fork_point else {}, pins_at(root, head)))
        checks, gates = ci_facts(github, slug, head)
        verdict = judge(branch, head, checks, gates, needs)
        if verdict.failed_step is None:
            verdict = _merge(root, branch, head, pr.get("number"), needs)
        if verdict.failed_step is None:
            merge.merged.append(branch)
            log(f"merged {branch}")
        else:
            log(f"held {branch}: {verdict.failed_step}")
        merge.results.append(verdict)
    return merge


def _fetch(root: Path, url: str, branch: str, token: str | None) -> str | None:
    ref = f"refs/onebit/bumps/{branch}"
    proc = gitops.git(["fetch", "--quiet", "--no-tags", url, f"+refs/heads/{branch}:{ref}"], cwd=root, check=False,
                      env=gitops.auth_env(url, token))
    if proc.returncode != 0:
        return None
    return _git(root, "rev-parse", ref).stdout.strip()


def _merge(root: Path, branch: str, head: str, number: int | None, needs: Sequence[str]) -> BumpResult:
    env = {k: v for k, v in IDENTITY.items() if k not in os.environ}
    passed = "CI passed" + (f"; hardware checklist passed: {', '.join(needs)}" if needs else "")
    message = f"Merge {branch}{f' (#{number})' if number else ''}\n\nMerged by the release: {passed}.\n"
    proc = _git(root, "merge", "--no-ff", "--no-edit", "-m", message, head, check=False, env=env)
    if proc.returncode == 0:
        return BumpResult(branch)
    files = sorted(set(_git(root, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()))
    _git(root, "merge", "--abort", check=False)
    return BumpResult(branch, "merge", f"{branch} does not merge cleanly into the release: conflict in "
                      f"{', '.join(files) or (proc.stderr or proc.stdout).strip()[-300:]}", held_for="conflict")


# ------------------------------------------------------------------------------------------------ --bumps JSON


def dump(results: Sequence[BumpResult]) -> str:
    return json.dumps([{"branch": r.branch, "failed_step": r.failed_step, "log": r.log, "held_for": r.held_for}
                       for r in results], indent=1) + "\n"


MAX_BUMPS = 16 << 20  # bytes of a --bumps file


def load(path: Path | str) -> list[BumpResult]:
    """The `--bumps` file: [{branch, failed_step, log, held_for}] (what `merge --json` writes)."""
    from ..io.readfile import UnreadableFile, read_json

    path = Path(path)
    try:
        data = read_json(path, MAX_BUMPS)  # a regular file, bounded, never through a link
        if not isinstance(data, list):
            raise ValueError("expected a list")
        return [BumpResult(str(b["branch"]), b.get("failed_step"), str(b.get("log") or ""), b.get("held_for"))
                for b in data]
    except UnreadableFile as exc:
        raise OnebitError(f"not a bump results file: it {exc.why}", where=str(path)) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OnebitError(f"not a bump results file: {exc}", where=str(path),
                          hint='expected [{"branch": ..., "failed_step": null | "...", "log": "..."}]') from None


# ------------------------------------------------------------------------------------------------ commands


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m builders.release.bumps", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge the passing bump branches into this checkout; record the held ones")
    m.add_argument("--root", default=".")
    m.add_argument("--remote", default=os.environ.get("ONEBIT_PINS_REMOTE", "origin"))
    how = m.add_mutually_exclusive_group()
    how.add_argument("--push", action="store_true", help="push the merged result to the base branch (refused: the "
                     "merges are undone and the passing bumps held as unpushed)")
    how.add_argument("--dry-run", action="store_true", help="try the merges to judge them, then undo them: the passing "
                     "bumps are held as unpushed (a release run that does not publish)")
    m.add_argument("--json", metavar="OUT", help="write the results for `1bit-build release --bumps OUT`")
    m.add_argument("--output", metavar="FILE", help="append commit=, pushed=, merged=, held= lines to FILE "
                   "($GITHUB_OUTPUT): commit is the one the release builds, always one the remote has")
    g = sub.add_parser("gate", help="record a hardware checklist's result on a bump's head commit (a commit status)")
    g.add_argument("--sha", required=True, help="the bump branch's head commit that was checked")
    g.add_argument("--recipe", required=True, help="the recipe whose hardware_checklist ran")
    g.add_argument("--state", choices=["success", "failure"], default="success")
    g.add_argument("--url", help="where the checklist's log is (the workflow run)")
    g.add_argument("--description", default="", help="one line, e.g. the runner's name")
    g.add_argument("--repo", default=os.environ.get("GITHUB_REPOSITORY"), help="OWNER/NAME (default $GITHUB_REPOSITORY)")
    args = p.parse_args(argv)
    try:
        if args.command == "gate":
            if not args.repo or not re.fullmatch(r"[0-9a-f]{40}", args.sha):
                raise OnebitError("gate needs --repo OWNER/NAME (or $GITHUB_REPOSITORY) and a 40-hex --sha")
            GitHub.from_env().set_status(args.repo, args.sha, state=args.state, context=GATE + args.recipe,
                                         description=args.description or f"hardware checklist of {args.recipe}: {args.state}",
                                         target_url=args.url)
            print(f"{GATE}{args.recipe} = {args.state} on {args.sha[:12]}")
            return 0
        return _merge_command(args)
    except OnebitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _merge_command(args) -> int:
    root = Path(args.root)
    start = _git(root, "rev-parse", "--verify", "HEAD^{commit}", what="not a git checkout with a commit").stdout.strip()
    merge = merge_passing(root, remote=args.remote, log=print)
    pushed = False
    if not merge.results:
        print(f"no bump pull request is open against {merge.base}")
    step = f"push to {merge.base}"
    if merge.merged and args.dry_run:
        merge.undo(start, step, f"passed and merged cleanly; a release run that does not publish pushes nothing, so "
                                f"it builds {start[:12]} as checked out, without this bump")
        print(f"dry run: the merges are undone; the release builds {start} as checked out")
    elif merge.merged and args.push:
        try:
            print(f"pushed {merge.push()} to {merge.base}")
            pushed = True
        except PushRefused as exc:
            if not merge.on_remote(start):  # what was checked out is not on the remote either: nothing to build
                raise
            merge.undo(start, step, f"passed and merged cleanly, but the push to {merge.base} was refused, so the "
                                    f"release builds {start[:12]} as checked out, without this bump; git said:\n"
                       + "\n".join(exc.lines))
            _warn(f"the push to {merge.base} was refused; the release builds {start} as checked out, and holds the "
                  f"bumps that passed (git said: {' / '.join(exc.lines)})")
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    held = [r for r in merge.results if r.failed_step is not None]
    if args.json:
        write_text_atomic(Path(args.json), dump(merge.results))
    if args.output:
        with open(args.output, "a") as f:  # GitHub's $GITHUB_OUTPUT: name=value lines
            f.write(f"commit={head}\npushed={'true' if pushed else 'false'}\nmerged={len(merge.merged)}\n"
                    f"held={len(held)}\n")
    print(f"the release builds {head}{' (pushed)' if pushed else ''}: {len(merge.merged)} bump(s) merged, "
          f"{len(held)} held")
    print(head)
    return 0


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
    if os.environ.get("GITHUB_ACTIONS") == "true":  # an annotation on the run's summary page (one line)
        print("::warning title=bumps not pushed::" + message.replace("%", "%25").replace("\r", "").replace("\n", "%0A"))


if __name__ == "__main__":
    sys.exit(main())
