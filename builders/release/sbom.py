"""A CycloneDX SBOM (cyclonedx-python-lib): every upstream pin with its commit and license, our patches as pedigree,
the vendored Python wheels, the toolchain inputs fetched as wheels, the tool versions each build job reported
(toolchain.json), and every redistributable a bundle ships from a toolchain (cudart, cuBLAS, cuBLASLt: what each
subtree's share/onebit/redistributables.json names, with its license text and each shipped file's sha256). Same
inputs, same bytes (serial and timestamp derived)."""
from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cyclonedx.model import AttachedText, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import (
    Commit,
    Component,
    ComponentType,
    Diff,
    Patch,
    PatchClassification,
    Pedigree,
)
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.spdx import is_supported_id
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from ..errors import OnebitError
from ..inputs.toolchain import REDISTRIBUTABLES
from .changes import file_sha256

SUBTREES = "libexec/onebit/*"  # a bundle's per-backend subtrees, each with its own redistributables.json


def _norm(name: str) -> str:
    """Pure: a Python distribution's normalized name (PEP 503), as its purl carries it."""
    return str(canonicalize_name(name))


@dataclass(frozen=True)
class PinInfo:
    name: str
    url: str
    commit: str
    license: str | None


def pin_purl(pin: PinInfo) -> PackageURL:
    """Pure: pkg:github/<owner>/<repo>@<commit> for GitHub upstreams, else pkg:generic/<name>@<commit>?vcs_url=..."""
    m = re.match(r"^(?:https://|git@)github\.com[/:](?P<owner>[^/]+)/(?P<repo>[^/]+?)(?:\.git)?/?$", pin.url)
    if m:
        return PackageURL(type="github", namespace=m["owner"], name=m["repo"], version=pin.commit)
    return PackageURL(type="generic", name=pin.name, version=pin.commit, qualifiers={"vcs_url": f"git+{pin.url}@{pin.commit}"})


def wheel_component(path: Path) -> Component:
    try:
        name, ver, _, _ = parse_wheel_filename(path.name)
        norm, version = str(name), str(ver)
    except InvalidWheelFilename:
        norm, version = re.sub(r"[-_.]+", "-", path.stem).lower(), None
    return Component(name=norm, version=version, type=ComponentType.LIBRARY, bom_ref=f"wheel:{path.name}",
                     purl=PackageURL(type="pypi", name=norm, version=version),
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=file_sha256(path))],
                     properties=[Property(name="onebit:vendored-wheel", value=path.name)])


def dist_component(name: str, version: str) -> Component:
    """A vendored Python distribution found installed in the bundle (its *.dist-info)."""
    norm = re.sub(r"[-_.]+", "-", name).lower()
    return Component(name=norm, version=version, type=ComponentType.LIBRARY, bom_ref=f"pypi:{norm}@{version}",
                     purl=PackageURL(type="pypi", name=norm, version=version),
                     properties=[Property(name="onebit:vendored", value="python")])


def pin_component(pin: PinInfo, patches: Sequence[Path]) -> Component:
    pedigree = None
    if patches:
        pedigree = Pedigree(
            commits=[Commit(uid=pin.commit, url=XsUri(pin.url))],
            patches=[Patch(type=PatchClassification.UNOFFICIAL,
                           diff=Diff(text=AttachedText(content=p.read_text(errors="replace"), content_type="text/x-diff")))
                     for p in patches],
            notes="patched by the 1bit engine: " + ", ".join(p.name for p in patches))
    return Component(name=pin.name, version=pin.commit, type=ComponentType.LIBRARY, bom_ref=f"pin:{pin.name}",
                     purl=pin_purl(pin), licenses=[LicenseExpression(pin.license)] if pin.license else None,
                     pedigree=pedigree,
                     properties=[Property(name="onebit:source-url", value=pin.url)])


