"""Pure decisions of the pin bot: which pins to look at, whether a move is allowed, names, and the PR body.

Nothing here touches git, the network or the file system; every function is tested by a table.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

import yaml

SHA = re.compile(r"^[0-9a-f]{40}$")
ROLLBACK_LABEL = "rollback"
HELD_LABEL = "held"  # a bump whose recipe no longer matches upstream's build (see the build-flag report)
BRANCH_PREFIX = "bump/"
MARKER = "<!-- onebit-pins"
NOTES_LIMIT = 20_000
BODY_LIMIT = 60_000


# ---------------------------------------------------------------------------------------------- selection


def select_pins(order: Sequence[str], names: Sequence[str], cadences: Mapping[str, str], cadence: str | None) -> list[str]:
    """The pins a run looks at, in file order: the named ones, else those of `cadence` ('all' or None: every pin
    that is not manual when no names are given). Unknown names are returned by `unknown_pins`."""
    if names:
        wanted = set(names)
        return [p for p in order if p in wanted]
    if cadence in (None, "all"):
        return [p for p in order if cadences.get(p) != "manual"]
    return [p for p in order if cadences.get(p) == cadence]


def unknown_pins(order: Sequence[str], names: Sequence[str]) -> list[str]:
    known = set(order)
    return [n for n in names if n not in known]


# ---------------------------------------------------------------------------------------------- verdicts


class Verdict(str, Enum):
    IDENTICAL = "identical"  # nothing to do
    NEW = "new"  # the pin had no commit (unresolved): nothing to descend from
    AHEAD = "ahead"  # new descends from old: a normal bump
    BEHIND = "behind"  # new is an ancestor of old: backwards
    DIVERGED = "diverged"  # neither: sideways (a force-push, a re-tag, a different branch)

    @property
    def forward(self) -> bool:
        return self in (Verdict.NEW, Verdict.AHEAD)


def verdict(old: str | None, new: str, *, old_in_new: bool | None, new_in_old: bool | None) -> Verdict:
    """Classify a move from `old` to `new` given two ancestry facts (None: not known, treated as False)."""
    if old is None:
        return Verdict.NEW
    if old == new:
        return Verdict.IDENTICAL
    if old_in_new:
        return Verdict.AHEAD
    if new_in_old:
        return Verdict.BEHIND
    return Verdict.DIVERGED


def refusal(v: Verdict, *, what: str, old: str | None, new: str, allow_rollback: bool, reason: str | None) -> str | None:
    """Why a move may not be made (None when it may). Backwards and sideways moves need --allow-rollback and a reason."""
    if v.forward or v is Verdict.IDENTICAL:
        return None
    if allow_rollback and reason and reason.strip():
        return None
    direction = "backwards" if v is Verdict.BEHIND else "sideways"
    detail = (
        f"{new[:12]} is an ancestor of {old[:12]}"
        if v is Verdict.BEHIND
        else f"{new[:12]} does not descend from {(old or '')[:12]} (force-pushed or re-tagged upstream?)"
    )
    return f"{what} would move {direction}: {detail}"


# ---------------------------------------------------------------------------------------------- names


def short(sha: str | None) -> str:
    return sha[:12] if sha else "unresolved"


def branch_name(pin: str, sha: str, prefix: str = BRANCH_PREFIX) -> str:
    """The branch a proposal lives on; its name is the proposal's identity (pin + new commit, or a build root's or
    toolchain input's name + the digest of its new files, under their own prefix)."""
    return f"{prefix}{pin}-{sha[:12]}"


def is_branch_of(pin: str, ref: str, prefix: str = BRANCH_PREFIX) -> bool:
    """Whether `ref` is a bump branch of `pin` (and not of a pin whose name only starts the same)."""
    start = f"{prefix}{pin}-"
    return ref.startswith(start) and re.fullmatch(r"[0-9a-f]{12}", ref[len(start):]) is not None


def fork_tag(pin: str, sha: str) -> str:
    """The tag that keeps an old fork tip reachable after a rebase: <name>-<sha12>."""
    return f"{pin}-{sha[:12]}"


def repo_slug(url: str) -> str | None:
    """owner/name of a repository URL: its last two path segments, without .git.

    For GitHub URLs this is the repository; for mirrors and test repositories (file://.../owner/name.git) the
    same rule lets the API client be pointed elsewhere."""
    path = re.sub(r"^[a-z+]+://[^/]*", "", url.strip()).rstrip("/")
    path = re.sub(r"^[^@/]+@[^:]+:", "", path)  # scp-like git@host:owner/name
    parts = [p for p in path.split("/") if p]
    if len(parts) < 2:
        return None
    name = parts[-1][:-4] if parts[-1].endswith(".git") else parts[-1]
    return f"{parts[-2]}/{name}"


