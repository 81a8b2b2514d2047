"""The data a plan is made of: commands, steps, the plan, and where things go on disk."""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

INSTALL_PREFIX = "/opt/onebit"  # the prefix packages are built for; everything is relocatable ($ORIGIN RPATH)


def digest(*parts: Any) -> str:
    """A stable cache key from JSON-able parts."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        cd = f"cd {shlex.quote(self.cwd)} && " if self.cwd else ""
        return f"{cd}{env + ' ' if env else ''}{shlex.join(self.argv)}"

    def to_json(self) -> dict:
        out: dict = {"argv": list(self.argv)}
        if self.cwd:
            out["cwd"] = self.cwd
        if self.env:
            out["env"] = dict(self.env)
        return out


@dataclass(frozen=True, eq=False)
class Step:
    id: str
    action: str  # which executor runs it (fetch, source, build, stage, package, bundle-*)
    title: str
    key: str
    commands: tuple[Command, ...] = ()
    needs: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "action": self.action,
            "title": self.title,
            "key": self.key,
            "needs": list(self.needs),
            "commands": [c.to_json() for c in self.commands],
        }


@dataclass(frozen=True)
class Layout:
    """Where a run keeps things. Sources and downloads are shared between bundles; work and out are per bundle."""

    root: Path  # the project checkout
    cache: Path  # content-addressed: git/<sha>.git, downloads/<sha256>/..., steps/<key>.json
    work: Path  # per bundle: src/, build/, stage/
    out: Path  # per bundle: packages, channel, tarball, SHA256SUMS

    def git_cache(self, commit: str) -> Path:
        return self.cache / "git" / f"{commit}.git"

    def downloads(self) -> Path:
        return self.cache / "downloads"

    def wheels(self, key: str) -> Path:
        return self.cache / "wheels" / key[:16]

    def step_stamp(self, key: str) -> Path:
        return self.cache / "steps" / f"{key}.json"

    def src(self, key: str) -> Path:
        return self.work / "src" / key[:16]

    def build(self, variant_id: str) -> Path:
        return self.work / "build" / variant_id

    def stage(self, variant_id: str) -> Path:
        return self.work / "stage" / variant_id

    def stage_tmp(self, variant_id: str) -> Path:
        return self.work / "stage" / f".{variant_id}.tmp"

    def staged_prefix(self, variant_id: str, *, tmp: bool = False) -> Path:
        root = self.stage_tmp(variant_id) if tmp else self.stage(variant_id)
        return root / INSTALL_PREFIX.lstrip("/")

    def packages(self) -> Path:
        return self.work / "packages"

    def next_out(self) -> Path:
        """Beside out, on its filesystem, so publishing is a rename even when work is elsewhere (no EXDEV)."""
        return self.out.with_name(f".{self.out.name}.next")


@dataclass
class Plan:
    bundle: str
    version: str
    build_number: int
    platform: str
    layout: Layout
    steps: list[Step]
    refusals: list[str] = field(default_factory=list)  # pins that are unresolved: those recipes can't be built
    missing: list[str] = field(default_factory=list)  # toolchains that are absent, one line each

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    def to_json(self) -> dict:
        return {
            "bundle": self.bundle,
            "version": self.version,
            "build_number": self.build_number,
            "platform": self.platform,
            "refusals": self.refusals,
            "missing_toolchains": self.missing,
            "steps": [s.to_json() for s in self.steps],
        }
