"""floor: the one portability floor every shipped ELF file meets, declared once in floor.yaml, and the stage gate's
decisions over the facts builders/io/elf.py reads.

floor.yaml names a manylinux policy by its PEP 600 name (manylinux_2_34: glibc 2.34); the symbol versions it allows
(GLIBC_, GLIBCXX_, CXXABI_, GCC_ ...) are auditwheel's policy data, read through auditwheel's own API, never copied
here. The file adds the host libraries every backend may link (`base`: the libc family, libstdc++, libgcc_s) and named
sets a recipe adds with `stage.host_libraries: [rocm7]` (`host_sets`: each SONAME with what provides it). The stage
gate (builders/ship/stage.py) fails a file that needs a symbol version the policy does not allow, or links a library that
is neither shipped in its package, nor in the base, nor in a set its recipe declares; each set a backend declares is
recorded in its manifest entry, so `1bit check` can name what a host lacks. A package that ships any ELF file
declares exactly `__glibc >=<the floor's glibc>`.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from . import yamlio
from ..errors import OnebitError
from ..plan_types import digest

FLOOR_FILE = "floor.yaml"
# the project's own floor.yaml (a link to it, packaged with builders): the floor of a project that declares none
DEFAULT_FILE = Path(__file__).resolve().parent / "default_floor.yaml"
ARCH = "x86_64"  # the machine every bundle is built for (bundles' platform linux-64)
# the ELF interpreter: always on the host, never an allow-list entry of auditwheel's (it skips it the same way)
INTERPRETER = "ld-linux-x86-64.so.2"
POLICY = re.compile(r"^manylinux_(\d+)_(\d+)$")


@dataclass(frozen=True)
class HostLibrary:
    soname: str
    provided_by: str
    set: str  # "base" or the host set's name

    def manifest(self) -> dict:
        """The manifest's `host_libraries` item (builders/steps/stage.py manifest_entry)."""
        return {"soname": self.soname, "provided_by": self.provided_by, "set": self.set}


@dataclass(frozen=True)
class Floor:
    policy: str  # PEP 600 name: manylinux_2_34
    versions: Mapping[str, tuple[str, ...]]  # auditwheel's allowed symbol versions by family (GLIBCXX -> 3.4 .. 3.4.29)
    base: tuple[str, ...]  # host libraries every backend may link
    sets: Mapping[str, tuple[HostLibrary, ...]]  # named host-library sets a recipe declares
    where: str = ""  # floor.yaml:line, for errors
    sysroot: Mapping | None = None  # floor.yaml's toolchain entry: the sysroot's pinned packages (config makes a Tool)
    # worked out once, when floor.yaml is read (a plan asks them of every variant):
    glibc: str = field(init=False)  # the glibc the policy names (PEP 600: manylinux_2_34 is 2.34): every `__glibc >=`
    key: str = field(init=False)  # what the stage step's cache key takes of the floor: a change re-runs the gate
    manifests: Mapping[str, tuple[dict, ...]] = field(init=False)  # set -> its items of a manifest's `host_libraries`

    def __post_init__(self) -> None:
        m = POLICY.match(self.policy)
        object.__setattr__(self, "glibc", f"{m.group(1)}.{m.group(2)}" if m else "")
        object.__setattr__(self, "key", digest(
            "floor", self.policy, sorted(self.versions.items()), self.base,
            sorted((n, [(h.soname, h.provided_by) for h in libs]) for n, libs in self.sets.items())))
        object.__setattr__(self, "manifests", {n: tuple(lib.manifest() for lib in libs) for n, libs in self.sets.items()})

    def caps(self) -> dict[str, str]:
        """Version family -> the highest version the policy allows (GLIBCXX -> 3.4.29), for the families the sysroot's
        link stand-ins cap (builders/roots/sysroot.py): GLIBC, GLIBCXX, CXXABI, GCC."""
        return {f: ceiling(f, self.versions).partition("_")[2] for f in ("GLIBC", "GLIBCXX", "CXXABI", "GCC")
                if f in self.versions}


