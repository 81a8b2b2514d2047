"""Lemonade's contract: one archive per llama.cpp backend Lemonade has, its backend_versions.json fragment, and the
offline install that pins what it installed.

What Lemonade does, read from its source (lemonade-sdk/lemonade; the commit is `lemonade.read_from` in release.yaml):

- It installs a backend into `<cache>/bin/<recipe>/<backend>/`: the archive is unpacked with `tar --strip-components`
  (1 when every member lies under one shared top folder, else 0: `compute_tarball_strip_components`), `version.txt` gets
  the tag with no newline, every file is made 0755, and the folder is swapped into place. It finds `llama-server` by a
  recursive search, so the archive carries exactly one, with its libraries reached through `$ORIGIN`.
- Its llamacpp backends on Linux x86_64 are cpu, vulkan (both downloaded from ggml-org/llama.cpp), rocm-stable (named
  with TheRock's major.minor from its own `therock.version`) and cuda (lemonade-sdk/llama.cpp; `get_install_params`).
  Checksums are looked up as `checksums.github.<repo it downloads from>.<tag>.<asset>` (`lookup_expected_asset_hash`).
- It keeps an installed backend only while `version.txt` equals the expected version: the config.json setting
  `llamacpp.<backend>_bin` when that holds a release tag (`rocm_bin` for both rocm channels; `build_bin_config_key`,
  `resolve_user_version`, the `update_required` check in system_info.cpp), else its `backend_versions.json` pin.
  Anything else is "update_required" and is replaced by its stock build whenever it is online.

So `install_all` records the tag it installed as that `<backend>_bin` setting, in the config.json Lemonade reads.

An archive holds the variant's `bin/` and `lib/`, the release's LICENSE, NOTICE and upstream licenses, and what the
subtree ships from a toolchain with its license text (`share/licenses/<package>/`, `share/onebit/redistributables.json`:
the cuda archive's cudart, cuBLAS and cuBLASLt under NVIDIA's EULA); one that would lack a named file is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..io import archives, lock, readfile, swap, tarball
from ..io.archives import member_problem
from ..project.config import file_sha256 as sha256
from ..errors import OnebitError
from ..inputs.toolchain import REDISTRIBUTABLES
from onebit.manifest import Backend, Manifest, default_adapter
from onebit.devices import DEVICE_FLAG, capabilities
from onebit.devices import backend_for as _backend_for

RECIPE = "llamacpp"
SERVER = "llama-server"
LICENSES = "share/licenses"  # in a variant's subtree: the license text of what it ships from a toolchain

# Our variant id -> the Lemonade llamacpp backend it stands in for. Only these get an archive: hrx and lean-vulkan have
# no slot in Lemonade (its validate_backend_choice refuses them); they reach Lemonade through the `onebit` backend.
VARIANT_BACKEND = {"cpu": "cpu", "vulkan": "vulkan", "lean-rocm": "rocm-stable", "rocm": "rocm-stable", "cuda": "cuda"}
# Lemonade backend -> its setting in config.json's `llamacpp` section (both rocm channels share `rocm_bin`).
BIN_KEY = {"cpu": "cpu_bin", "vulkan": "vulkan_bin", "rocm-stable": "rocm_bin", "rocm-nightly": "rocm_bin",
           "cuda": "cuda_bin"}

NAME_RE = re.compile(r"^llama-(?P<tag>[A-Za-z0-9][A-Za-z0-9._+]*)-(?:bin-)?ubuntu-(?:(?P<kind>[a-z0-9._]+(?:-[a-z0-9._]+)?)-)?"
                     r"x64\.(?:tar\.gz|tar\.xz)$")
COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
REPO_RE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")

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


def check_component(value: str, what: str) -> str:
    """A recipe or backend name must be one path component: `.`, `..`, `a/b` and empty are refused."""
    if not isinstance(value, str) or not COMPONENT_RE.fullmatch(value):
        raise OnebitError(f"{what} {value!r} is not a single folder name (letters, digits, '.', '_', '-'; not '.' or '..')",
                          hint=f"Lemonade installs into <cache>/bin/<recipe>/<backend>/: pass a plain name as {what}")
    return value


def check_tag(value: str, what: str = "the tag") -> str:
    if not isinstance(value, str) or not TAG_RE.fullmatch(value):
        raise OnebitError(f"{what} {value!r} is not a release tag (letters, digits, '.', '_', '+', '-'; one line)",
                          hint="version.txt holds the tag on one line, as Lemonade writes it")
    return value


# ------------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """release.yaml `lemonade:`: what the archive names and the fragment need to know about Lemonade."""

    repos: Mapping[str, str] = field(default_factory=dict)  # Lemonade backend -> owner/repo it downloads it from
    therock: str | None = None  # TheRock major.minor of Lemonade's backend_versions.json: names the rocm archive
    cuda_arch: tuple[str, ...] = ()  # one cuda archive per sm_xx
    read_from: str | None = None  # where the above was read: lemonade-sdk/lemonade@<commit>

    def repo(self, backend: str) -> str:
        repo = self.repos.get(backend)
        if not repo:
            raise OnebitError(f"no download repository for Lemonade's {backend} backend",
                              where="release.yaml: lemonade.download_repo",
                              hint="name the repository Lemonade downloads it from, or set ONEBIT_LEMONADE_REPO")
        return repo


def settings(doc: Any = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read the `lemonade:` section of release.yaml (a yamlio Document, or None); $ONEBIT_LEMONADE_REPO names one
    download repository for every backend. Bad values are one error naming release.yaml:line."""
    env = os.environ if env is None else env
    data = (doc.data or {}) if doc is not None else {}
    section = data.get("lemonade") if isinstance(data, dict) else None
    section = section or {}

    def bad(key: tuple, what: str) -> OnebitError:
        where = doc.where(("lemonade", *key)) if doc is not None else "lemonade." + ".".join(map(str, key))
        return OnebitError(what, where=where)

    if not isinstance(section, dict):
        raise bad((), "must be a mapping (download_repo, therock, cuda_arch, read_from)")
    unknown = sorted(set(map(str, section)) - {"download_repo", "therock", "cuda_arch", "read_from"})
    if unknown:
        raise bad((unknown[0],), f"unknown key {unknown[0]!r} (download_repo, therock, cuda_arch, read_from)")
    raw = section.get("download_repo") or {}
    if isinstance(raw, str):
        raw = {b: raw for b in sorted(set(VARIANT_BACKEND.values()))}
    if not isinstance(raw, dict):
        raise bad(("download_repo",), "must be owner/name or a mapping backend -> owner/name")
    repos = {}
    for backend, repo in raw.items():
        if backend not in BIN_KEY:
            raise bad(("download_repo", backend), f"Lemonade has no llamacpp backend {backend!r} ({', '.join(BIN_KEY)})")
        if not isinstance(repo, str) or not REPO_RE.fullmatch(repo):
            raise bad(("download_repo", backend), f"{repo!r} is not owner/name")
        repos[backend] = repo
    if env.get("ONEBIT_LEMONADE_REPO"):
        one = env["ONEBIT_LEMONADE_REPO"]
        if not REPO_RE.fullmatch(one):
            raise OnebitError(f"ONEBIT_LEMONADE_REPO={one!r} is not owner/name")
        repos = {b: one for b in sorted(set(VARIANT_BACKEND.values()) | set(repos))}
    therock = section.get("therock")
    if therock is not None and (not isinstance(therock, str) or not re.fullmatch(r"\d+\.\d+", therock)):
        raise bad(("therock",), f"{therock!r} is not major.minor in quotes (TheRock's version as Lemonade cuts it, e.g. '7.14')")
    archs = section.get("cuda_arch") or []
    archs = [archs] if isinstance(archs, str) else archs
    if not isinstance(archs, list) or not all(isinstance(a, str) and re.fullmatch(r"sm_\d+", a) for a in archs):
        raise bad(("cuda_arch",), f"{archs!r} is not a list of sm_xx")
    read_from = section.get("read_from")
    return Settings(repos=repos, therock=therock, cuda_arch=tuple(archs),
                    read_from=str(read_from) if read_from is not None else None)


