"""Lemonade's contract: one archive per llama-server backend, its backend_versions.json fragment, and the offline install.

Lemonade (lemonade-sdk/lemonade) installs a backend into `<cache>/bin/<recipe>/<backend>/`: it extracts the archive into
`<dir>.staging`, writes `version.txt` (the tag, no newline), makes every file 0755 and swaps the folder into place
(the previous install kept as `<dir>.old` until the rename succeeded). It finds `llama-server` by a recursive search and
sets no LD_LIBRARY_PATH, so the archive carries exactly one `llama-server` with its libraries reached via `$ORIGIN`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..archives import member_problem
from ..config import file_sha256 as sha256
from ..errors import OnebitError
from .. import tarball

RECIPE = "llamacpp"
SERVER = "llama-server"

# Our variant id -> Lemonade's backend name. Lemonade calls its ROCm build `rocm-stable`.
BACKENDS = {"cpu": "cpu", "vulkan": "vulkan", "cuda": "cuda", "hrx": "hrx", "lean-vulkan": "lean-vulkan",
            "lean-rocm": "rocm-stable", "rocm": "rocm-stable"}

NAME_RE = re.compile(r"^llama-(?P<tag>[^-/]+)-(?:bin-)?ubuntu-(?:(?P<kind>.+?)-)?x64\.(?P<ext>tar\.gz|tar\.xz)$")


def asset_name(variant: str, tag: str, *, rocm: str | None = None, cuda_arch: str | None = None) -> str:
    """Pure: Lemonade's asset-name template for a variant (rocm needs major.minor, cuda an sm_xx)."""
    if variant == "cpu":
        return f"llama-{tag}-bin-ubuntu-x64.tar.gz"
    if variant in ("lean-rocm", "rocm"):
        if not rocm or not re.fullmatch(r"\d+\.\d+", rocm):
            raise OnebitError(f"Lemonade archive for {variant!r} needs the ROCm version as major.minor, got {rocm!r}")
        return f"llama-{tag}-bin-ubuntu-rocm-{rocm}-x64.tar.gz"
    if variant == "cuda":
        if not cuda_arch or not re.fullmatch(r"sm_\d+", cuda_arch):
            raise OnebitError(f"Lemonade archive for cuda needs the CUDA architecture as sm_xx, got {cuda_arch!r}")
        return f"llama-{tag}-ubuntu-cuda-{cuda_arch}-x64.tar.xz"
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", variant):
        raise OnebitError(f"variant id {variant!r} cannot name a Lemonade archive")
    return f"llama-{tag}-bin-ubuntu-{variant}-x64.tar.gz"


@dataclass(frozen=True)
class Parsed:
    tag: str
    recipe: str
    backend: str


def parse_name(name: str) -> Parsed:
    """Pure: an archive's file name -> (tag, Lemonade recipe, Lemonade backend)."""
    m = NAME_RE.match(name)
    if not m:
        raise OnebitError(f"{name}: not a Lemonade llama.cpp archive name (llama-<tag>-bin-ubuntu[-<backend>]-x64.tar.gz)",
                          hint="pass --recipe and --backend to install it anyway")
    kind = m["kind"] or "cpu"
    if kind.startswith("rocm-"):
        backend = "rocm-stable"
    elif kind.startswith("cuda-"):
        backend = "cuda"
    else:
        backend = BACKENDS.get(kind, kind)
    return Parsed(tag=m["tag"], recipe=RECIPE, backend=backend)


# ------------------------------------------------------------------------------------------------------- archives


def archive_files(prefix: Path, root: str, licenses: Mapping[str, Path]) -> dict[str, Path]:
    """Pure-ish: the archive's members for one backend: `<root>/bin`, `<root>/lib` and the license files."""
    base = prefix / root
    files = {rel: e.src for under in ("bin", "lib")
             for rel, e in tarball.tree_entries(base / under, under, follow_links=True).items()}
    servers = [rel for rel in files if PurePosixPath(rel).name == SERVER]
    if len(servers) != 1:
        raise OnebitError(f"{base}: a Lemonade archive needs exactly one {SERVER}, found {len(servers)}: {servers}",
                          hint="check the variant's stage.root in its recipe")
    for need in ("LICENSE", "NOTICE"):
        if need not in licenses:
            raise OnebitError(f"a Lemonade archive needs {need}; none was given")
    files.update({name: Path(src) for name, src in licenses.items()})
    return files


def make_archives(prefix: Path, out: Path, tag: str, licenses: Mapping[str, Path], *, mtime: int,
                  params: Mapping[str, Mapping[str, str]] | None = None) -> list[tuple[str, str, Path]]:
    """One archive per llama-server backend of the installed prefix's manifest. Returns (variant, backend, path)."""
    manifest = json.loads((prefix / "share/onebit/manifest.json").read_text())
    made = []
    for backend, entry in sorted(manifest.get("backends", {}).items()):
        if entry.get("adapter", "llama-server") != "llama-server" or SERVER not in entry.get("binaries", {}):
            continue
        root = entry.get("root") or str(PurePosixPath(entry["binaries"][SERVER]).parent.parent)
        variant = PurePosixPath(root).name
        extra = dict((params or {}).get(variant, {}))
        archs = extra.get("cuda_arch")
        for arch in archs if isinstance(archs, list) else [archs]:  # one asset per sm_xx a multi-arch build carries
            name = asset_name(variant, tag, rocm=extra.get("rocm"), cuda_arch=arch)
            top = name.removesuffix(".tar.gz").removesuffix(".tar.xz")
            files = archive_files(prefix, root, licenses)
            path = tarball.write(out / name, top, {rel: tarball.Entry(src=src) for rel, src in files.items()}, mtime=mtime)
            made.append((variant, backend, path))
    return made



