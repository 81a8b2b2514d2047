"""lemonade_install: the offline install into Lemonade's cache, as Lemonade itself installs (lemonade.py has the
contract): where the cache is, the checksum an archive must have, every check that can be made before writing (names,
checksum, members, unpacked size, one llama-server), then each archive unpacked aside and swapped into
`<cache>/bin/<recipe>/<backend>/` with its `version.txt` under the cache's lock, and the installed tags pinned in
Lemonade's config.json (lemonade_config.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import OnebitError
from ..io import archives, lock, swap
from ..io.archives import member_problem
from ..project.config import file_sha256 as sha256
from .lemonade import SERVER, check_component, check_tag, parse_name
from .lemonade_config import bin_key, config_lock, config_with_pins, env_override, record_pins

MiB, GiB = 1 << 20, 1 << 30


@dataclass(frozen=True)
class Limits:
    """How far one archive may unpack. A real backend unpacks to a few times its size; a bomb to thousands."""

    members: int = 20_000
    ratio: int = 50  # unpacked bytes per archive byte
    floor: int = 256 * MiB  # ... but any archive may unpack to this much
    ceiling: int = 16 * GiB  # ... and none to more

    def max_bytes(self, archive_size: int) -> int:
        return min(self.ceiling, max(self.floor, self.ratio * archive_size))

    def text(self) -> str:
        return (f"at most {self.members:,} members and max({self.floor // MiB} MiB, {self.ratio} x the archive's size) "
                f"unpacked, never over {self.ceiling // GiB} GiB")


LIMITS = Limits()


# ------------------------------------------------------------------------------------------------ where things are


def cache_dir(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """Pure: Lemonade's cache: LEMONADE_CACHE_DIR, else CACHE_DIRECTORY, else $XDG_CACHE_HOME/lemonade, else ~/.cache/lemonade."""
    env = os.environ if env is None else env
    if env.get("LEMONADE_CACHE_DIR"):
        return Path(env["LEMONADE_CACHE_DIR"])
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "lemonade"
    return (home or Path(env.get("HOME") or Path.home())) / ".cache" / "lemonade"



def expected_sha(name: str, *, fragment_path: Path | None = None, sums_path: Path | None = None) -> str:
    """The sha256 an archive must have, from a backend_versions.json fragment or a GNU SHA256SUMS file."""
    if fragment_path is not None:
        try:
            doc = json.loads(Path(fragment_path).read_text())
        except json.JSONDecodeError as exc:
            raise OnebitError(f"not JSON: {exc.msg}", where=f"{fragment_path}:{exc.lineno}") from None
        found = {value.removeprefix("sha256:")
                 for repo in ((doc.get("checksums") or {}).get("github") or {}).values() if isinstance(repo, dict)
                 for assets in repo.values() if isinstance(assets, dict)
                 for asset, value in assets.items() if asset == name and isinstance(value, str)}
        if len(found) > 1:
            raise OnebitError(f"two different checksums for {name}", where=str(fragment_path))
        if not found:
            raise OnebitError(f"no checksum for {name}", where=str(fragment_path),
                              hint="pass the fragment of the release it came from")
        return found.pop()
    if sums_path is not None:
        for line in Path(sums_path).read_text().splitlines():
            digest, _, fname = line.partition("  ")
            if fname.lstrip("*") == name:
                return digest.strip()
        raise OnebitError(f"no checksum for {name}", where=str(sums_path),
                          hint="pass the SHA256SUMS of the release it came from")
    raise OnebitError(f"{name}: nothing to verify it against",
                      hint="pass --sums SHA256SUMS or --fragment backend_versions.json from its release, or --no-verify")


# -------------------------------------------------------------------------------------------------- reading archives


def strip_components(entries: Iterable[tuple[str, bool]]) -> int:
    """Pure: tar's --strip-components for an archive's (name, is_dir) list, decided as Lemonade decides it: 1 when every
    member lies under one shared top folder and some member is nested in it, else 0. `./x` shares the top folder `.`."""
    first, same, nested = "", True, False
    for name, is_dir in entries:
        name = name.rstrip("/") if name not in ("/", "") else name
        top, sep, _ = name.partition("/")
        if not sep:
            if not is_dir:
                same = False
            elif not first:
                first = top
            elif top != first:
                same = False
        else:
            if not first:
                first = top
            elif top != first:
                same = False
            nested = True
    return 1 if same and first and nested else 0


class _Hashing:
    """A file read through while hashing every byte, so what is unpacked is provably what was verified."""

    def __init__(self, raw):
        self.raw, self.h = raw, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.h.update(data)
        return data

    def finish(self) -> str:
        while self.read(1 << 20):
            pass
        return self.h.hexdigest()


@dataclass(frozen=True)
class Checked:
    """An archive that passed every check, and where it goes."""

    archive: Path
    recipe: str
    backend: str
    tag: str
    sha: str
    strip: int
    members: int
    size: int  # unpacked bytes

    def target(self, cache: Path) -> Path:
        return cache / "bin" / self.recipe / self.backend


