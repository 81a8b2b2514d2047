"""plan: a pure function (project, bundle, host facts, layout) -> ordered steps with exact commands and cache keys.

Every other step executes a plan; nothing decides twice. `1bit-build plan BUNDLE` prints it.

How a bundle name becomes steps. The walk crosses this file, config.py (the bundle's variants), host.py (is a tool
new enough) and the variant's build kind in kinds/ (its commands and flags); the step types are in plan_types.py.
  make_plan       the bundle's variants, the refusals (unresolved pins), one `variant_steps` each, then `plan_bundle`
  variant_steps   the planners below in order: source -> companions -> toolchain -> wheels -> build -> stage -> package
  plan_<action>   one small pure function per step action, returning its Step(s)
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .config import MIRRORS_ENV, PLACEHOLDER, SYSROOT, SYSROOT_CMAKE, Bundle, Pin, Project, Recipe, Tool, Variant, describe_placeholders
from .errors import OnebitError
from .floor import Floor
from .host import HostFacts, ToolFact, version_ok, pinned_root
from .kinds import KINDS, KindContext, flags
from .kinds.cmake import SYSROOT_CMAKE_FILE
from .root import Root, build_root
from .plan_types import (INSTALL_PREFIX, BuildData, BundleData, Command, CratesData, ExtraSource, FetchData, HfData,
                         Layout, PackageData, Plan, RecipeTest, RootData, RuntimeData, SourceData, StageData, Step,
                         SubmodulesData, ToolchainData, WheelsData, digest)

BUILDER_VERSION = "5"  # bump to invalidate every build step key (5: serve vendors one wheel set per CPython)


# ---- placeholders --------------------------------------------------------------------------------------------------
def expand(text: str, values: Mapping[str, str], where: str | Callable[[], str] = "") -> str:
    """Replace {name} placeholders; an unknown one is an error naming the recipe's file:line (`where`, or a function
    that says it: worked out only for the error)."""

    def sub(m) -> str:
        name = m.group(1)
        if name not in values:
            raise OnebitError(f"unknown placeholder {{{name}}}", where=where() if callable(where) else where,
                              hint=f"known placeholders: {describe_placeholders(set(values))}")
        return values[name]

    return PLACEHOLDER.sub(sub, text)


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


# ---- planners: one per step action ---------------------------------------------------------------------------------
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


def plan_fetch(pin: Pin, layout: Layout, may_lack: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Step:
    """The pin's commit into the content-addressed git cache from the first of its mirrors that has it (builders/fetch.py,
    git through builders/gitcmd.py); the step runs no command of its own, so the plan describes the mirrors in order."""
    describe = []
    dirs = layout.mirror_dirs if layout.mirror_dirs is not None else (Path(f"${MIRRORS_ENV}"),)
    for mirror in pin.fetch_order(dirs):
        if mirror.kind == "mirror_dir":  # its objects copied (a partial clone: only if the absent files are tolerated)
            describe.append(f"from the mirror directory {mirror.spec}: its objects of {pin.short} copied")
        elif mirror.kind == "pypi_sdist":
            spec = mirror.spec
            describe.append(f"from the sdist {spec['package']}=={spec['version']} (sha256 {spec['sha256'][:12]}…, "
                            f"into {layout.downloads() / spec['sha256']}): its {spec['git_dir']}")
        else:
            describe.append(f"from {mirror.spec}: git fetch --depth=1 {pin.commit}")
    describe.append(f"verified: the commit's object id is {pin.commit}")
    return Step(id=f"fetch:{pin.name}", action="fetch",
                title=f"fetch {pin.name} @ {pin.short} (verified by commit SHA; mirrors in order)",
                key=digest("fetch", pin.url, pin.commit), describe=tuple(describe),
                data=FetchData(pin=pin.name, commit=pin.commit, dest=str(layout.git_cache(pin.commit)), may_lack=may_lack))


def _fetch_for(steps: dict[str, Step], pin: Pin, layout: Layout, user: tuple[str, tuple[str, ...]]) -> None:
    """The pin's fetch step, with this recipe among those whose `source.may_lack` a partial clone must satisfy."""
    sid = f"fetch:{pin.name}"
    step = steps.get(sid) or plan_fetch(pin, layout)
    if user not in step.data.may_lack:
        step = dataclasses.replace(step, data=dataclasses.replace(step.data, may_lack=step.data.may_lack + (user,)))
    steps[sid] = step


