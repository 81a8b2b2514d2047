"""plan: a pure function (project, bundle, host facts, layout) -> ordered steps with exact commands and cache keys.

Every other step executes a plan; nothing decides twice. `1bit-build plan BUNDLE` prints it.

How a bundle name becomes steps. The walk crosses this file (the composition and the helpers the planners share),
config.py (the bundle's variants), host.py (is a tool new enough), the step kinds in steps/ (one module each: its
planner and data) and the variant's build kind in kinds/ (its commands and flags); Step, Command, Plan and Layout
are in plan_types.py.
  make_plan       the bundle's variants, the refusals (unresolved pins), one `variant_steps` each, then the bundle
                  steps (steps/bundle.py)
  variant_steps   the step kinds' planners in order: source (with its fetch and submodules steps) -> root ->
                  companions (crates, hf) -> toolchain -> wheels -> build -> stage -> package
  variant_inputs  what the build, stage and package planners of one variant share (steps/variant.py), worked out once
"""
from __future__ import annotations

import dataclasses
import re
from functools import partial
from pathlib import Path
from typing import Mapping, Sequence

from .project.config import SYSROOT, SYSROOT_CMAKE, Bundle, Project, Tool, Variant
from .errors import OnebitError
from .inputs.host import HostFacts, ToolFact, version_ok
from .kinds import KINDS, KindContext, flags
from .kinds.cmake import SYSROOT_CMAKE_FILE
from .roots.root import Root, build_root
from .plan_types import INSTALL_PREFIX, Layout, Plan, Step, digest
from .steps.build import plan_build
from .steps.bundle import clobbers, plan_bundle
from .steps.crates import plan_crates
from .steps.hf import hf_unresolved, plan_hf
from .steps.package import plan_package
from .steps.root import plan_root
from .steps.source import Source, plan_source
from .steps.stage import plan_stage
from .steps.toolchain import pinned_dir, plan_toolchain
from .steps.variant import Binds, VariantInputs, expand
from .steps.wheels import plan_wheels, wheels_key


# ---- placeholders --------------------------------------------------------------------------------------------------
def tool_values(variant: Variant, facts: Mapping[str, ToolFact]) -> dict[str, str]:
    values = {}
    for tool in variant.toolchain:
        fact = facts.get(tool.key)
        if fact is None:
            continue
        values[f"tool:{tool.tool}"] = fact.path
        values[f"tool:{tool.tool}:root"] = fact.root or ""
        values[f"tool:{tool.tool}:major"] = (fact.version or "0").split(".")[0]
    return values


def fetched(tool: Tool, fact: ToolFact | None) -> bool:
    """Pure: whether an absent tool is one the build fetches first (a pinned input not yet assembled, or a tool of a
    build root that is not assembled yet), so the host need not bring it."""
    return fact is not None and not fact.found and fact.override is None and (fact.fetchable or (tool.pinned and not tool.root))


def missing_tools(variant: Variant, facts: Mapping[str, ToolFact]) -> list[str]:
    """One line per required tool the host must bring (absent, or too old), saying what to do. What the build fetches
    itself is not missing (`to_fetch`)."""
    out = []
    for tool in variant.toolchain:
        if tool.optional:
            continue
        fact = facts.get(tool.key)
        label = f"{tool.tool}{' ' + tool.version if tool.version else ''}"
        why = f" ({tool.why})" if tool.why else ""
        if fetched(tool, fact):
            continue
        if fact is None or not fact.found:
            if tool.root and fact is not None and fact.override is None:
                out.append(f"{label} for {variant.id}: not in build root {tool.root} at {fact.path}; add its package to "
                           f"roots/{tool.root}.yaml and run `1bit-build roots resolve {tool.root}`"
                           + (f", or set {tool.env} to override it with a toolkit" if tool.env else "") + why)
            elif tool.env:
                out.append(f"{label} for {variant.id}: not found at {fact.path if fact else tool.path}; "
                           f"set {tool.env} to the toolchain root{why}")
            elif tool.pkgconfig:
                out.append(f"{label} for {variant.id}: pkg-config finds no '{tool.pkgconfig}'; install its development package{why}")
            else:
                out.append(f"{label} for {variant.id}: '{tool.tool}' is not on PATH; install it{why}")
        elif not version_ok(fact.version, tool.version):
            out.append(f"{label} for {variant.id}: found {fact.version or 'an unknown version'} at {fact.path}; "
                       f"need {tool.version}{' (set ' + tool.env + ')' if tool.env else ''}")
    return out


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB"


