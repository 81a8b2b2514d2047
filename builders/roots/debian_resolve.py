"""debian_resolve: which Debian packages a build root holds, decided from the archive's Packages indexes (pure).

Given the stanzas of one or more suites' `Packages` indexes (the first suite is the base, e.g. sid; later ones, e.g.
experimental, are used only where asked or where nothing else will do) and the packages a root requests, `resolve`
returns the closure apt would install with `--no-install-recommends`:

- every Essential: yes package of the base suite, and what those need (a root is a Debian system, and a build step
  runs its shell, coreutils and the dpkg-free tools every maintainer takes for granted);
- Depends and Pre-Depends, never Recommends or Suggests;
- alternatives `a | b`: an alternative already chosen wins, else the first that can be satisfied;
- virtual packages (Provides, versioned or not): a provider already chosen wins, else a real package of that name,
  else the first provider by (suite preference, Priority, name);
- version constraints (<<, <=, =, >=, >>) compared as dpkg does (python-debian's Version);
- a package requested as `name/experimental` (any later suite) takes that suite's newest version; every other package
  takes the newest version of the earliest suite that satisfies what asks for it, so a later suite fills in only what
  the base cannot satisfy (apt's NotAutomatic pinning of experimental);
- one version per package: when a later constraint rejects the version chosen first, the package is re-decided with
  the constraint known, from the start (bounded), so the result does not depend on the order of discovery.

Architecture-qualified dependencies (`python3:any`) and `[arch]` restrictions are read for amd64. Conflicts and Breaks
are not solved (a root is one consistent suite, not an upgrade); what is chosen is reported in full so a reviewer sees
it. Parsing is python-debian's (deb822 paragraphs, relation fields, Version); nothing here reads a file or the network.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from debian.deb822 import PkgRelation
from debian.debian_support import Version

ARCH = "amd64"
PRIORITY_ORDER = {"required": 0, "important": 1, "standard": 2, "optional": 3, "extra": 4}
FIELDS = ("Package", "Version", "Architecture", "Depends", "Pre-Depends", "Provides", "Essential", "Priority",
          "Filename", "SHA256", "Size", "Multi-Arch", "Source")


class ResolveError(ValueError):
    """A request the indexes cannot satisfy: the message names the package and the chain that asked for it."""


@dataclass(frozen=True)
class Candidate:
    name: str
    version: str
    suite: str
    rank: int  # the suite's position: 0 is the base
    filename: str
    sha256: str
    size: int
    depends: str = ""  # the raw fields, parsed only for what is chosen
    pre_depends: str = ""
    provides: str = ""
    essential: bool = False
    priority: str = "optional"
    source: str = ""

    @property
    def v(self) -> Version:
        return Version(self.version)


@dataclass(frozen=True)
class Chosen:
    """One package of the closure: the candidate and why it is there (the first chain that asked for it)."""

    pkg: Candidate
    why: str


@dataclass
class Index:
    """Every candidate by name and every provider by virtual name, across the suites in order. A stanza read from
    a Packages text is parsed when its name (or a virtual name it provides) is first asked for (`cands`, `provs`);
    only Essential ones are parsed at once: a suite's 70 000 stanzas are mostly never looked at."""

    suites: tuple[str, ...]
    by_name: dict[str, list[Candidate]] = field(default_factory=dict)
    providers: dict[str, list[tuple[Candidate, str | None]]] = field(default_factory=dict)  # virtual -> (pkg, =version)
    raw: dict[str, list[tuple[int, str, str]]] = field(default_factory=dict)  # name -> (rank, suite, stanza) unparsed
    raw_providers: dict[str, list[tuple[str, str | None, int]]] = field(default_factory=dict)  # virtual -> (name, =v, rank)

    def cands(self, name: str) -> list[Candidate]:
        for rank, suite, text in self.raw.pop(name, ()):
            self._add(_parse_one(text), rank, suite, provides=False)  # its Provides are in raw_providers
        return self.by_name.get(name, [])

    def provs(self, virtual: str) -> list[tuple[Candidate, str | None]]:
        for name, version, rank in self.raw_providers.pop(virtual, ()):
            self.providers.setdefault(virtual, []).extend((c, version) for c in self.cands(name) if c.rank == rank)
        return self.providers.get(virtual, [])

    def _add(self, st: Mapping[str, str], rank: int, suite: str, provides: bool = True) -> None:
        if st.get("Architecture", ARCH) not in (ARCH, "all"):
            return
        c = Candidate(name=st["Package"], version=st["Version"], suite=suite, rank=rank,
                      filename=st.get("Filename", ""), sha256=st.get("SHA256", ""), size=int(st.get("Size") or 0),
                      depends=st.get("Depends", ""), pre_depends=st.get("Pre-Depends", ""),
                      provides=st.get("Provides", ""), essential=st.get("Essential", "").lower() == "yes",
                      priority=st.get("Priority", "optional"), source=st.get("Source", "").split(" ")[0])
        self.by_name.setdefault(c.name, []).append(c)
        for group in _relations(c.provides) if provides else ():
            for alt in group:
                ver = alt.get("version")
                self.providers.setdefault(alt["name"], []).append((c, ver[1] if ver and ver[0] == "=" else None))