# ---------------------------------------------------------------------------------------------------------- names


def asset_name(backend: str, tag: str, *, therock: str | None = None, cuda_arch: str | None = None) -> str:
    """Pure: Lemonade's asset name for one of its llamacpp backends on Linux x86_64 (get_install_params)."""
    if backend == "cpu":
        return f"llama-{tag}-bin-ubuntu-x64.tar.gz"
    if backend == "vulkan":
        return f"llama-{tag}-bin-ubuntu-vulkan-x64.tar.gz"
    if backend == "rocm-stable":
        if not therock or not re.fullmatch(r"\d+\.\d+", therock):
            raise OnebitError(f"Lemonade's rocm archive is named with its TheRock major.minor, got {therock!r}",
                              where="release.yaml: lemonade.therock",
                              hint="copy therock.version from Lemonade's backend_versions.json, cut to major.minor")
        return f"llama-{tag}-bin-ubuntu-rocm-{therock}-x64.tar.gz"
    if backend == "cuda":
        if not cuda_arch or not re.fullmatch(r"sm_\d+", cuda_arch):
            raise OnebitError(f"Lemonade's cuda archive is named with the CUDA architecture as sm_xx, got {cuda_arch!r}",
                              where="release.yaml: lemonade.cuda_arch")
        return f"llama-{tag}-ubuntu-cuda-{cuda_arch}-x64.tar.xz"
    raise OnebitError(f"Lemonade has no llamacpp backend {backend!r} on Linux x86_64 (cpu, vulkan, rocm-stable, cuda)")


