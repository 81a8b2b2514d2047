"""The pin bot's part for toolchain inputs: the wheels and Debian packages recipes pin by content move like any pin.

A toolchain input is one distinct pinned list of a recipe's `toolchain:` entry (`wheels:` or `debs:`), wherever it is
carried: the Vulkan SDK's eight packages, carried by recipes/vulkan.yaml, zinc.yaml, lean.yaml (variant vulkan) and
hrx.yaml, are ONE input, `toolchain:vulkan-sdk`; zig's wheel is `toolchain:zig`; NVIDIA's CUDA wheels `toolchain:nvcc`.

What each entry moves to (pure decisions, `pick_wheel` and `pick_deb`):
- a wheel: the newest release on the package index (its JSON API, at the base of the pip index setting) that
  satisfies the tool's `version:` constraint, is no pre-release, has a file with exactly the tags of the pinned file
  (same python/abi/platform), and, for NVIDIA's wheels, keeps the major version (a cu13 wheel stays 13.x). The sha256
  is the index's.
- a Debian package: the suite whose Packages index holds exactly the pinned pool path (bookworm, trixie, then the build
  roots' suites, sid and experimental, first found wins); the move is the newest version of that package in that same
  suite, so the Vulkan SDK's mix (libvulkan1 from bookworm beside trixie's headers) stays a mix. A pool path no suite
  holds any more is reported as vanished (only the download cache or the snapshot archive has it), never moved.
An entry whose newest candidate is older than the pin holds the whole input (like a pin that would move backwards)
unless --allow-rollback with a --reason.

Delivery is the roots' (builders/pins/roots.py), generalized to several files per PR: a local run edits every recipe
carrying the input in place (a precise text edit of the changed entries: comments and layout are kept, the lists stay
identical); `--report DIR` writes toolchains.json (per input: state, detail, and each carrying file's base sha256 and new
text); the token holder reads it back strictly (`read_report`: every file is the committed one with only this input's
entries changed, and exactly the files that carry it) and opens one PR per input on
onebit/bump-toolchain-<name>-<sha12>.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import OnebitError
from . import decide as pin_decide, file_moves, report
from .bump import Options, Outcome
from .file_moves import (ENTRY_NAME, MAX_DETAIL, SHA256, claim, committed_reader, entries, picked, read_strictly,
                         rollback_allowed, selected)

PREFIX = "toolchain:"
REPORT = "toolchains.json"  # beside report.json and roots.json in the evaluating job's artifact
VERSION = 1
MAX_FILE = 1 << 20
MAX_REPORT = 16 << 20
BRANCH_PREFIX = "onebit/bump-toolchain-"
MARKER = "<!-- onebit-toolchain-bump"
# the suites a pinned Debian package is looked for in, in this order (the first that holds the pinned pool path is its
# suite): the Vulkan SDK's point releases, then the build roots' suites (roots/*.yaml)
DEB_SUITES = ("bookworm", "trixie")
VANISHED = "vanished: only the cache or the snapshot archive has it"

Log = Callable[[str], None]


def _noop(_: str) -> None:
    pass


# ---- the inputs of the project (pure) --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Place:
    recipe: str  # recipes/<name>.yaml (or floor.yaml), relative to the project root
    where: str  # where in it: "toolchain" or "variants.<v>.toolchain"


@dataclass(frozen=True)
class Input:
    name: str  # zig, nvcc, vulkan-sdk
    kind: str  # wheels | debs
    tool: str
    version: str | None  # the tool's version constraint
    entries: tuple[Mapping, ...]  # the pinned list, as in the recipe
    places: tuple[Place, ...]

    @property
    def files(self) -> list[str]:
        return sorted({p.recipe for p in self.places})


def _key(entry: Mapping, kind: str) -> tuple:
    if kind == "wheels":
        return (entry.get("package"), str(entry.get("version")), entry.get("sha256"))
    return (entry.get("path"), entry.get("sha256"))


def _tool_lists(data: Mapping) -> list[tuple[str, Mapping]]:
    """Pure: the toolchain entries of a recipe's data, each with where it is (other shapes are skipped)."""
    def entries(v) -> list:
        return [t for t in v if isinstance(t, Mapping)] if isinstance(v, list) else []

    out = [("toolchain", t) for t in entries(data.get("toolchain"))]
    variants = data.get("variants")
    for vname, v in sorted(variants.items() if isinstance(variants, Mapping) else [], key=lambda kv: str(kv[0])):
        if isinstance(v, Mapping):
            out += [(f"variants.{vname}.toolchain", t) for t in entries(v.get("toolchain"))]
    return out


