"""plan: a pure function (project, bundle, host facts, layout) -> ordered steps with exact commands and cache keys.

Every other step executes a plan; nothing decides twice. `1bit-build plan BUNDLE --dry-run` prints it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from . import companion_steps
from .config import Pin, Project, Tool, Variant
from .host import HostFacts, ToolFact, version_ok, wheel_root
from .kinds import KINDS, KindContext
from . import repro
from .errors import OnebitError
from .plan_types import (INSTALL_PREFIX, BuildData, BundleData, Command, ExtraSource, FetchData, Layout, PackageData,
                         Plan, RecipeTest, RuntimeData, SourceData, StageData, Step, ToolchainData, WheelsData, digest)

BUILDER_VERSION = "5"  # bump to invalidate every build step key (5: serve vendors one wheel set per CPython)
_PLACEHOLDER = re.compile(r"\{([a-z0-9_]+(?::[^{}:]+(?::(?:root|major))?)?)\}")


@dataclass(frozen=True)
class Source:
    """What a variant builds from: a pinned commit (+patches, +extra pins) or a local directory."""

    key: str
    dir: str
    commit: str | None
    short: str
    pin: Pin | None
    step_id: str | None = None


def expand(text: str, values: Mapping[str, str], where: str = "") -> str:
    """Replace {name} placeholders; an unknown one is an error naming the recipe."""

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in values:
            raise OnebitError(f"unknown placeholder {{{name}}}", where=where,
                              hint=f"known placeholders: {', '.join('{' + v + '}' for v in sorted(values))}")
        return values[name]

    return _PLACEHOLDER.sub(sub, text)


def expand_test(test: dict, values: Mapping[str, str], where: str) -> dict:
    """A recipe test with its {tool:...} placeholders expanded ({commit7}/{commit} stay for the runner)."""
    keep = {k: "{" + k + "}" for k in ("commit", "commit7")}
    return {**test, "run": [expand(a, {**values, **keep}, where) for a in test["run"]]}


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


def missing_tools(variant: Variant, facts: Mapping[str, ToolFact]) -> list[str]:
    """One line per required tool that is absent or too old, saying what to do."""
    out = []
    for tool in variant.toolchain:
        if tool.optional:
            continue
        fact = facts.get(tool.key)
        label = f"{tool.tool}{' ' + tool.version if tool.version else ''}"
        why = f" ({tool.why})" if tool.why else ""
        if fact is None or not fact.found:
            if tool.wheels and fact is not None:
                out.append(f"{label} for {variant.id}: not at {fact.path}; `1bit-build fetch BUNDLE` downloads "
                           f"{', '.join(w.requirement for w in tool.wheels)} (sha256-checked) into the cache"
                           f"{', or set ' + tool.env + ' to override them with a toolkit' if tool.env else ''}{why}")
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


def _fetch_step(pin: Pin, layout: Layout) -> Step:
    commands = []
    for mirror in pin.fetch_order():
        if mirror.kind == "pypi_sdist":
            spec = mirror.spec
            dest = layout.downloads() / spec["sha256"]
            commands.append(Command(("pip", "download", "--no-deps", "--no-binary", spec["package"],
                                     "--dest", str(dest), f"{spec['package']}=={spec['version']}")))
            commands.append(Command(("git", "fetch", f"<{spec['package']}-{spec['version']}>/{spec['git_dir']}", pin.commit)))
        else:
            commands.append(Command(("git", "fetch", "--depth=1", mirror.spec, pin.commit)))
    return Step(
        id=f"fetch:{pin.name}",
        action="fetch",
        title=f"fetch {pin.name} @ {pin.short} (verified by commit SHA; mirrors in order)",
        key=digest("fetch", pin.url, pin.commit),
        commands=tuple(commands),
        data=FetchData(pin=pin.name, commit=pin.commit, dest=str(layout.git_cache(pin.commit))),
    )


def _source(project: Project, variant: Variant, layout: Layout, steps: dict[str, Step]) -> Source:
    recipe = variant.recipe
    if recipe.pin_name is None:
        local = recipe.source["local"]
        d = project.digests.get(f"local:{local}", "")
        return Source(key=digest("local", local, d), dir=str(project.root / local), commit=None, short=d[:7], pin=None)
    pin = project.pins[recipe.pin_name]
    extra = [(project.pins[e["pin"]], e["into"]) for e in recipe.source.get("extra", [])]
    for p in [pin] + [e for e, _ in extra]:
        steps.setdefault(f"fetch:{p.name}", _fetch_step(p, layout))
    subs = list(recipe.source.get("submodules", []))
    if subs:  # companion sources: the pin's submodules at their gitlinks
        steps.setdefault(f"fetch:submodules:{pin.name}", companion_steps.submodule_step(layout, pin, subs))
    patches = recipe.patches(project.root)
    key = digest("source", pin.commit, [(p.file, project.digests.get(str(p.path))) for p in patches],
                 [(e.name, e.commit, into) for e, into in extra], *([sorted(subs)] if subs else []))
    # The checkout's directory is named by what it is a checkout *of* (commit, patch names, extra pins), not by the
    # patches' contents: a refreshed patch resets and re-patches the same tree, so only the files it touches get new
    # mtimes and the build after it is incremental. The key file beside it says which contents it holds.
    series = digest([p.file for p in patches], [(e.name, e.commit, into) for e, into in extra], *([sorted(subs)] if subs else []))[:8]
    src = layout.src(f"{pin.name}@{pin.commit[:12]}" + (f"-{series}" if patches or extra or subs else ""))
    step_id = f"source:{recipe.pin_name}@{pin.short}" + (f"+{len(patches)}p" if patches else "") + (f"+{len(extra)}x" if extra else "")
    if step_id in steps and steps[step_id].key != key:
        step_id += f"~{key[:7]}"
    if step_id not in steps:
        # a worktree of the content-addressed cache: no copy of the objects, and the cache's shallow boundary holds
        cmds = [Command(("git", "--git-dir", str(layout.git_cache(pin.commit)), "worktree", "add", "--quiet", "--force",
                         "--detach", str(src), pin.commit))]
        for e, into in extra:
            cmds.append(Command(("git", "--git-dir", str(layout.git_cache(e.commit)), "worktree", "add", "--quiet", "--force",
                                 "--detach", f"{src}/{into}", e.commit)))
        for p in patches:
            cmds.append(Command(("git", "-C", str(src), "apply", "--check", str(p.path))))
            cmds.append(Command(("git", "-C", str(src), "apply", str(p.path))))
        steps[step_id] = Step(
            id=step_id,
            action="source",
            title=f"check out {recipe.pin_name} @ {pin.short}" + (f" and apply {len(patches)} patch(es)" if patches else ""),
            key=key,
            commands=tuple(cmds),
            needs=tuple(f"fetch:{p.name}" for p in [pin] + [e for e, _ in extra]) + ((f"fetch:submodules:{pin.name}",) if subs else ()),
            data=SourceData(dir=str(src), pin=pin.name, commit=pin.commit, patches=tuple(str(p.path) for p in patches),
                            extra=tuple(ExtraSource(e.name, e.commit, into) for e, into in extra), where=str(recipe.path),
                            submodules_lock=str(companion_steps.submodules_lock(layout, pin, subs)) if subs else None),
        )
    return Source(key=key, dir=str(src), commit=pin.commit, short=pin.short, pin=pin, step_id=step_id)


def apply_overrides(variant: Variant, overrides: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The per-invocation option overrides (`--set RECIPE.OPTION=VALUE`) that apply to this variant."""
    out: dict[str, str] = {}
    for target in (variant.recipe.name, variant.id):
        out.update(overrides.get(target, {}))
    return out