@dataclass(frozen=True)
class Parsed:
    tag: str
    recipe: str
    backend: str


def parse_name(name: str) -> Parsed:
    """Pure: an archive's file name -> (tag, Lemonade recipe, Lemonade backend); only names Lemonade itself asks for."""
    m = NAME_RE.match(name)
    kind = (m["kind"] or "") if m else None
    backend, kw = None, {}
    if kind == "":
        backend = "cpu"
    elif kind == "vulkan":
        backend = "vulkan"
    elif kind is not None and kind.startswith("rocm-"):
        backend, kw = "rocm-stable", {"therock": kind.removeprefix("rocm-")}
    elif kind is not None and kind.startswith("cuda-"):
        backend, kw = "cuda", {"cuda_arch": kind.removeprefix("cuda-")}
    try:
        if backend is None or asset_name(backend, m["tag"], **kw) != name:
            raise OnebitError("no match")
    except OnebitError:
        raise OnebitError(f"{name}: not the name of a Lemonade llama.cpp archive (llama-<tag>-bin-ubuntu[-vulkan|"
                          "-rocm-<major.minor>]-x64.tar.gz, llama-<tag>-ubuntu-cuda-sm_<nn>-x64.tar.xz)",
                          hint="pass --recipe, --backend and --tag to install it anyway") from None
    return Parsed(tag=m["tag"], recipe=RECIPE, backend=backend)


# ------------------------------------------------------------------------------------------------------- archives


def archive_files(prefix: Path, root: str, licenses: Mapping[str, Path]) -> dict[str, Path]:
    """The archive's members for one backend: `<root>/bin` and `<root>/lib`; what the subtree ships from a toolchain
    with its license (`share/licenses/` and `share/onebit/redistributables.json`, where the variant has them: the cuda
    subtree's cudart, cuBLAS and cuBLASLt under NVIDIA's EULA); and the release's license files."""
    base = prefix / root
    files = {rel: e.src for under in ("bin", "lib", LICENSES)
             for rel, e in tarball.tree_entries(base / under, under, follow_links=True).items()}
    if (base / REDISTRIBUTABLES).is_file():
        files[REDISTRIBUTABLES] = base / REDISTRIBUTABLES
    servers = [rel for rel in files if PurePosixPath(rel).name == SERVER]
    if len(servers) != 1:
        raise OnebitError(f"{base}: a Lemonade archive needs exactly one {SERVER}, found {len(servers)}: {servers}",
                          hint="check the variant's stage.root in its recipe")
    for need in ("LICENSE", "NOTICE"):
        if need not in licenses:
            raise OnebitError(f"a Lemonade archive needs {need}; none was given")
    both = sorted(set(files) & set(licenses))
    if both:
        raise OnebitError(f"{base}: {both[0]} is both in the subtree and one of the release's license files")
    files.update({name: Path(src) for name, src in licenses.items()})
    missing = redistributable_problems(files.get(REDISTRIBUTABLES), lambda rel: rel in files)
    if missing:
        raise OnebitError(f"{base}: {missing[0]}", hint="the variant ships a toolchain's files only with their license: "
                                                         "build it again (builders/inputs/toolchain.py ship)")
    return files


