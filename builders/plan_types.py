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
    env: tuple[tuple[str, str], ...] = ()  # set over the caller's environment
    unset: tuple[str, ...] = ()  # removed from the caller's environment (a make build inherits no CFLAGS)
    path: tuple[str, ...] = ()  # folders put before the caller's PATH (toolchain roots' bin/: zig, glslc)
    mkdirs: tuple[str, ...] = ()  # directories the executor makes before running it (a build root's bind sources)
    inside: "Command | None" = None  # the command as its root runs it: itself without the wrapping (builders/roots/root.py)
    clear: bool = False  # env is the whole environment: nothing of the caller's is inherited (a wrapped host command)
    files: tuple[tuple[str, str], ...] = ()  # (path, text) the executor writes (aside, then renamed) before running it
    links: tuple[tuple[str, str], ...] = ()  # (path, target) symlinks the executor makes before running it

    def shell(self) -> str:
        pairs = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        if self.path and not self.clear:  # a cleared environment's PATH holds them already
            pairs.append(f"PATH={shlex.quote(':'.join(self.path))}:\"$PATH\"")
        env = " ".join(([] if self.clear else [f"-u {k}" for k in self.unset]) + pairs)
        cd = f"cd {shlex.quote(self.cwd)} && " if self.cwd else ""
        lead = "env -i " if self.clear else ("env " if self.unset else "")
        return f"{cd}{lead + env + ' ' if env else ''}{shlex.join(self.argv)}"

    def environ(self, caller: Mapping[str, str]) -> dict[str, str]:
        """The environment this command runs with, given the caller's (not read at all when `clear`)."""
        if self.clear:
            return dict(self.env)
        env = {**{k: v for k, v in caller.items() if k not in self.unset}, **dict(self.env)}
        if self.path:
            env["PATH"] = ":".join([*self.path, *([env["PATH"]] if env.get("PATH") else [])])
        return env

    def to_json(self) -> dict:
        out: dict = {"argv": list(self.argv)}
        if self.cwd:
            out["cwd"] = self.cwd
        if self.env:
            out["env"] = dict(self.env)
        if self.unset:
            out["unset"] = list(self.unset)
        if self.path:
            out["path"] = list(self.path)
        if self.mkdirs:
            out["mkdirs"] = list(self.mkdirs)
        if self.clear:
            out["clear_env"] = True
        if self.files:
            out["files"] = {p: t for p, t in self.files}
        if self.links:
            out["links"] = dict(self.links)
        return out


# ---- the stage step's payload: typed, so a typo fails when the plan is made, not as a KeyError halfway through a
# build. Every other step kind's data lives in its module (builders/steps/); this one is here, below both, because the
# mechanism that takes it whole, builders/ship/stage.py, imports no step ---------------------------------------------------
@dataclass(frozen=True)
class RuntimeData:
    """Redistributable runtime libraries a variant ships, unmodified, from a toolchain root (cudart, cuBLAS)."""

    root: str
    package: str
    libs: tuple[str, ...]


@dataclass(frozen=True)
class RecipeTest:
    name: str
    run: tuple[str, ...]  # argv; the first item relative to the variant's stage root
    expect: str | None = None
    needs: str | None = None
    timeout: int = 120


@dataclass(frozen=True)
class StageData:
    variant: str
    package: str
    stage_root: str  # the DESTDIR, swapped into place when staging passes
    stage_tmp: str
    tmp_prefix: str  # stage_tmp + INSTALL_PREFIX
    prefix: str  # stage_root + INSTALL_PREFIX
    root: str  # the variant's subtree of the prefix ("" = the prefix)
    keep: tuple[str, ...]  # relative to root
    binaries: Mapping[str, str]  # relative to root
    links: Mapping[str, str]  # prefix-relative link -> root-relative target
    backend: str | None
    manifest_entry: Mapping[str, Any] | None
    build_dir: str
    home: str
    tests: tuple[RecipeTest, ...]
    test_values: Mapping[str, str]
    where: str
    runtime: tuple[RuntimeData, ...] = ()  # copied into root/lib after relocation, with their license files
    strip: str | None = None  # "debug": the debug sections of every shipped ELF file are stripped
    toolchains: tuple[str, ...] = ()  # the variant's toolchain roots: an RPATH into one is dropped (link-time only)
    build_root: Any = None  # the Root (builders/roots/root.py) the variant was built in: its tests and probes run there too
    offload_targets: tuple[str, ...] = ()  # every shipped HIP file carries exactly these GPU targets (builders/ship/offload.py)
    floor: Any = None  # builders.project.floor.Floor: what every shipped ELF file meets (floor.yaml); None: no gate
    host_libraries: tuple[str, ...] = ()  # the floor's host-library sets the variant declares (stage.host_libraries)


@dataclass(frozen=True, eq=False)
class Step:
    id: str
    action: str  # which step kind runs it (builders/steps/: fetch, source, build, stage, package, the bundle steps)
    title: str
    key: str
    commands: tuple[Command, ...] = ()
    needs: tuple[str, ...] = ()
    data: Any = None  # the step kind's data (builders/steps/<kind>.py), by action
    # what the step does that is not a command of its own (fetches, patches), in words: its kind's describe(step)
    describe: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "action": self.action,
            "title": self.title,
            "key": self.key,
            "needs": list(self.needs),
            "commands": [c.to_json() for c in self.commands],
            **({"describe": list(self.describe)} if self.describe else {}),
        }


@dataclass(frozen=True)
class Layout:
    """Where a run keeps things. Sources and downloads are shared between bundles; work and out are per bundle."""

    root: Path  # the project checkout
    cache: Path  # content-addressed: git/<sha>.git, downloads/<sha256>/..., steps/<key>.json
    work: Path  # per bundle: src/, build/, stage/
    out: Path  # per bundle: packages, channel, tarball, SHA256SUMS
    # local mirror directories of git repositories, consulted before every pin's own mirrors (fetch.mirror_dirs);
    # None: $ONEBIT_GIT_MIRRORS, read when the fetch runs
    mirror_dirs: tuple[Path, ...] | None = None

    def git_cache(self, commit: str) -> Path:
        return self.cache / "git" / f"{commit}.git"

    def downloads(self) -> Path:
        return self.cache / "downloads"

    def wheels(self, key: str) -> Path:
        return self.cache / "wheels" / key[:16]

    def step_stamp(self, key: str) -> Path:
        return self.cache / "steps" / f"{key}.json"

    def src(self, name: str) -> Path:
        return self.work / "src" / name

    def build(self, variant_id: str) -> Path:
        return self.work / "build" / variant_id

    def stage(self, variant_id: str) -> Path:
        return self.work / "stage" / variant_id

    def stage_tmp(self, variant_id: str) -> Path:
        return self.work / "stage" / f".{variant_id}.tmp"

    def staged_prefix(self, variant_id: str, *, tmp: bool = False) -> Path:
        root = self.stage_tmp(variant_id) if tmp else self.stage(variant_id)
        return root / INSTALL_PREFIX.lstrip("/")

    def packages(self, key: str) -> Path:
        """Each package step writes into a directory named by its key: a stale file can never pass for a new one."""
        return self.work / "packages" / key[:16]

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
    missing: list[str] = field(default_factory=list)  # what the host must bring and lacks, one line each
    # what the build fetches and assembles first (build roots, pinned toolchain inputs), one line per input
    to_fetch: list[str] = field(default_factory=list)
    host: Any = None  # the HostFacts the plan was made from: toolchain.json records these, never a second probe

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
            "to_fetch": self.to_fetch,
            "steps": [s.to_json() for s in self.steps],
        }
