"""The commit a release points at (`target_commitish`, `release --target`): always the one it was assembled from.

- Building here, that is the checkout's HEAD: a `--target` naming another commit is refused, and so is a checkout whose
  tracked files differ from HEAD (what was built is then no commit at all).
- Assembling `--from` parts, that is the commit the parts recorded (toolchain.json's `project`, written by every
  build): `--target` must name it, every part must name the same one, none may have been built from uncommitted
  changes, and the assembling checkout (whose recipes, pins and history the release reads) must be at it too. Parts
  from before builds recorded their commit are taken on the checkout's word, as before.

A run that neither publishes nor names a target points at nothing, and nothing is checked.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..io import gitcmd
from ..errors import OnebitError
from ..ship.toolchain_record import FILE as RECORD, checkout

SHA = re.compile(r"[0-9a-f]{40}")


class TargetError(OnebitError):
    pass


@dataclass(frozen=True)
class Built:
    """Where a part of the release came from, as its toolchain.json records it (commit None: it does not say)."""
    where: str
    commit: str | None
    modified: tuple[str, ...] = ()


def _files(modified: Sequence[str]) -> str:
    return ", ".join(modified[:3]) + (", ..." if len(modified) > 3 else "")


def decide(*, given: str | None, head: str | None, modified: Sequence[str] = (), parts: Sequence[Built] | None = None,
           publish: bool = False, root: str = ".") -> str | None:
    """Pure: the commit the release points at, or a TargetError saying why it cannot point at one. `given` is
    --target (resolved to a full commit where the checkout has it), `head` and `modified` the assembling checkout's
    HEAD and changed tracked files, `parts` None when this run builds, else what each part recorded."""
    if given is None and not publish:
        return None
    recorded: dict[str, list[str]] = {}
    for p in parts or ():
        if p.commit:
            recorded.setdefault(p.commit, []).append(p.where)
    if len(recorded) > 1:
        raise TargetError("the parts were built from " + str(len(recorded)) + " commits: " + "; ".join(
            f"{c} ({', '.join(w)})" for c, w in sorted(recorded.items())),
            hint="a release points at one commit: build every part from it (release.yml's jobs check out the first "
                 "job's commit)")
    built = next(iter(recorded), None)
    dirty = next((p for p in parts or () if p.modified), None)
    if dirty is not None:
        raise TargetError(f"{dirty.where} was built from uncommitted changes on top of {dirty.commit} "
                          f"({_files(dirty.modified)}): it was built from no commit the release could point at",
                          hint="commit them, then build the part again into a fresh --out")
    if built is not None:
        if given is not None and given != built:
            raise TargetError(f"--target {given} is not the commit the parts were built from: {built} (the `project` of "
                              f"{recorded[built][0]}/{RECORD})",
                              hint=f"a release points at the commit it was assembled from: pass --target {built}, or "
                                   "build the parts from the commit you meant")
        if head is not None and head != built:
            raise TargetError(f"this checkout is at {head}, the parts were built from {built}: the release would read "
                              "its recipes, pins and history from another commit than it points at",
                              where=root, hint=f"assemble from a checkout of {built}")
    if built is None:  # this run built the parts, or they record no commit: the checkout's HEAD is what was built
        if head is None:
            raise TargetError(f"{root} is not a git checkout with a commit: the release must point at the commit it was "
                              "built from", hint="build and release from a clone of the repository")
        if given is not None and given != head:
            raise TargetError(f"--target {given} is not the commit this release is "
                              f"{'built' if parts is None else 'assembled'} from: the checkout is at {head}",
                              hint=f"check out {given} and release from there, or leave --target out (it is HEAD)")
    if modified:
        raise TargetError(f"{root} has uncommitted changes ({_files(modified)}): what "
                          f"{'was built' if parts is None else 'assembles the release'} is not a commit",
                          hint="commit or stash them, and build again")
    return built or given or head


def resolve(root: Path, rev: str) -> str:
    """--target as the checkout knows it: a full commit id. A full id the checkout lacks is taken as written."""
    proc = gitcmd.run(["-C", str(root), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"])
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip()
    if SHA.fullmatch(rev):
        return rev
    raise TargetError(f"--target {rev}: no such commit in {root}", hint="pass the full commit id the release points at")


def for_release(root: Path, given: str | None, *, parts=None, publish: bool = False) -> str | None:
    """The commit this release points at (see `decide`): `parts` are compose.Part objects (--from), or None when
    this run built them from the checkout."""
    state = checkout(root) or {}
    built = None if parts is None else [
        Built(where=str(p.dir), commit=(p.record.get("project") or {}).get("commit"),
              modified=tuple((p.record.get("project") or {}).get("modified") or ())) for p in parts]
    return decide(given=resolve(root, given) if given else None, head=state.get("commit"),
                  modified=state.get("modified") or (), parts=built, publish=publish, root=str(root))