def redistributable_problems(doc: Path | bytes | None, has: Callable[[str], bool]) -> list[str]:
    """What redistributables.json (a path, or its bytes) names that is not beside it (`has(rel)`: a path relative to
    the subtree is there): each shipped file and each license text."""
    if doc is None:
        return []
    try:
        data = json.loads(doc if isinstance(doc, bytes) else Path(doc).read_bytes())
        entries = data["redistributables"]
        named = [(e["package"], rel) for e in entries for rel in [*e["files"], *e["license_files"]]]
    except (ValueError, KeyError, TypeError):
        return [f"{REDISTRIBUTABLES} is not what builders/inputs/toolchain.py writes"]
    return [f"{REDISTRIBUTABLES} names {rel} ({package}), which is not there" for package, rel in named if not has(rel)]


def make_archives(prefix: Path, out: Path, tag: str, licenses: Mapping[str, Path], *, mtime: int,
                  settings: Settings | None = None) -> list[tuple[str, str, Path]]:
    """One archive per llama-server backend of the installed prefix that Lemonade has a slot for (VARIANT_BACKEND);
    the others (hrx, lean-vulkan) get none. Returns (variant, Lemonade backend, path)."""
    settings = settings or Settings()
    manifest = json.loads((prefix / "share/onebit/manifest.json").read_text())
    made = []
    for _, entry in sorted(manifest.get("backends", {}).items()):
        if entry.get("adapter", "llama-server") != "llama-server" or SERVER not in entry.get("binaries", {}):
            continue
        root = entry.get("root") or str(PurePosixPath(entry["binaries"][SERVER]).parent.parent)
        variant = PurePosixPath(root).name
        backend = VARIANT_BACKEND.get(variant)
        if backend is None:
            continue
        archs = list(settings.cuda_arch) if backend == "cuda" else [None]
        if backend == "cuda" and not archs:
            raise OnebitError("Lemonade's cuda archive is named with the CUDA architecture, and none is configured",
                              where="release.yaml: lemonade.cuda_arch", hint="list the sm_xx the cuda build carries")
        files = archive_files(prefix, root, licenses)
        for arch in archs:  # one asset per sm_xx a multi-arch build carries: Lemonade picks it by the GPU's
            name = asset_name(backend, tag, therock=settings.therock, cuda_arch=arch)
            top = name.removesuffix(".tar.gz").removesuffix(".tar.xz")
            path = tarball.write(out / name, top, {rel: tarball.Entry(src=src) for rel, src in files.items()}, mtime=mtime)
            made.append((variant, backend, path))
    return made


def fragment(settings: Settings, tag: str, archives: Iterable[Path]) -> dict:
    """backend_versions.json fragment: `llamacpp.<backend>` = tag, and each archive's sha256 keyed under the repository
    Lemonade downloads that backend from: `checksums.github.<owner/repo>.<tag>.<asset>` = `sha256:<hex>`."""
    versions: dict[str, str] = {}
    sums: dict[str, dict[str, str]] = {}
    for path in archives:
        parsed = parse_name(Path(path).name)
        repo = settings.repo(parsed.backend)
        versions[parsed.backend] = tag
        sums.setdefault(repo, {})[Path(path).name] = f"sha256:{sha256(path)}"
    return {RECIPE: dict(sorted(versions.items())),
            "checksums": {"github": {repo: {tag: dict(sorted(assets.items()))} for repo, assets in sorted(sums.items())}}}