def compare_url(url: str, old: str | None, new: str) -> str | None:
    """A web link comparing two commits, for GitHub-hosted repositories; None elsewhere."""
    m = re.match(r"^(?:https?://|git@)(?:www\.)?github\.com[/:]", url)
    slug = repo_slug(url)
    if not m or not slug or not old:
        return None
    return f"https://github.com/{slug}/compare/{old[:12]}...{new[:12]}"


# ---------------------------------------------------------------------------------------------- tested pair file


def _dig(data: Any, key: str) -> Any:
    if isinstance(data, Mapping) and key in data:
        return data[key]
    node = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def pair_commit(text: str, key: str) -> str:
    """The commit recorded under `key` in AMD's tested-pair file: YAML/JSON (dotted keys reach nested maps) or
    KEY=VALUE lines. Raises ValueError with what was found."""
    value: Any = None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, Mapping):
        value = _dig(data, key)
    if value is None:
        for line in text.splitlines():
            m = re.match(rf"^\s*(?:export\s+)?{re.escape(key)}\s*[=:]\s*['\"]?([^'\"\s#]+)", line)
            if m:
                value = m.group(1)
                break
    if value is None:
        raise ValueError(f"no key {key!r} in the file")
    value = str(value).strip().lower()
    if not SHA.match(value):
        raise ValueError(f"{key!r} is {value!r}, not a 40-hex commit")
    return value


# ---------------------------------------------------------------------------------------------- edits


@dataclass(frozen=True)
class Edit:
    """Set the scalar at `path` in pins.yaml. `replaces`: a sibling key this one takes the place of
    (commit replaces unresolved); `after`: where a missing key is inserted."""

    path: tuple
    value: Any
    replaces: str | None = None
    after: tuple[str, ...] = ()


def apply_edits(data: Any, edits: Iterable[Edit]) -> Any:
    """The data pins.yaml must hold after `edits` (used to verify the text edit)."""
    out = json.loads(json.dumps(data))
    for e in edits:
        node = out
        for part in e.path[:-1]:
            node = node[part]
        if e.replaces and e.replaces in node:
            del node[e.replaces]
        node[e.path[-1]] = e.value
    return out


# ---------------------------------------------------------------------------------------------- check


@dataclass(frozen=True)
class Change:
    pin: str
    field: str  # "commit" | "upstream.commit" | "removed" | "added" | "unresolved"
    old: str | None
    new: str | None
    url: str
    policy: str


def pin_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """What moved between two pins.yaml `pins` maps, in the new file's order."""
    out: list[Change] = []
    for name, pin in new.items():
        before = old.get(name)
        if before is None:
            out.append(Change(name, "added", None, pin.get("commit"), pin.get("url", ""), pin.get("policy", "")))
            continue
        if before.get("commit") != pin.get("commit"):
            kind = "unresolved" if pin.get("commit") is None else "commit"
            out.append(Change(name, kind, before.get("commit"), pin.get("commit"), pin.get("url", ""), pin.get("policy", "")))
        up_old = (before.get("upstream") or {}).get("commit")
        up_new = (pin.get("upstream") or {}).get("commit")
        if up_old != up_new and up_new:
            out.append(Change(name, "upstream.commit", up_old, up_new, (pin.get("upstream") or {}).get("url", ""), pin.get("policy", "")))
    for name, pin in old.items():
        if name not in new:
            out.append(Change(name, "removed", pin.get("commit"), None, pin.get("url", ""), pin.get("policy", "")))
    return out


def labels_from_event(event: Mapping[str, Any] | None) -> list[str]:
    """Label names of the pull request in a GitHub event payload."""
    pr = (event or {}).get("pull_request") or {}
    return [str(label.get("name")) for label in pr.get("labels") or [] if isinstance(label, Mapping)]


# ---------------------------------------------------------------------------------------------- PR body


@dataclass(frozen=True)
class Move:
    label: str
    old: str | None
    new: str
    old_tag: str | None = None
    new_tag: str | None = None
    compare: str | None = None
    count: int | None = None