def build_string(variant: Variant, short: str, build_number: int, overrides: Mapping[str, str]) -> str:
    """`<variant>_h<commit7>_<n>`; with overrides `<variant>_h<commit7>_set<hash6>_<n>`, so such a build never passes
    for the release one."""
    tag = f"_set{digest(sorted(overrides.items()))[:6]}" if overrides else ""
    return f"{variant.name}_h{short}{tag}_{build_number}"


def _variant_steps(project: Project, variant: Variant, host: HostFacts, layout: Layout, build_number: int,
                   version: str, steps: dict[str, Step], overrides: Mapping[str, str]) -> str:
    """Adds the variant's steps; returns the id of its package step."""
    recipe = variant.recipe
    source = _source(project, variant, layout, steps)
    build_dir = layout.build(variant.id)
    staged_prefix = layout.staged_prefix(variant.id)
    build_prefix = build_dir / "_prefix"
    wheels = recipe.source.get("wheels", [])
    pythons = tuple(recipe.source.get("pythons", ()))
    wheels_key = digest("wheels", wheels, pythons)
    wheels_dir = layout.wheels(wheels_key)
    install_prefix = f"{INSTALL_PREFIX}/{variant.root}" if variant.root else INSTALL_PREFIX
    values = {
        "source": source.dir,
        "build": str(build_dir),
        "prefix": str(build_prefix),
        "wheels": str(wheels_dir),
        "python": host.python,
        "commit": source.commit or "",
        "commit7": source.short,
        "build_number": str(build_number),
        "variant": variant.id,
        **tool_values(variant, host.tools),
    }
    companions = []  # crates vendored from the checkout, Hugging Face files of the pin: {crates} and {hf}
    if recipe.source.get("crates") and source.pin is not None:
        sstep = next(s.id for s in steps.values() if s.action == "source" and s.key == source.key)
        companions.append(steps.setdefault(f"fetch:crates:{recipe.name}",
                                           companion_steps.crates_step(layout, recipe, source.key, source.dir, sstep)))
        values["crates"] = companions[-1].data.dir
    if recipe.source.get("huggingface") and source.pin is not None:
        companions.append(steps.setdefault(f"fetch:hf:{source.pin.name}", companion_steps.hf_step(layout, source.pin)))
        values["hf"] = companions[-1].data.dir
    where = str(recipe.path)
    unknown = sorted(set(overrides) - set(variant.options)) if variant.kind == "cmake" else []
    if unknown:
        raise OnebitError(f"--set {recipe.name}.{unknown[0]}: {variant.id} has no build option {unknown[0]!r}",
                          where=where, hint=f"its options: {', '.join(sorted(variant.options))}")
    options = {k: expand(str(v), values, where) if isinstance(v, str) else v for k, v in {**variant.options, **overrides}.items()}
    env = {k: expand(v, values, where) for k, v in variant.env.items()}
    commands = tuple(tuple(expand(a, values, where) for a in argv) for argv in variant.commands)
    launcher = host.tools.get("ccache")
    stage_tmp = layout.stage_tmp(variant.id)
    ctx = KindContext(
        source=source.dir,
        build=str(build_dir),
        destdir=str(stage_tmp),
        prefix=install_prefix,
        # where this variant's files land: its subtree of the staged prefix (kinds that copy their own install tree)
        staged_prefix=str(layout.staged_prefix(variant.id, tmp=True)) + (f"/{variant.root}" if variant.root else ""),
        build_prefix=str(build_prefix),
        jobs=host.jobs,
        build_type=variant.build_type,
        options=options,
        env=env,
        targets=variant.targets,
        commands=commands,
        launcher=launcher.path if launcher and launcher.found else None,
        net_cut=host.net_cut if variant.network == "none" else (),
        # ccache: paths relative to the work dir, so a fresh work dir (CI, tests) still hits the cache
        extra_env={**({"CCACHE_BASEDIR": str(layout.work), "CCACHE_NOHASHDIR": "true"} if launcher and launcher.found else {}),
                   # no work, cache or $HOME path in what ships (and the same bytes from any work dir)
                   **repro.prefix_map_env(repro.build_maps(source=source.dir, build=str(build_dir), recipe=recipe.name,
                                                           cache=str(layout.cache), home=host.home), env)},
    )
    kind = KINDS[variant.kind]
    needs = [source.step_id] if source.step_id else []
    for tool in variant.toolchain:
        fact = host.tools.get(tool.key)
        if tool.wheels and fact is not None and fact.root == str(wheel_root(tool, layout.cache / "toolchains")):
            tid = f"toolchain:{tool.tool}"
            steps.setdefault(tid, Step(
                id=tid, action="toolchain",
                title=f"fetch {len(tool.wheels)} wheel(s) (sha256-checked) and assemble the {tool.tool} toolchain",
                key=digest("toolchain", fact.root, [dataclasses.astuple(w) for w in tool.wheels]),
                commands=tuple(Command(("pip", "download", "--no-deps", "--only-binary", ":all:", w.requirement))
                               for w in tool.wheels),
                data=ToolchainData(tool=tool.tool, wheels=tool.wheels, dest=fact.root)))
            needs.append(tid)
    if wheels:
        wid = f"fetch:wheels:{recipe.name}"
        steps.setdefault(wid, Step(
            id=wid,
            action="wheels",
            title=f"fetch {len(wheels)} Python requirement(s) as wheels for {recipe.name}",
            key=wheels_key,
            commands=tuple(Command(("pip", "download", "--no-deps", "--only-binary", ":all:", "--python-version", p,
                                    "--dest", f"{wheels_dir}/cp{p.replace('.', '')}", *wheels)) for p in pythons),
            data=WheelsData(dir=str(wheels_dir), requirements=tuple(wheels), pythons=pythons),
        ))
        needs.append(wid)
    needs += [c.id for c in companions]
    toolchain = sorted((t.key, (host.tools.get(t.key).version if host.tools.get(t.key) else None)) for t in variant.toolchain
                       if not t.optional)
    build_key = digest("build", BUILDER_VERSION, repro.PREFIX_MAPS, source.key, variant.kind, options, variant.targets, env,
                       commands, variant.build_type, toolchain, wheels_key if wheels else None, install_prefix,
                       *[c.key for c in companions])
    steps[f"build:{variant.id}"] = Step(
        id=f"build:{variant.id}",
        action="build",
        title=f"build {variant.id} ({variant.kind}{', network cut' if ctx.net_cut else ''})",
        key=build_key,
        commands=tuple(kind.build(ctx)),
        needs=tuple(needs),
        data=BuildData(variant=variant.id, kind=variant.kind, build_dir=str(build_dir), source_dir=source.dir,
                       fresh_dir=variant.kind == "script", where=where,
                       network_isolated=variant.network != "none" or bool(host.net_cut)),
    )
    bstring = build_string(variant, source.short, build_number, overrides)
    manifest_entry = None
    if variant.backend:
        manifest_entry = {
            "recipe": recipe.name,
            "package": variant.package_name,
            "version": version,
            "build_number": build_number,
            "build_string": bstring,
            "root": variant.root or None,
            "adapter": variant.adapter,
            "binaries": {name: variant.in_prefix(rel) for name, rel in variant.binaries.items()},
            "devices": list(variant.devices),
            "source": {"pin": source.pin.name, "url": source.pin.url, "commit": source.commit,
                       "patches": [p.file for p in recipe.patches(project.root)]} if source.pin else None,
            "features": list(variant.features),
            "overrides": dict(overrides) or None,
            "build_network": "not isolated" if variant.network == "none" and not host.net_cut else None,
        }
        if variant.provides_env:
            manifest_entry["env"] = dict(variant.provides_env)
    tests = tuple(RecipeTest(name=t["name"], run=tuple(t["run"]), expect=t.get("expect"), needs=t.get("needs"))
                  for t in (expand_test(t, values, where) for t in variant.tests))
    # redistributable runtime libraries the variant ships from its toolchains (cudart, cuBLAS), unmodified
    runtime = tuple(RuntimeData(root=host.tools[t.key].root or "", package=w.package, libs=w.ship)
                    for t in variant.toolchain if t.key in host.tools for w in t.wheels if w.ship)
    stage_key = digest("stage", build_key, variant.install, variant.root, variant.keep, variant.binaries, variant.links,
                       manifest_entry, [dataclasses.astuple(t) for t in tests], [dataclasses.astuple(r) for r in runtime])
    steps[f"stage:{variant.id}"] = Step(
        id=f"stage:{variant.id}",
        action="stage",
        title=f"stage {variant.id} into a DESTDIR, set RPATH $ORIGIN, check it",
        key=stage_key,
        commands=tuple(kind.install(ctx)) if variant.install == "build-system" else (),
        needs=(f"build:{variant.id}",),
        data=StageData(variant=variant.id, package=variant.package_name, stage_root=str(layout.stage(variant.id)),
                       stage_tmp=str(stage_tmp), tmp_prefix=str(layout.staged_prefix(variant.id, tmp=True)),
                       prefix=str(staged_prefix), root=variant.root, keep=tuple(variant.keep),
                       binaries=dict(variant.binaries), links=dict(variant.links), backend=variant.backend,
                       manifest_entry=manifest_entry, build_dir=str(build_dir), home=host.home, tests=tests,
                       test_values={"commit": source.commit or "", "commit7": source.short}, where=where,
                       runtime=runtime),
    )
    depends = tuple(expand(d, values, where) for d in variant.depends)
    package_key = digest("package", stage_key, variant.package_name, version, bstring, build_number, depends)
    pid = f"package:{variant.id}"
    steps[pid] = Step(
        id=pid,
        action="package",
        title=f"package {variant.package_name}-{version}-{bstring}.conda",
        key=package_key,
        needs=(f"stage:{variant.id}",),
        data=PackageData(name=variant.package_name, version=version, build_string=bstring, build_number=build_number,
                         license=recipe.data["license"], summary=variant.recipe.data["summary"],
                         homepage=recipe.data.get("homepage"), prefix=str(staged_prefix),
                         out=str(layout.packages(package_key)), depends=depends, glibc_from_elf=True),
    )
    return pid


