"""`1bit-build release`: build bundles at the week's tag and assemble the release directory.

    <out>/1bit-<tag>-linux-x86_64.tar.zst        one top folder, LICENSE, NOTICE, licenses/<pin>/...
    <out>/*.conda                                 every package of every bundle (flat: release assets have no folders)
    <out>/llama-<tag>-*ubuntu-*x64.tar.{gz,xz}     one Lemonade archive per backend Lemonade has (cpu, vulkan, rocm, cuda)
    <out>/backend_versions.json                   the Lemonade fragment (checksums under the repo Lemonade downloads from)
    <out>/sbom.cdx.json  changes.json  notes.md  SHA256SUMS (GNU, every file above, changes.json included)

The directory is assembled aside and swapped into place, so a failed release leaves the previous one whole.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..io import gitcmd
from ..errors import OnebitError
from . import changes, lemonade, lemonade_archives, lemonade_onebit, notes, sbom
from . import tag as tags
from ..ship import package
from ..io import tarball
from ..io.swap import replace_dir

LICENSE_NAMES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "COPYING", "LICENSE-MIT")
PLATFORM = "linux-x86_64"


@dataclass
class ReleaseConfig:
    repo: str
    lemonade: lemonade.Settings = field(default_factory=lemonade.Settings)
    fan_out: dict = field(default_factory=dict)  # variant or recipe -> the build option CI builds once per value


def load_config(root: Path, env: Mapping[str, str] | None = None) -> ReleaseConfig:
    """release.yaml at the project root (repo: owner/name; lemonade: see lemonade.settings; fan_out: variant ->
    option); $ONEBIT_RELEASE_REPO wins."""
    from ..project import yamlio

    env = os.environ if env is None else env
    path = root / "release.yaml"
    doc = yamlio.load(path) if path.is_file() else None
    data = doc.data if doc is not None and isinstance(doc.data, dict) else {}
    repo = env.get("ONEBIT_RELEASE_REPO") or data.get("repo")
    if not repo:
        raise OnebitError("no release repository configured", where=str(path),
                          hint="add `repo: owner/name` to release.yaml or set ONEBIT_RELEASE_REPO")
    return ReleaseConfig(repo=repo, lemonade=lemonade.settings(doc, env),
                         fan_out={str(k): str(v) for k, v in (data.get("fan_out") or {}).items()})


@dataclass
class BuiltBundle:
    """A bundle (or one flavor of it) ready to release: its installed tree (or a bundle tarball holding it), its
    .conda files, and what the builds that made it knew (toolchain.json records, gate results)."""
    name: str
    packages: list[Path]
    pins: list[str]  # pin names of the sources built
    prefix: Path | None = None  # the installed tree
    tarball: Path | None = None  # or a bundle tarball to read it from
    wheels: list[Path] = field(default_factory=list)
    records: dict[str, dict] = field(default_factory=dict)  # variant -> its build's record (toolchain.json)
    gates: dict[str, dict] = field(default_factory=dict)  # variant -> the hardware gate its job passed (gate.json)
    params: dict[str, dict] = field(default_factory=dict)  # Lemonade asset parameters this bundle fixes (a flavor's arch)
    upstream_licenses: dict[str, Path] = field(default_factory=dict)  # pin -> license file shipped in its package


def tarball_name(tag: str, bundle: str, several: bool) -> str:
    """Pure: `1bit-<tag>-linux-x86_64` for a one-bundle release; the bundle is named when a release has several."""
    return f"1bit-{bundle}-{tag}-{PLATFORM}" if several else f"1bit-{tag}-{PLATFORM}"


def upstream_license(git_dir: Path, commit: str) -> bytes | None:
    """The upstream's license file at the pinned commit, from the git cache (offline)."""
    for name in LICENSE_NAMES:
        proc = gitcmd.run(["--git-dir", str(git_dir), "show", f"{commit}:{name}"], text=False)
        if proc.returncode == 0:
            return proc.stdout
    return None