def may_lack_under(globs: Sequence[str], into: str) -> tuple[str, ...]:
    """Pure: a recipe's may_lack globs (paths of its checkout) as paths of an extra pin checked out at `into`."""
    prefix = into.strip("/") + "/"
    return tuple(g[len(prefix):] for g in globs if g.startswith(prefix))


def submodules_lock(layout: Layout, pin: Pin, want: Sequence[str]) -> Path:
    return layout.cache / "submodules" / f"{pin.commit}-{digest(sorted(want))[:12]}.json"


def plan_submodules(layout: Layout, pin: Pin, want: Sequence[str]) -> Step:
    """The pin's git submodules at the gitlinks its commit records (companions.py fetches them)."""
    return Step(id=f"fetch:submodules:{pin.name}", action="submodules",
                title=f"fetch submodules of {pin.name} @ {pin.short} at their gitlinks ({', '.join(want)})",
                key=digest("submodules", pin.url, pin.commit, sorted(want)),
                describe=tuple(f"{p}: its .gitmodules URL fetched at the gitlink {pin.short} records" for p in want),
                needs=(f"fetch:{pin.name}",),
                data=SubmodulesData(pin=pin.name, commit=pin.commit, url=pin.url, want=tuple(want),
                                    lock=str(submodules_lock(layout, pin, want)), git_dir=str(layout.git_cache(pin.commit))))


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
    _fetch_for(steps, pin, layout, (where, may_lack))
    for e, into in extra:
        _fetch_for(steps, e, layout, (where, may_lack_under(may_lack, into)))
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
        describe = tuple(f"apply {p.path.relative_to(project.root) if p.path.is_relative_to(project.root) else p.path} "
                         "(builders/patch.py: checked first; refused in one line if it no longer applies)" for p in patches)
        steps[step_id] = Step(
            id=step_id, action="source",
            title=f"check out {recipe.pin_name} @ {pin.short}" + (f" and apply {len(patches)} patch(es)" if patches else ""),
            key=key, commands=tuple(cmds), describe=describe,
            needs=tuple(f"fetch:{p.name}" for p in [pin] + [e for e, _ in extra]) + ((f"fetch:submodules:{pin.name}",) if subs else ()),
            data=SourceData(dir=str(src), pin=pin.name, commit=pin.commit, patches=tuple(str(p.path) for p in patches),
                            extra=tuple(ExtraSource(e.name, e.commit, into) for e, into in extra), where=str(recipe.path),
                            submodules_lock=str(submodules_lock(layout, pin, subs)) if subs else None,
                            may_lack=may_lack))
    return Source(key=key, dir=str(src), commit=pin.commit, short=pin.short, pin=pin, name=pin.name, step_id=step_id)


def plan_crates(layout: Layout, recipe: Recipe, source: Source, root: Root | None = None) -> Step:
    """`cargo vendor` of the checkout's Cargo.toml, cached by source: {crates}. It runs in the sandbox, with the cargo
    of the variant's build root when it has one (`root`; None: the host's)."""
    manifest = recipe.source["crates"]["manifest"]
    key = digest("crates", source.key, manifest)
    dest = layout.cache / "crates" / key[:16]
    where = f"in build root {root.name}'s sandbox" if root else "in the sandbox"
    return Step(id=f"fetch:crates:{recipe.name}", action="crates",
                title=f"cargo vendor the crates of {manifest} for {recipe.name} {where}, network on "
                      "(cached by source, offline afterwards)",
                key=key,
                describe=(f"cargo vendor --locked --versioned-dirs --manifest-path {source.dir}/{manifest}: into "
                          f"{dest}/vendor, written aside and swapped",),
                needs=(*((source.step_id,) if source.step_id else ()), *((root_step_id(root.name),) if root else ())),
                data=CratesData(source=source.dir, manifest=manifest, dir=str(dest), where=str(recipe.path), root=root))


