"""What a build knew, written beside its bundle as `toolchain.json`: for every variant it built, the package it made,
the source it built from (pin and commit), the version of every tool of its toolchain as the build host answered,
the toolchain inputs fetched as wheels (name, version, sha256), the options overridden with --set, and what the
build reported about itself (the shader features a glslc lacked); and the project commit the build ran from
(`project`: the checkout's HEAD and the tracked files that differed from it), so a release assembled from these files
points at that commit and no other.

The release assembles bundles from jobs that ran on other machines; it reads names (lean-rocm's ROCm major.minor),
the SBOM's tool list and the notes from these files, never from the machine that assembles.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from ..io import gitcmd
from ..project.config import Project, Tool
from ..inputs.host import ToolFact
from ..plan_types import Plan

FILE = "toolchain.json"
SCHEMA = 1


def variant_record(variant, facts: Mapping[str, ToolFact], *, package: str, build_string: str,
                   pin: str | None, commit: str | None, overrides: Mapping[str, str], notes: Mapping,
                   toolchain_overrides: Mapping[str, str] | None = None, build_root: Mapping | None = None) -> dict:
    """Pure: one variant's record (with the toolchains its environment overrode, and the build root it ran in:
    name, content address, glibc, and every package by pool path and sha256)."""
    tools, inputs = {}, []
    for tool in variant.toolchain:
        fact = facts.get(tool.key)
        if fact is None or not fact.found:
            continue  # an optional tool the host lacks (ccache)
        tools[tool.tool] = fact.version
        if fact.override:
            continue  # not the pinned inputs: toolchain_overrides says what it was
        for w in tool.wheels:  # the pinned toolchain inputs the tool was assembled from
            inputs.append({"tool": tool.tool, "package": w.package, "version": w.version, "sha256": w.sha256})
        for d in tool.debs:
            inputs.append({"tool": tool.tool, "package": d.name, "sha256": d.sha256})
    out = {"package": package, "build_string": build_string, "source": {"pin": pin, "commit": commit},
           "tools": dict(sorted(tools.items())), "inputs": sorted(inputs, key=lambda i: (i["tool"], i["package"]))}
    if overrides:
        out["overrides"] = dict(sorted(overrides.items()))
    if toolchain_overrides:
        out["toolchain_overrides"] = dict(sorted(toolchain_overrides.items()))
    if build_root:
        out["build_root"] = dict(build_root)
    out.update({k: v for k, v in sorted(notes.items())})
    return out


def checkout(root: Path) -> dict | None:
    """The project commit a checkout is at: {"commit": HEAD, "modified": the tracked files that differ from it}, or
    None where `root` is not in a git checkout with a commit."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return gitcmd.run(["-C", str(root), *args])

    head = git("rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if head.returncode != 0 or not head.stdout.strip():
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head.stdout.strip(), "modified": sorted(line[3:] for line in status.stdout.splitlines() if line[3:])}


def for_plan(plan: Plan, project: Project, facts: Mapping[str, ToolFact], notes_of: Callable[[str], Mapping],
             commit_of: Callable[[Path], dict | None] = checkout) -> dict:
    """Pure given the facts: the document for every variant the plan builds (`notes_of(build_dir)`: what its build
    reported; `commit_of(root)`: the project commit it ran from, see `checkout`)."""
    by_id = {v.id: v for v in project.variants(project.bundle(plan.bundle))}
    variants = {}
    for step in plan.steps:
        if step.action != "package":
            continue
        stage = next(plan.step(n) for n in step.needs if n.startswith("stage:"))
        build = plan.step(f"build:{stage.data.variant}")
        source = next((plan.step(n) for n in build.needs if plan.step(n).action == "source"), None)
        entry = stage.data.manifest_entry or {}
        variant = by_id[stage.data.variant]
        variants[stage.data.variant] = variant_record(
            variant, facts, package=step.data.name, build_string=step.data.build_string,
            pin=source.data.pin if source else None, commit=source.data.commit if source else None,
            overrides=entry.get("overrides") or {}, notes=notes_of(build.data.build_dir),
            toolchain_overrides=_toolchain_overrides(variant, facts),
            build_root=_build_root(project, variant, getattr(stage.data.build_root, "dir", None)))
    return {"schema": SCHEMA, "bundle": plan.bundle, "version": plan.version, "build_number": plan.build_number,
            "platform": plan.platform, "project": commit_of(Path(project.root)), "variants": variants}


def _toolchain_overrides(variant, facts: Mapping[str, ToolFact]) -> dict[str, str]:
    return {f.override: f.root or "" for t in variant.toolchain if (f := facts.get(t.key)) is not None and f.override}


def _build_root(project: Project, variant, assembled: str | None) -> dict | None:
    """The build root a variant ran in, as its pin says (and its glibc, as the assembled root recorded)."""
    if not variant.build_root:
        return None
    pin = project.roots[variant.build_root]
    meta = {}
    if assembled:
        try:
            meta = json.loads((Path(assembled) / "onebit-root.json").read_text())
        except (OSError, ValueError):
            meta = {}
    return {"name": pin.name, "key": pin.key, "snapshot": pin.snapshot, "glibc": meta.get("glibc"),
            "packages": [{"package": d.package, "version": d.version, "path": d.path, "sha256": d.sha256}
                         for d in pin.resolved]}


def tools_of(plan: Plan, project: Project) -> list[Tool]:
    ids = {s.data.variant for s in plan.steps if s.action == "build"}
    return [t for v in project.variants(project.bundle(plan.bundle)) if v.id in ids for t in v.toolchain]


def dumps(doc: Mapping) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def load(directory: Path) -> dict | None:
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())