def fragment(repo: str, tag: str, archives: Mapping[str, Path]) -> dict:
    """backend_versions.json fragment: `llamacpp.<backend>` = tag, `checksums.github.<repo>.<tag>.<asset>` = sha256:<hex>."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo or ""):
        raise OnebitError(f"release repository {repo!r} is not owner/name", hint="set it in the release configuration")
    versions, sums = {}, {}
    for path in archives.values():
        parsed = parse_name(path.name)
        versions[parsed.backend] = tag
        sums[path.name] = f"sha256:{sha256(path)}"
    return {RECIPE: dict(sorted(versions.items())), "checksums": {"github": {repo: {tag: dict(sorted(sums.items()))}}}}


def contract_problems(archive: Path) -> list[str]:
    """Everything in `archive` that breaks Lemonade's contract (empty: it holds)."""
    problems = []
    if not archive.name.endswith((".tar.gz", ".tar.xz")):
        problems.append(f"{archive.name}: Lemonade extracts .tar.gz/.tar.xz/.tar.bz2/.7z/.zip, not this")
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
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
    for need in ("LICENSE", "NOTICE"):
        if f"{top}/{need}" not in {m.name for m in members}:
            problems.append(f"{archive.name}: no {need} in the top folder")
    return problems


# -------------------------------------------------------------------------------------------------------- install


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


def expected_sha(name: str, *, fragment_path: Path | None = None, sums_path: Path | None = None) -> str | None:
    """The sha256 an archive must have, from a backend_versions.json fragment or a GNU SHA256SUMS file."""
    if fragment_path is not None:
        doc = json.loads(fragment_path.read_text())
        for repo in doc.get("checksums", {}).get("github", {}).values():
            for assets in repo.values():
                if name in assets:
                    return assets[name].removeprefix("sha256:")
        raise OnebitError(f"{fragment_path}: no checksum for {name}", hint="pass the fragment of the release it came from")
    if sums_path is not None:
        for line in sums_path.read_text().splitlines():
            digest, _, fname = line.partition("  ")
            if fname.lstrip("*") == name:
                return digest.strip()
        raise OnebitError(f"{sums_path}: no checksum for {name}", hint="pass the SHA256SUMS of the release it came from")
    return None


def _extract(archive: Path, staging: Path) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        tops = set()
        for m in members:
            why = member_problem(m.name, is_link=m.issym() or m.islnk(), is_special=not (m.isfile() or m.isdir()))
            if why:
                raise OnebitError(f"{archive.name}: member {m.name!r} {why}; nothing was installed")
            tops.add(PurePosixPath(m.name).parts[0])
        if len(tops) != 1:
            raise OnebitError(f"{archive.name}: needs one top folder, has {len(tops)}; nothing was installed")
        for m in members:
            rel = PurePosixPath(*PurePosixPath(m.name).parts[1:])
            if not rel.parts:
                continue
            dest = staging / rel
            if m.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)


def install(archive: Path, cache: Path, *, recipe: str | None = None, backend: str | None = None,
            tag: str | None = None, sha: str | None = None) -> Path:
    """Install one archive into `<cache>/bin/<recipe>/<backend>/` the way Lemonade does. Returns the install folder.

    A checksum mismatch, a bad member or an interruption leaves the previous install as it was."""
    if not archive.is_file():
        raise OnebitError(f"{archive}: no such archive")
    parsed = None
    if recipe is None or backend is None or tag is None:
        parsed = parse_name(archive.name)
    recipe, backend, tag = recipe or parsed.recipe, backend or parsed.backend, tag or parsed.tag
    if sha is not None and sha256(archive) != sha:
        raise OnebitError(f"{archive.name}: sha256 {sha256(archive)} does not match the expected {sha}; nothing was installed",
                          hint="download the archive again, or check the checksums file is from the same release")
    target = cache / "bin" / recipe / backend
    staging, old = target.with_name(target.name + ".staging"), target.with_name(target.name + ".old")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    if old.exists() and not target.exists():  # a swap was interrupted between its two renames: restore
        os.replace(old, target)
    shutil.rmtree(old, ignore_errors=True)
    staging.mkdir()
    try:
        _extract(archive, staging)
        (staging / "version.txt").write_bytes(tag.encode())
        for path in staging.rglob("*"):
            if path.is_file():
                path.chmod(0o755)
        if not any(p.name == SERVER for p in staging.rglob(SERVER) if p.is_file()):
            raise OnebitError(f"{archive.name}: no {SERVER} inside; nothing was installed")
        if target.exists():
            os.replace(target, old)
        try:
            os.replace(staging, target)
        except BaseException:
            if old.exists() and not target.exists():
                os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