def plan_hf(layout: Layout, pin: Pin) -> Step:
    """The pin's Hugging Face files at its revision, each checked against its sha256: {hf}."""
    hf = pin.raw["companions"]["huggingface"]
    files = dict(hf["files"])
    key = digest("hf", hf["repo"], hf.get("revision"), sorted(files.items(), key=lambda kv: kv[0]))
    return Step(id=f"fetch:hf:{pin.name}", action="hf",
                title=f"fetch {len(files)} file(s) of {hf['repo']} @ {str(hf.get('revision'))[:7]} (sha256 from pins.yaml)",
                key=key,
                describe=tuple(f"GET <the Hugging Face endpoint>/{hf['repo']}/resolve/{hf.get('revision')}/{name}, "
                               f"sha256 {files[name][:12]}…" for name in sorted(files)),
                data=HfData(pin=pin.name, repo=hf["repo"], revision=hf.get("revision"), files=tuple(sorted(files.items())),
                            dir=str(layout.cache / "hf" / key[:16]), where=pin.where))


def hf_unresolved(pin: Pin) -> str | None:
    """Why the pin's checkpoint can't be fetched, or None."""
    hf = (pin.raw.get("companions") or {}).get("huggingface")
    if not hf:
        return "it has no companions.huggingface entry"
    if hf.get("unresolved") or not hf.get("revision"):
        return hf.get("unresolved") or "no revision"
    missing = sorted(n for n, h in hf["files"].items() if not h)
    return f"no sha256 for {', '.join(missing)}" if missing else None


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


def plan_toolchain(variant: Variant, host: HostFacts, layout: Layout) -> list[Step]:
    """A toolchain the fetch step provides (the CUDA toolkit from NVIDIA's pinned wheels), when the host uses that copy:
    every wheel fetched by name, version and sha256 and assembled into one root in the cache."""
    out = []
    for tool in variant.toolchain:
        fact = host.tools.get(tool.key)
        if not (tool.pinned and fact is not None and pinned_dir(tool, fact, layout) == str(pinned_root(tool, layout.cache / "toolchains"))):
            continue
        if not fact.root:  # gathered without the cache's toolchains folder: the pinned input goes where the layout says
            fact = dataclasses.replace(fact, root=pinned_dir(tool, fact, layout))
        what = f"{len(tool.wheels)} wheel(s)" if tool.wheels else f"{len(tool.debs)} Debian package(s)"
        describe = tuple(f"the wheel {w.requirement} (sha256 {w.sha256[:12]}…): its {w.root}/ unpacked" for w in tool.wheels)
        describe += tuple(f"{d.path} from the Debian archives (sha256 {d.sha256[:12]}…): its data unpacked"
                          for d in tool.debs)
        describe += (f"assembled into {fact.root}",)
        out.append(Step(
            id=f"toolchain:{tool.tool}", action="toolchain",
            title=f"fetch {what} (sha256-checked) and assemble the {tool.tool} toolchain",
            key=digest("toolchain", fact.root, [dataclasses.astuple(w) for w in tool.wheels],
                       [dataclasses.astuple(d) for d in tool.debs], *([tool.floor] if tool.floor else [])),
            describe=describe + ((f"link stand-ins of libstdc++ and libgcc_s capped at {tool.floor[0]}",)
                                 if tool.floor else ()),
            data=ToolchainData(tool=tool.tool, wheels=tool.wheels, dest=fact.root, debs=tool.debs, floor=tool.floor)))
    return out


def root_step_id(name: str) -> str:
    return f"root:{name}"


def root_dirs(project: Project, cache: Path) -> dict[str, str]:
    """Where each build root is assembled: its content address in the cache (what the host facts are gathered with)."""
    return {name: str(pin.dest(cache)) for name, pin in project.roots.items()}