_STANZA_SPLIT = re.compile(r"\n\s*\n")
_NAME = re.compile(r"^Package:[ \t]*(\S+)", re.M)
_ARCH = re.compile(r"^Architecture:[ \t]*(\S+)", re.M)
_ESSENTIAL = re.compile(r"^Essential:[ \t]*yes", re.M | re.I)
_PROVIDES = re.compile(r"^Provides:[ \t]*(.*(?:\n[ \t]+.*)*)", re.M)


def _parse_one(text: str) -> dict[str, str]:
    """One stanza, by python-debian's deb822 parser."""
    from debian import deb822

    return dict(deb822.Packages(text, fields=list(FIELDS)))


def _relations(text: str) -> list[list[dict]]:
    """Parsed relations of a Depends-like field, with the alternatives that do not apply to amd64 dropped."""
    out = []
    if not (text or "").strip():
        return out
    for group in PkgRelation.parse_relations(text):
        kept = [alt for alt in group if _for_arch(alt)]
        if kept:
            out.append(kept)
    return out


def _for_arch(alt: Mapping) -> bool:
    arch = alt.get("arch")
    if not arch:
        return True
    enabled = [a for a in arch if a.enabled]
    if enabled:
        return any(a.arch in (ARCH, "any", "linux-any") for a in enabled)
    return not any(a.arch == ARCH for a in arch)


def index(suites: Sequence[tuple[str, str | Iterable[Mapping[str, str]]]]) -> Index:
    """Pure: an Index over (suite name, its Packages text or parsed stanzas) in preference order (the base first)."""
    idx = Index(suites=tuple(s for s, _ in suites))
    for rank, (suite, stanzas) in enumerate(suites):
        if not isinstance(stanzas, str):
            for st in stanzas:
                idx._add(st, rank, suite)
            continue
        for text in _STANZA_SPLIT.split(stanzas):
            name, arch = _NAME.search(text), _ARCH.search(text)
            if name is None or (arch is not None and arch.group(1) not in (ARCH, "all")):
                continue
            if _ESSENTIAL.search(text):
                idx._add(_parse_one(text), rank, suite)
                continue
            idx.raw.setdefault(name.group(1), []).append((rank, suite, text))
            provides = _PROVIDES.search(text)
            for group in _relations(provides.group(1)) if provides else ():  # python-debian's relation parser
                for alt in group:
                    ver = alt.get("version")
                    idx.raw_providers.setdefault(alt["name"], []).append(
                        (name.group(1), ver[1] if ver and ver[0] == "=" else None, rank))
    return idx