# ---- auditwheel's policy data ----------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def policy_data(name: str) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
    """(symbol versions by family, allowed libraries) of a manylinux policy on x86_64, from auditwheel's bundled
    policy data through its API. LookupError for a name auditwheel does not know."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    policy = WheelPolicies(libc=Libc.GLIBC, arch=Architecture(ARCH)).get_policy_by_name(f"{name}_{ARCH}")
    return ({family: tuple(sorted(v, key=version_order)) for family, v in sorted(policy.symbol_versions.items())},
            frozenset(policy.whitelist))


def known_policies() -> list[str]:
    """The manylinux policies auditwheel knows, PEP 600 names, newest first."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    return [p.name.removesuffix(f"_{ARCH}") for p in WheelPolicies(libc=Libc.GLIBC, arch=Architecture(ARCH))
            if POLICY.match(p.name.removesuffix(f"_{ARCH}"))]


# ---- loading floor.yaml ----------------------------------------------------------------------------------------------
def from_doc(doc: yamlio.Document) -> tuple[Floor | None, list[str]]:
    """A floor.yaml document that matched its schema as a Floor, or the problems (file:line) that stop it: a policy
    auditwheel does not know, a base library outside the policy's own allow-list, a SONAME listed twice."""
    data = doc.data
    try:
        versions, whitelist = policy_data(data["policy"])
    except LookupError:
        return None, [f"{doc.where(('policy',))}: unknown manylinux policy {data['policy']!r}; auditwheel knows "
                      f"{', '.join(known_policies())}"]
    problems = []
    seen: dict[str, str] = {}
    for i, soname in enumerate(data["base"]):
        if soname != INTERPRETER and soname not in whitelist:
            problems.append(f"{doc.where(('base', i))}: {soname} is not on {data['policy']}'s allow-list of host "
                            f"libraries (auditwheel's policy data): a base library must be on every such host")
        if soname in seen:
            problems.append(f"{doc.where(('base', i))}: {soname} is listed twice")
        seen[soname] = "base"
    sets: dict[str, tuple[HostLibrary, ...]] = {}
    for name, hostset in data.get("host_sets", {}).items():
        libs = []
        for soname, provided_by in hostset["libraries"].items():
            if soname in seen:
                problems.append(f"{doc.where(('host_sets', name, 'libraries', soname))}: {soname} is already in "
                                f"{seen[soname] if seen[soname] == 'base' else 'host set ' + repr(seen[soname])}")
            seen[soname] = name
            libs.append(HostLibrary(soname, provided_by, name))
        sets[name] = tuple(libs)
    if problems:
        return None, problems
    return Floor(policy=data["policy"], versions=versions, base=tuple(data["base"]), sets=sets,
                 where=doc.where(("policy",)), sysroot=(data.get("toolchain") or [None])[0]), []


def load(root: Path) -> tuple[Floor | None, list[str]]:
    """The project's floor.yaml (schema floor.schema.json), or the default floor where the project has none."""
    from . import schemas

    path = Path(root) / FLOOR_FILE
    try:
        doc = yamlio.load(path if path.is_file() else DEFAULT_FILE)
    except OnebitError as exc:
        return None, [str(exc)]
    problems = schemas.validate(doc, "floor")
    return (None, problems) if problems else from_doc(doc)


def recipe_problems(floor: Floor, where: Sequence[tuple[str, str]]) -> list[str]:
    """Pure: every `stage.host_libraries` entry (file:line, set name) that names no host set of the floor."""
    known = ", ".join(sorted(floor.sets)) or "none"
    return [f"{at}: unknown host-library set {name!r}; floor.yaml declares: {known}" for at, name in where
            if name not in floor.sets]


# ---- the gate's decisions --------------------------------------------------------------------------------------------
def version_order(number: str) -> tuple:
    """Sort key of a symbol version's number: numeric parts numerically (3.4.9 < 3.4.29), names (FLOAT128) last."""
    try:
        return (0, tuple(int(p) for p in number.split(".")))
    except ValueError:
        return (1, number)


def ceiling(family: str, versions: Mapping[str, Collection[str]]) -> str:
    """Pure: the highest numeric version of a family the policy allows (GLIBCXX -> GLIBCXX_3.4.29)."""
    numeric = [v for v in versions.get(family, ()) if version_order(v)[0] == 0]
    return f"{family}_{max(numeric, key=version_order)}" if numeric else family


def above_floor(version: str, versions: Mapping[str, Collection[str]]) -> bool:
    """Pure: does a needed symbol version lie outside the policy? Only the families the policy governs are checked
    (GLIBC, GLIBCXX, CXXABI, GCC ...); a library's own versions (hip_4.2 of libamdhip64) are its business. GLIBC_PRIVATE
    is never allowed."""
    family, sep, number = version.partition("_")
    return bool(sep) and family in versions and number not in versions[family]