def root_of(project: Project, host: HostFacts, layout: Layout, name: str | None) -> Root:
    """The Root a variant with build root `name` runs in (None: the host, the trivial root): assembled where the
    host facts say, else at its content address in the cache."""
    if not name:
        return host_root(host)
    directory = host.roots.get(name) or root_dirs(project, layout.cache)[name]
    return build_root(name, directory, project.roots[name].key, why_not=host.sandbox)


def host_root(host: HostFacts) -> Root:
    return Root(base=dict(host.env), net_cut=tuple(host.net_cut))


def plan_root(project: Project, variant: Variant, host: HostFacts, layout: Layout) -> list[Step]:
    """The build root the variant runs in: every package fetched by pool path and sha256, assembled once into the
    cache under its content address (shared by every variant that names it)."""
    name = variant.build_root
    if not name:
        return []
    pin = project.roots[name]
    dest = root_of(project, host, layout, name).dir
    return [Step(id=root_step_id(name), action="root",
                 title=f"fetch {len(pin.resolved)} Debian package(s) ({pin.download_size / 2**20:.0f} MiB, sha256-checked) "
                       f"and assemble build root {name}",
                 key=digest("root", pin.key),
                 describe=(f"every package of roots/{name}.yaml by pool path and sha256, unpacked (no maintainer "
                           f"script runs) into {dest}, as `1bit-build roots assemble {name}` does",),
                 data=RootData(name=name, dest=dest, key=pin.key, where=str(pin.path)))]


def wheels_key(recipe: Recipe, host: HostFacts) -> str:
    """The vendored wheels are fetched for every supported CPython (source.pythons), not the build machine's own."""
    return digest("wheels", recipe.source.get("wheels", []), tuple(recipe.source.get("pythons", ())))


def plan_wheels(recipe: Recipe, host: HostFacts, layout: Layout) -> list[Step]:
    """The recipe's Python requirements as wheels for the build machine's interpreter."""
    wheels = recipe.source.get("wheels", [])
    if not wheels:
        return []
    key = wheels_key(recipe, host)
    pythons = tuple(recipe.source.get("pythons", ()))
    where = layout.wheels(key)
    return [Step(id=f"fetch:wheels:{recipe.name}", action="wheels",
                 title=f"fetch {len(wheels)} Python requirement(s) as wheels for {recipe.name}", key=key,
                 describe=tuple(f"pip download --no-deps --only-binary :all: --python-version {p} --dest "
                                f"{where}/cp{p.replace('.', '')} {' '.join(wheels)}" for p in pythons),
                 data=WheelsData(dir=str(where), requirements=tuple(wheels), pythons=pythons))]


@dataclass(frozen=True)
class Binds:
    """What a variant's commands see of the host inside its build root (the host root sees everything): the source
    (and the git objects its worktree points at), companions, wheels and override toolkits read-only; the build dir
    and the compiler cache read-write; what must exist before bwrap binds it."""

    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    mkdirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class VariantInputs:
    """What the build, stage and package planners of one variant share, worked out once (placeholders expanded)."""

    variant: Variant
    source: Source
    layout: Layout
    host: HostFacts
    values: Mapping[str, str]  # the placeholders' values
    options: Mapping[str, object]
    env: Mapping[str, str]
    commands: tuple[tuple[str, ...], ...]
    ctx: KindContext  # what the build kind turns into commands
    install_prefix: str
    companions: tuple[Step, ...]
    wheels_key: str | None
    overrides: Mapping[str, str]
    build_number: int
    version: str
    patches: tuple[str, ...]
    path: tuple[str, ...] = ()  # toolchain folders put first on PATH for the build's and the install's commands
    root: Root = field(default_factory=Root)  # where the commands run: the host, or the variant's build root
    binds: Binds = field(default_factory=Binds)  # what of the host a build root shows them
    floor: Floor | None = None  # the project's floor (floor.yaml): the stage gate's and the package's

    @property
    def build_dir(self) -> Path:
        return self.layout.build(self.variant.id)

    @property
    def toolchain_overrides(self) -> dict[str, str]:
        return toolchain_overrides(self.variant, self.host.tools)

    @property
    def build_string(self) -> str:
        return build_string(self.variant, self.source.short, self.build_number, self.overrides, self.toolchain_overrides)


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
    unknown = sorted(set(overrides) - set(variant.options)) if variant.kind == "cmake" else []
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
    extra_env = {"CCACHE_BASEDIR": str(layout.work), "CCACHE_NOHASHDIR": "true"} if ccache else {}
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
                         binds=binds, floor=project.floor)