def check(archive: Path, *, recipe: str | None = None, backend: str | None = None, tag: str | None = None,
          sha: str | None = None, limits: Limits = LIMITS) -> Checked:
    """Everything that can be known before writing: the names, the checksum (when `sha` is given), every member's
    name and kind, the unpacked size and member count against `limits`, and one llama-server inside. Writes nothing."""
    archive = Path(archive)
    if not archive.is_file():
        raise OnebitError(f"{archive}: no such archive")
    parsed = parse_name(archive.name) if recipe is None or backend is None or tag is None else None
    recipe = check_component(recipe if recipe is not None else parsed.recipe, "recipe")
    backend = check_component(backend if backend is not None else parsed.backend, "backend")
    tag = check_tag(tag if tag is not None else parsed.tag)
    actual = sha256(archive)
    if sha is not None and actual != sha.lower():
        raise OnebitError(f"{archive.name}: sha256 {actual} does not match the expected {sha}; nothing was installed",
                          hint="download the archive again, or check the checksums file is from the same release")
    max_bytes = limits.max_bytes(archive.stat().st_size)
    entries, count, total, servers = [], 0, 0, 0
    try:
        with archives.reading(archive, kind="tar") as stream:
            for m, _ in stream:
                count += 1
                if count > limits.members:
                    raise OnebitError(f"{archive.name}: more than {limits.members:,} members; nothing was installed",
                                      hint=f"an archive may hold {limits.text()}")
                why = member_problem(m.name, is_link=m.issym() or m.islnk(), is_special=not (m.isfile() or m.isdir()))
                if why:
                    raise OnebitError(f"{archive.name}: member {m.name!r} {why}; nothing was installed",
                                      hint="the archive is corrupt or malicious: delete it and download it again")
                if m.isfile():
                    total += m.size
                    if total > max_bytes:
                        raise OnebitError(f"{archive.name}: unpacks to more than {max_bytes:,} bytes (from "
                                          f"{archive.stat().st_size:,}); nothing was installed",
                                          hint=f"an archive may hold {limits.text()}")
                    servers += PurePosixPath(m.name).name == SERVER
                entries.append((m.name, m.isdir()))
    except archives.Unreadable as exc:
        raise OnebitError(f"{archive.name}: not a readable tar archive ({exc.why}); nothing was installed") from None
    if servers != 1:
        raise OnebitError(f"{archive.name}: {servers} files named {SERVER}, need exactly one; nothing was installed")
    return Checked(archive=archive, recipe=recipe, backend=backend, tag=tag, sha=actual,
                   strip=strip_components(entries), members=count, size=total)


def _unpack(c: Checked, into: Path) -> None:
    """Unpack a checked archive into `into` with the project's one unpacker (builders/io/archives.py: no links, `strip`
    folders stripped, at most the members and bytes the check counted), reading it once more through a hash: a file
    changed since it was checked (other bytes, more bytes) is refused before anything is swapped in."""
    changed = OnebitError(f"{c.archive.name}: changed while it was being installed; nothing was installed")
    try:
        with open(c.archive, "rb") as raw:
            src = _Hashing(raw)
            archives.unpack(src, into, strip=c.strip, links="refuse", kind="tar", label=c.archive.name,
                            budget=archives.Budget(bytes=c.size, members=c.members))
            if src.finish() != c.sha:
                raise changed
    except archives.Unreadable as exc:
        raise OnebitError(f"{c.archive.name}: not a readable tar archive ({exc.why}); nothing was installed") from None
    except archives.NotWritten as exc:
        raise OnebitError(f"{exc.what}; nothing was installed") from None
    except archives.ArchiveError:
        raise changed from None
    (into / "version.txt").write_bytes(c.tag.encode())
    for path in into.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o755)


# ------------------------------------------------------------------------------------------------------- install


def install_all(checked: Sequence[Checked], cache: Path, *, config: Path | None = None, pin: bool = True,
                env: Mapping[str, str] | None = None, say: Callable[[str], None] = lambda s: None) -> list[Path]:
    """Install checked archives into Lemonade's cache under its lock: each is unpacked aside, then all are swapped into
    place (builders/swap.replace_dir: a kill at any moment leaves each backend's old or new folder, whole), then the
    installed tags are recorded as Lemonade's `<backend>_bin` settings in `<config>/config.json`. Returns the folders."""
    env = os.environ if env is None else env
    targets = [c.target(cache) for c in checked]
    dup = next((t for t in targets if targets.count(t) > 1), None)
    if dup is not None:
        raise OnebitError(f"two archives install into {dup}; nothing was installed", hint="install one of them")
    pins = {bin_key(c.recipe, c.backend): c.tag for c in checked if bin_key(c.recipe, c.backend)}
    pin = pin and bool(pins) and config is not None
    held = [(cache / "bin", "Lemonade cache")] + ([(config_lock(config), "Lemonade config")] if pin else [])
    with lock.hold_all(held, say=say):
        if pin:
            config_with_pins(config, pins)  # a config we cannot update is refused before anything is swapped
        asides: list[Path] = []
        try:
            for c, target in zip(checked, targets):
                for stale in target.parent.glob(f".{target.name}.*.new"):  # left by a killed install; we hold the lock
                    shutil.rmtree(stale, ignore_errors=True)
                asides.append(swap.aside(target))
                _unpack(c, asides[-1])
            for aside, target in zip(asides, targets):
                swap.replace_dir(aside, target)
        finally:
            for aside in asides:
                shutil.rmtree(aside, ignore_errors=True)
        if pin:
            path = record_pins(config, pins)
            say(f"pinned {', '.join(f'{s}.{k}={t}' for (s, k), t in pins.items())} in {path}")
            for c in checked:
                if bin_key(c.recipe, c.backend) and env.get(env_override(c.recipe, c.backend)) not in (None, "", c.tag):
                    say(f"note: {env_override(c.recipe, c.backend)}={env[env_override(c.recipe, c.backend)]} is set and "
                        f"overrides that setting in Lemonade")
    return targets


def install(archive: Path, cache: Path, *, recipe: str | None = None, backend: str | None = None,
            tag: str | None = None, sha: str | None = None, config: Path | None = None, limits: Limits = LIMITS) -> Path:
    """Check and install one archive (see `check` and `install_all`)."""
    c = check(archive, recipe=recipe, backend=backend, tag=tag, sha=sha, limits=limits)
    return install_all([c], cache, config=config)[0]
