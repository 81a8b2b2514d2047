"""The declarative inputs: pins.yaml, recipes/*.yaml, bundles/*.yaml, loaded, validated and cross-checked."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from onebit.digest import file_sha256  # builders' modules import it from here too

from . import floor as floors, schemas, yamlio
from .version import this_week
from ..errors import OnebitError, ValidationError
from .floor import Floor

DEFAULT_VARIANT = "default"
# `{name}`, `{tool:NAME}`, `{tool:NAME:root}`, `{tool:NAME:major}`: what a recipe's options, env, commands, tests and
# run requirements may name; the plan fills them in, validation refuses an unknown one with its file:line
PLACEHOLDER = re.compile(r"\{([a-z0-9_]+(?::[^{}:]+(?::(?:root|major))?)?)\}")
PLACEHOLDERS = ("source", "build", "prefix", "wheels", "python", "commit", "commit7", "build_number", "variant")


# local mirror directories of git repositories (`--mirror-dir`, this variable): consulted before a pin's own mirrors
MIRRORS_ENV = "ONEBIT_GIT_MIRRORS"


@dataclass(frozen=True)
class Mirror:
    kind: str  # "git" | "pypi_sdist" | "mirror_dir"
    spec: Any  # url string for git, dict for pypi_sdist, the repository's path for mirror_dir

    def describe(self) -> str:
        if self.kind == "git":
            return f"git {self.spec}"
        if self.kind == "mirror_dir":
            return f"mirror dir {self.spec}"
        return f"sdist {self.spec['package']}=={self.spec['version']} (sha256 {self.spec['sha256'][:12]}…)"


@dataclass(frozen=True)
class Pin:
    name: str
    url: str
    policy: str
    cadence: str
    license: str
    commit: str | None
    unresolved: str | None
    mirrors: tuple[Mirror, ...]
    branch: str | None = None
    tag: str | None = None
    raw: dict = field(default_factory=dict, compare=False, hash=False)
    where: str = ""

    @property
    def short(self) -> str:
        return (self.commit or "unresolved")[:7]

    def fetch_order(self, mirror_dirs: Sequence[str | Path] = ()) -> tuple[Mirror, ...]:
        """Every repository of the local mirror directories that may hold the pin (each directory in order, each of
        repo_names in order), then the mirrors in the order given; the canonical url last unless listed."""
        mirrors = [Mirror("mirror_dir", str(Path(d) / n)) for d in mirror_dirs for n in repo_names(self.name, self.url)]
        mirrors += self.mirrors
        if not any(m.kind == "git" and m.spec == self.url for m in mirrors):
            mirrors.append(Mirror("git", self.url))
        return tuple(mirrors)


def repo_names(name: str, url: str) -> tuple[str, ...]:
    """Pure: the repositories a mirror directory may hold a pin under, in order: `<pin name>.git`, then the last part
    of its URL (`.git` added where it lacks it): ds4-rocm -> ds4-rocm.git, ds4.git. The upstream of a fork pin is the
    pin `<name>-upstream` (fetch.upstream_pin), so rocmfpx's `upstream.commit` is found in rocmfpx-upstream.git."""
    base = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    names = [f"{name}.git", base if base.endswith(".git") else f"{base}.git"]
    return tuple(dict.fromkeys(n for n in names if n not in (".git", "..git")))


@dataclass(frozen=True)
class Patch:
    file: str
    purpose: str
    upstream: str
    path: Path

    @property
    def sha256(self) -> str:
        return file_sha256(self.path)


