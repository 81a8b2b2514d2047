"""The source step: the checkout a variant builds, a git worktree of the fetched commit (and of its extra pins), its
submodules at their gitlinks, its patches applied (builders/inputs/patch.py: checked first, refused in one line if one no
longer applies). Variants that build the same commit, patches and extra pins share one checkout."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..inputs import companions, patch
from ..io import gitcmd, swap
from ..inputs import fetch as fetching
from ..project.config import Pin, Project, Variant
from ..errors import BuildError
from ..plan_types import Command, Layout, Step, digest
from .base import Kind, StepContext, described, holds_key
from .fetch import fetch_for
from .submodules import plan_submodules, submodules_lock


@dataclass(frozen=True)
class ExtraSource:
    pin: str
    commit: str
    into: str


@dataclass(frozen=True)
class SourceData:
    dir: str  # stable per (pin commit, patch list): a changed patch resets this checkout and re-applies
    pin: str
    commit: str
    patches: tuple[str, ...]
    extra: tuple[ExtraSource, ...]
    where: str
    submodules_lock: str | None = None  # the pin's submodules, checked out at their gitlinks
    may_lack: tuple[str, ...] = ()  # the recipe's source.may_lack: files its checkout may lack (a partial clone's)
    shown_patches: tuple[str, ...] = ()  # the patches as the plan names them (relative to the project)


@dataclass(frozen=True)
class Source:
    """What a variant builds from: a pinned commit (+patches, +extra pins) or a local directory."""

    key: str
    dir: str
    commit: str | None
    short: str
    pin: Pin | None
    name: str  # names the checkout in the path maps: one target per checkout, whichever variant builds it
    step_id: str | None = None


def may_lack_under(globs: Sequence[str], into: str) -> tuple[str, ...]:
    """Pure: a recipe's may_lack globs (paths of its checkout) as paths of an extra pin checked out at `into`."""
    prefix = into.strip("/") + "/"
    return tuple(g[len(prefix):] for g in globs if g.startswith(prefix))


def plan_source(project: Project, variant: Variant, layout: Layout, steps: dict[str, Step]) -> Source:
    """The checkout (a worktree of the fetched commit, patched), with the fetch steps it needs. Variants that build
    the same commit, patches and extra pins share one checkout and one step."""
    recipe = variant.recipe
    if recipe.pin_name is None:
        local = recipe.source["local"]
        d = project.digests.get(f"local:{local}", "")
        return Source(key=digest("local", local, d), dir=str(project.root / local), commit=None, short=d[:7], pin=None,
                      name=Path(local).name or recipe.name)
    pin = project.pins[recipe.pin_name]
    extra = [(project.pins[e["pin"]], e["into"]) for e in recipe.source.get("extra", [])]
    may_lack = recipe.may_lack
    where = recipe.path.relative_to(project.root).as_posix() if recipe.path.is_relative_to(project.root) else str(recipe.path)
    fetch_for(steps, pin, layout, (where, may_lack))
    for e, into in extra:
        fetch_for(steps, e, layout, (where, may_lack_under(may_lack, into)))
    subs = list(recipe.source.get("submodules", []))
    if subs:
        steps.setdefault(f"fetch:submodules:{pin.name}", plan_submodules(layout, pin, subs))
    patches = recipe.patches(project.root)
    extras = [(e.name, e.commit, into) for e, into in extra]
    key = digest("source", pin.commit, [(p.file, project.digests.get(str(p.path))) for p in patches], extras,
                 *([sorted(subs)] if subs else []))
    # The checkout's directory is named by what it is a checkout *of* (commit, patch names, extra pins), not by the
    # patches' contents: a refreshed patch resets and re-patches the same tree, so only the files it touches get new
    # mtimes and the build after it is incremental. The key file beside it says which contents it holds.
    series = digest([p.file for p in patches], extras, *([sorted(subs)] if subs else []))[:8]
    src = layout.src(f"{pin.name}@{pin.commit[:12]}" + (f"-{series}" if patches or extra or subs else ""))
    step_id = f"source:{recipe.pin_name}@{pin.short}" + (f"+{len(patches)}p" if patches else "") + (f"+{len(extra)}x" if extra else "")
    if step_id in steps and steps[step_id].key != key:
        step_id += f"~{key[:7]}"
    if step_id not in steps:
        # a worktree of the content-addressed cache: no copy of the objects, and the cache's shallow boundary holds
        cmds = [Command(("git", "--git-dir", str(layout.git_cache(pin.commit)), "worktree", "add", "--quiet", "--force",
                         "--detach", str(src), pin.commit))]
        cmds += [Command(("git", "--git-dir", str(layout.git_cache(e.commit)), "worktree", "add", "--quiet", "--force",
                          "--detach", f"{src}/{into}", e.commit)) for e, into in extra]
        shown = tuple(str(p.path.relative_to(project.root) if p.path.is_relative_to(project.root) else p.path)
                      for p in patches)
        steps[step_id] = described(Step(
            id=step_id, action="source",
            title=f"check out {recipe.pin_name} @ {pin.short}" + (f" and apply {len(patches)} patch(es)" if patches else ""),
            key=key, commands=tuple(cmds),
            needs=tuple(f"fetch:{p.name}" for p in [pin] + [e for e, _ in extra]) + ((f"fetch:submodules:{pin.name}",) if subs else ()),
            data=SourceData(dir=str(src), pin=pin.name, commit=pin.commit, patches=tuple(str(p.path) for p in patches),
                            extra=tuple(ExtraSource(e.name, e.commit, into) for e, into in extra), where=str(recipe.path),
                            submodules_lock=str(submodules_lock(layout, pin, subs)) if subs else None,
                            may_lack=may_lack, shown_patches=shown)), STEP)
    return Source(key=key, dir=str(src), commit=pin.commit, short=pin.short, pin=pin, name=pin.name, step_id=step_id)