def contract_problems(archive: Path) -> list[str]:
    """Everything in `archive` that breaks Lemonade's contract (empty: it holds)."""
    problems = []
    if not archive.name.endswith((".tar.gz", ".tar.xz")):
        problems.append(f"{archive.name}: Lemonade extracts .tar.gz/.tar.xz/.tar.bz2/.7z/.zip, not this")
    members = archives.members(archive)
    tops = {m.name.split("/")[0] for m in members}
    if len(tops) != 1:
        problems.append(f"{archive.name}: {len(tops)} top folders, need one: {sorted(tops)}")
    servers = [m.name for m in members if PurePosixPath(m.name).name == SERVER and m.isfile()]
    if len(servers) != 1:
        problems.append(f"{archive.name}: {len(servers)} files named {SERVER}, need exactly one")
    for m in members:
        if m.issym() or m.islnk() or not (m.isfile() or m.isdir()):
            problems.append(f"{archive.name}: {m.name} is a link or special file")
    top = next(iter(tops)) if len(tops) == 1 else ""
    names = {m.name for m in members}
    for need in ("LICENSE", "NOTICE"):
        if f"{top}/{need}" not in names:
            problems.append(f"{archive.name}: no {need} in the top folder")
    if f"{top}/{REDISTRIBUTABLES}" in names:  # what it ships from a toolchain goes with its license text
        doc = archives.read(archive, f"{top}/{REDISTRIBUTABLES}")
        problems += [f"{archive.name}: {p}" for p in redistributable_problems(doc, lambda rel: f"{top}/{rel}" in names)]
    return problems


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


def config_dir(env: Mapping[str, str] | None = None, *, cache: Path | None = None, home: Path | None = None) -> Path:
    """Pure: the folder of Lemonade's config.json. `lemond CACHE` given a cache folder and no config folder keeps both
    together (cli_parser.cpp), so an explicit cache means that folder; else STATE_DIRECTORY, $XDG_CONFIG_HOME/lemonade,
    ~/.config/lemonade (path_linux.cpp). LEMONADE_CACHE_DIR does not move the config."""
    env = os.environ if env is None else env
    if cache is not None:
        return Path(cache)
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"])
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "lemonade"
    return (home or Path(env.get("HOME") or Path.home())) / ".config" / "lemonade"


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


# ----------------------------------------------------------------------------------------------------- the config


def bin_key(recipe: str, backend: str) -> tuple[str, str] | None:
    """Pure: Lemonade's (config section, setting) that pins this backend's version, or None where it has none."""
    if recipe == RECIPE and backend in BIN_KEY:
        return RECIPE, BIN_KEY[backend]
    return None


def env_override(recipe: str, backend: str) -> str:
    """The environment variable that overrides the setting in Lemonade (LEMONADE_<SECTION>_<KEY>, upper case)."""
    section, key = bin_key(recipe, backend)
    return f"LEMONADE_{section}_{key}".upper()


def with_pins(text: str | None, pins: Mapping[tuple[str, str], str], *, where: str = "config.json") -> str:
    """Pure: config.json's text with each (section, key) set to its tag; every other setting, the key order, the
    indentation and the final newline stay as they were. A new file is written the way Lemonade writes it (2 spaces)."""
    if text is None or not text.strip():
        doc: dict = {}
        indent: str | int | None = 2
        newline = True
    else:
        try:
            doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            raise OnebitError(f"not JSON ({exc.msg}); nothing was changed", where=f"{where}:{exc.lineno}",
                              hint="fix or remove it: Lemonade itself would set it aside as config.json.corrupted") from None
        except _NotJSON as exc:
            raise OnebitError(f"holds {exc}, which JSON cannot carry; nothing was changed", where=where,
                              hint="fix it by hand: rewriting it would lose or corrupt that value") from None
        except RecursionError:
            raise OnebitError("nested too deeply to read; nothing was changed", where=where) from None
        bad = _lone_surrogate(doc)
        if bad is not None:
            raise OnebitError(f"holds a lone surrogate ({bad}), which UTF-8 cannot carry; nothing was changed", where=where,
                              hint="fix it by hand: Lemonade reads config.json as UTF-8")
        if not isinstance(doc, dict):
            raise OnebitError("is not a JSON object; nothing was changed", where=where)
        m = re.match(r"\s*\{\s*?\n([ \t]+)\S", text)
        indent = m[1] if m else None
        newline = text.endswith("\n")
    for (section, key), tag in pins.items():
        block = doc.setdefault(section, {})
        if not isinstance(block, dict):
            raise OnebitError(f"{section!r} is not an object; nothing was changed", where=where)
        block[key] = tag
    separators = None if indent is not None or ": " in (text or ": ") else (",", ":")
    return json.dumps(doc, indent=indent, ensure_ascii=False, separators=separators, allow_nan=False) + ("\n" if newline else "")