_OPS = {"<<": lambda c: c < 0, "<=": lambda c: c <= 0, "=": lambda c: c == 0, ">=": lambda c: c >= 0,
        ">>": lambda c: c > 0, "<": lambda c: c <= 0, ">": lambda c: c >= 0,
        "!=": lambda c: c != 0}  # only learnt: a version that led to a dead end


def satisfies(version: str | None, constraint: tuple[str, str] | None) -> bool:
    """Pure: whether `version` meets `(op, version)`; no constraint is always met; an unversioned Provides meets
    only an unversioned dependency."""
    if constraint is None:
        return True
    if version is None:
        return False
    op, want = constraint
    a, b = Version(version), Version(want)
    return _OPS[op]((a > b) - (a < b))


@dataclass(frozen=True)
class Request:
    name: str
    suite: str | None = None  # `name/experimental`: take that suite's newest

    @classmethod
    def parse(cls, text: str) -> "Request":
        name, _, suite = text.partition("/")
        return cls(name.strip(), suite.strip() or None)

    def __str__(self) -> str:
        return f"{self.name}/{self.suite}" if self.suite else self.name


def resolve(idx: Index, requests: Sequence[Request], *, essential: bool = True, max_rounds: int = 50) -> list[Chosen]:
    """Pure: the closure of `requests` (plus the base suite's Essential: yes packages), sorted by name. Raises
    ResolveError naming what cannot be satisfied and the chain that asked for it."""
    for r in requests:
        if r.suite is not None and r.suite not in idx.suites:
            raise ResolveError(f"{r}: suite {r.suite!r} is not one of the root's suites ({', '.join(idx.suites)})")
    # Constraints learnt from conflicts: name -> the constraints every chosen version must meet.
    learnt: dict[str, list[tuple[str, str] | None]] = {}
    dead_ends: list[str] = []
    for _ in range(max_rounds):
        try:
            return _attempt(idx, requests, learnt, essential)
        except _Conflict as c:
            dead_ends.append(c.message)
            for name, constraint in c.options:  # the first way out not tried yet that some version still allows
                seen = learnt.setdefault(name, [])
                if constraint not in seen and any(all(satisfies(x.version, k) for k in [*seen, constraint])
                                                  for x in idx.cands(name)):
                    seen.append(constraint)
                    break
            else:
                first = dead_ends[0] if len(dead_ends) > 1 else None
                raise ResolveError(c.message + (f"; it started with: {first}" if first else "")) from None
    raise ResolveError("the dependencies did not settle after re-deciding the conflicting packages "
                       f"{', '.join(sorted(learnt))} {max_rounds} times")


class _Conflict(Exception):
    """A dead end, and the ways out in the order to try them: each (package, constraint) is learnt for the next
    round (another version of the package that asked, or of the package whose chosen version is in the way)."""

    def __init__(self, options: Sequence[tuple[str, tuple[str, str]]], message: str):
        super().__init__(message)
        self.options, self.message = list(options), message


def _pick(idx: Index, name: str, constraints: Sequence, prefer: str | None) -> Candidate | None:
    """The candidate of a real package `name` meeting every constraint: the newest of `prefer`'s suite when the root
    names the package with its suite, else the newest of the earliest suite that has one."""
    cands = [c for c in idx.cands(name) if all(satisfies(c.version, k) for k in constraints)]
    if not cands:
        return None
    if prefer is not None:  # named with its suite: from that suite or not at all
        own = [c for c in cands if c.suite == prefer]
        return max(own, key=lambda c: c.v) if own else None
    best_rank = min(c.rank for c in cands)
    return max((c for c in cands if c.rank == best_rank), key=lambda c: c.v)


