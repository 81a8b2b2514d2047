"""Assemble a bundle from the parts that CI jobs built, building nothing.

A part is the out dir of one build job (`1bit-build release-part`, or a whole `1bit-build build`): its channel's
.conda files, its manifest.json, its toolchain.json (what that build knew) and, where the job gated it on hardware,
gate.json. For each bundle of the release, the packages it needs are named by planning the bundle at the tag's
version and build number on this checkout: those exact files must be among the parts. A part built in another week,
at another build number, from another pin commit or from another revision of a recipe names other files (or other
manifest entries) and is refused with what differs. The metapackage, the manifest and the installed tree are then
written by the same code the build uses (builders/ship/bundle.py), so the assembled bundle is the one a single machine
would have built.

A variant that release.yaml fans out (`fan_out: {cuda: CMAKE_CUDA_ARCHITECTURES}`: one job per CUDA architecture)
makes one flavor of each bundle that holds it per value found among the parts, e.g. nvidia-sm_90.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..io import archives
from ..ship import bundle as bundles
from ..ship import manifest, toolchain_record
from ..project.config import Project, file_sha256
from ..errors import OnebitError
from ..inputs.host import HostFacts, ToolFact
from ..plan import all_tools, clobbers, make_plan
from ..plan_types import Layout, Plan

GATE_FILE = "gate.json"


class ComposeError(OnebitError):
    pass


@dataclass(frozen=True)
class Part:
    """One job's output, as it arrived."""
    dir: Path
    record: dict  # toolchain.json
    manifest: dict  # manifest.json
    packages: Mapping[str, Path]  # .conda file name -> path (its variants; its own metapackage left out)
    gate: dict | None = None


def find_parts(root: Path) -> list[Part]:
    """Every part below `root` (a directory holding toolchain.json and channel/), in path order."""
    import json

    root = Path(root)
    if not root.is_dir():
        raise ComposeError(f"{root}: no such directory", hint="pass --from the directory the build jobs' artifacts went to")
    parts = []
    for rec in sorted(root.rglob(toolchain_record.FILE)):
        d = rec.parent
        if not (d / "channel").is_dir() or not (d / "manifest.json").is_file():
            continue
        record = json.loads(rec.read_text())
        pkgs = {p.name: p for p in sorted((d / "channel").rglob("*.conda"))
                if not p.name.startswith(bundles.meta_name(record.get("bundle", "")) + "-")}
        gate = json.loads((d / GATE_FILE).read_text()) if (d / GATE_FILE).is_file() else None
        parts.append(Part(dir=d, record=record, manifest=json.loads((d / "manifest.json").read_text()), packages=pkgs,
                          gate=gate))
    stale = [m.parent for m in root.rglob("manifest.json") if (m.parent / "channel").is_dir()
             and not (m.parent / toolchain_record.FILE).is_file()]
    if stale:
        raise ComposeError(f"{stale[0]}: a built bundle without {toolchain_record.FILE}",
                           hint="it was built before builds recorded what they knew: build it again")
    if not parts:
        raise ComposeError(f"{root}: no built bundle below it (a directory with {toolchain_record.FILE} and channel/)",
                           hint="download the build jobs' artifacts there, or build first")
    return parts


def flavor_label(value: str) -> str:
    """Pure: the name a fanned-out value gives its flavor: CUDA's `90-real` / `80-virtual` -> `sm_90` / `sm_80`."""
    m = re.fullmatch(r"(\d+)(?:-(?:real|virtual))?", value)
    if m:
        return f"sm_{m[1]}"
    return re.sub(r"[^a-z0-9]+", "_", value.lower()).strip("_")


@dataclass(frozen=True)
class Want:
    """One package a bundle needs, as this checkout plans it."""
    variant: str
    file: str
    package: str
    build_string: str
    backend: str | None
    entry: Mapping | None  # the manifest entry the plan makes (without what the build reports about itself)


@dataclass
class Flavor:
    bundle: str
    label: str  # "" or e.g. "sm_90"
    plan: Plan
    wants: list[Want]
    fanned: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # variant -> {option: value}

    @property
    def name(self) -> str:
        return f"{self.bundle}-{self.label}" if self.label else self.bundle


def _no_facts(project: Project, bundle: str) -> HostFacts:
    """The assembling machine's toolchain must not matter: plan with every tool absent (names never depend on it)."""
    return HostFacts(tools={t.key: ToolFact(t.key, "", False) for t in all_tools(project, bundle)}, net_cut=(), jobs=1,
                     home="/nonexistent")


def wants_of(plan: Plan) -> list[Want]:
    out = []
    for step in plan.steps:
        if step.action != "package":
            continue
        stage = next(plan.step(n) for n in step.needs if n.startswith("stage:"))
        out.append(Want(variant=stage.data.variant, file=step.data.file.name, package=step.data.name,
                        build_string=step.data.build_string, backend=stage.data.backend,
                        entry=stage.data.manifest_entry))
    return out


