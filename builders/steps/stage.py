"""The stage step: the build system's install into a fresh DESTDIR, keep what the recipe packages, RPATH $ORIGIN,
check every ELF file against the floor, run the recipe's tests, swap the stage root into place
(builders/ship/stage.py's stage_variant)."""
from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

from ..ship import stage as staging
from ..kinds import KINDS
from ..plan_types import RecipeTest, RuntimeData, StageData, Step, digest
from ..ship.stage import KEY_FILE
from .base import Kind, StepContext, holds_key
from .variant import VariantInputs, expand, on_path

# StageData (with RecipeTest and RuntimeData) is this step's data; it lives in plan_types.py because the mechanism
# below the steps, builders/ship/stage.py, takes it whole, and no mechanism imports a step.


def manifest_entry(v: VariantInputs) -> dict | None:
    """The variant's entry in share/onebit/manifest.json (backends only)."""
    variant, source = v.variant, v.source
    if not variant.backend:
        return None
    entry = {
        "recipe": variant.recipe.name, "package": variant.package_name, "version": v.version,
        "build_number": v.build_number, "build_string": v.build_string, "root": variant.root or None,
        "adapter": variant.adapter, "binaries": {name: variant.in_prefix(rel) for name, rel in variant.binaries.items()},
        "devices": list(variant.devices),
        "source": {"pin": source.pin.name, "url": source.pin.url, "commit": source.commit,
                   "patches": list(v.patches)} if source.pin else None,
        "features": list(variant.features), "overrides": dict(v.overrides) or None,
        "build_network": "not isolated" if variant.network == "none" and not v.root.cuts_network else None,
        "toolchain_overrides": v.toolchain_overrides or None,
        "build_root": {"name": v.root.name, "key": v.root.key[:16]} if not v.root.is_host else None,
    }
    if variant.provides_env:
        entry["env"] = dict(variant.provides_env)
    if variant.host_libraries and v.floor:
        entry["host_libraries"] = [dict(i) for name in variant.host_libraries for i in v.floor.manifests.get(name, ())]
    return entry


def recipe_tests(v: VariantInputs) -> tuple[RecipeTest, ...]:
    """The recipe's tests with their {tool:...} placeholders expanded ({commit}/{commit7} stay for the runner)."""
    variant = v.variant
    values = {**v.values, **{k: "{" + k + "}" for k in ("commit", "commit7")}}
    own = len(variant.recipe.data.get("tests", []))
    out = []
    for i, t in enumerate(variant.tests):
        ypath = ("tests", i) if i < own else ("variants", variant.name, "tests", i - own)
        run = tuple(expand(a, values, partial(variant.recipe.doc.where, ypath + ("run", j))) for j, a in enumerate(t["run"]))
        out.append(RecipeTest(name=t["name"], run=run, expect=t.get("expect"), needs=t.get("needs")))
    return tuple(out)


def toolchain_roots(v: VariantInputs) -> tuple[str, ...]:
    """The roots of the variant's toolchains (pinned inputs in the cache, or a root a variable gave), sorted."""
    return tuple(sorted({f.root for t in v.variant.toolchain if (f := v.host.tools.get(t.key)) is not None and f.root
                         and (t.pinned or t.env)}))


def install_commands(v: VariantInputs) -> tuple:
    """The build system's install into the DESTDIR, where the build ran (the DESTDIR, which the stage step makes fresh
    before it runs them, bound read-write into a build root)."""
    commands = on_path(KINDS[v.variant.kind].install(v.ctx), v.path)
    return v.root.wrap_all(commands, ro=v.binds.ro, rw=(*v.binds.rw, str(v.layout.stage_tmp(v.variant.id))),
                           mkdirs=v.binds.mkdirs)


def plan_stage(v: VariantInputs, build: Step) -> Step:
    """Install into a DESTDIR, keep what the recipe packages, set RPATH $ORIGIN, check it, run the recipe's tests."""
    variant, layout = v.variant, v.layout
    entry = manifest_entry(v)
    tests = recipe_tests(v)
    # redistributable runtime libraries the variant ships from its toolchains (cudart, cuBLAS), unmodified
    runtime = tuple(RuntimeData(root=v.host.tools[t.key].root or "", package=w.package, libs=w.ship)
                    for t in variant.toolchain if t.key in v.host.tools for w in t.wheels if w.ship)
    key = digest("stage", build.key, variant.install, variant.root, variant.keep, variant.binaries, variant.links,
                 entry, [dataclasses.astuple(t) for t in tests], [dataclasses.astuple(r) for r in runtime],
                 *([variant.strip] if variant.strip else []),
                 *([("offload", variant.offload_targets)] if variant.offload_targets else []),
                 *([("floor", v.floor.key, variant.host_libraries)] if v.floor else []))
    return Step(id=f"stage:{variant.id}", action="stage",
                title=f"stage {variant.id} into a DESTDIR, set RPATH $ORIGIN, check it", key=key,
                commands=install_commands(v) if variant.install == "build-system" else (),
                needs=(build.id,),
                data=StageData(variant=variant.id, package=variant.package_name, stage_root=str(layout.stage(variant.id)),
                               stage_tmp=str(layout.stage_tmp(variant.id)),
                               tmp_prefix=str(layout.staged_prefix(variant.id, tmp=True)),
                               prefix=str(layout.staged_prefix(variant.id)), root=variant.root, keep=tuple(variant.keep),
                               binaries=dict(variant.binaries), links=dict(variant.links), backend=variant.backend,
                               manifest_entry=entry, build_dir=str(v.build_dir), home=v.host.home, tests=tests,
                               test_values={"commit": v.source.commit or "", "commit7": v.source.short},
                               where=str(variant.recipe.path), runtime=runtime, strip=variant.strip,
                               toolchains=toolchain_roots(v), build_root=v.root,
                               offload_targets=variant.offload_targets, floor=v.floor,
                               host_libraries=variant.host_libraries))


class StageStep(Kind):
    action = "stage"

    def run(self, ctx: StepContext, step: Step) -> None:
        from ..ship.repro import wheel_members

        # the vendored wheels, one folder per CPython (cp311/, ...)
        vendored = wheel_members(d for s in ctx.plan.steps if s.action == "wheels" for d in sorted(Path(s.data.dir).glob("cp*")))
        staging.stage_variant(step.data, ctx.layout.work, step.key, cache=ctx.layout.cache, vendored=vendored,
                              run_install=lambda: ctx.run_commands(step.commands), log=ctx.log)

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return holds_key(Path(step.data.stage_root) / KEY_FILE, step.key)

    def describe(self, step: Step) -> list[str]:
        return []  # its commands are the step's own; the rest is builders/ship/stage.py's


STEP = StageStep()