class _NotJSON(ValueError):
    pass


def _no_constant(name: str):
    raise _NotJSON(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise _NotJSON(f"the number {text[:40]} (out of a double's range)")
    return value


def _lone_surrogate(value: Any) -> str | None:
    """The first string (or key) of a JSON value that holds a lone surrogate, escaped; None when there is none."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo += list(v.keys()) + list(v.values())
        elif isinstance(v, list):
            todo += v
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return ascii(v[exc.start:exc.end])[1:-1]
    return None


def config_file(config: Path) -> Path:
    """The file to write: `<config>/config.json`, or where it links to (written through, beside its target, so the
    link stays a link); a link that leads nowhere, or to something that is not a file, is refused in one line."""
    path = Path(config) / "config.json"
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if not target.exists():
        raise OnebitError(f"is a link to {os.readlink(path)}, which does not exist; nothing was changed", where=str(path),
                          hint="create the file it names, or replace the link by a file")
    if not target.is_file():
        raise OnebitError(f"is a link to {target}, which is not a file; nothing was changed", where=str(path))
    return target


MAX_CONFIG = 16 << 20  # bytes of Lemonade's config.json (a few KiB in practice)


def _read_config(config: Path, pins: Mapping[tuple[str, str], str]) -> tuple[Path, str]:
    """config.json's path and its text with the pins set; read by builders/io/readfile.py (a regular file of at most
    MAX_CONFIG bytes: a FIFO, a device or a directory there is refused in one line, never waited on)."""
    path = config_file(config)
    try:
        text = None if readfile.absent(path) else readfile.read_bytes(path, MAX_CONFIG).decode("utf-8")
    except readfile.UnreadableFile as exc:
        raise OnebitError(f"{exc.why}; nothing was changed", where=str(path),
                          hint="replace it by Lemonade's config file, or remove it") from None
    except UnicodeDecodeError:
        raise OnebitError("not UTF-8 text; nothing was changed", where=str(path)) from None
    return path, with_pins(text, pins, where=str(path))


def record_pins(config: Path, pins: Mapping[tuple[str, str], str]) -> Path:
    """Set Lemonade's `<backend>_bin` settings in `<config>/config.json` (or the file it links to), written beside it
    and renamed into place. The caller holds the config's lock (config_lock)."""
    path, text = _read_config(config, pins)
    swap.write_text_atomic(path, text)
    return path


def config_lock(config: Path) -> Path:
    """The directory whose lock covers config.json: the folder of the file really written (two caches sharing one
    config, or one config reached through a link, take the same lock)."""
    return config_file(config).parent.resolve() / "config.json"


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
            _read_config(config, pins)  # a config we cannot update is refused before anything is swapped
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


