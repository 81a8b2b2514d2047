"""What upstream offers now, per policy: ls-remote and the GitHub REST API only, never a clone."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..project.config import Pin
from ..errors import OnebitError
from . import gitops
from .decide import pair_commit, repo_slug
from .http import GitHub
from .versions import newest_tag


@dataclass(frozen=True)
class Target:
    """Upstream's current offer for one pin. For forks, `commit` is the upstream commit and `fork_head` our branch."""

    commit: str
    ref: str | None = None  # a ref that reaches `commit` (for fetching history)
    tag: str | None = None
    notes: str | None = None
    notes_url: str | None = None
    fork_head: str | None = None


def pair_value(pins: dict[str, Pin], name: str, github: GitHub) -> str:
    """The commit AMD's tested-pair source records for pin `name` (a submodule gitlink, or a key in a file)."""
    pin = pins[name]
    pair = pin.raw.get("tested_pair") or {}
    slug = repo_slug(pair.get("source", ""))
    if not slug:
        raise OnebitError(f"tested_pair.source {pair.get('source')!r} does not name a repository", where=pin.where)
    reply = github.contents(slug, pair["path"], pair.get("branch"))
    if reply["type"] == "submodule":
        sha = reply["sha"].lower()
        if not gitops.SHA.match(sha):
            raise OnebitError(f"malformed API reply: submodule {pair['path']} records {sha!r}", where=f"{slug}/{pair['path']}")
        return sha
    try:
        return pair_commit(reply["text"], pair["key"])
    except ValueError as exc:
        raise OnebitError(f"tested-pair file {slug}/{pair['path']}: {exc}", where=pin.where,
                          hint="check tested_pair.path and tested_pair.key in pins.yaml") from None


def partner_of(pins: dict[str, Pin], name: str) -> str | None:
    pair = pins[name].raw.get("tested_pair")
    if not pair:
        return None
    partner = pair["partner"]
    if partner not in pins:
        raise OnebitError(f"tested_pair.partner {partner!r} is not a pin", where=pins[name].where,
                          hint=f"pins.yaml has: {', '.join(pins)}")
    if not pins[partner].raw.get("tested_pair"):
        raise OnebitError(f"partner pin {partner!r} has no tested_pair (path/key of its commit)", where=pins[partner].where)
    return partner


def resolve(pins: dict[str, Pin], name: str, github: GitHub) -> Target:
    pin = pins[name]
    raw = pin.raw
    where = pin.where
    if pin.policy == "release":
        slug = repo_slug(pin.url)
        if not slug:
            raise OnebitError(f"cannot tell the GitHub repository of {pin.url}", where=where)
        rel = github.latest_release(slug)
        tag = rel["tag"]
        refs = gitops.ls_remote(pin.url, f"refs/tags/{tag}", where=where)
        sha = refs.get(f"refs/tags/{tag}")
        if not sha:
            raise OnebitError(f"the latest release names tag {tag!r}, but {pin.url} has no such tag", where=where)
        return Target(sha, f"refs/tags/{tag}", tag, rel["body"], rel["url"])
    if pin.policy == "tag-pattern":
        tags = gitops.tag_commits(pin.url, where=where)
        try:
            tag = newest_tag(tags, raw["tag_pattern"])
        except re.error as exc:
            raise OnebitError(f"tag_pattern {raw['tag_pattern']!r} is not a valid regular expression: {exc}", where=where,
                              hint="fix tag_pattern in pins.yaml (it must match the whole tag name)") from None
        if not tag:
            raise OnebitError(f"no tag of {pin.url} matches tag_pattern {raw['tag_pattern']!r}", where=where,
                              hint="the pattern must match the whole tag name")
        return Target(tags[tag], f"refs/tags/{tag}", tag)
    if pin.policy == "branch":
        return Target(gitops.branch_head(pin.url, pin.branch, where=where), f"refs/heads/{pin.branch}")
    if pin.policy == "tested-pair":
        return Target(pair_value(pins, name, github), f"refs/heads/{pin.branch}" if pin.branch else None)
    if pin.policy in ("fork-rebase", "fork-merge"):
        up = raw["upstream"]
        if raw.get("tested_pair"):
            commit = pair_value(pins, name, github)
        else:
            commit = gitops.branch_head(up["url"], up["branch"], where=where)
        head = gitops.branch_head(pin.url, pin.branch, where=where)
        return Target(commit, f"refs/heads/{up['branch']}", fork_head=head)
    raise OnebitError(f"unknown policy {pin.policy!r}", where=where)  # pragma: no cover - the schema forbids it
