"""bundle: a bundle from its packages. The metapackage that pins every package exactly and carries
share/onebit/manifest.json, and the deterministic tarball of the installed tree.

Two callers, one mechanism: the build's bundle steps (steps/bundle.py) and the release's assembly from the packages CI
jobs built on different machines (release/compose.py). So a bundle assembled from parts is, byte for byte, the bundle
one machine builds (tests/test_release_compose.py holds them to that).
"""
from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from . import manifest, package
from ..io import tarball
from ..plan_types import digest

META_LICENSE = "Apache-2.0"


def pin_spec(name: str, version: str, build_string: str) -> str:
    """Pure: the exact match spec the metapackage depends on."""
    return f"{name} =={version} {build_string}"


def meta_name(bundle: str) -> str:
    return f"onebit-bundle-{bundle}"


def meta_build_string(bundle: str, depends: Iterable[str], build_number: int, flavor: str = "") -> str:
    """Pure: from what the metapackage pins (path-independent), not from a cache key (which holds work paths).
    A flavor (a bundle released once per value of a fanned-out option, e.g. nvidia per CUDA architecture) leads it."""
    base = f"h{digest('meta-build', bundle, sorted(depends))[:7]}_{build_number}"
    return f"{flavor}_{base}" if flavor else base


def tarball_name(bundle: str, version: str, build_number: int, platform: str) -> str:
    return f"onebit-{bundle}-{version}-{build_number}-{platform}.tar.zst"


def write_metapackage(*, bundle: str, version: str, build_number: int, platform: str, summary: str,
                      depends: Sequence[str], manifest_text: str, out_dir: Path, scratch: Path,
                      flavor: str = "") -> Path:
    """The metapackage `onebit-bundle-<bundle>`: no files but the manifest, every package pinned exactly."""
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / Path(manifest.MANIFEST_PATH).parent).mkdir(parents=True)
    (scratch / manifest.MANIFEST_PATH).write_text(manifest_text)
    try:
        return package.assemble(name=meta_name(bundle), version=version,
                                build_string=meta_build_string(bundle, depends, build_number, flavor),
                                build_number=build_number, files_dir=scratch, out_dir=out_dir, platform=platform,
                                license=META_LICENSE, summary=summary, depends=list(depends))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def tree_entries(trees: Iterable[Path], manifest_text: str | bytes) -> dict[str, tarball.Entry]:
    """The installed tree: every package's files (two packages never install one path: the bundle step checks),
    plus the bundle's manifest."""
    entries: dict[str, tarball.Entry] = {}
    for tree in trees:
        entries.update(tarball.tree_entries(tree))
    data = manifest_text.encode() if isinstance(manifest_text, str) else manifest_text
    entries[manifest.MANIFEST_PATH] = tarball.Entry(data=data)
    return entries


def write_tarball(out: Path, trees: Iterable[Path], manifest_text: str | bytes, *, mtime: int) -> Path:
    """`onebit-<bundle>-<version>-<n>-<platform>.tar.zst`, one top folder named like the file."""
    top = Path(out).name.removesuffix(".tar.zst")
    return tarball.write(out, top, tree_entries(trees, manifest_text), mtime=mtime)


def manifest_doc(bundle: str, version: str, build_number: int, platform: str,
                 entries: Mapping[str, Mapping]) -> dict:
    """The bundle manifest from its backends' entries (backend -> entry), validated."""
    return manifest.make_manifest(bundle, version, build_number, platform, sorted(entries.items()))