@dataclass(frozen=True)
class Proposal:
    pin: str
    policy: str
    moves: tuple[Move, ...]
    branch: str = ""
    release_notes: str | None = None
    release_url: str | None = None
    patch_reports: tuple[tuple[str, str], ...] = ()  # (recipe, markdown)
    checklist: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (recipe, commands)
    companions: tuple[tuple[str, str | None, str | None], ...] = ()  # (what, old, new)
    kept_tag: str | None = None
    rollback_reason: str | None = None
    verdict: Verdict = Verdict.AHEAD
    edits: tuple[Edit, ...] = field(default=(), compare=False)
    flag_reports: tuple[str, ...] = ()  # one markdown block per recipe variant (builders/pins/flags.py)
    held: tuple[str, ...] = ()  # why the bump is held: recipe, option/flag, upstream file:line

    @property
    def new(self) -> str:
        return self.moves[0].new

    @property
    def title(self) -> str:
        m = self.moves[0]
        target = m.new_tag or short(m.new)
        extra = f" (+{', '.join(x.label for x in self.moves[1:])})" if len(self.moves) > 1 else ""
        prefix = "Rollback" if self.rollback_reason else "Bump"
        return f"{prefix} {self.pin} to {target}{extra}" + (" (held)" if self.held else "")


def _commit_ref(sha: str | None, tag: str | None) -> str:
    if not sha:
        return "unresolved"
    return f"`{sha[:12]}` ({tag})" if tag else f"`{sha[:12]}`"


def render_pr_body(p: Proposal) -> str:
    lines = [f"Automated pin bump for **{p.pin}** (policy `{p.policy}`).", ""]
    if p.rollback_reason:
        lines += [f"> **Rollback** ({p.verdict.value}): {p.rollback_reason}", ">", "> This PR carries the `rollback` label so the pin guard lets it pass.", ""]
    if p.held:
        lines += ["> **Held**: a recipe no longer matches upstream's build at the new commit:"]
        lines += [f"> - {reason}" for reason in p.held]
        lines += [">", f"> This PR carries the `{HELD_LABEL}` label, which the pin guard refuses. Fix the recipe on this branch "
                  "(the build-flag report below has the details), then remove the label.", ""]
    lines += ["| what | old | new | commits | compare |", "|---|---|---|---|---|"]
    for m in p.moves:
        count = "?" if m.count is None else str(m.count)
        compare = f"[{short(m.old)}...{short(m.new)}]({m.compare})" if m.compare else "—"
        lines.append(f"| {m.label} | {_commit_ref(m.old, m.old_tag)} | {_commit_ref(m.new, m.new_tag)} | {count} | {compare} |")
    lines.append("")
    if p.kept_tag:
        lines += [f"The old fork tip stays reachable as the tag `{p.kept_tag}`.", ""]
    if p.companions:
        lines += ["### Companion values", "", "| what | old | new |", "|---|---|---|"]
        for what, old, new in p.companions:
            lines.append(f"| {what} | `{old or '—'}` | `{new or '—'}` |")
        lines.append("")
    if p.policy == "release":
        lines += ["### Release notes", ""]
        notes = (p.release_notes or "").strip() or "(the release has no notes)"
        if len(notes) > NOTES_LIMIT:
            notes = notes[:NOTES_LIMIT] + "\n\n… (truncated)"
        if p.release_url:
            lines += [f"From {p.release_url}", ""]
        lines += [notes, ""]
    lines += ["### Patch report", ""]
    if p.patch_reports:
        for recipe, md in p.patch_reports:
            lines += [f"**{recipe}**", "", md, ""]
    else:
        lines += ["No recipe carries patch files for this pin.", ""]
    lines += ["### Build-flag report", ""]
    if p.flag_reports:
        lines += ["Each recipe that builds from this pin, against upstream's own build at the new commit "
                  "(docs/pins.md: what is compared, and what holds a bump).", ""]
        for md in p.flag_reports:
            lines += [md, ""]
    else:
        lines += ["No recipe builds from this pin.", ""]
    lines += ["### Hardware checklist", "", "CI has no GPU: run these on a Strix Halo box before merging.", ""]
    commands = [(r, c) for r, cmds in p.checklist for c in cmds]
    if commands:
        lines += [f"- [ ] `{c}` ({r})" for r, c in commands]
    else:
        lines.append("- [ ] (no recipe lists a hardware checklist for this pin)")
    lines += ["", f"{MARKER} pin={p.pin} commit={p.new} -->"]
    body = "\n".join(lines)
    if len(body) > BODY_LIMIT:
        body = body[:BODY_LIMIT] + f"\n\n… (truncated)\n{MARKER} pin={p.pin} commit={p.new} -->"
    return body