def to_fetch(project: Project, variants: Sequence[Variant], facts: Mapping[str, ToolFact]) -> list[str]:
    """Pure: what the build fetches and assembles before anything else, one line per build root and per pinned
    toolchain input (with its size where the pin states it, the variants that use it, and the variables that would
    replace it), in the order the variants name them."""
    groups: dict[str, dict] = {}
    for variant in variants:
        for tool in variant.toolchain:
            fact = facts.get(tool.key)
            if tool.optional or not fetched(tool, fact):
                continue
            if tool.root and not (tool.wheels or tool.debs):
                pin = project.roots[tool.root]
                g = groups.setdefault(f"root:{tool.root}", {
                    "what": f"build root {tool.root}: {len(pin.resolved)} Debian package(s), {_mib(pin.download_size)}",
                    "users": [], "env": []})
            else:
                sizes = [d.size for d in tool.debs]
                size = f", {_mib(sum(sizes))}" if tool.debs and all(sizes) else ""
                what = (f"{len(tool.debs)} Debian package(s){size}" if tool.debs else
                        ", ".join(w.requirement for w in tool.wheels) + (" (wheel)" if len(tool.wheels) == 1 else " (wheels)"))
                inputs = sorted([w.sha256 for w in tool.wheels] + [d.sha256 for d in tool.debs])  # its identity
                g = groups.setdefault(f"tool:{tool.tool}:{digest(inputs)}", {
                    "what": f"{tool.tool}: {what}", "users": [], "env": []})
            if variant.id not in g["users"]:
                g["users"].append(variant.id)
            if tool.env and tool.env not in g["env"]:
                g["env"].append(tool.env)
    out = []
    for g in groups.values():
        env = f"; {', '.join(g['env'])} would replace {'them' if g['what'].startswith('build root') else 'it'}" if g["env"] else ""
        out.append(f"{g['what']} (for {', '.join(g['users'])}{env})")
    return out