def license_files(root: Path, pins: Mapping[str, dict], used: Sequence[str], git_cache: Callable[[str], Path],
                  scratch: Path, shipped: Mapping[str, Path] | None = None) -> dict[str, Path]:
    """LICENSE and NOTICE of the project, and licenses/<pin>/LICENSE for every upstream built: the file its package
    already carries (info/licenses/), else the one at the pinned commit in the git cache."""
    files = {"LICENSE": root / "LICENSE", "NOTICE": root / "NOTICE"}
    for need in ("LICENSE", "NOTICE"):
        if not files[need].is_file():
            raise OnebitError(f"the project has no {need} file", where=str(root), hint="a release ships both")
    for name in sorted(set(used)):
        if (shipped or {}).get(name):
            files[f"licenses/{name}/LICENSE"] = Path(shipped[name])
            continue
        commit = (pins.get(name) or {}).get("commit")
        text = upstream_license(git_cache(commit), commit) if commit else None
        if text is None:
            raise OnebitError(f"pin {name}: no license file ({', '.join(LICENSE_NAMES)}) at {commit}",
                              hint="its license must ship with the release; fetch the pin again or add one by patch")
        path = scratch / "licenses" / name / "LICENSE"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
        files[f"licenses/{name}/LICENSE"] = path
    return files


def _place(src: Path, dest_dir: Path) -> Path:
    """Copy into the release dir; the same name twice must be the same bytes (cpu is in several bundles)."""
    dest = dest_dir / src.name
    if dest.exists():
        if dest.read_bytes() != src.read_bytes():
            raise OnebitError(f"two bundles produced {src.name} with different bytes", hint="build them from one commit")
        return dest
    shutil.copyfile(src, dest)
    return dest