@dataclass(frozen=True)
class Problem:
    """One reason a shipped file fails the gate."""

    file: str  # relative to the staged prefix
    kind: str  # "version": a symbol version above the floor; "link": a NEEDED library not allowed; "module"; "unreadable"
    library: str = ""
    version: str = ""
    symbol: str = ""  # a symbol that needs `version` (demangled where possible), filled in by the stage
    host_set: str = ""  # the floor's set a "link" library is in, which the recipe does not declare

    def line(self, floor: Floor, declared: Sequence[str]) -> str:
        """The gate's one line for this problem."""
        if self.kind == "version" and self.version == "GLIBC_PRIVATE":
            return (f"{self.file} needs GLIBC_PRIVATE of {self.library}{self._symbol()}: glibc's internal ABI, which no "
                    f"floor allows")
        if self.kind == "version":
            family = self.version.partition("_")[0]
            return (f"{self.file} needs {self.version} of {self.library}{self._symbol()}, above the floor {floor.policy} "
                    f"({ceiling(family, floor.versions)})")
        if self.kind == "link" and self.host_set:
            return (f"{self.file} links {self.library}, a library of host set {self.host_set!r}, which the recipe does "
                    f"not declare (stage.host_libraries: {', '.join(declared) or 'none'})")
        if self.kind == "link":
            return (f"{self.file} links {self.library}, which is neither shipped in the package nor a host library the "
                    f"floor {floor.policy} allows (base, or a declared host set: {', '.join(declared) or 'none'})")
        if self.kind == "module":
            return f"{self.file} is a kernel module without a vermagic: no kernel would load it"
        return f"{self.file} is an ELF file pyelftools cannot read ({self.library}): the gate cannot check it"

    def hint(self) -> str:
        if self.kind == "version" and self.version == "GLIBC_PRIVATE":
            return "a program must not call glibc's private symbols; find what pulls it in (a static libc piece)"
        if self.kind == "version":
            return ("build against the pinned sysroot (the floor's glibc and libstdc++ headers), not the build host's "
                    "or root's libraries; floor.yaml names the floor")
        if self.kind == "link" and self.host_set:
            return f"declare it in the recipe: stage.host_libraries: [{self.host_set}]"
        if self.kind == "link":
            return ("ship the library in the package (kept beside the program behind $ORIGIN, with its license), stop "
                    "linking it, or add it to a host set in floor.yaml and declare that set in the recipe")
        return "check how the file is built"

    def _symbol(self) -> str:
        return f" ({self.symbol})" if self.symbol else ""


def file_problems(rel: str, facts, shipped: Collection[str], floor: Floor, declared: Sequence[str]) -> list[Problem]:
    """Pure: why one shipped ELF file (its elf.ElfFacts) fails the floor: per governed family the highest symbol version
    above the floor, then every NEEDED library that is neither shipped (a file of that name in the staged tree) nor in
    the base, nor in a declared host set. Kernel modules (relocatable objects) are checked by their vermagic only;
    another machine's code (a GPU code object) and other relocatable objects are not loaded by the host's loader."""
    if facts.error:
        return [Problem(rel, "unreadable", library=facts.error)]
    if facts.type == "ET_REL":
        return [Problem(rel, "module")] if rel.endswith(".ko") and not facts.vermagic else []
    if facts.machine and facts.machine != "EM_X86_64":
        return []
    out: list[Problem] = []
    worst: dict[str, tuple[str, str]] = {}  # family -> (library, version)
    for library, version in facts.version_needs:
        if not above_floor(version, floor.versions):
            continue
        family, _, number = version.partition("_")
        held = worst.get(family)
        if held is None or version_order(number) > version_order(held[1].partition("_")[2]):
            worst[family] = (library, version)
    out += [Problem(rel, "version", library=lib, version=ver) for _, (lib, ver) in sorted(worst.items())]
    allowed = set(floor.base) | {lib.soname for name in declared for lib in floor.sets.get(name, ())}
    in_set = {lib.soname: name for name, libs in floor.sets.items() for lib in libs}
    for library in facts.needed:
        if library not in allowed and library not in shipped:
            out.append(Problem(rel, "link", library=library, host_set=in_set.get(library, "")))
    return out
