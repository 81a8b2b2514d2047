"""toolchain_moves: where each pinned entry of a toolchain input moves, and what that makes of the input (pure).

- a wheel (`pick_wheel`): the newest release on the package index that satisfies the tool's `version:` constraint,
  is no pre-release, has a file with exactly the tags of the pinned file (same python/abi/platform), and, for NVIDIA's
  wheels, keeps the major version (a cu13 wheel stays 13.x). The sha256 is the index's.
- a Debian package (`pick_deb`): the suite whose Packages index holds exactly the pinned pool path (the first found in
  the order given); the move is the newest version of that package in that same suite, so the Vulkan SDK's mix
  (libvulkan1 from bookworm beside trixie's headers) stays a mix. A pool path no suite holds any more is vanished
  (only the download cache or the snapshot archive has it), never moved.
An entry whose newest candidate is older than the pin holds the whole input (`decide`) unless a rollback is allowed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import OnebitError
from .file_moves import MAX_DETAIL, SHA256

VANISHED = "vanished: only the cache or the snapshot archive has it"


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