def apply_overrides(variant: Variant, overrides: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The per-invocation option overrides (`--set RECIPE.OPTION=VALUE`) that apply to this variant."""
    out: dict[str, str] = {}
    for target in (variant.recipe.name, variant.id):
        out.update(overrides.get(target, {}))
    return out


def build_string(variant: Variant, short: str, build_number: int, overrides: Mapping[str, str],
                 toolchain_overrides: Mapping[str, str] | None = None) -> str:
    """`<variant>_h<commit7>_<n>`; with --set overrides `<variant>_h<commit7>_set<hash6>_<n>`, with a toolchain taken
    from the environment instead of its pinned input or build root (VULKAN_SDK, CUDA_HOME, ONEBIT_*_TOOLCHAIN)
    `..._env<hash6>_<n>`: such a build never passes for the release one."""
    tag = f"_set{digest(sorted(overrides.items()))[:6]}" if overrides else ""
    if toolchain_overrides:
        tag += f"_env{digest(sorted(toolchain_overrides.items()))[:6]}"
    return f"{variant.name}_h{short}{tag}_{build_number}"


def toolchain_overrides(variant: Variant, facts: Mapping[str, ToolFact]) -> dict[str, str]:
    """Pure: the variables that replaced a pinned toolchain input or the build root's copy for this variant, with
    the toolkit root each gave (the manifest's `toolchain_overrides`)."""
    out = {}
    for tool in variant.toolchain:
        fact = facts.get(tool.key)
        if fact is not None and fact.override:
            out[fact.override] = fact.root or ""
    return dict(sorted(out.items()))


# ---- the shared inputs of a variant's planners ---------------------------------------------------------------------
def plan_companions(variant: Variant, source: Source, layout: Layout, root: Root | None = None) -> list[Step]:
    """Crates vendored from the checkout and the pin's Hugging Face files, when the recipe asks for them."""
    recipe = variant.recipe
    if source.pin is None:
        return []
    out = []
    if recipe.source.get("crates"):
        out.append(plan_crates(layout, recipe, source, root))
    if recipe.source.get("huggingface"):
        out.append(plan_hf(layout, source.pin))
    return out


def root_dirs(project: Project, cache: Path) -> dict[str, str]:
    """Where each build root is assembled: its content address in the cache (what the host facts are gathered with)."""
    return {name: str(Path(cache) / pin.cache_dir) for name, pin in project.roots.items()}


def root_of(project: Project, host: HostFacts, layout: Layout, name: str | None) -> Root:
    """The Root a variant with build root `name` runs in (None: the host, the trivial root): assembled where the
    host facts say, else at its content address in the cache."""
    if not name:
        return host_root(host)
    directory = host.roots.get(name) or root_dirs(project, layout.cache)[name]
    return build_root(name, directory, project.roots[name].key, why_not=host.sandbox)


def host_root(host: HostFacts) -> Root:
    return Root(base=dict(host.env), net_cut=tuple(host.net_cut))


def variant_inputs(project: Project, variant: Variant, host: HostFacts, layout: Layout, source: Source,
                   companions: Sequence[Step], overrides: Mapping[str, str], build_number: int, version: str) -> VariantInputs:
    recipe = variant.recipe
    build_dir = layout.build(variant.id)
    wkey = wheels_key(recipe, host)
    values = {"source": source.dir, "build": str(build_dir), "prefix": str(build_dir / "_prefix"),
              "wheels": str(layout.wheels(wkey)), "python": host.python, "commit": source.commit or "",
              "commit7": source.short, "build_number": str(build_number), "variant": variant.id,
              **tool_values(variant, host.tools)}
    for step in companions:
        values[{"crates": "crates", "hf": "hf"}[step.action]] = step.data.dir
    if any(t.tool == SYSROOT for t in variant.toolchain):  # the sysroot's toolchain file, for a script running CMake
        values[SYSROOT_CMAKE] = str(build_dir / SYSROOT_CMAKE_FILE)
    unknown = sorted(set(overrides) - set(variant.options)) if KINDS[variant.kind].strict_options else []
    if unknown:
        raise OnebitError(f"--set {recipe.name}.{unknown[0]}: {variant.id} has no build option {unknown[0]!r}",
                          where=str(recipe.path), hint=f"its options: {', '.join(sorted(variant.options))}")
    options = {k: expand(v, values, partial(variant.where, "build", "options", k)) if isinstance(v, str) else v
               for k, v in {**variant.options, **overrides}.items()}
    env = {k: expand(v, values, partial(variant.where, "build", "env", k)) for k, v in variant.env.items()}
    path = tuple(expand(d, values, partial(variant.where, "build", "path", i)) for i, d in enumerate(variant.path))
    commands = tuple(tuple(expand(a, values, partial(variant.where, "build", "commands", i, j)) for j, a in enumerate(argv))
                     for i, argv in enumerate(variant.commands))
    install_prefix = f"{INSTALL_PREFIX}/{variant.root}" if variant.root else INSTALL_PREFIX
    launcher = host.tools.get(f"ccache[{variant.build_root}]" if variant.build_root else "ccache")
    ccache = launcher is not None and launcher.found
    extra_env = {"CCACHE_BASEDIR": ccache_base(layout), "CCACHE_NOHASHDIR": "true"} if ccache else {}
    root = root_of(project, host, layout, variant.build_root)
    binds = Binds()
    if not root.is_host:
        ccache_dir = str(layout.cache / "ccache")
        if ccache:
            extra_env["CCACHE_DIR"] = ccache_dir  # the sandbox's HOME is private: one compiler cache in the cache dir
        ro = [source.dir]
        if source.pin is not None:  # the checkout is a worktree: its .git points at the fetched objects
            ro.append(str(layout.git_cache(source.commit)))
            ro += [str(layout.git_cache(project.pins[e["pin"]].commit)) for e in recipe.source.get("extra", [])]
        ro += [s.data.dir for s in companions]
        if recipe.source.get("wheels"):
            ro.append(str(layout.wheels(wkey)))
        # a toolkit an override gave (TheRock), or a pinned toolchain input assembled in the cache (the Vulkan SDK)
        ro += sorted({f.root for t in variant.toolchain if (f := host.tools.get(t.key)) is not None and f.root
                      and (f.override or t.wheels or t.debs)})
        binds = Binds(ro=tuple(dict.fromkeys(ro)), rw=(str(build_dir), *([ccache_dir] if ccache else [])),
                      mkdirs=(str(build_dir), *([ccache_dir] if ccache else [])))
    root, host_libs, links = with_sysroot(project, variant, host, root, build_dir, layout)
    if not root.is_host and root.sysroot_dir and root.sysroot_dir not in binds.ro:  # the sysroot, read-only, in the root
        binds = dataclasses.replace(binds, ro=(*binds.ro, root.sysroot_dir))
    replaced = toolchain_overrides(variant, host.tools)
    ctx = KindContext(
        source=source.dir, build=str(build_dir), destdir=str(layout.stage_tmp(variant.id)), prefix=install_prefix,
        # where this variant's files land: its subtree of the staged prefix (kinds that copy their own install tree)
        staged_prefix=str(layout.staged_prefix(variant.id, tmp=True)) + (f"/{variant.root}" if variant.root else ""),
        build_prefix=str(build_dir / "_prefix"), jobs=host.jobs, build_type=variant.build_type, options=options,
        env=env, targets=variant.targets, commands=commands, launcher=launcher.path if ccache else None,
        # ccache: paths relative to the work dir, so a fresh work dir (CI, tests) still hits the cache
        extra_env=extra_env,
        # no work, cache or $HOME path in what ships (and the same bytes from any work dir and any ccache history)
        maps=tuple(flags.build_maps(source=source.dir, build=str(build_dir), name=source.name, cache=str(layout.cache),
                                    home=host.home)),
        sysroot=root.sysroot(), host_libs=host_libs, host_lib_links=links,
        glibc=project.floor.glibc if project.floor else "",
    )
    return VariantInputs(variant=variant, source=source, layout=layout, host=host, values=values, options=options,
                         env=env, commands=commands, ctx=ctx, install_prefix=install_prefix, companions=tuple(companions),
                         wheels_key=wkey if recipe.source.get("wheels") else None, overrides=overrides,
                         build_number=build_number, version=version,
                         patches=tuple(p.file for p in recipe.patches(project.root)), path=path, root=root,
                         binds=binds, floor=project.floor, toolchain_overrides=replaced,
                         build_string=build_string(variant, source.short, build_number, overrides, replaced))


def ccache_base(layout: Layout) -> str:
    """Pure: ccache's base_dir, under which it hashes paths relative to the compile's directory: the work dir and the
    cache together where they share a folder below / (a test's or CI's one temporary folder: the sysroot in the cache
    and the checkout in the work dir then hash alike from any such folder, so a fresh work dir still hits), else the
    work dir."""
    import os

    common = os.path.commonpath([str(layout.work), str(layout.cache)])
    return common if common != "/" else str(layout.work)


def with_sysroot(project: Project, variant: Variant, host: HostFacts, root: Root, build_dir: Path, layout: Layout
                 ) -> tuple[Root, object, tuple[tuple[str, str], ...]]:
    """Pure: the variant's root with the floor's sysroot its compilers build against (when the variant has it and it
    is assembled, or will be: a pinned input), the libraries of the user's system its link takes without shipping
    them (a build root's ROCm or XRT: the recipe's host sets), and the link names the executor makes for them."""
    tool = next((t for t in variant.toolchain if t.tool == SYSROOT), None)
    if tool is None:
        return root, None, ()
    sysroot_dir = pinned_dir(tool, host.tools.get(tool.key), layout)
    cxx = next((m.group(1) for d in tool.debs if (m := re.match(r"libstdc\+\+-(\d+)-dev_", d.name))), "11")
    root = dataclasses.replace(root, sysroot_dir=sysroot_dir, sysroot_cxx=cxx)
    sonames = [lib.soname for name in variant.host_libraries
               for lib in (project.floor.sets.get(name, ()) if project.floor else ())]
    override = next((f"{f.root}/lib" for t in variant.toolchain if t.env and (f := host.tools.get(t.key)) is not None
                     and f.override and f.root and t.tool != SYSROOT), None)
    links_dir = str(build_dir / "onebit-host-libs")
    host_libs = root.host_libs(sonames, links_dir, override)
    links = root.host_lib_links(sonames, links_dir) if host_libs is not None and not override else ()
    return root, host_libs, links


# ---- composing -----------------------------------------------------------------------------------------------------
def _add(steps: dict[str, Step], step: Step) -> Step:
    """Add a step once (variants share fetch, source and companion steps); return the one in the plan."""
    return steps.setdefault(step.id, step)


def variant_steps(project: Project, variant: Variant, host: HostFacts, layout: Layout, build_number: int,
                  version: str, steps: dict[str, Step], overrides: Mapping[str, str]) -> Step:
    """The variant's steps, planner by planner, in order; returns its package step."""
    source = plan_source(project, variant, layout, steps)
    # the build root first: the crates step runs its cargo
    root = root_of(project, host, layout, variant.build_root) if variant.build_root else None
    root_steps = [_add(steps, s) for s in plan_root(project, variant.build_root, root)]
    companions = [_add(steps, s) for s in plan_companions(variant, source, layout, root)]
    inputs = root_steps + [_add(steps, s) for s in plan_toolchain(variant, host, layout)
                           + plan_wheels(variant.recipe, host, layout)]
    v = variant_inputs(project, variant, host, layout, source, companions, overrides, build_number, version)
    build = _add(steps, plan_build(v, needs=[*([source.step_id] if source.step_id else []), *(s.id for s in inputs + companions)]))
    stage = _add(steps, plan_stage(v, build))
    return _add(steps, plan_package(v, stage))


def refusal(project: Project, variant: Variant) -> list[str]:
    """Why this host's plan cannot include the variant: an unresolved pin, or a checkpoint that can't be fetched."""
    pins = [variant.recipe.pin_name] + [e["pin"] for e in variant.recipe.source.get("extra", [])]
    unresolved = [project.pins[p] for p in pins if p and project.pins[p].unresolved]
    if unresolved:
        return [f"{variant.id}: pin {pin.name!r} is unresolved ({pin.where}): {pin.unresolved}" for pin in unresolved]
    hf_why = hf_unresolved(project.pins[pins[0]]) if pins[0] and variant.recipe.source.get("huggingface") else None
    if hf_why:
        return [f"{variant.id}: the Hugging Face files of pin {pins[0]!r} can't be fetched ({project.pins[pins[0]].where}): {hf_why}"]
    return []


def _check_names(bundle: Bundle, variants: Sequence[Variant], only: set[str] | None,
                 overrides: Mapping[str, Mapping[str, str]]) -> None:
    known = {v.recipe.name for v in variants} | {v.id for v in variants}
    for target in overrides:
        if target not in known:
            raise OnebitError(f"--set {target}.…: bundle {bundle.name!r} has no recipe or variant {target!r}",
                              hint=f"it has: {', '.join(sorted(known))}")
    for name in sorted(only or ()):
        if name not in known:
            raise OnebitError(f"--only {name}: bundle {bundle.name!r} has no recipe or variant {name!r}",
                              hint=f"it has: {', '.join(sorted(known))}")


def make_plan(project: Project, bundle_name: str, host: HostFacts, layout: Layout, *, build_number: int | None = None,
              only: set[str] | None = None, overrides: Mapping[str, Mapping[str, str]] | None = None,
              version: str | None = None) -> Plan:
    bundle = project.bundle(bundle_name)
    bn = bundle.build_number if build_number is None else build_number
    version = version or bundle.version
    overrides = overrides or {}
    variants = project.variants(bundle)
    _check_names(bundle, variants, only, overrides)
    problems = clobbers({v.package_name: claims(v) for v in variants})
    if problems:
        raise OnebitError(f"bundle {bundle.name!r}: two packages would install the same path:\n    " + "\n    ".join(problems),
                          where=str(bundle.path), hint="give each backend variant its own stage.root (libexec/onebit/{variant})")
    plan = Plan(bundle=bundle.name, version=version, build_number=bn, platform=bundle.platform, layout=layout, steps=[],
                host=host)
    steps: dict[str, Step] = {}
    packages: list[Step] = []
    built: list[Variant] = []
    for variant in variants:
        if only and variant.id not in only and variant.recipe.name not in only:
            continue
        refused = refusal(project, variant)
        if refused:
            plan.refusals += refused
            continue
        plan.missing += missing_tools(variant, host.tools)
        built.append(variant)
        packages.append(variant_steps(project, variant, host, layout, bn, version, steps, apply_overrides(variant, overrides)))
    plan.to_fetch = to_fetch(project, built, host.tools)
    rooted = sorted({f"{v.id} ({v.build_root})" for v in built if v.build_root})
    if rooted and host.sandbox:
        plan.missing.append(f"build roots for {', '.join(rooted)}: {host.sandbox}")
    if packages:
        for s in plan_bundle(bundle, version, bn, packages, layout):
            _add(steps, s)
    plan.steps = _ordered(steps)
    return plan


def _ordered(steps: dict[str, Step]) -> list[Step]:
    """Dependencies first, otherwise in insertion order."""
    done: dict[str, Step] = {}

    def visit(sid: str) -> None:
        if sid in done:
            return
        for need in steps[sid].needs:
            visit(need)
        done[sid] = steps[sid]

    for sid in steps:
        visit(sid)
    return list(done.values())


def claims(variant: Variant) -> list[str]:
    """Pure: the prefix paths a variant's package owns, known before building: its subtree (as `root/`), or, for a
    variant that installs into the prefix itself, its binaries; plus its links."""
    own = [variant.root + "/"] if variant.root else [variant.in_prefix(rel) for rel in variant.binaries.values()]
    return own + list(variant.links)


def all_tools(project: Project, bundle_name: str) -> list[Tool]:
    tools = []
    for v in project.variants(project.bundle(bundle_name)):
        tools.extend(v.toolchain)
    return tools
