"""root_pins: the pin file of a build root (roots/<name>.yaml, schemas/root.schema.json), read, compared and written.

What a root is made of, loaded with the project (config) like recipes: the suites it is resolved from, the packages it
asks for, and the resolved closure, every .deb by pool path, sha256 and size, with the timestamp at which Debian's
snapshot archive still serves a pool path the archive has since dropped. Pure apart from reading the files; resolving
against the archive, assembling and entering are builders/roots/assemble.py.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import yamlio
from ..errors import OnebitError

ASSEMBLY = "root-assembly-1"  # part of a root's content address: a change of roots.assemble_tree never reuses an old root


# ---- the pin file --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolvedDeb:
    package: str
    version: str
    suite: str
    path: str
    sha256: str
    size: int

    def to_yaml(self) -> dict:
        return {"package": self.package, "version": self.version, "suite": self.suite, "path": self.path,
                "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class RootPin:
    name: str
    path: Path
    summary: str
    suites: tuple[tuple[str, str], ...]  # (suite, component), the base first
    packages: tuple[str, ...]
    snapshot: str | None
    resolved: tuple[ResolvedDeb, ...]
    where: str = ""
    essential: bool = True  # the base suite's Essential: yes packages are part of the root
    # worked out once, when the pin is read (a plan asks them of every rooted variant):
    key: str = field(init=False)  # the content address: the assembly's version, every package's pool path and sha256
    cache_dir: str = field(init=False)  # where it is assembled, under the cache: roots/<key[:16]>
    download_size: int = field(init=False)

    def __post_init__(self) -> None:
        key = root_key(self.resolved)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "cache_dir", f"roots/{key[:16]}")
        object.__setattr__(self, "download_size", sum(d.size for d in self.resolved))

    def dest(self, cache: Path) -> Path:
        return Path(cache) / self.cache_dir


def root_key(resolved: Iterable[ResolvedDeb]) -> str:
    """Pure: the content address of a root assembled from `resolved`."""
    h = hashlib.sha256(ASSEMBLY.encode())
    for d in sorted(resolved, key=lambda d: d.path):
        h.update(f"\n{d.path} {d.sha256}".encode())
    return h.hexdigest()


def from_data(data: Mapping, path: Path, where: str = "") -> RootPin:
    return RootPin(name=data["name"], path=Path(path), summary=data["summary"],
                   suites=tuple((s["suite"], s.get("component", "main")) for s in data["suites"]),
                   packages=tuple(data["packages"]), snapshot=data.get("snapshot"),
                   resolved=tuple(ResolvedDeb(**r) for r in data.get("resolved") or ()), where=where,
                   essential=data.get("essential", True))


def load_roots(folder: Path) -> tuple[dict[str, RootPin], list[str]]:
    """Every roots/<name>.yaml that parses and matches its schema; the problems of the others (file:line)."""
    from . import schemas

    roots: dict[str, RootPin] = {}
    problems: list[str] = []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            doc = yamlio.load(path)
        except OnebitError as exc:
            problems.append(str(exc))
            continue
        found = schemas.validate(doc, "root")
        if not found and doc.data["name"] != path.stem:
            found = [f"{doc.where(('name',))}: root name {doc.data['name']!r} must match its file name {path.stem!r}"]
        if not found:
            found = request_problems(doc)
        problems += found
        if not found:
            roots[path.stem] = from_data(doc.data, path, doc.where(("name",)))
    return roots, problems


def request_problems(doc: yamlio.Document) -> list[str]:
    """A `name/<suite>` request must name one of the root's suites; a package is requested once."""
    suites = {s["suite"] for s in doc.data["suites"]}
    out, seen = [], set()
    for i, text in enumerate(doc.data["packages"]):
        name, _, suite = text.partition("/")
        if suite and suite not in suites:
            out.append(f"{doc.where(('packages', i))}: {text!r} names suite {suite!r}, which is not one of the root's "
                       f"suites ({', '.join(sorted(suites))})")
        if name in seen:
            out.append(f"{doc.where(('packages', i))}: {name!r} is requested twice")
        seen.add(name)
    return out


GENERATED = "# --- written by `1bit-build roots resolve` (and the pin bot) from the suites' Packages indexes; not by hand"


def render(text: str, resolved: Sequence[ResolvedDeb], snapshot: str) -> str:
    """Pure: the pin file's text with its generated part (snapshot + resolved) replaced; the hand-written part above
    it (name, suites, packages, comments) is kept byte for byte."""
    lines = text.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line.rstrip("\n") == GENERATED
                or line.startswith(("snapshot:", "resolved:"))), len(lines))
    head = "".join(lines[:cut]).rstrip("\n") + "\n"
    out = [head, GENERATED + "\n", f"snapshot: {json.dumps(snapshot)}\n", "resolved:\n"]
    for d in sorted(resolved, key=lambda d: d.package):
        out.append(f"  - {{package: {json.dumps(d.package)}, version: {json.dumps(d.version)}, suite: {d.suite}, "
                   f"size: {d.size},\n     path: {json.dumps(d.path)},\n     sha256: {d.sha256}}}\n")
    return "".join(out)


def moved_text(text: str, old_snapshot: str | None, resolved: Sequence[ResolvedDeb], changed: bool, stamp: str) -> str:
    """Pure: the pin file a re-resolution writes (builders.roots.assemble.resolve_file): `text` with the closure `resolved`, the
    snapshot timestamp `stamp` when the closure changed (or the file had none), else the old one kept."""
    return render(text, resolved, stamp if changed or not old_snapshot else old_snapshot)


@dataclass(frozen=True)
class Change:
    package: str
    old: str | None  # version (suite), None: added
    new: str | None  # None: removed


def diff(old: Iterable[ResolvedDeb], new: Iterable[ResolvedDeb]) -> list[Change]:
    """Pure: what a re-resolution changes, package by package (added, removed, another version or suite)."""
    a = {d.package: d for d in old}
    b = {d.package: d for d in new}
    out = []
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x and y and (x.version, x.suite, x.sha256) == (y.version, y.suite, y.sha256):
            continue
        out.append(Change(name, f"{x.version} ({x.suite})" if x else None, f"{y.version} ({y.suite})" if y else None))
    return out


def describe(changes: Sequence[Change]) -> list[str]:
    """Pure: one line per change, for a report or a commit message."""
    return [f"{c.package}: " + (f"{c.old} -> {c.new}" if c.old and c.new else f"added {c.new}" if c.new
                                else f"removed {c.old}") for c in changes]


def glibc_of(resolved: Iterable[ResolvedDeb]) -> str | None:
    """Pure: the root's glibc (major.minor of libc6's version): the floor every binary built in it may need."""
    for d in resolved:
        if d.package == "libc6":
            m = re.match(r"(?:\d+:)?(\d+\.\d+)", d.version)
            return m.group(1) if m else None
    return None