def flavors(project: Project, bundle: str, *, version: str, build_number: int, parts: Sequence[Part],
            fan_out: Mapping[str, str], scratch: Path) -> list[Flavor]:
    """The bundle's flavors: one per value of a fanned-out option found among the parts (none: the bundle itself)."""
    layout = Layout(root=project.root, cache=scratch / "cache", work=scratch / "work", out=scratch / "out")
    facts = _no_facts(project, bundle)
    variants = project.variants(project.bundle(bundle))
    fanned = [(v, fan_out.get(v.id) or fan_out.get(v.recipe.name)) for v in variants]
    fanned = [(v, opt) for v, opt in fanned if opt]
    if len(fanned) > 1:
        raise ComposeError(f"bundle {bundle}: {len(fanned)} fanned-out variants ({', '.join(v.id for v, _ in fanned)})",
                           hint="release.yaml's fan_out may name one variant per bundle")
    combos: list[dict[str, dict[str, str]]] = [{}]
    if fanned:
        v, option = fanned[0]
        values = sorted({(rec.get("overrides") or {}).get(option) for p in parts
                         for vid, rec in p.record.get("variants", {}).items() if vid == v.id} - {None})
        if values:
            combos = [{v.id: {option: value}} for value in values]
    out = []
    for overrides in combos:
        plan = make_plan(project, bundle, facts, layout, build_number=build_number, version=version, overrides=overrides)
        label = flavor_label(next(iter(next(iter(overrides.values())).values()))) if overrides else ""
        out.append(Flavor(bundle=bundle, label=label, plan=plan, wants=wants_of(plan), fanned=overrides))
    return out


def _why_not(want: Want, parts: Sequence[Part], version: str, build_number: int, pins: Mapping) -> str:
    """What the parts have instead of a wanted package, and why it does not do."""
    for part in parts:
        rec = part.record.get("variants", {}).get(want.variant)
        if rec is None:
            continue
        problems = check_variant(part, want.variant, version, build_number, pins)
        if problems:
            return "; ".join(problems)
        return (f"{part.dir} has {rec.get('package')} with build string {rec.get('build_string')}, not "
                f"{want.build_string} (built from another revision of this checkout?)")
    return "no part built it"


def check_variant(part: Part, variant: str, version: str, build_number: int, pins: Mapping) -> list[str]:
    """Pure: what makes a part's build of a variant unfit for this release: its version, its build number, or the
    commit of the pin it was built from."""
    problems = []
    if part.record.get("version") != version:
        problems.append(f"{part.dir}: built at version {part.record.get('version')}, this release is {version}")
    if part.record.get("build_number") != build_number:
        problems.append(f"{part.dir}: built at build number {part.record.get('build_number')}, this release's tag "
                        f"asks for {build_number}")
    src = (part.record.get("variants", {}).get(variant) or {}).get("source") or {}
    pin = pins.get(src.get("pin")) if src.get("pin") else None
    if pin is not None and src.get("commit") != pin.commit:
        problems.append(f"{part.dir}: {variant} was built from {src['pin']} @ {src.get('commit')}; this checkout pins "
                        f"{pin.commit}")
    return problems


def _pick(want: Want, parts: Sequence[Part]) -> tuple[Part, Path] | None:
    found = [(p, p.packages[want.file]) for p in parts if want.file in p.packages]
    if not found:
        return None
    digests = {file_sha256(path) for _, path in found}
    if len(digests) > 1:
        raise ComposeError(f"{want.file}: {len(found)} parts hold it with different bytes: "
                           + ", ".join(str(p.dir) for p, _ in found),
                           hint="one job must build each package; the others may not upload it")
    return found[0]


HOST_REPORTED = ("build_network",)  # what the build host reports about itself in an entry, not the recipe


def _entry_problem(want: Want, entry: Mapping | None, record: Mapping) -> str | None:
    """The part's manifest entry must be this checkout's planned entry plus what the build reported about itself."""
    if want.backend is None:
        return None
    if entry is None:
        return f"its manifest has no backend {want.backend}"
    planned = {k: v for k, v in (want.entry or {}).items() if v is not None and k not in HOST_REPORTED}
    notes = set(record) - {"package", "build_string", "source", "tools", "inputs", "overrides"}
    extra = set(entry) - set(planned) - notes - set(HOST_REPORTED)
    differ = sorted(k for k in planned if entry.get(k) != planned[k])
    if differ or extra:
        return (f"its manifest entry for {want.backend} differs from this checkout's recipe in "
                f"{', '.join(differ + sorted(extra))}")
    return None


@dataclass
class Composed:
    """A bundle (flavor) assembled from parts: what the release flow needs."""
    name: str  # bundle or bundle-flavor
    bundle: str
    flavor: str
    version: str
    build_number: int
    prefix: Path  # the installed tree: every package's files and the bundle's manifest
    manifest_text: str
    packages: list[Path]  # the variant packages and the flavor's metapackage
    records: dict[str, dict]  # variant -> what its build knew (toolchain.json)
    gates: dict[str, dict]  # variant -> the gate.json of the job that built it (hardware checklists)
    upstream_licenses: dict[str, Path]  # pin -> its license file, from the package that shipped it
    fanned: dict[str, dict[str, str]]
    parts: dict[str, Path]  # package file -> the part it came from


