"""lemonade_archives: the release's Lemonade archives (one per llama.cpp backend Lemonade has a slot for, from an
installed prefix), their backend_versions.json fragment, and the check that an archive keeps Lemonade's contract
(lemonade.py).

An archive holds the variant's `bin/` and `lib/`, the release's LICENSE, NOTICE and upstream licenses, and what the
subtree ships from a toolchain with its license text (`share/licenses/<package>/`, `share/onebit/redistributables.json`:
the cuda archive's cudart, cuBLAS and cuBLASLt under NVIDIA's EULA); one that would lack a named file is refused.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath

from ..errors import OnebitError
from ..inputs.toolchain import REDISTRIBUTABLES
from ..io import archives, tarball
from ..project.config import file_sha256 as sha256
from .lemonade import RECIPE, SERVER, VARIANT_BACKEND, Settings, asset_name, parse_name

LICENSES = "share/licenses"  # in a variant's subtree: the license text of what it ships from a toolchain


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