def _attempt(idx: Index, requests: Sequence[Request], learnt: Mapping[str, Sequence], essential: bool) -> list[Chosen]:
    prefer = {r.name: r.suite for r in requests if r.suite}
    chosen: dict[str, Chosen] = {}
    provided: dict[str, list[tuple[Candidate, str | None]]] = {}  # virtual name -> chosen providers
    queue: list[Candidate] = []

    def away(by: Candidate | None) -> list[tuple[str, tuple[str, str]]]:
        """The way out that moves the package that asked to another version (none for the root's own requests)."""
        return [(by.name, ("!=", by.version))] if by is not None else []

    def take(name: str, constraint, why: str, by: Candidate | None) -> None:
        got = _pick(idx, name, [constraint, *learnt.get(name, ())], prefer.get(name))
        if got is None:
            have = ", ".join(f"{c.version} ({c.suite})" for c in idx.cands(name)) or "none"
            raise _Conflict(away(by), f"{name}{_show(constraint)}: no version in {'/'.join(idx.suites)} satisfies it "
                                      f"(have: {have}); needed by {why}")
        chosen[name] = Chosen(got, why)
        for group in _relations(got.provides):
            for alt in group:
                ver = alt.get("version")
                provided.setdefault(alt["name"], []).append((got, ver[1] if ver and ver[0] == "=" else None))
        queue.append(got)

    def met(alt: Mapping) -> bool | None:
        """True: a package already chosen satisfies it; False: a chosen package of that name does not (a conflict
        unless another alternative does); None: nothing chosen answers it yet."""
        name, constraint = alt["name"], alt.get("version")
        if any(satisfies(v, constraint) for _, v in provided.get(name, ())):
            return True
        have = chosen.get(name)
        if have is not None:
            return satisfies(have.pkg.version, constraint)
        return None

    def need(group: list[dict], why: str, by: Candidate | None) -> None:
        states = [met(alt) for alt in group]
        if True in states:
            return
        for alt, state in zip(group, states):
            name, constraint = alt["name"], alt.get("version")
            if state is False:
                continue  # its chosen version does not fit; try the next alternative first
            if _pick(idx, name, [constraint, *learnt.get(name, ())], prefer.get(name)) is not None:
                take(name, constraint, why, by)
                return
            provs = [(c, v) for c, v in idx.provs(name) if satisfies(v, constraint)
                     and all(satisfies(c.version, k) for k in learnt.get(c.name, ()))
                     and (c.name not in chosen or chosen[c.name].pkg == c)]
            if provs:
                c, _ = min(provs, key=lambda p: (p[0].name not in chosen, p[0].rank,
                                                 PRIORITY_ORDER.get(p[0].priority, 9), p[0].name))
                if c.name not in chosen:
                    take(c.name, ("=", c.version), f"{why} (provides {name})", by)
                return
        text = " | ".join(f"{a['name']}{_show(a.get('version'))}" for a in group)
        # nothing chosen fits and nothing new can: move the package that asked, or the chosen one in the way
        blockers = [(a["name"], a.get("version")) for a, st in zip(group, states) if st is False and a.get("version")]
        detail = "; ".join(f"{n} {chosen[n].pkg.version} is chosen for {chosen[n].why}" for n, _ in blockers)
        have = "; ".join(f"{a['name']} " + ", ".join(f"{c.version} ({c.suite})" for c in idx.cands(a["name"]))
                         for a in group if idx.cands(a["name"]) and a["name"] not in chosen)
        raise _Conflict(blockers + away(by), f"{text}: nothing in {'/'.join(idx.suites)} satisfies it"
                                             + (f" (have: {have})" if have else "") + f"; needed by {why}"
                                             + (f" ({detail})" if detail else ""))

    seeds = [(r.name, f"the root's request {r}") for r in requests]
    if essential:
        base = idx.suites[0]
        seeds += sorted((n, "Essential: yes") for n, cs in idx.by_name.items()
                        if any(c.essential and c.suite == base for c in cs))
    for name, why in seeds:
        need([{"name": name, "version": None}], why, None)
    while queue:
        pkg = queue.pop(0)
        for group in _relations(pkg.pre_depends) + _relations(pkg.depends):
            need(group, f"{pkg.name} {pkg.version}", pkg)
    return [chosen[n] for n in sorted(chosen)]


def _show(constraint) -> str:
    return f" ({constraint[0]} {constraint[1]})" if constraint else ""