def input_component(spec: Mapping[str, str]) -> Component:
    """A toolchain input fetched as a wheel by name, version and sha256 (NVIDIA's CUDA wheels), or as a Debian package
    by its file (the Vulkan SDK's, the floor's sysroot: `name_version_arch.deb`, toolchain.json names the file)."""
    deb = re.fullmatch(r"([^_/]+)_([^_/]+)_([^_/]+)\.deb", spec["package"]) if "version" not in spec else None
    if deb:
        name, version, arch = deb.groups()
        version = version.replace("%3a", ":")
        return Component(name=name, version=version, type=ComponentType.LIBRARY, bom_ref=f"input:deb:{name}@{version}",
                         purl=PackageURL(type="deb", namespace="debian", name=name, version=version,
                                         qualifiers={"arch": arch}),
                         hashes=[HashType(alg=HashAlgorithm.SHA_256, content=spec["sha256"])],
                         properties=[Property(name="onebit:toolchain-input", value=spec.get("tool", ""))])
    norm = re.sub(r"[-_.]+", "-", spec["package"]).lower()
    return Component(name=norm, version=spec["version"], type=ComponentType.LIBRARY,
                     bom_ref=f"input:{norm}@{spec['version']}", purl=PackageURL(type="pypi", name=norm, version=spec["version"]),
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=spec["sha256"])],
                     properties=[Property(name="onebit:toolchain-input", value=spec.get("tool", ""))])


@dataclass(frozen=True)
class Redistributable:
    """One entry of a subtree's redistributables.json, as shipped: the wheel it came from (package, version, sha256;
    version None for an override toolkit's, which records neither), its license with the text of its license files,
    and each shipped file (path in the installed prefix, sha256)."""
    package: str
    version: str | None
    wheel_sha256: str | None
    license: str
    license_text: str
    files: tuple[tuple[str, str], ...]
    toolkit: str | None = None  # "override": from a toolkit of the builder's own (CUDA_HOME), not a pinned wheel

    @property
    def name(self) -> str:
        return _norm(self.package)

    @property
    def key(self) -> tuple:
        return self.name, self.version, self.wheel_sha256, self.toolkit


def read_redistributables(prefix: Path) -> list[Redistributable]:
    """Every redistributable an installed bundle ships: each `libexec/onebit/*/share/onebit/redistributables.json`,
    checked against the files beside it (each license file there, each shipped file there with the recorded
    sha256), so the SBOM names what the bundle holds."""
    out = []
    for doc_path in sorted(Path(prefix).glob(f"{SUBTREES}/{REDISTRIBUTABLES}")):
        base = doc_path.parents[2]
        sub = base.relative_to(prefix).as_posix()
        try:
            doc = json.loads(doc_path.read_text())
            entries = doc["redistributables"]
            if not isinstance(entries, list):
                raise TypeError
        except json.JSONDecodeError as exc:
            raise OnebitError(f"not JSON: {exc.msg}", where=f"{doc_path}:{exc.lineno}") from None
        except (KeyError, TypeError):
            raise OnebitError("has no `redistributables` list", where=str(doc_path)) from None
        for i, e in enumerate(entries):
            where = f"{doc_path}: redistributables[{i}]"
            try:
                package, license_, license_files, files = e["package"], e["license"], e["license_files"], e["files"]
            except (KeyError, TypeError) as exc:
                raise OnebitError(f"has no {exc}", where=where) from None
            texts = []
            for rel in license_files:
                if not (base / rel).is_file():
                    raise OnebitError(f"{package}: its license file {sub}/{rel} is not in the bundle", where=where,
                                      hint="a redistributable ships only with its license: build the variant again")
                texts.append((rel, (base / rel).read_text(errors="replace")))
            shipped = []
            for rel, sha in sorted(files.items()):
                if not (base / rel).is_file() or file_sha256(base / rel) != sha:
                    raise OnebitError(f"{package}: {sub}/{rel} is {'not the file it records' if (base / rel).is_file() else 'missing'}",
                                      where=where, hint="the bundle changed after it was built: build it again")
                shipped.append((f"{sub}/{rel}", sha))
            text = texts[0][1] if len(texts) == 1 else "".join(f"==> {rel} <==\n{t}\n" for rel, t in texts)
            out.append(Redistributable(package=package, version=e.get("version"), wheel_sha256=e.get("wheel_sha256"),
                                       license=license_, license_text=text, files=tuple(shipped),
                                       toolkit=e.get("toolkit")))
    return out