# ------------------------------------------------------------------------------------- the engine's onebit backend
# The engine's Lemonade (1bit-MONSTER/lemonade) runs `1bit serve -m M --port P --device D --alias NAME ...` through its
# `onebit` recipe. Lemonade offers a backend of a recipe only where one of the recipe's support rows matches a device
# of the host (family + architecture; an empty list: any) and keeps it while `1bit version` is at least the recipe's
# `backend_versions.json` pin. So the release derives both from what its bundles can serve: one row per
# `1bit serve --device` value any bundle takes (onebit.devices.capabilities over each bundle's manifest), its families
# from the manifest devices that serve it. `onebit` holds the versions Lemonade reads; `onebit_support` the rows in the
# shape of Lemonade's BackendDescriptor support table, with the bundles that serve each (docs/lemonade.md; the fork's
# own table takes them through recipes/patches/lemonade-onebit/0001-onebit-support-every-bundle-device.patch).
ONEBIT = "onebit"
ONEBIT_SUPPORT = "onebit_support"
# The AMD architectures the strix bundle's GPU builds target (recipes/lean.yaml GPU_TARGETS, recipes/ds4-rocm.yaml
# ROCM_ARCH, hrx's gfx1151 pairing): Strix Halo's Radeon 8060S.
ONEBIT_AMD_ARCH = ("gfx1151",)
# a manifest device -> (Lemonade device family, its architectures: None = the release's CUDA ones, () = any)
_FAMILY = {"CPU": ("cpu", ("x86_64",)), "Vulkan0": ("amd_gpu", ()), "CUDA0": ("nvidia_gpu", None),
           "HRX0": ("amd_gpu", ONEBIT_AMD_ARCH), "ROCm0": ("amd_gpu", ONEBIT_AMD_ARCH), "NPU0": ("amd_npu", ("XDNA2",))}
# Vulkan runs on NVIDIA's driver too (the H200: docs/vulkan.md)
_ALSO = {"Vulkan0": ("nvidia_gpu", ())}


def onebit_manifest(doc: Mapping) -> Manifest:
    """Pure: the part of a bundle's manifest (share/onebit/manifest.json, parsed) that says what it serves: each
    backend's programs, devices and adapter (the release reads the manifest the build wrote and validated)."""
    backends = {name: Backend(name=name, binaries=dict(e.get("binaries") or {}), devices=tuple(e.get("devices") or ()),
                              adapter=e.get("adapter") or default_adapter(name), root=e.get("root"))
                for name, e in (doc.get("backends") or {}).items()}
    return Manifest(path=Path("share/onebit/manifest.json"), prefix=Path("."), bundle=str(doc.get("bundle", "")),
                    version=str(doc.get("version", "")), build_number=int(doc.get("build_number") or 0),
                    platform=str(doc.get("platform", "")), backends=backends)


def onebit_devices(manifest: Manifest) -> dict[str, tuple[str, ...]]:
    """Pure: what one bundle serves through `1bit serve --device D`: D -> the manifest devices of the backend that
    serves it (only the one llama-server device D names, for a backend that has several: hrx's HRX0, not its
    Vulkan0)."""
    out = {}
    for device in capabilities(manifest, laya=False).devices:
        if device == "auto":
            continue
        devices = manifest.backends[_backend_for(device, manifest)].devices
        flag = DEVICE_FLAG.get(device, "CPU" if device == "cpu" else None)
        out[device] = (flag,) if flag in devices else tuple(devices)
    return out


def onebit_rows(bundles: Mapping[str, tuple[Any, Sequence[str]]], version: str) -> dict:
    """Pure: the fragment's onebit rows from the release's bundles (name -> (its onebit.manifest.Manifest, the sm_xx
    its cuda build carries)): `onebit.<device>` = version, and `onebit_support.<device>` = {families: {family:
    [arch...]}, bundles: [...]}; a device no bundle serves has no row."""
    rows: dict[str, dict] = {}
    for bundle, (manifest, cuda_arch) in sorted(bundles.items()):
        for device, mdevices in onebit_devices(manifest).items():
            row = rows.setdefault(device, {"families": {}, "bundles": []})
            row["bundles"].append(bundle)
            for m in mdevices:
                for family, archs in [_FAMILY[m], *([_ALSO[m]] if m in _ALSO else [])] if m in _FAMILY else []:
                    archs = tuple(cuda_arch) if archs is None else archs
                    have = row["families"].get(family)
                    # () is any: it absorbs a list; two lists join
                    row["families"][family] = () if have == () or archs == () else tuple(sorted({*(have or ()), *archs}))
    support = {d: {"families": {f: list(a) for f, a in sorted(r["families"].items())}, "bundles": r["bundles"]}
               for d, r in sorted(rows.items())}
    return {ONEBIT: {d: version for d in sorted(rows)}, ONEBIT_SUPPORT: support}