def tree_digest(root: Path) -> str:
    """A digest of every file under root (names and contents), ignoring caches."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(file_sha256(path).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class WheelInput:
    """One wheel of a toolchain input: fetched by name and version, checked against its sha256, its `root` folder
    unpacked into the tool's root; `ship` names the runtime libraries of it that a variant redistributes."""

    package: str
    version: str
    sha256: str
    root: str
    ship: tuple[str, ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class DebInput:
    """One Debian package of a toolchain input: its path in a Debian archive and the sha256 of the file."""

    path: str
    sha256: str
    size: int | None = None  # bytes (the Packages entry's Size): a download is cut off past it, before hashing

    @property
    def name(self) -> str:
        """The package file's name (glslc_2025.2-1_amd64.deb)."""
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Tool:
    tool: str
    version: str | None = None
    env: str | None = None
    default: str | None = None
    path: str | None = None
    why: str | None = None
    optional: bool = False
    pkgconfig: str | None = None
    wheels: tuple[WheelInput, ...] = ()  # a toolchain input assembled from wheels fetched and verified into the cache
    debs: tuple[DebInput, ...] = ()  # a toolchain input assembled from Debian packages fetched and verified likewise
    in_root: str | None = None  # the tool's absolute path inside the variant's build root (`{tool:T:root}` is /usr)
    root: str | None = None  # the build root the variant runs in (set from build.root): the tool is looked up there
    floor: tuple | None = None  # the sysroot's: (policy, ((family, cap), ...)) its link stand-ins are capped at

    @property
    def pinned(self) -> bool:
        """Whether the fetch step provides this tool (its `env` then overrides the pinned copy): pinned inputs, or
        the variant's build root."""
        return bool(self.wheels or self.debs or self.root)

    @property
    def key(self) -> str:
        base = f"{self.tool}@{self.env}" if self.env else self.tool
        return f"{base}[{self.root}]" if self.root else base


def _tool(data: dict, root: str | None = None) -> "Tool":
    wheels = tuple(WheelInput(**{**w, "ship": tuple(w.get("ship", ()))}) for w in data.get("wheels", ()))
    debs = tuple(DebInput(**d) for d in data.get("debs", ()))
    return Tool(**{**{k: v for k, v in data.items() if k not in ("wheels", "debs")}, "wheels": wheels, "debs": debs,
                   "root": root})


@dataclass(frozen=True)
class Variant:
    """One buildable variant of a recipe: everything merged, ready for the plan."""

    recipe: "Recipe"
    name: str
    toolchain: tuple[Tool, ...]
    kind: str
    options: dict
    targets: tuple[str, ...]
    env: dict
    commands: tuple[tuple[str, ...], ...]
    network: str
    build_type: str
    install: str
    root: str  # the prefix subtree this variant installs into ("" = the prefix itself)
    keep: tuple[str, ...]  # relative to root
    binaries: dict  # logical name -> path relative to root
    links: dict  # convenience symlink (prefix-relative) -> target relative to root
    backend: str | None
    adapter: str
    devices: tuple[str, ...]
    features: tuple[str, ...]
    provides_env: dict
    tests: tuple[dict, ...]
    depends: tuple[str, ...] = ()  # run requirements of its package (conda match specs; virtual packages)
    path: tuple[str, ...] = ()  # folders put first on PATH for the build's commands (toolchain roots' bin/)
    strip: str | None = None  # "debug": strip the debug sections of what ships
    build_root: str | None = None  # roots/<name>.yaml the build step runs inside (None: the host)
    offload_targets: tuple[str, ...] = ()  # the GPU targets every shipped HIP file must carry exactly (gfx1151)
    host_libraries: tuple[str, ...] = ()  # floor.yaml's host-library sets its shipped files may link (rocm7)

    @property
    def id(self) -> str:
        return self.recipe._id(self.name)

    def in_prefix(self, rel: str) -> str:
        """A root-relative path as a prefix-relative one."""
        return f"{self.root}/{rel}" if self.root else rel

    @property
    def package_name(self) -> str:
        return f"onebit-{self.id}"

    def where(self, *ypath) -> str:
        """`file:line: yaml.path` of a merged field: the variant's override when it has one, else the recipe's."""
        doc = self.recipe.doc
        over = ("variants", self.name, *ypath)
        return doc.where(over if over in doc.lines else tuple(ypath))

    def placeholders(self) -> set[str]:
        """Every placeholder this variant's fields may use (its toolchain's tools, {crates} and {hf} when it has them)."""
        names = set(PLACEHOLDERS)
        for tool in self.toolchain:
            names |= {f"tool:{tool.tool}", f"tool:{tool.tool}:root", f"tool:{tool.tool}:major"}
        if self.recipe.pin_name and self.recipe.source.get("crates"):
            names.add("crates")
        if self.recipe.pin_name and self.recipe.source.get("huggingface"):
            names.add("hf")
        if any(t.tool == SYSROOT for t in self.toolchain):
            names.add(SYSROOT_CMAKE)
        return names


SYSROOT = "sysroot"  # floor.yaml's toolchain entry: the pinned sysroot (builders/roots/sysroot.py)
SYSROOT_KINDS = ("cmake", "make", "cargo")  # the build kinds that compile C/C++ and link with the sysroot's flags
# a script recipe that runs CMake itself (hrx's three passes) names the sysroot's toolchain file with this placeholder
# (-DCMAKE_TOOLCHAIN_FILE={sysroot:cmake}); the plan writes the file and gives the variant the sysroot
SYSROOT_CMAKE = "sysroot:cmake"


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path
    data: dict = field(compare=False, hash=False)
    doc: yamlio.Document = field(compare=False, hash=False)
    sysroot: Tool | None = field(default=None, compare=False, hash=False)  # floor.yaml's, given to compiled variants

    @property
    def source(self) -> dict:
        return self.data["source"]

    @property
    def pin_name(self) -> str | None:
        return self.source.get("pin")

    @property
    def may_lack(self) -> tuple[str, ...]:
        """source.may_lack: globs of files of the pinned tree this recipe never reads, which a partial clone in a
        mirror directory may lack (builders/inputs/fetch.py, docs/mirrors.md)."""
        return tuple(self.source.get("may_lack", ()))

    def patches(self, root: Path) -> tuple[Patch, ...]:
        base = root / "recipes" / "patches" / self.source.get("patch_dir", self.name)
        return tuple(Patch(p["file"], p["purpose"], p["upstream"], base / p["file"]) for p in self.source.get("patches", []))

    def _id(self, variant: str) -> str:
        return self.name if variant == DEFAULT_VARIANT else f"{self.name}-{variant}"

    def variant_names(self) -> list[str]:
        return list(self.data.get("variants", {DEFAULT_VARIANT: {}}))

    def variant(self, name: str) -> Variant:
        variants = self.data.get("variants", {DEFAULT_VARIANT: {}})
        if name not in variants:
            raise OnebitError(
                f"recipe {self.name!r} has no variant {name!r}",
                where=str(self.path),
                hint=f"choose one of: {', '.join(variants)}",
            )
        over = variants[name] or {}
        build = self.data["build"]
        vbuild = over.get("build", {})
        stage = self.data["stage"]
        vstage = over.get("stage", {})
        provides = {**self.data["provides"], **over.get("provides", {})}
        build_root = vbuild.get("root", build.get("root"))
        tools = [_tool(t, build_root) for t in self.data.get("toolchain", []) + over.get("toolchain", [])]
        commands = vbuild.get("commands", build.get("commands", []))
        if self.sysroot is not None and (build["kind"] in SYSROOT_KINDS or "{" + SYSROOT_CMAKE + "}" in str(commands)):
            tools.append(dataclasses.replace(self.sysroot, root=build_root))  # the floor's sysroot: every compiled variant
        return Variant(
            recipe=self,
            name=name,
            toolchain=tuple(tools),
            kind=build["kind"],
            options={**build.get("options", {}), **vbuild.get("options", {})},
            targets=tuple(vbuild.get("targets", build.get("targets", []))),
            env={**build.get("env", {}), **vbuild.get("env", {})},
            commands=tuple(tuple(c) for c in vbuild.get("commands", build.get("commands", []))),
            network=build.get("network", "none"),
            build_type=build.get("build_type", "Release"),
            install=stage.get("install", "build-system"),
            root=vstage.get("root", stage.get("root", "")).replace("{variant}", self._id(name)),
            keep=tuple(vstage.get("keep", stage.get("keep", []))),
            binaries={**stage["binaries"], **vstage.get("binaries", {})},
            links={k.replace("{variant}", self._id(name)): v
                   for k, v in {**stage.get("links", {}), **vstage.get("links", {})}.items()},
            backend=provides.get("backend"),
            adapter=provides.get("adapter", "llama-server"),
            devices=tuple(provides.get("devices", [])),
            features=tuple(provides.get("features", [])),
            provides_env=dict(provides.get("env", {})),
            tests=tuple(self.data.get("tests", [])) + tuple(over.get("tests", [])),
            depends=tuple(self.data.get("requirements", {}).get("run", [])) + tuple(over.get("requirements", {}).get("run", [])),
            path=tuple(vbuild.get("path", build.get("path", []))),
            strip=vstage.get("strip", stage.get("strip")),
            build_root=build_root,
            offload_targets=tuple(vstage.get("offload_targets", stage.get("offload_targets", []))),
            host_libraries=tuple(vstage.get("host_libraries", stage.get("host_libraries", []))),
        )


@dataclass(frozen=True)
class Bundle:
    name: str
    path: Path
    version: str
    build_number: int
    platform: str
    summary: str
    components: tuple[tuple[str, tuple[str, ...] | None], ...]


@dataclass
class Project:
    root: Path
    pins: dict[str, Pin]
    recipes: dict[str, Recipe]
    bundles: dict[str, Bundle]
    pins_doc: yamlio.Document
    digests: dict[str, str] = field(default_factory=dict)  # patch files and local sources, read once at load
    roots: dict = field(default_factory=dict)  # roots/<name>.yaml: name -> roots.RootPin
    floor: Floor | None = None  # floor.yaml (or the default floor): what every shipped ELF file may need

    def bundle(self, name: str) -> Bundle:
        if name not in self.bundles:
            raise OnebitError(
                f"no bundle named {name!r}",
                hint=f"bundles/ has: {', '.join(sorted(self.bundles)) or 'nothing'}",
            )
        return self.bundles[name]

    def variants(self, bundle: Bundle) -> list[Variant]:
        out = []
        for recipe_name, variant_names in bundle.components:
            recipe = self.recipes[recipe_name]
            for v in variant_names or recipe.variant_names():
                out.append(recipe.variant(v))
        return out


def placeholder_problems(recipe: Recipe) -> list[str]:
    """Every {placeholder} in a recipe's options, env, commands, test commands and run requirements that the plan
    could not fill in for one of its variants, with its file:line (the plan would stop there)."""
    problems: dict[str, None] = {}
    for name in recipe.variant_names():
        variant = recipe.variant(name)
        known = variant.placeholders()
        found = [(variant.where("build", "options", k), v, known) for k, v in variant.options.items() if isinstance(v, str)]
        found += [(variant.where("build", "env", k), v, known) for k, v in variant.env.items()]
        found += [(variant.where("build", "commands", i, j), a, known)
                  for i, argv in enumerate(variant.commands) for j, a in enumerate(argv)]
        found += [(variant.where("build", "path", i), d, known) for i, d in enumerate(variant.path)]
        own = len(recipe.data.get("tests", []))
        for i, t in enumerate(variant.tests):
            base = ("tests", i) if i < own else ("variants", name, "tests", i - own)
            found += [(recipe.doc.where(base + ("run", j)), a, known) for j, a in enumerate(t["run"])]
        own = len(recipe.data.get("requirements", {}).get("run", []))
        found += [(recipe.doc.where(("requirements", "run", i) if i < own else ("variants", name, "requirements", "run", i - own)),
                   d, known) for i, d in enumerate(variant.depends)]
        for where, text, names in found:
            for m in PLACEHOLDER.finditer(text):
                if m.group(1) not in names:
                    problems[f"{where}: unknown placeholder {{{m.group(1)}}} (variant {variant.id}); "
                             f"known: {describe_placeholders(names)}"] = None
    return list(problems)


def describe_placeholders(names: set[str]) -> str:
    """`{build}, {commit}, ... and {tool:T}, {tool:T:root}, {tool:T:major} for T in cc, cmake` (one line)."""
    plain = sorted(n for n in names if not n.startswith("tool:"))
    tools = sorted({n.split(":")[1] for n in names if n.startswith("tool:")})
    text = ", ".join("{" + n + "}" for n in plain)
    return text + (f"; {{tool:T}}, {{tool:T:root}}, {{tool:T:major}} for T in {', '.join(tools)}" if tools else "")


def _pin(name: str, data: dict, doc: yamlio.Document) -> Pin:
    mirrors = []
    for m in data.get("mirrors", []):
        kind = next(iter(m))
        mirrors.append(Mirror(kind, m[kind]))
    return Pin(
        name=name,
        url=data["url"],
        policy=data["policy"],
        cadence=data["cadence"],
        license=data["license"],
        commit=data.get("commit"),
        unresolved=data.get("unresolved"),
        mirrors=tuple(mirrors),
        branch=data.get("branch"),
        tag=data.get("tag"),
        raw=data,
        where=doc.where(("pins", name)),
    )


def load_pins(path: Path) -> tuple[dict[str, Pin], yamlio.Document, list[str]]:
    doc = yamlio.load(path)
    problems = schemas.validate(doc, "pins")
    if not problems:
        problems = schemas.pin_path_problems(doc) + schemas.regex_problems(doc)
    pins = {}
    if not problems:
        pins = {name: _pin(name, data, doc) for name, data in doc.data["pins"].items()}
    return pins, doc, problems


def load_project(root: Path | str, *, strict: bool = True) -> Project:
    """Load and validate everything under root. All problems are collected and raised together."""
    root = Path(root).resolve()
    problems: list[str] = []

    def guarded(fn, *args):
        try:
            return fn(*args)
        except OnebitError as exc:
            problems.append(str(exc))
            return None

    loaded = guarded(load_pins, root / "pins.yaml")
    pins: dict[str, Pin] = {}
    pins_doc = None
    if loaded:
        pins, pins_doc, pin_problems = loaded
        problems += pin_problems

    def valid_docs(folder: str, schema_name: str):
        """Each YAML file of the folder that parses and matches its schema; problems of the others are collected."""
        for path in sorted((root / folder).glob("*.yaml")):
            doc = guarded(yamlio.load, path)
            found = schemas.validate(doc, schema_name) if doc is not None else ["(unparsable)"]
            if doc is not None:
                problems.extend(found)
            if found:
                broken.add(f"{folder}/{path.stem}")
                continue
            yield path, doc

    floor, floor_problems = floors.load(root)
    problems += floor_problems
    broken: set[str] = set()
    recipes: dict[str, Recipe] = {}
    for path, doc in valid_docs("recipes", "recipe"):
        name = doc.data["name"]
        if name != path.stem:
            problems.append(f"{doc.where(('name',))}: recipe name {name!r} must match its file name {path.stem!r}")
        recipe = Recipe(name=name, path=path, data=doc.data, doc=doc, sysroot=sysroot_tool(floor))
        # what the plan or the build would otherwise trip over: escaping paths, bad regexes, unknown backends and
        # placeholders, each with its file:line
        found = (schemas.prefix_path_problems(doc) + schemas.regex_problems(doc) + schemas.backend_problems(doc)
                 + placeholder_problems(recipe))
        problems.extend(found)
        if found:
            broken.add(f"recipes/{path.stem}")
            continue
        recipes[name] = recipe
        if floor is not None:
            problems += floors.recipe_problems(floor, _host_set_refs(recipe))
        pin_name = recipe.pin_name
        if pin_name and pins and pin_name not in pins:
            problems.append(f"{doc.where(('source', 'pin'))}: unknown pin {pin_name!r}; pins.yaml has: {', '.join(sorted(pins))}")
        for i, extra in enumerate(recipe.source.get("extra", [])):
            if pins and extra["pin"] not in pins:
                problems.append(f"{doc.where(('source', 'extra', i, 'pin'))}: unknown pin {extra['pin']!r}")
        if pin_name is None and not (root / recipe.source["local"]).is_dir():
            problems.append(f"{doc.where(('source', 'local'))}: directory {recipe.source['local']!r} does not exist")
        for i, patch in enumerate(recipe.patches(root)):
            if not patch.path.is_file():
                problems.append(
                    f"{doc.where(('source', 'patches', i, 'file'))}: patch file {patch.path.relative_to(root)} does not exist"
                )

    from .root_pins import load_roots

    build_roots, root_problems = load_roots(root / "roots")
    problems += root_problems
    for recipe in recipes.values():
        for where, name in _root_refs(recipe):
            if name not in build_roots and not any(p.startswith(f"roots/{name}.yaml") or f"/roots/{name}.yaml:" in p
                                                   for p in root_problems):
                problems.append(f"{where}: unknown build root {name!r}; roots/ has: {', '.join(sorted(build_roots)) or 'nothing'}")

    bundles: dict[str, Bundle] = {}
    for path, doc in valid_docs("bundles", "bundle"):
        data = doc.data
        if data["name"] != path.stem:
            problems.append(f"{doc.where(('name',))}: bundle name {data['name']!r} must match its file name {path.stem!r}")
        components = []
        for i, comp in enumerate(data["components"]):
            rname = comp["recipe"]
            if rname not in recipes:
                if f"recipes/{rname}" not in broken:  # a broken recipe was reported already
                    problems.append(f"{doc.where(('components', i, 'recipe'))}: unknown recipe {rname!r}")
                continue
            known = recipes[rname].variant_names()
            for j, v in enumerate(comp.get("variants", [])):
                if v not in known:
                    problems.append(
                        f"{doc.where(('components', i, 'variants', j))}: recipe {rname!r} has no variant {v!r} (has: {', '.join(known)})"
                    )
            components.append((rname, tuple(comp["variants"]) if "variants" in comp else None))
        bundles[data["name"]] = Bundle(
            name=data["name"],
            path=path,
            version=str(data.get("version") or this_week()),  # releases pass the tag's version
            build_number=int(data.get("build_number", 0)),
            platform=data["platform"],
            summary=data["summary"],
            components=tuple(components),
        )

    if problems and strict:
        raise ValidationError(problems)
    digests: dict[str, str] = {}
    for recipe in recipes.values():
        for patch in recipe.patches(root):
            if patch.path.is_file():
                digests[str(patch.path)] = patch.sha256
        local = recipe.source.get("local")
        if local and (root / local).is_dir():
            digests[f"local:{local}"] = tree_digest(root / local)
    return Project(root=root, pins=pins, recipes=recipes, bundles=bundles, pins_doc=pins_doc, digests=digests,
                   roots=build_roots, floor=floor)


def sysroot_tool(floor: Floor | None) -> Tool | None:
    """floor.yaml's sysroot as the tool every compiled variant gets, carrying the floor its stand-ins are capped at."""
    if floor is None or not floor.sysroot:
        return None
    return dataclasses.replace(_tool(dict(floor.sysroot)), floor=(floor.policy, tuple(sorted(floor.caps().items()))))


def _host_set_refs(recipe: Recipe) -> list[tuple[str, str]]:
    """(file:line, name) of every host-library set a recipe or one of its variants declares (stage.host_libraries)."""
    out = [(recipe.doc.where(("stage", "host_libraries", i)), n)
           for i, n in enumerate(recipe.data["stage"].get("host_libraries", []))]
    for name, over in (recipe.data.get("variants") or {}).items():
        for i, n in enumerate(((over or {}).get("stage") or {}).get("host_libraries", [])):
            out.append((recipe.doc.where(("variants", name, "stage", "host_libraries", i)), n))
    return out


def _root_refs(recipe: Recipe) -> list[tuple[str, str]]:
    """(file:line, name) of every build root a recipe or one of its variants names."""
    out = []
    if recipe.data["build"].get("root"):
        out.append((recipe.doc.where(("build", "root")), recipe.data["build"]["root"]))
    for name, over in (recipe.data.get("variants") or {}).items():
        r = ((over or {}).get("build") or {}).get("root")
        if r:
            out.append((recipe.doc.where(("variants", name, "build", "root")), r))
    return out