def find_inputs(recipes: Mapping[str, Mapping]) -> list[Input]:
    """Pure: the distinct pinned toolchain inputs of `recipes` (recipe file -> its parsed YAML), each with the places
    that carry it; one input per distinct list, named by its tool (a tool with two different lists: `tool-<recipe>`)."""
    groups: dict[tuple, dict] = {}
    for recipe in sorted(recipes):
        for where, t in _tool_lists(recipes[recipe] or {}):
            if not isinstance(t, Mapping):
                continue
            for kind in ("wheels", "debs"):
                entries = t.get(kind)
                if not entries or not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                    continue
                key = (t.get("tool"), kind, tuple(_key(e, kind) for e in entries))
                g = groups.setdefault(key, {"tool": t.get("tool"), "kind": kind, "version": t.get("version"),
                                            "entries": tuple(dict(e) for e in entries), "places": []})
                g["places"].append(Place(recipe, where))
    by_tool: dict[str, int] = {}
    for g in groups.values():
        by_tool[g["tool"]] = by_tool.get(g["tool"], 0) + 1
    out = []
    for g in groups.values():
        name = g["tool"] if by_tool[g["tool"]] == 1 else f"{g['tool']}-{Path(g['places'][0].recipe).stem}"
        out.append(Input(name, g["kind"], g["tool"], None if g["version"] is None else str(g["version"]),
                         g["entries"], tuple(g["places"])))
    return sorted(out, key=lambda i: i.name)


def load_inputs(root: Path) -> list[Input]:
    """The inputs of the project at `root`: recipes/*.yaml, and floor.yaml's toolchain (the sysroot every compiled
    variant builds against: moved within its suite like any Debian input, so never past the floor)."""
    recipes = {}
    for f in sorted((Path(root) / "recipes").glob("*.yaml")):
        recipes[f"recipes/{f.name}"] = _plain(_load(f))
    floor = Path(root) / "floor.yaml"
    if floor.is_file():
        recipes["floor.yaml"] = _plain(_load(floor))
    return find_inputs(recipes)


