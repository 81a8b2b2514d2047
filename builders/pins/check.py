"""`pins check --base REF`: fail a change in which a pin moved backwards or sideways, unless labelled rollback; and
fail a bump the bot held (labelled held) until a person has fixed the recipe and removed the label."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..project import yamlio
from ..errors import OnebitError
from . import decide, gitops
from .bump import load


@dataclass(frozen=True)
class Finding:
    pin: str
    field: str
    old: str | None
    new: str | None
    verdict: str
    ok: bool
    detail: str = ""


def base_text(root: Path, ref: str) -> str | None:
    """pins.yaml as it is at `ref` (None when the file did not exist there)."""
    top = Path(gitops.git(["rev-parse", "--show-toplevel"], cwd=root, what="pins check needs a git checkout", where=str(root)).stdout.strip())
    rel = (Path(root).resolve() / "pins.yaml").relative_to(top.resolve()).as_posix()
    gitops.git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=top, what=f"no such ref {ref!r}",
               hint="fetch the base branch first (actions/checkout with fetch-depth: 0), e.g. origin/main")
    proc = gitops.git(["show", f"{ref}:{rel}"], cwd=top, check=False)
    return proc.stdout if proc.returncode == 0 else None


def event_labels(env: dict | None = None) -> list[str]:
    env = os.environ if env is None else env
    path = env.get("GITHUB_EVENT_PATH")
    if not path or not Path(path).is_file():
        return []
    try:
        return decide.labels_from_event(json.loads(Path(path).read_text(encoding="utf-8")))
    except (ValueError, OSError):
        raise OnebitError("the GitHub event payload is not JSON", where=path) from None


def _judge(change: decide.Change, new_pin: dict) -> Finding:
    c = change
    if c.field == "added":
        return Finding(c.pin, c.field, None, c.new, "added", True)
    if c.field == "removed":
        return Finding(c.pin, c.field, c.old, None, "removed", True)
    if c.field == "unresolved":
        return Finding(c.pin, "commit", c.old, None, "dropped", False, "the pin lost its commit (now unresolved)")
    if c.old is None:
        return Finding(c.pin, c.field, None, c.new, "new", True)
    where = f"pins.{c.pin}.{c.field}"
    if c.field == "commit" and c.policy == "fork-rebase":
        tag = decide.fork_tag(c.pin, c.old)
        kept = gitops.ls_remote(c.url, f"refs/tags/{tag}", where=where).get(f"refs/tags/{tag}")
        if kept == c.old:
            return Finding(c.pin, c.field, c.old, c.new, "rebased", True, f"old fork tip kept as tag {tag}")
    branch = new_pin.get("branch") if c.field == "commit" else (new_pin.get("upstream") or {}).get("branch")
    tag = new_pin.get("tag") if c.field == "commit" else None
    ref = f"refs/tags/{tag}" if tag else (f"refs/heads/{branch}" if branch else None)
    anc = gitops.ancestry(c.url, c.old, c.new, new_ref=ref, where=where)
    v = decide.verdict(c.old, c.new, old_in_new=anc.old_in_new, new_in_old=anc.new_in_old)
    detail = f"{anc.count} commits" if v.forward and anc.count is not None else ""
    if not v.forward and c.field == "commit" and c.policy == "fork-rebase":
        detail = f"and no tag {decide.fork_tag(c.pin, c.old)} keeps the old fork tip"
    return Finding(c.pin, c.field, c.old, c.new, v.value, v.forward, detail)


def check(root: Path, base: str, labels: Sequence[str] = ()) -> tuple[list[Finding], bool]:
    """The findings, and whether the change passes (every move forward, or a rollback label; never a held label)."""
    root = Path(root)
    old_text = base_text(root, base)
    pins, _ = load(root)  # the working file must be valid
    if old_text is None:
        return [], True
    try:
        old = yamlio.load_text(old_text, f"{base}:pins.yaml").data or {}
    except OnebitError:
        old = {}
    new = yamlio.load(root / "pins.yaml").data
    findings = [_judge(c, new["pins"].get(c.pin) or {}) for c in decide.pin_changes(old.get("pins") or {}, new["pins"])]
    rollback = decide.ROLLBACK_LABEL in labels
    return findings, (all(f.ok for f in findings) or rollback) and decide.HELD_LABEL not in labels