def source_key_file(src: Path) -> Path:
    """Beside the checkout, not in it: the tree stays exactly the commit plus its patches."""
    return src.with_name(src.name + ".onebit-key")


def checkout_commands(ctx: StepContext, step: Step) -> list[Command]:
    """The plan's worktree commands, as sparse checkouts where a cache entry lacks files (a partial clone's): each
    absent file checked against the recipe's source.may_lack (one line naming the first that is not), listed
    in the log and beside the checkout (<src>.onebit-absent)."""
    d: SourceData = step.data
    out: list[Command] = []
    listed: list[str] = []
    for c in step.commands:
        if "apply" in c.argv:
            continue
        if c.argv[1:2] != ("--git-dir",) or "worktree" not in c.argv:
            out.append(c)
            continue
        cache_dir, dest, commit = c.argv[2], c.argv[-2], c.argv[-1]
        absent = [p for p, _ in fetching.absent_files(Path(cache_dir))]
        into = os.path.relpath(dest, d.dir)
        globs = d.may_lack if into == "." else may_lack_under(d.may_lack, into)
        bad = fetching.untolerated(absent, [(d.where, globs)])
        if bad:
            raise BuildError(f"the cache entry of {commit[:7]} ({cache_dir}) lacks {bad[0][0]}, which this recipe "
                             "may use (no glob of its source.may_lack matches it)", where=d.where,
                             hint="fetch the commit from a complete mirror (delete that cache entry first), or add "
                                  "the path to source.may_lack if the build never reads it")
        listed += [p if into == "." else f"{into}/{p}" for p in absent]
        out += [Command(argv) for argv in fetching.worktree_commands(cache_dir, dest, commit, absent)]
    marker = Path(d.dir).with_name(Path(d.dir).name + fetching.ABSENT_FILE)
    if listed:
        swap.write_text_atomic(marker, "".join(f"{p}\n" for p in listed))
        ctx.log(f"{step.id}: {len(listed)} file(s) of the pinned tree are absent from the checkout (its mirror is a "
                f"partial clone; tolerated by source.may_lack), listed in {marker}: {', '.join(listed)}")
    else:
        marker.unlink(missing_ok=True)
    return out


class SourceStep(Kind):
    action = "source"

    def run(self, ctx: StepContext, step: Step) -> None:
        d: SourceData = step.data
        src = Path(d.dir)
        key_file = source_key_file(src)
        key_file.unlink(missing_ok=True)
        if patch.reset_checkout(src, d.commit, [(e.into, e.commit) for e in d.extra]):
            ctx.log(f"reset {src.name} to {d.commit[:7]} (its patches changed)")
        else:
            shutil.rmtree(src, ignore_errors=True)
            for cache_dir in {c.argv[2] for c in step.commands if c.argv[1:2] == ("--git-dir",)}:
                gitcmd.run(["--git-dir", cache_dir, "worktree", "prune"])
            ctx.run_commands(checkout_commands(ctx, step))
        if d.submodules_lock:
            companions.checkout_submodules(src, Path(d.submodules_lock), ctx.layout.git_cache)
        results = patch.apply_all(src, [Path(p) for p in d.patches], where=d.where)
        for r in results:
            ctx.log(f"patch {r.patch}: {r.status}{' ' + r.detail if r.detail else ''}")
        swap.write_text_atomic(key_file, step.key + "\n")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return holds_key(source_key_file(Path(step.data.dir)), step.key) and Path(step.data.dir).is_dir()

    def describe(self, step: Step) -> list[str]:
        return [f"apply {p} (builders/inputs/patch.py: checked first; refused in one line if it no longer applies)"
                for p in step.data.shown_patches]


STEP = SourceStep()