def pinned_dir(tool: Tool, fact: ToolFact | None, layout: Layout) -> str:
    """Where a tool's pinned inputs are assembled: where the host facts found them, else (facts gathered without the
    cache's toolchains folder) their content address in this layout's cache; "" for a tool without pinned inputs."""
    if fact is not None and fact.root:
        return fact.root
    return str(pinned_root(tool, layout.cache / "toolchains")) if (tool.wheels or tool.debs) else ""


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


def on_path(commands: Sequence[Command], path: Sequence[str]) -> tuple[Command, ...]:
    """Pure: the commands with the recipe's toolchain folders first on their PATH."""
    return tuple(dataclasses.replace(c, path=tuple(path)) for c in commands) if path else tuple(commands)


def plan_build(v: VariantInputs, needs: Sequence[str]) -> Step:
    """The build kind's commands (configure + build, or make, or the recipe's script) in the variant's build dir."""
    variant = v.variant
    toolchain = sorted((t.key, (v.host.tools.get(t.key).version if v.host.tools.get(t.key) else None))
                       for t in variant.toolchain if not t.optional)
    key = digest("build", BUILDER_VERSION, flags.PREFIX_MAPS, v.source.key, variant.kind, v.options, variant.targets,
                 v.env, v.commands, variant.build_type, toolchain, v.wheels_key, v.install_prefix,
                 *[c.key for c in v.companions], *([v.path] if v.path else []),
                 *([("root", v.root.name, v.root.key)] if not v.root.is_host else []),
                 *([v.toolchain_overrides] if v.toolchain_overrides else []), *sysroot_key(v))
    commands = on_path(KINDS[variant.kind].build(v.ctx), v.path)
    net = variant.network != "none"
    where = ("" if v.root.is_host else f", in {v.root.describe()}") + (", network cut" if not net and v.root.cuts_network else "")
    return Step(id=f"build:{variant.id}", action="build",
                title=f"build {variant.id} ({variant.kind}{where})", key=key,
                commands=v.root.wrap_all(commands, ro=v.binds.ro, rw=v.binds.rw, mkdirs=v.binds.mkdirs, net=net),
                needs=tuple(needs),
                data=BuildData(variant=variant.id, kind=variant.kind, build_dir=str(v.build_dir), source_dir=v.source.dir,
                               fresh_dir=variant.kind == "script", where=str(variant.recipe.path),
                               network_isolated=net or v.root.cuts_network,
                               flags=digest(v.ctx.maps, *sysroot_key(v))))


def sysroot_key(v: VariantInputs) -> list:
    """What of the sysroot a build's key takes (its content address, never where the cache is, and the host
    libraries its link takes); a build dir configured with another is wiped first (CMake reads a toolchain file only
    when it first configures)."""
    if not v.root.sysroot_dir:
        return []
    hl = v.ctx.host_libs
    return [("sysroot", Path(v.root.sysroot_dir).name, v.root.sysroot_cxx,
             (Path(hl.links).name, hl.rpath_link) if hl is not None else None, [t for _, t in v.ctx.host_lib_links])]


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
        entry["host_libraries"] = v.floor.host_libraries(variant.host_libraries)
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


def _install_commands(v: VariantInputs) -> tuple[Command, ...]:
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
                commands=_install_commands(v) if variant.install == "build-system" else (),
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


