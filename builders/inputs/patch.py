"""Check patches before applying them; report drift (which apply, which fail, where) without touching the tree."""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..io import gitcmd
from ..errors import PatchError

_FAILED = re.compile(r"^error: patch failed: (?P<file>.+):(?P<line>\d+)$", re.M)
_NOT_EXIST = re.compile(r"^error: (?P<file>.+): (?:does not exist in index|No such file or directory)$", re.M)
_OFFSET = re.compile(r"^Hunk #(?P<n>\d+) succeeded at (?P<at>\d+) \(offset (?P<off>-?\d+) lines?\)", re.M)
_HUNK = re.compile(r"^@@ -(?P<old>\d+)(?:,(?P<oldn>\d+))? \+\d+(?:,\d+)? @@.*$", re.M)


@dataclass(frozen=True)
class PatchResult:
    patch: str
    status: str  # "applies" | "offset" | "already-applied" | "fails"
    file: str | None = None
    hunk: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fails"


def _git_apply(worktree: Path, patch: Path, *extra: str) -> subprocess.CompletedProcess:
    return gitcmd.run(["apply", "--verbose", *extra, str(patch)], cwd=worktree)


def failing_hunk(patch_text: str, file: str, line: int) -> str | None:
    """The hunk header of `file` in the patch whose old range starts at `line` (git reports the hunk's start)."""
    section = None
    for block in re.split(r"^diff --git ", patch_text, flags=re.M)[1:]:
        header = block.splitlines()[0]
        if header.endswith(f" b/{file}") or f"a/{file} " in header:
            section = block
            break
    if section is None:
        return None
    hunks = list(_HUNK.finditer(section))
    for m in hunks:
        if int(m.group("old")) == line:
            return m.group(0)
    return hunks[0].group(0) if hunks else None


def check_one(worktree: Path, patch: Path) -> PatchResult:
    """What would happen if `patch` were applied to `worktree` now. Touches nothing."""
    proc = _git_apply(worktree, patch, "--check")
    if proc.returncode == 0:
        offsets = _OFFSET.findall(proc.stderr + proc.stdout)
        if offsets:
            detail = "; ".join(f"hunk #{n} at line {at} (offset {off})" for n, at, off in offsets)
            return PatchResult(patch.name, "offset", detail=detail)
        return PatchResult(patch.name, "applies")
    reverse = _git_apply(worktree, patch, "--check", "--reverse")
    if reverse.returncode == 0:
        return PatchResult(patch.name, "already-applied", detail="the change is already in the source (merged upstream?)")
    text = proc.stderr
    m = _FAILED.search(text)
    if m:
        file, line = m.group("file"), int(m.group("line"))
        hunk = failing_hunk(patch.read_text(encoding="utf-8", errors="replace"), file, line)
        return PatchResult(patch.name, "fails", file=file, hunk=hunk, detail=text.strip())
    m = _NOT_EXIST.search(text)
    return PatchResult(patch.name, "fails", file=m.group("file") if m else None, detail=text.strip())


def apply_all(worktree: Path, patches: Sequence[Path], *, where: str = "") -> list[PatchResult]:
    """Check then apply each patch in order; the first that does not apply stops everything with a PatchError.

    All or nothing: when one fails (even after its check passed), the patches applied before it are reversed, so
    the tree is left as it was."""
    results: list[PatchResult] = []
    applied: list[Path] = []
    try:
        for patch in patches:
            result = check_one(worktree, patch)
            if result.status == "fails":
                raise PatchError(
                    f"patch {patch.name} no longer applies: {result.file or '?'} {result.hunk or ''}".rstrip(),
                    where=where or str(patch),
                    hint="refresh the patch against the new commit (git am -3, fix, git format-patch), "
                    "or drop it if the change was merged upstream; `1bit-build patches check` shows every patch's state",
                )
            if result.status != "already-applied":
                proc = _git_apply(worktree, patch)
                if proc.returncode != 0:  # check passed: the tree changed under us, or git failed to write
                    detail = " / ".join(proc.stderr.strip().splitlines()[-3:]) or f"git apply exit {proc.returncode}"
                    raise PatchError(f"patch {patch.name} passed its check but failed to apply: {detail}",
                                     where=where or str(patch),
                                     hint="is something else writing the source tree? run the build again; "
                                     "the patches applied before it were reversed")
                applied.append(patch)
            results.append(result)
    except (PatchError, gitcmd.GitError):  # a check that failed, or a git call past its deadline
        for done in reversed(applied):
            _git_apply(worktree, done, "--reverse")
        raise
    return results


def drift_report(repo: Path, commit: str, patches: Sequence[Path]) -> list[PatchResult]:
    """Check every patch in order on a scratch worktree of `commit`; later patches are checked on top of earlier ones."""
    results = []
    with tempfile.TemporaryDirectory(prefix="onebit-drift-") as tmp:
        wt = Path(tmp) / "wt"
        gitcmd.run(["worktree", "add", "--detach", str(wt), commit], cwd=repo, check=True)
        try:
            for patch in patches:
                result = check_one(wt, patch)
                if result.status in ("applies", "offset"):
                    _git_apply(wt, patch)
                results.append(result)
        finally:
            gitcmd.run(["worktree", "remove", "--force", str(wt)], cwd=repo)
    return results


def render_markdown(results: Sequence[PatchResult]) -> str:
    if not results:
        return "No patch files: nothing to check."
    lines = ["| patch | result | where |", "|---|---|---|"]
    for r in results:
        where = " ".join(x for x in (f"`{r.file}`" if r.file else "", f"`{r.hunk}`" if r.hunk else "") if x) or r.detail
        lines.append(f"| {r.patch} | {r.status} | {where} |")
    return "\n".join(lines)


def reset_checkout(src: Path, commit: str, extras: Sequence[tuple[str, str]] = ()) -> bool:
    """Put an existing checkout back to exactly `commit` (and each extra worktree `into` to its commit), undoing old
    patches, so new ones can be applied. Only files that differ are rewritten, so a build over this tree stays
    incremental. False when src is not such a checkout (the caller then makes a fresh one)."""
    trees = [(src, commit)] + [(src / into, c) for into, c in extras]
    for tree, want in trees:
        head = gitcmd.run(["-C", str(tree), "rev-parse", "HEAD"])
        if head.returncode != 0 or head.stdout.strip() != want or not (tree / ".git").exists():
            return False
    for tree, want in trees:
        for argv in (["-C", str(tree), "reset", "--quiet", "--hard", want], ["-C", str(tree), "clean", "-fdxq"]):
            proc = gitcmd.run(argv)
            if proc.returncode != 0:
                return False
    return True