def redistributable_component(items: Sequence[Redistributable], tools: Sequence[str] = ()) -> Component:
    """One redistributable, however many bundles ship it: pkg:pypi/<package>@<version> with the wheel's sha256, its
    license with the text, one `onebit:file:<path>` property (the file's sha256) per shipped file; `tools`: the
    toolchains it is also an input of. An override toolkit's is named without version or hash, and says so."""
    r = items[0]
    override = r.version is None
    if is_supported_id(r.license):
        lic = DisjunctiveLicense(id=r.license, text=AttachedText(content=r.license_text, content_type="text/plain"))
    else:
        lic = DisjunctiveLicense(name=r.license, text=AttachedText(content=r.license_text, content_type="text/plain"))
    props = [Property(name="onebit:redistributable", value="override toolkit" if override else "pinned wheel")]
    props += [Property(name="onebit:toolchain-input", value=t) for t in sorted(set(tools))]
    props += [Property(name=f"onebit:file:{path}", value=sha) for path, sha in sorted({f for i in items for f in i.files})]
    if override:
        props.append(Property(name="onebit:toolkit", value=r.toolkit or "override"))
        return Component(name=r.name, type=ComponentType.LIBRARY, bom_ref=f"redist:{r.name}@override",
                         description="shipped from an override toolkit (CUDA_HOME), not a pinned wheel: its version "
                                     "and the sha256 of what it came from are not recorded", licenses=[lic],
                         properties=props)
    return Component(name=r.name, version=r.version, type=ComponentType.LIBRARY, bom_ref=f"redist:{r.name}@{r.version}",
                     purl=PackageURL(type="pypi", name=r.name, version=r.version),
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=r.wheel_sha256)] if r.wheel_sha256 else None,
                     licenses=[lic], properties=props)


def make_sbom(*, tag: str, version: str, pins: Sequence[PinInfo], patches: Mapping[str, Sequence[Path]],
              wheels: Sequence[Path], toolchain: Mapping[str, str] | Iterable[tuple[str, str | None]],
              timestamp: dt.datetime, inputs: Iterable[Mapping[str, str] | tuple] = (),
              redistributables: Iterable[Redistributable] = ()) -> str:
    """The SBOM as CycloneDX 1.6 JSON. `patches` maps a pin name to its patch files; `toolchain` holds (tool,
    version) pairs as the build jobs reported them (one tool may appear at two versions: two runners);
    `redistributables` what the bundles ship from toolchains (read_redistributables), one component per wheel (a
    toolchain input that is also shipped is that one component)."""
    pairs = sorted(set(toolchain.items() if isinstance(toolchain, Mapping) else toolchain), key=lambda p: (p[0], p[1] or ""))
    tools = [Component(name=name, version=ver, type=ComponentType.APPLICATION,
                       bom_ref=f"tool:{name}" + (f"@{ver}" if sum(1 for n, _ in pairs if n == name) > 1 else ""))
             for name, ver in pairs]
    meta = BomMetaData(
        component=Component(name="1bit-engine", version=version, type=ComponentType.APPLICATION, bom_ref="1bit-engine",
                            licenses=[LicenseExpression("Apache-2.0")], properties=[Property(name="onebit:tag", value=tag)]),
        tools=ToolRepository(components=tools), timestamp=timestamp)
    components = [pin_component(p, [Path(x) for x in patches.get(p.name, ())]) for p in sorted(pins, key=lambda p: p.name)]
    dists = sorted({w for w in wheels if isinstance(w, tuple)})
    files = sorted((Path(w) for w in wheels if not isinstance(w, tuple)), key=lambda w: w.name)
    components += [wheel_component(w) for w in files]
    specs = {dict(i)["package"]: dict(i) for i in inputs}
    shipped: dict[tuple, list[Redistributable]] = {}
    for r in redistributables:
        shipped.setdefault(r.key, []).append(r)
    folded = set()
    for key in sorted(shipped, key=lambda k: tuple(x or "" for x in k)):
        items = shipped[key]
        same = [s for s in specs.values() if (_norm(s["package"]), s.get("version"), s["sha256"]) == key[:3]]
        folded.update(s["package"] for s in same)
        components.append(redistributable_component(items, [s.get("tool", "") for s in same]))
    components += [input_component(specs[k]) for k in sorted(specs) if k not in folded]
    seen = {(c.name, c.version) for c in components}
    components += [dist_component(n, v) for n, v in dists if (re.sub(r"[-_.]+", "-", n).lower(), v) not in seen]
    bom = Bom(components=components, metadata=meta, serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"1bit-engine/{tag}"))
    bom.register_dependency(meta.component, components)
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"