def plan_package(v: VariantInputs, stage: Step) -> Step:
    """One .conda of the staged prefix, with its run requirements."""
    variant = v.variant
    recipe = variant.recipe
    values = v.values
    own = len(recipe.data.get("requirements", {}).get("run", []))
    depends = tuple(expand(d, values, partial(recipe.doc.where, ("requirements", "run", i) if i < own else
                                              ("variants", variant.name, "requirements", "run", i - own)))
                    for i, d in enumerate(variant.depends))
    key = digest("package", stage.key, variant.package_name, v.version, v.build_string, v.build_number, depends)
    return Step(id=f"package:{variant.id}", action="package",
                title=f"package {variant.package_name}-{v.version}-{v.build_string}.conda", key=key, needs=(stage.id,),
                data=PackageData(name=variant.package_name, version=v.version, build_string=v.build_string,
                                 build_number=v.build_number, license=recipe.data["license"], summary=recipe.data["summary"],
                                 homepage=recipe.data.get("homepage"), prefix=stage.data.prefix,
                                 out=str(v.layout.packages(key)), depends=depends,
                                 glibc_floor=v.floor.glibc if v.floor else None))


def plan_bundle(bundle: Bundle, version: str, build_number: int, packages: Sequence[Step], layout: Layout) -> list[Step]:
    """The metapackage (with the manifest), the channel, the tarball, SHA256SUMS, and the move into place."""
    meta_key = digest("meta", bundle.name, version, build_number, [p.key for p in packages])
    nxt = layout.next_out()
    tar_name = f"onebit-{bundle.name}-{version}-{build_number}-{bundle.platform}.tar.zst"
    common = dict(name=f"onebit-bundle-{bundle.name}", summary=bundle.summary, packages=tuple(p.id for p in packages),
                  out=str(layout.packages(meta_key)))
    return [
        Step("bundle:metapackage", "metapackage", f"metapackage onebit-bundle-{bundle.name} with share/onebit/manifest.json",
             meta_key, needs=tuple(p.id for p in packages), data=BundleData(**common, dir=str(nxt))),
        Step("bundle:channel", "channel", "index a local conda channel (py-rattler index_fs)",
             digest("channel", meta_key), needs=("bundle:metapackage",), data=BundleData(**common, dir=str(nxt / "channel"))),
        Step("bundle:tarball", "tarball", f"tar.zst of the installed tree: {tar_name}",
             digest("tarball", meta_key), needs=("bundle:channel",), data=BundleData(**common, dir=str(nxt / tar_name))),
        Step("bundle:checksums", "checksums", "SHA256SUMS of every artifact", digest("sums", meta_key),
             needs=("bundle:tarball",), data=BundleData(**common, dir=str(nxt / "SHA256SUMS"))),
        Step("bundle:publish", "publish", f"move the finished bundle into place: {layout.out}", digest("publish", meta_key),
             needs=("bundle:checksums",), data=BundleData(**common, dir=str(nxt), to=str(layout.out))),
    ]


# ---- composing -----------------------------------------------------------------------------------------------------
def _add(steps: dict[str, Step], step: Step) -> Step:
    """Add a step once (variants share fetch, source and companion steps); return the one in the plan."""
    return steps.setdefault(step.id, step)


def variant_steps(project: Project, variant: Variant, host: HostFacts, layout: Layout, build_number: int,
                  version: str, steps: dict[str, Step], overrides: Mapping[str, str]) -> Step:
    """The variant's steps, planner by planner, in order; returns its package step."""
    source = plan_source(project, variant, layout, steps)
    # the build root first: the crates step runs its cargo
    root_steps = [_add(steps, s) for s in plan_root(project, variant, host, layout)]
    root = root_of(project, host, layout, variant.build_root) if root_steps else None
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


def all_tools(project: Project, bundle_name: str) -> list[Tool]:
    tools = []
    for v in project.variants(project.bundle(bundle_name)):
        tools.extend(v.toolchain)
    return tools
