"""changes.json: what moved since the previous release, from pins.yaml's history, the git cache and the bump results."""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..project.config import file_sha256
from ..io import gitcmd
from ..errors import OnebitError

LOG_TAIL = 20


def git(cwd_or_gitdir: Path, *args: str, bare: bool = False) -> str:
    base = ["--git-dir", str(cwd_or_gitdir)] if bare else ["-C", str(cwd_or_gitdir)]
    proc = gitcmd.run([*base, *args])
    if proc.returncode != 0:
        raise OnebitError(f"git {' '.join(args)} in {cwd_or_gitdir} failed: {proc.stderr.strip()}")
    return proc.stdout


def pins_at(repo: Path, rev: str | None) -> dict[str, dict]:
    """pins.yaml's pins at a revision of the project repository (None: the working tree)."""
    if rev is None:
        text = (repo / "pins.yaml").read_text()
    else:
        proc = gitcmd.run(["-C", str(repo), "show", f"{rev}:pins.yaml"])
        if proc.returncode != 0:
            return {}
        text = proc.stdout
    return (yaml.safe_load(text) or {}).get("pins", {}) or {}


def compare_url(url: str, old: str, new: str) -> str | None:
    """Pure: a web compare link for GitHub-hosted upstreams, else None."""
    m = re.match(r"^(?:https://|git@)github\.com[/:](?P<slug>[^/]+/[^/]+?)(?:\.git)?/?$", url or "")
    return f"https://github.com/{m['slug']}/compare/{old}...{new}" if m else None


@dataclass(frozen=True)
class PinChange:
    name: str
    url: str
    old: str | None
    new: str | None

    def moved(self) -> bool:
        return self.old != self.new


def pin_changes(old: Mapping[str, dict], new: Mapping[str, dict]) -> list[PinChange]:
    """Pure: every pin, with its commit before and after (None where absent or unresolved)."""
    return [PinChange(name, (new.get(name) or old.get(name) or {}).get("url", ""),
                      (old.get(name) or {}).get("commit"), (new.get(name) or {}).get("commit"))
            for name in sorted(set(old) | set(new))]


def commit_log(git_dir: Path | None, old: str, new: str) -> tuple[int, list[str]] | None:
    """(count, titles newest first) of old..new in a git dir, or None when the cache cannot say."""
    if git_dir is None or not Path(git_dir).exists():
        return None
    try:
        out = git(Path(git_dir), "log", "--format=%s", f"{old}..{new}", bare=True)
    except OnebitError:
        return None
    titles = out.splitlines()
    return len(titles), titles


def pin_entry(change: PinChange, git_dir: Path | None) -> dict:
    entry = {"url": change.url, "from": change.old, "to": change.new, "commits": None, "titles": [], "compare": None}
    if change.old and change.new and change.moved():
        entry["compare"] = compare_url(change.url, change.old, change.new)
        log = commit_log(git_dir, change.old, change.new)
        if log is not None:
            entry["commits"], entry["titles"] = log
    elif change.old == change.new:
        entry["commits"] = 0
    return entry


def patch_changes(repo: Path, prev: str | None, rev: str | None = "HEAD") -> dict[str, list[str]]:
    """Patch files added, dropped or refreshed under recipes/patches/ between two revisions of the project
    (`rev` None: the working tree)."""
    result = {"added": [], "dropped": [], "refreshed": []}
    if prev is None:
        if rev is None:
            names = [p.relative_to(repo).as_posix() for p in (repo / "recipes" / "patches").rglob("*.patch")]
        else:
            names = git(repo, "ls-tree", "-r", "--name-only", rev, "--", "recipes/patches").splitlines()
        result["added"] = sorted(n.removeprefix("recipes/patches/") for n in names if n.endswith(".patch"))
        return result
    out = git(repo, "diff", "--name-status", "--no-renames", prev, *([rev] if rev else []), "--", "recipes/patches")
    kinds = {"A": "added", "D": "dropped", "M": "refreshed"}
    for line in out.splitlines():
        status, _, path = line.partition("\t")
        if path.endswith(".patch") and status[:1] in kinds:
            result[kinds[status[:1]]].append(path.removeprefix("recipes/patches/"))
    return {k: sorted(v) for k, v in result.items()}


HELD_FOR = ("failure", "pending", "hardware", "conflict", "unpushed")


@dataclass(frozen=True)
class BumpResult:
    branch: str
    failed_step: str | None = None  # None: merged
    log: str = ""
    held_for: str | None = None  # failure (default when held) | pending (CI not done) | hardware (checklist not passed
    #                              on its runner yet) | conflict (does not merge cleanly) | unpushed (passed, but the
    #                              release could not push it, or did not: a dry run); see builders/release/bumps.py


def bump_entries(results: Sequence[BumpResult], tail: int = LOG_TAIL) -> list[dict]:
    """Pure: passing bump branches are merged; the others are held with the step, why, and the last lines of its log."""
    out = []
    for r in sorted(results, key=lambda r: r.branch):
        if r.failed_step is None:
            out.append({"branch": r.branch, "result": "merged", "why": None})
        else:
            held_for = r.held_for if r.held_for in HELD_FOR else "failure"
            out.append({"branch": r.branch, "result": "held",
                        "why": {"step": r.failed_step, "held_for": held_for, "log": r.log.splitlines()[-tail:]}})
    return out


def gate_summary(gate: Mapping | None) -> dict | None:
    """Pure: a hardware gate (gate.json) as changes.json records it: passed, and each item's line and result."""
    if not gate:
        return None
    return {"passed": bool(gate.get("passed")), "runner": gate.get("runner"),
            "items": [{"line": i.get("line"), "result": i.get("result"), **({"why": i["why"]} if i.get("why") else {})}
                      for i in gate.get("items", [])]}


def build_entries(records: Mapping[str, Mapping], gates: Mapping[str, Mapping] | None = None) -> dict:
    """Pure: what each variant's build knew (its toolchain.json record) and the gate its job passed, by variant."""
    out = {}
    for variant in sorted(records):
        entry = dict(records[variant])
        gate = gate_summary((gates or {}).get(variant))
        if gate:
            entry["gate"] = gate
        out[variant] = entry
    return out


def artifact_sums(out: Path, skip: Sequence[str] = ("SHA256SUMS", "changes.json")) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): file_sha256(p)
            for p in sorted(out.rglob("*")) if p.is_file() and p.name not in skip and not p.name.startswith(".")}


def make_changes(*, tag: str, previous_tag: str | None, date: str, repo: Path, prev_rev: str | None,
                 rev: str | None = "HEAD", git_dir_for: Callable[[str, str], Path | None] = lambda name, commit: None,
                 bumps: Sequence[BumpResult] = (), artifacts: Mapping[str, str] | None = None,
                 builds: Mapping[str, Mapping] | None = None) -> dict:
    """The changes.json document. `git_dir_for(pin, commit)` names the cached git dir holding a pin's new commit."""
    old = pins_at(repo, prev_rev) if prev_rev else {}
    new = pins_at(repo, rev)
    pins = {c.name: pin_entry(c, git_dir_for(c.name, c.new) if c.new else None) for c in pin_changes(old, new)}
    return {
        "tag": tag,
        "previous_tag": previous_tag,
        "date": date,
        "pins": pins,
        "patches": patch_changes(repo, prev_rev, rev),
        "bumps": bump_entries(bumps),
        "builds": {k: dict(v) for k, v in sorted((builds or {}).items())},
        "artifacts": dict(sorted((artifacts or {}).items())),
    }


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"