def compose(project: Project, flavor: Flavor, parts: Sequence[Part], scratch: Path) -> Composed:
    """Assemble one flavor of a bundle from the parts; refuses when a package is missing or does not fit."""
    plan = flavor.plan
    pins = project.pins
    problems, picked = [], []
    for want in flavor.wants:
        hit = _pick(want, parts)
        if hit is None:
            problems.append(f"{want.file}: {_why_not(want, parts, plan.version, plan.build_number, pins)}")
            continue
        part, path = hit
        problems += check_variant(part, want.variant, plan.version, plan.build_number, pins)
        rec = part.record.get("variants", {}).get(want.variant, {})
        entry = (part.manifest.get("backends") or {}).get(want.backend) if want.backend else None
        problem = _entry_problem(want, entry, rec)
        if problem:
            problems.append(f"{part.dir}: {want.variant}: {problem}")
        picked.append((want, part, path, entry, rec))
    if problems:
        raise ComposeError(f"cannot assemble bundle {flavor.name} at {plan.version} build {plan.build_number} from the "
                           "built parts:\n  - " + "\n  - ".join(dict.fromkeys(problems)),
                           hint="build every part from this checkout at the tag's version and build number "
                                "(release.yml's release-tag job passes them), or release the week they were built for")
    work = scratch / flavor.name
    shutil.rmtree(work, ignore_errors=True)
    trees, infos, owners = {}, {}, {}
    for want, part, path, _, _ in picked:
        tree = work / "pkgs" / want.file.removesuffix(".conda")
        archives.unpack(path, tree, precheck=True)  # the project's one unpacker reads a .conda's two tars
        infos[want.variant] = work / "info" / want.variant
        infos[want.variant].parent.mkdir(parents=True, exist_ok=True)
        os.rename(tree / "info", infos[want.variant])
        trees[want.variant] = tree
        owners[want.package] = [p.relative_to(tree).as_posix() for p in sorted(tree.rglob("*"))
                                if p.is_file() or p.is_symlink()]
    owners[bundles.meta_name(flavor.bundle)] = [manifest.MANIFEST_PATH]
    clash = clobbers(owners)
    if clash:
        raise ComposeError(f"bundle {flavor.name}: two packages install the same path:\n    " + "\n    ".join(clash[:20]))
    entries = {want.backend: entry for want, _, _, entry, _ in picked if want.backend}
    doc = bundles.manifest_doc(plan.bundle, plan.version, plan.build_number, plan.platform, entries)
    text = manifest.dumps(doc)
    depends = [bundles.pin_spec(w.package, plan.version, w.build_string) for w, *_ in picked]
    meta = bundles.write_metapackage(bundle=plan.bundle, version=plan.version, build_number=plan.build_number,
                                     platform=plan.platform, summary=project.bundle(plan.bundle).summary, depends=depends,
                                     manifest_text=text, out_dir=work / "meta", scratch=work / "meta-files",
                                     flavor=flavor.label)
    prefix = work / "prefix"
    for tree in trees.values():
        shutil.copytree(tree, prefix, symlinks=True, dirs_exist_ok=True, copy_function=os.link)
    (prefix / manifest.MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
    (prefix / manifest.MANIFEST_PATH).write_text(text)
    licenses = {}
    for want, _, _, _, rec in picked:
        pin = (rec.get("source") or {}).get("pin")
        found = sorted((infos[want.variant] / "licenses").glob("*")) if (infos[want.variant] / "licenses").is_dir() else []
        if pin and found:
            licenses.setdefault(pin, found[0])
    return Composed(name=flavor.name, bundle=plan.bundle, flavor=flavor.label, version=plan.version,
                    build_number=plan.build_number, prefix=prefix, manifest_text=text,
                    packages=[path for _, _, path, _, _ in picked] + [meta],
                    records={w.variant: rec for w, _, _, _, rec in picked},
                    gates={w.variant: part.gate for w, part, *_ in picked if part.gate},
                    upstream_licenses=licenses, fanned={k: dict(v) for k, v in flavor.fanned.items()},
                    parts={path.name: part.dir for _, part, path, _, _ in picked})


def tree_digest(prefix: Path) -> str:
    """A digest of an installed tree (paths, link targets, bytes, executable bits), for tests and logs."""
    h = hashlib.sha256()
    for p in sorted(Path(prefix).rglob("*")):
        rel = p.relative_to(prefix).as_posix()
        if p.is_symlink():
            h.update(f"L {rel} {os.readlink(p)}\n".encode())
        elif p.is_file():
            h.update(f"F {rel} {os.access(p, os.X_OK)} {file_sha256(p)}\n".encode())
    return h.hexdigest()