def assemble(*, root: Path, out: Path, tag: str, previous_tag: str | None, date: dt.date, config: ReleaseConfig,
             built: Sequence[BuiltBundle], git_cache: Callable[[str], Path], mtime: int,
             bumps: Sequence[changes.BumpResult] = ()) -> list[Path]:
    """Write the release directory for already built bundles. Returns the files, SHA256SUMS last."""
    pins = changes.pins_at(root, None)
    used = sorted({p for b in built for p in b.pins})
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".release-", dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        rel = tmp / "release"
        rel.mkdir()
        dists: set[tuple[str, str]] = set()
        pins_used: set[str] = set()
        prefixes = {}
        for b in built:  # what each bundle holds: its manifest's pins, its vendored Python distributions
            prefixes[b.name] = b.prefix if b.prefix is not None else tarball.extract_tree(b.tarball, tmp / "prefix" / b.name)
            dists.update(installed_dists(prefixes[b.name]))
            pins_used.update(manifest_pins(prefixes[b.name]))
        used = sorted(set(used) | (pins_used & set(pins)))
        shipped = {k: v for b in built for k, v in b.upstream_licenses.items()}
        lic = license_files(root, pins, used, git_cache, tmp / "scratch", shipped)
        backends: dict[str, Path] = {}
        onebit: dict[str, tuple] = {}  # what each bundle serves through the engine's Lemonade `onebit` backend
        for b in built:
            for pkg in b.packages:
                _place(pkg, rel)
            name = tarball_name(tag, b.name, len(built) > 1)
            entries = tarball.tree_entries(prefixes[b.name])  # the bundle's tree, links kept, plus the licenses
            entries.update({rel: tarball.Entry(src=path, executable=False) for rel, path in lic.items()})
            tarball.write(rel / f"{name}.tar.zst", name, entries, mtime=mtime)
            # a flavor of a fanned-out variant (nvidia-sm_90) names its Lemonade archive after that architecture alone
            arch = next((p["cuda_arch"] for p in (b.params or {}).values() if p.get("cuda_arch")), None)
            settings = dataclasses.replace(config.lemonade, cuda_arch=(arch,)) if arch else config.lemonade
            manifest = json.loads((prefixes[b.name] / "share/onebit/manifest.json").read_text())
            onebit[b.name] = (lemonade_onebit.onebit_manifest(manifest), settings.cuda_arch)
            for _, backend, archive in lemonade_archives.make_archives(prefixes[b.name], tmp / "lemonade" / b.name, tag, lic,
                                                                       mtime=mtime, settings=settings):
                backends[archive.name] = _place(archive, rel)
        if backends or onebit:
            frag = lemonade_archives.fragment(config.lemonade, tag, backends.values()) if backends else {}
            frag.update(lemonade_onebit.onebit_rows(onebit, tags.version(tag)))
            (rel / "backend_versions.json").write_text(json.dumps(frag, indent=2) + "\n")
        patches = {}
        for recipe in sorted((root / "recipes").glob("*.yaml")):
            data = yaml.safe_load(recipe.read_text()) or {}
            src = data.get("source") or {}
            if src.get("pin") in used and src.get("patches"):
                base = root / "recipes" / "patches" / src.get("patch_dir", data.get("name", recipe.stem))
                patches.setdefault(src["pin"], []).extend(base / p["file"] for p in src["patches"])
        records = [r for b in built for r in b.records.values()]
        redistributables = [r for b in built for r in sbom.read_redistributables(prefixes[b.name])]
        (rel / "sbom.cdx.json").write_text(sbom.make_sbom(
            tag=tag, version=tags.version(tag),
            pins=[sbom.PinInfo(n, pins[n].get("url", ""), pins[n]["commit"], pins[n].get("license"))
                  for n in used if pins[n].get("commit")],
            patches=patches, wheels=[*sorted({w for b in built for w in b.wheels}), *sorted(dists)],
            toolchain=sorted({(t, v) for r in records for t, v in r.get("tools", {}).items()}, key=str),
            inputs=sorted({tuple(sorted(i.items())) for r in records for i in r.get("inputs", [])}),
            timestamp=dt.datetime.fromtimestamp(mtime, tz=dt.UTC), redistributables=redistributables))
        prev_rev = previous_tag if previous_tag and _has_rev(root, previous_tag) else None
        doc = changes.make_changes(tag=tag, previous_tag=previous_tag, date=date.isoformat(), repo=root,
                                   prev_rev=prev_rev, rev=None if not _has_rev(root, "HEAD") else "HEAD",
                                   git_dir_for=lambda name, commit: git_cache(commit), bumps=bumps,
                                   artifacts=changes.artifact_sums(rel),
                                   builds={b.name: changes.build_entries(b.records, b.gates) for b in built})
        (rel / "changes.json").write_text(changes.dumps(doc))
        (rel / "notes.md").write_text(notes.render(doc))
        package.sha256sums(rel, rel / "SHA256SUMS")
        replace_dir(rel, out)
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    return files + [out / "SHA256SUMS"]


def installed_dists(prefix: Path) -> set[tuple[str, str]]:
    """(name, version) of every Python distribution vendored in an installed prefix (its *.dist-info/METADATA)."""
    found = set()
    for meta in prefix.rglob("*.dist-info/METADATA"):
        fields = dict(line.split(": ", 1) for line in meta.read_text(errors="replace").splitlines()[:20] if ": " in line)
        if fields.get("Name") and fields.get("Version"):
            found.add((fields["Name"], fields["Version"]))
    return found


def manifest_pins(prefix: Path) -> set[str]:
    """The pins the bundle manifest says its backends were built from."""
    path = prefix / "share/onebit/manifest.json"
    if not path.is_file():
        return set()
    doc = json.loads(path.read_text())
    return {(b.get("source") or {}).get("pin") for b in doc.get("backends", {}).values()} - {None}


def _has_rev(root: Path, rev: str) -> bool:
    return gitcmd.run(["-C", str(root), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"]).returncode == 0


def local_tags(root: Path) -> list[str]:
    proc = gitcmd.run(["-C", str(root), "tag", "-l", "v*"])
    return proc.stdout.split() if proc.returncode == 0 else []


def previous(existing: Sequence[str], current: str) -> str | None:
    """Pure: the newest release tag older than `current`."""
    def order(t):
        return tags.parse(t)
    older = [t for t in existing if tags.TAG_RE.match(t) and t != current and order(t) < order(current)]
    return max(older, key=order, default=None)