def _load(f: Path):
    import yaml

    try:
        return yaml.safe_load(f.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise OnebitError(f"cannot read {f.parent.name}/{f.name}: {str(exc).splitlines()[0]}") from None


def _plain(data):
    return data if isinstance(data, Mapping) else {}


# ---- one entry's move (pure) -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """What one pinned entry does: current, move, back (a move to an older version: holds), or vanished."""
    label: str  # the package name
    state: str  # current | move | back | vanished | refused
    old: str
    new: str | None = None
    entry: Mapping | None = None  # the new entry (move, back)

    def line(self) -> str:
        if self.state in ("vanished", "refused"):
            return f"{self.label}: {self.old}: {self.new}"
        return f"{self.label}: {self.old} -> {self.new}"


def wheel_tags(filename: str) -> frozenset:
    from packaging.utils import parse_wheel_filename

    return frozenset(parse_wheel_filename(filename)[3])


def same_major(package: str) -> bool:
    """Pure: NVIDIA's wheels keep their major version (a cu13 wheel stays 13.x)."""
    return package.lower().replace("_", "-").startswith("nvidia-")


def pick_wheel(entry: Mapping, releases: Mapping[str, Sequence[Mapping]], constraint: str | None) -> Step:
    """Pure: where one pinned wheel moves, from the index's releases (PyPI's JSON `releases`: version -> files, each
    with filename, digests.sha256, packagetype, yanked)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    package, old, sha = entry["package"], str(entry["version"]), entry["sha256"]
    pinned = next((f for f in releases.get(old, ()) if (f.get("digests") or {}).get("sha256") == sha), None)
    if pinned is None:
        return Step(package, "refused", old, f"the index serves no file of {package} {old} with the pinned sha256")
    tags = wheel_tags(pinned["filename"])
    try:
        spec = SpecifierSet(constraint or "")
    except InvalidSpecifier:
        spec = SpecifierSet("")
    cur = Version(old)
    best = None
    for ver, files in releases.items():
        try:
            v = Version(ver)
        except InvalidVersion:
            continue
        if v.is_prerelease or v.is_devrelease or (spec and v not in spec):
            continue
        if same_major(package) and v.major != cur.major:
            continue
        f = next((f for f in files if f.get("packagetype", "bdist_wheel") == "bdist_wheel" and not f.get("yanked")
                  and f.get("filename", "").endswith(".whl") and wheel_tags(f["filename"]) == tags
                  and SHA256.match((f.get("digests") or {}).get("sha256", ""))), None)
        if f is not None and (best is None or v > best[0]):
            best = (v, ver, f)
    if best is None or best[0] == cur:  # nothing eligible (a pinned pre-release with no release beside it) moves nothing
        return Step(package, "current", old, old)
    new = {**entry, "version": best[1], "sha256": best[2]["digests"]["sha256"]}
    return Step(package, "move" if best[0] > cur else "back", old, best[1], new)


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    arch: str
    filename: str
    sha256: str


def index_debs(stanzas: Sequence[Mapping[str, str]]) -> list[Deb]:
    out = []
    for s in stanzas:
        if s.get("Package") and s.get("Version") and s.get("Filename") and s.get("SHA256"):
            out.append(Deb(s["Package"], s["Version"], s.get("Architecture", ""), s["Filename"], s["SHA256"]))
    return out


def pool_name(path: str) -> tuple[str, str, str]:
    """Pure: (package, version without epoch, architecture) of a pool path's file name."""
    base = path.rsplit("/", 1)[-1].removesuffix(".deb")
    parts = base.split("_")
    if len(parts) != 3:
        raise OnebitError(f"{path}: not a Debian package file name (NAME_VERSION_ARCH.deb)")
    return parts[0], parts[1], parts[2]


def suite_of(path: str, indexes: Sequence[tuple[str, Sequence[Deb]]]) -> str | None:
    """Pure: the first suite (in the given order) whose index holds exactly this pool path."""
    for suite, debs in indexes:
        if any(d.filename == path for d in debs):
            return suite
    return None


def pick_deb(entry: Mapping, indexes: Sequence[tuple[str, Sequence[Deb]]]) -> Step:
    """Pure: where one pinned Debian package moves: the newest version of it in the suite that holds the pinned file."""
    from debian.debian_support import Version

    path = entry["path"]
    package, _, arch = pool_name(path)
    suite = suite_of(path, indexes)
    if suite is None:
        return Step(package, "vanished", path.rsplit("/", 1)[-1], VANISHED)
    debs = dict(indexes)[suite]
    cur = next(d for d in debs if d.filename == path)
    if cur.sha256 != entry["sha256"]:
        return Step(package, "refused", f"{cur.version} ({suite})",
                    f"the {suite} index gives {path} another sha256 than the pin's")
    same = [d for d in debs if d.package == package and d.arch == arch]
    best = max(same, key=lambda d: Version(d.version))
    old = f"{cur.version} ({suite})"
    if Version(best.version) == Version(cur.version):
        return Step(package, "current", old, old)
    new = {**entry, "path": best.filename, "sha256": best.sha256}
    return Step(package, "move" if Version(best.version) > Version(cur.version) else "back", old,
                f"{best.version} ({suite})", new)


def decide(steps: Sequence[Step], allowed: bool) -> str:
    """Pure: the input's state from its entries' steps: held (an entry would go back, no rollback allowed), refused
    (nothing moves and an entry is unusable), would-propose (something moves), else current."""
    back = [s for s in steps if s.state == "back"]
    moves = [s for s in steps if s.state == "move"] + (back if allowed else [])
    if back and not allowed:
        return "held"
    if moves:
        return "would-propose"
    if any(s.state in ("vanished", "refused") for s in steps):
        return "refused"
    return "current"


def detail(steps: Sequence[Step], state: str) -> str:
    moved = [s.line() for s in steps if s.state in ("move", "back")]
    bad = [s.line() for s in steps if s.state in ("vanished", "refused")]
    if state == "held":
        text = ("would move to an older version: " + "; ".join(s.line() for s in steps if s.state == "back")
                + " (pins bump --allow-rollback --reason TEXT moves it)")
    elif state == "current":
        text = f"{len(steps)} entries, all current"
    else:
        text = f"{len(moved)} change(s), {len(steps)} entries" + (": " + "; ".join(moved) if moved else "")
    if bad:
        text += "; " + "; ".join(bad)
    return text[:MAX_DETAIL]


def new_entries(entries: Sequence[Mapping], steps: Sequence[Step], allowed: bool) -> list[Mapping]:
    """Pure: the pinned list after the moves (an entry going back only when allowed)."""
    out = []
    for e, s in zip(entries, steps):
        go = s.state == "move" or (s.state == "back" and allowed and s.entry is not None)
        out.append(s.entry if go else e)
    return out


# ---- the recipe edit (pure) ------------------------------------------------------------------------------------------
def _scalar(v) -> str:
    return re.escape(str(v))


def edit_text(text: str, old: Sequence[Mapping], new: Sequence[Mapping], kind: str, where: str = "recipe") -> str:
    """Pure: `text` with each changed entry rewritten in place: every line naming the old sha256 gets the new one, and
    the old pool path (debs) or `version: OLD` (wheels) on that line the new; comments and layout are kept. A changed
    entry whose old sha256 is on no line, or whose line does not name its path or version, is a OnebitError."""
    lines = text.splitlines(keepends=True)
    for o, n in zip(old, new):
        if dict(o) == dict(n):
            continue
        hit = [i for i, ln in enumerate(lines) if o["sha256"] in ln]
        if not hit:
            raise OnebitError(f"{where}: no line pins {o['sha256']}", hint="edit the entry by hand, or re-run")
        for i in hit:
            ln = lines[i].replace(o["sha256"], n["sha256"])
            if kind == "debs":
                if o["path"] not in ln:
                    raise OnebitError(f"{where}:{i + 1}: the line of {o['sha256'][:12]} does not name {o['path']}")
                ln = ln.replace(o["path"], n["path"])
            else:
                pat = re.compile(r"(\bversion:\s*)([\"']?)" + _scalar(o["version"]) + r"\2(?=\s*[,}\n])")
                ln, count = pat.subn(lambda m: m.group(1) + m.group(2) + str(n["version"]) + m.group(2), ln)
                if count != 1:
                    raise OnebitError(f"{where}:{i + 1}: the line of {o['sha256'][:12]} does not say version: {o['version']}")
            lines[i] = ln
    return "".join(lines)


# ---- reading the world (thin) ----------------------------------------------------------------------------------------
def index_setting(config_list: str) -> str | None:
    """Pure: the index-url of `pip config list`'s output (`global.index-url='...'`; download's or install's else)."""
    found = {}
    for line in config_list.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip().endswith(".index-url") and not key.strip().endswith("extra-index-url"):
            found[key.strip().split(".")[0]] = value.strip().strip("'\"")
    return next((found[k] for k in ("download", "install", "global", ":env:") if found.get(k)), None)


def json_base(index: str) -> str:
    """Pure: the base of an index's JSON API from its simple index URL (`<base>/simple` -> `<base>`)."""
    url = index.split()[0].rstrip("/")
    return url[: -len("/simple")] if url.endswith("/simple") else url


def pypi_base(env: Mapping[str, str] | None = None) -> str:
    """The package index whose JSON API is asked (`<base>/pypi/<name>/json`): the index of the pip that downloads the
    wheels (builders/inputs/fetch.py runs `python -m pip`): $PIP_INDEX_URL, else pip's configured index-url, else pip's
    default; its `/simple` dropped."""
    import sys

    from ..io import runner

    env = os.environ if env is None else env
    url = (env.get("PIP_INDEX_URL") or "").strip()
    if not url:
        proc = runner.run([sys.executable, "-m", "pip", "config", "list"], timeout=120)
        url = index_setting(proc.stdout) or ""
    if not url:
        proc = runner.run([sys.executable, "-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"],
                          timeout=120)
        url = proc.stdout.strip()
        if proc.returncode != 0 or not url:
            raise OnebitError("cannot tell pip's package index", hint="set PIP_INDEX_URL")
    return json_base(url)


def read_releases(package: str, *, base: str | None = None, session=None) -> dict:
    """`releases` of the index's JSON for `package` (version -> files)."""
    from ..io.http import make_session

    url = f"{(base or pypi_base()).rstrip('/')}/pypi/{package}/json"
    try:
        resp = (session or make_session()).get(url, timeout=(15, 120))
    except Exception as exc:  # requests' errors
        raise OnebitError(f"cannot read the package index's JSON for {package}: {type(exc).__name__}") from None
    if resp.status_code != 200:
        raise OnebitError(f"the package index answered HTTP {resp.status_code} for {package}'s JSON",
                          hint="set PIP_INDEX_URL to an index that serves /pypi/<name>/json")
    try:
        data = resp.json()
    except ValueError:
        raise OnebitError(f"the package index's JSON for {package} is not JSON") from None
    rel = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(rel, dict):
        raise OnebitError(f"the package index's JSON for {package} has no releases")
    return rel


def deb_suites(root: Path) -> list[str]:
    """The suites pinned packages are looked for in: bookworm, trixie, then the build roots' (roots/*.yaml) suites."""
    from ..project.root_pins import load_roots

    out = list(DEB_SUITES)
    found, _ = load_roots(Path(root) / "roots") if (Path(root) / "roots").is_dir() else ({}, [])
    for name in sorted(found):
        for suite, _component in found[name].suites:
            if suite not in out:
                out.append(suite)
    for s in ("sid", "experimental"):
        if s not in out:
            out.append(s)
    return out


class World:
    """What the moves are read from: the package index's JSON and the Debian suites' indexes (each read once)."""

    def __init__(self, root: Path, *, archives: Sequence[str] | None = None, log: Log = _noop):
        self.root = Path(root)
        self.archives = archives
        self.log = log
        self._debs: list | None = None
        self._releases: dict[str, dict] = {}
        self._session = None
        self._base: str | None = None

    def session(self):
        if self._session is None:
            from ..io.http import make_session

            self._session = make_session()
        return self._session

    def releases(self, package: str) -> dict:
        if package not in self._releases:
            self.log(f"read {package}'s releases from the package index")
            if self._base is None:
                self._base = pypi_base()
            self._releases[package] = read_releases(package, base=self._base, session=self.session())
        return self._releases[package]

    def deb_indexes(self) -> list[tuple[str, list[Deb]]]:
        if self._debs is None:
            from ..roots import debs
            from ..roots.assemble import parse_packages, read_index

            archives = debs.mirrors() if self.archives is None else list(self.archives)
            self._debs = [(s, index_debs(parse_packages(read_index(s, "main", archives, session=self.session(),
                                                                    log=self.log))))
                          for s in deb_suites(self.root)]
        return self._debs


def steps_of(inp: Input, world: World, allowed: bool) -> list[Step]:
    if inp.kind == "wheels":
        return [pick_wheel(e, world.releases(e["package"]), inp.version) for e in inp.entries]
    indexes = world.deb_indexes()
    return [pick_deb(e, indexes) for e in inp.entries]


# ---- evaluating (no token) -------------------------------------------------------------------------------------------
def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def evaluate_input(root: Path, inp: Input, opts: Options, world: World) -> dict:
    """One input read now, nothing written: its toolchains.json entry (each carrying file's new text when it moves)."""
    allowed = rollback_allowed(opts)
    texts = {f: (Path(root) / f).read_text(encoding="utf-8") for f in inp.files}
    entry = {"name": inp.name, "state": "current", "detail": "", "files": []}
    try:
        steps = steps_of(inp, world, allowed)
    except OnebitError as exc:
        return {**entry, "state": "refused", "detail": exc.what[:MAX_DETAIL]}
    state = decide(steps, allowed)
    entry = {**entry, "state": state, "detail": detail(steps, state)}
    if state not in ("would-propose", "held"):
        return {**entry, "files": [{"path": f, "base_sha256": digest(t), "text": None} for f, t in texts.items()]}
    new = new_entries(inp.entries, steps, True)  # held: the file it would become, shown, never delivered
    try:
        files = [{"path": f, "base_sha256": digest(t), "text": edit_text(t, inp.entries, new, inp.kind, f)}
                 for f, t in texts.items()]
    except OnebitError as exc:
        return {**entry, "state": "error", "detail": exc.what[:MAX_DETAIL], "files": []}
    return {**entry, "files": files}


def evaluate_inputs(root: Path, opts: Options, *, names_given: bool, log: Log = _noop, world: World | None = None) -> list[dict]:
    """Every selected input of the project at `root`, in name order, as toolchains.json entries."""
    return list(each_input(root, opts, names_given=names_given, log=log, world=world))


def each_input(root: Path, opts: Options, *, names_given: bool, log: Log = _noop, world: World | None = None):
    """The entries one by one, each read from the files as they are when it is evaluated (a local run writes one
    input's edit before the next input that shares a recipe, zinc.yaml's zig and Vulkan SDK, is read)."""
    try:
        inputs = {i.name: i for i in load_inputs(root)}
    except OnebitError as exc:
        yield {"name": "*", "state": "error", "detail": exc.what[:MAX_DETAIL], "files": []}
        return
    wanted = picked(opts.names, PREFIX)
    for n in sorted(set(wanted) - set(inputs)):
        yield {"name": n if ENTRY_NAME.match(n) else "*", "state": "error", "files": [],
               "detail": f"no toolchain input named {n!r}; the recipes pin: {', '.join(sorted(inputs)) or 'none'}"[:MAX_DETAIL]}
    world = world or World(root, log=log)
    for name in selected(sorted(inputs), wanted, names_given, opts.cadence):
        yield evaluate_input(root, inputs[name], opts, world)


def write_report(work: Path, entries: Sequence[dict]) -> Path:
    """toolchains.json into `work`, written aside and swapped into place."""
    return report.write_file(work, REPORT, {"version": VERSION, "inputs": list(entries)})


def entry_outcome(e: dict) -> Outcome:
    return Outcome(PREFIX + e["name"], e["state"], e["detail"])


def bump_inputs(root: Path, opts: Options, *, names_given: bool, log: Log = _noop, world: World | None = None) -> list[Outcome]:
    """A local run: every selected input evaluated and, unless --dry-run or held, every carrying recipe edited in place."""
    from ..io.swap import write_text_atomic

    out = []
    for e in each_input(root, opts, names_given=names_given, log=log, world=world):
        if e["state"] != "would-propose" or opts.dry_run:
            out.append(entry_outcome(e))
            continue
        for f in e["files"]:
            write_text_atomic(Path(root) / f["path"], f["text"])
        out.append(Outcome(PREFIX + e["name"], "edited", e["detail"] + f" ({', '.join(f['path'] for f in e['files'])})"))
    return out


def in_process(root: Path, opts: Options, *, names_given: bool, log: Log = _noop, world: World | None = None) -> dict:
    return {"version": VERSION, "inputs": evaluate_inputs(root, opts, names_given=names_given, log=log, world=world)}


def load_report(work: Path):
    """toolchains.json of a downloaded artifact, as parsed JSON (bounded in size)."""
    return report.load_file(work, REPORT, MAX_REPORT)


# ---- the token holder: toolchains.json read back strictly ------------------------------------------------------------
@dataclass(frozen=True)
class InputMove:
    name: str
    state: str
    detail: str
    files: tuple[tuple[str, str], ...] = ()  # (path, new text)
    changes: tuple[str, ...] = ()  # "package: old -> new"
    older: tuple[str, ...] = ()


def _normal(e: Mapping) -> tuple:
    """Pure: an entry as comparable data (its scalars as text, `ship` as a tuple)."""
    return tuple(sorted((k, tuple(map(str, v)) if k == "ship" and isinstance(v, list) else str(v)) for k, v in e.items()))


def _entries_in(text: str, path: str, inp: Input) -> tuple[dict, ...] | None:
    """The list of `inp`'s tool at its places in `path`'s text (None unless every place carries the same one)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    places = {p.where for p in inp.places if p.recipe == path}
    lists = set()
    for where, t in _tool_lists(_plain(data)):
        if isinstance(t, Mapping) and t.get("tool") == inp.tool and where in places:
            entries = t.get(inp.kind)
            if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                return None
            lists.add(tuple(_normal(e) for e in entries))
    if len(lists) != 1:
        return None
    return tuple(dict(e) for e in next(iter(lists)))


def read_report(data, inputs: Mapping[str, Input], committed: Callable[[str], str], allowed: bool) -> list[InputMove]:
    """toolchains.json checked against this checkout: `inputs` its inputs (from the committed recipes),
    `committed(path)` a committed file's text. Each moving input must carry exactly its files, each the committed one
    (base sha256) with only this input's entries rewritten (`edit_text` of the committed file gives the new text),
    the lists identical in every file. The state is decided again here from the entries, never taken from the report."""
    return read_strictly(REPORT, lambda: _read(data, inputs, committed, allowed))


def _line(label: str, o: Mapping, n: Mapping, kind: str) -> str:
    if kind == "debs":
        return f"{label}: {pool_name(o['path'])[1]} -> {pool_name(n['path'])[1]}"
    return f"{label}: {o['version']} -> {n['version']}"


def _read(data, inputs: Mapping[str, Input], committed: Callable[[str], str], allowed: bool) -> list[InputMove]:
    from debian.debian_support import Version as DebVersion
    from packaging.version import Version

    bad = report._bad
    out: list[InputMove] = []
    seen: set[str] = set()
    for w, e, name, state, det in entries(data, "inputs", VERSION, ("files",)):
        files = report._list(e["files"], f"{w}.files")
        if state == "error":
            if not ENTRY_NAME.match(name) or files:
                raise bad(w, "an error entry names no file")
            out.append(InputMove(name, state, det))
            continue
        claim(name, w, inputs, seen, "a toolchain input")
        inp = inputs[name]
        got: dict[str, str | None] = {}
        for j, f in enumerate(files):
            fw = f"{w}.files[{j}]"
            f = report._obj(f, fw, {"path", "base_sha256", "text"}, {"path", "base_sha256", "text"})
            path = report._str(f["path"], f"{fw}.path", limit=300)
            base = report._str(f["base_sha256"], f"{fw}.base_sha256", limit=64)
            text = report._str(f["text"], f"{fw}.text", none=True, limit=MAX_FILE)
            if path in got:
                raise bad(f"{fw}.path", f"{path!r} comes twice")
            if path not in inp.files:
                raise bad(f"{fw}.path", f"{path!r} does not carry toolchain:{name}")
            if not SHA256.match(base or "") or base != digest(committed(path)):
                raise bad(f"{fw}.base_sha256", f"made from another {path} than this checkout's committed one")
            got[path] = text
        if state in ("current", "refused"):
            if any(t is not None for t in got.values()):
                raise bad(f"{w}.files", f"a {state} input carries no new file")
            out.append(InputMove(name, state, det))
            continue
        if set(got) != set(inp.files) or any(t is None for t in got.values()):
            raise bad(f"{w}.files", f"a {state} input carries the new text of exactly the files that carry it: "
                                    f"{', '.join(inp.files)}")
        new_list = None
        for path, text in got.items():
            lst = _entries_in(text, path, inp)
            if lst is None:
                raise bad(f"{w}.files", f"the new {path} does not carry one {inp.tool} list where the committed one does")
            if new_list is not None and [dict(x) for x in lst] != [dict(x) for x in new_list]:
                raise bad(f"{w}.files", f"the new lists of toolchain:{name} differ between the files")
            new_list = lst
        old = [dict(x) for x in _entries_in(committed(inp.files[0]), inp.files[0], inp) or ()]
        new = [dict(x) for x in new_list]
        if len(old) != len(new) or not old:
            raise bad(f"{w}.files", "the new list has other entries than the committed one")
        try:
            for path, text in got.items():
                if edit_text(committed(path), old, new, inp.kind, path) != text:
                    raise bad(f"{w}.files", f"{path} is not the committed file with only toolchain:{name}'s entries moved")
        except OnebitError as exc:
            raise bad(f"{w}.files", exc.what) from None
        changes, older = [], []
        for o, n in zip(old, new):
            if o == n:
                continue
            if {k for k in o if k not in ("path", "sha256", "version")} != {k for k in n if k not in ("path", "sha256", "version")} \
                    or any(o.get(k) != n.get(k) for k in o if k not in ("path", "sha256", "version")):
                raise bad(f"{w}.files", "an entry changed more than its version, path and sha256")
            label = o.get("package") or pool_name(o["path"])[0]
            if inp.kind == "debs":
                if pool_name(n["path"])[0] != label:
                    raise bad(f"{w}.files", f"{o['path']} is replaced by another package's file")
                back = DebVersion(pool_name(n["path"])[1]) < DebVersion(pool_name(o["path"])[1])
            else:
                back = Version(n["version"]) < Version(o["version"])
            line = _line(label, o, n, inp.kind)
            changes.append(line)
            if back:
                older.append(line)
        if not changes:
            raise bad(f"{w}.files", "moves no entry")
        st = "held" if older and not allowed else "would-propose"
        det = ("would move to an older version: " + "; ".join(older) + " (pins bump --allow-rollback --reason TEXT "
               "moves it)") if st == "held" else f"{len(changes)} change(s): " + "; ".join(changes)
        out.append(InputMove(name, st, det, tuple(sorted(got.items())), tuple(changes), tuple(older)))
    return out


def verified_moves(ctx, opts: Options, data) -> list[InputMove]:
    """toolchains.json read against this checkout: with --open-pr the committed files (HEAD), else the working tree's."""
    inputs = {i.name: i for i in load_inputs(ctx.root)}
    return read_report(data, inputs, committed_reader(ctx, opts), rollback_allowed(opts))


# ---- the token holder: delivery --------------------------------------------------------------------------------------
def branch_name(name: str, files: Sequence[tuple[str, str]]) -> str:
    """Pure: the branch an input's move lives on; named by the input and the new files' content."""
    h = hashlib.sha256("\0".join(f"{p}\0{t}" for p, t in sorted(files)).encode("utf-8")).hexdigest()
    return pin_decide.branch_name(name, h, BRANCH_PREFIX)


def is_branch_of(name: str, ref: str) -> bool:
    return pin_decide.is_branch_of(name, ref, BRANCH_PREFIX)


def pr_title(name: str, changes: int) -> str:
    return f"toolchains: move {name} ({changes} entries changed)"


def pr_body(m: InputMove, rollback: str | None = None) -> str:
    lines = [f"Automated move of the toolchain input **{m.name}**: the pinned entries (by version and sha256) moved "
             "to the newest in their suite or on the package index; only these entries change, in every recipe that "
             "carries them:", ""] + [f"- `{p}`" for p, _ in m.files] + [""]
    if rollback:
        lines += [f"> **Rollback**: {rollback}", ">", "> Entries that move to an older version:"]
        lines += [f"> - {o}" for o in m.older] + [""]
    lines += [f"### Changes ({len(m.changes)})", ""] + [f"- `{c}`" for c in m.changes]
    lines += ["", f"{MARKER} input={m.name} -->"]
    return "\n".join(lines)


def commit_message(m: InputMove, rollback: str | None) -> str:
    return "\n".join([pr_title(m.name, len(m.changes)), ""] + list(m.changes)
                     + (["", f"Rollback: {rollback}"] if rollback else [])) + "\n"


def proposal(m: InputMove, rollback: str | None) -> dict:
    """Pure: a moving input's PR: every file that carries it, the branch, title, body and commit message."""
    return {"files": dict(m.files), "branch": branch_name(m.name, m.files), "title": pr_title(m.name, len(m.changes)),
            "body": pr_body(m, rollback), "message": commit_message(m, rollback)}


def deliver(ctx, opts: Options, moves: Sequence[InputMove]) -> list[Outcome]:
    """Each verified move: a PR of its own (--open-pr), a line (--dry-run), or the files written in place
    (file_moves.deliver, shared with the build roots)."""
    return file_moves.deliver(ctx, opts, moves, prefix=PREFIX, branch_prefix=BRANCH_PREFIX, proposal=proposal)