def claims(variant: Variant) -> list[str]:
    """Pure: the prefix paths a variant's package owns, known before building: its subtree (as `root/`), or, for a
    variant that installs into the prefix itself, its binaries; plus its links."""
    own = [variant.root + "/"] if variant.root else [variant.in_prefix(rel) for rel in variant.binaries.values()]
    return own + list(variant.links)


def clobbers(owners: Mapping[str, Sequence[str]]) -> list[str]:
    """Pure: every prefix path two packages would both install. A claim ending in '/' owns the whole subtree.

    owners: package name -> its claims (or, after staging, its real file list)."""
    problems = []
    flat = sorted((path, pkg) for pkg, paths in owners.items() for path in paths)
    for i, (a, pa) in enumerate(flat):
        for b, pb in flat[i + 1:]:
            if pa == pb:
                continue
            if a == b or (a.endswith("/") and b.startswith(a)) or (b.endswith("/") and a.startswith(b)):
                problems.append(f"{pa} and {pb} would both install {min(a, b, key=len)}")
    return problems


def make_plan(project: Project, bundle_name: str, host: HostFacts, layout: Layout, *, build_number: int | None = None,
              only: set[str] | None = None, overrides: Mapping[str, Mapping[str, str]] | None = None,
              version: str | None = None) -> Plan:
    bundle = project.bundle(bundle_name)
    bn = bundle.build_number if build_number is None else build_number
    version = version or bundle.version
    overrides = overrides or {}
    plan = Plan(bundle=bundle.name, version=version, build_number=bn, platform=bundle.platform, layout=layout, steps=[])
    steps: dict[str, Step] = {}
    packages: list[str] = []
    variants = project.variants(bundle)
    known = {v.recipe.name for v in variants} | {v.id for v in variants}
    for target in overrides:
        if target not in known:
            raise OnebitError(f"--set {target}.…: bundle {bundle.name!r} has no recipe or variant {target!r}",
                              hint=f"it has: {', '.join(sorted(known))}")
    owners = {v.package_name: claims(v) for v in variants}
    problems = clobbers(owners)
    if problems:
        raise OnebitError(f"bundle {bundle.name!r}: two packages would install the same path:\n    " + "\n    ".join(problems),
                          where=str(bundle.path), hint="give each backend variant its own stage.root (libexec/onebit/{variant})")
    for variant in variants:
        if only and variant.id not in only and variant.recipe.name not in only:
            continue
        pins = [variant.recipe.pin_name] + [e["pin"] for e in variant.recipe.source.get("extra", [])]
        unresolved = [project.pins[p] for p in pins if p and project.pins[p].unresolved]
        if unresolved:
            for pin in unresolved:
                plan.refusals.append(f"{variant.id}: pin {pin.name!r} is unresolved ({pin.where}): {pin.unresolved}")
            continue
        hf_why = companion_steps.hf_unresolved(project.pins[pins[0]]) if pins[0] and variant.recipe.source.get("huggingface") else None
        if hf_why:
            plan.refusals.append(f"{variant.id}: the Hugging Face files of pin {pins[0]!r} can't be fetched ({project.pins[pins[0]].where}): {hf_why}")
            continue
        plan.missing += missing_tools(variant, host.tools)
        packages.append(_variant_steps(project, variant, host, layout, bn, version, steps, apply_overrides(variant, overrides)))
    if packages:
        pkg_keys = [steps[p].key for p in packages]
        meta_key = digest("meta", bundle.name, version, bn, pkg_keys)
        nxt = layout.next_out()
        tar_name = f"onebit-{bundle.name}-{version}-{bn}-{bundle.platform}.tar.zst"
        common = dict(name=f"onebit-bundle-{bundle.name}", summary=bundle.summary, packages=tuple(packages),
                      out=str(layout.packages(meta_key)))
        bundle_steps = [
            Step("bundle:metapackage", "metapackage", f"metapackage onebit-bundle-{bundle.name} with share/onebit/manifest.json",
                 meta_key, needs=tuple(packages), data=BundleData(**common, dir=str(nxt))),
            Step("bundle:channel", "channel", "index a local conda channel (py-rattler index_fs)",
                 digest("channel", meta_key), needs=("bundle:metapackage",), data=BundleData(**common, dir=str(nxt / "channel"))),
            Step("bundle:tarball", "tarball", f"tar.zst of the installed tree: {tar_name}",
                 digest("tarball", meta_key), needs=("bundle:channel",), data=BundleData(**common, dir=str(nxt / tar_name))),
            Step("bundle:checksums", "checksums", "SHA256SUMS of every artifact", digest("sums", meta_key),
                 needs=("bundle:tarball",), data=BundleData(**common, dir=str(nxt / "SHA256SUMS"))),
            Step("bundle:publish", "publish", f"move the finished bundle into place: {layout.out}", digest("publish", meta_key),
                 needs=("bundle:checksums",), data=BundleData(**common, dir=str(nxt), to=str(layout.out))),
        ]
        for s in bundle_steps:
            steps[s.id] = s
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


def all_tools(project: Project, bundle_name: str) -> list[Tool]:
    tools = []
    for v in project.variants(project.bundle(bundle_name)):
        tools.extend(v.toolchain)
    return tools
