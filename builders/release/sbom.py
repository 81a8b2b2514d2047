"""A CycloneDX SBOM (cyclonedx-python-lib): every upstream pin with its commit and license, our patches as pedigree,
the vendored Python wheels, the toolchain inputs fetched as wheels, and the tool versions each build job reported
(toolchain.json). Same inputs, same bytes (serial and timestamp derived)."""
from __future__ import annotations

import datetime as dt
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
from cyclonedx.model.license import LicenseExpression
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from .changes import file_sha256

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
    """A toolchain input fetched as a wheel by name, version and sha256 (NVIDIA's CUDA wheels)."""
    norm = re.sub(r"[-_.]+", "-", spec["package"]).lower()
    return Component(name=norm, version=spec["version"], type=ComponentType.LIBRARY,
                     bom_ref=f"input:{norm}@{spec['version']}", purl=PackageURL(type="pypi", name=norm, version=spec["version"]),
                     hashes=[HashType(alg=HashAlgorithm.SHA_256, content=spec["sha256"])],
                     properties=[Property(name="onebit:toolchain-input", value=spec.get("tool", ""))])


def make_sbom(*, tag: str, version: str, pins: Sequence[PinInfo], patches: Mapping[str, Sequence[Path]],
              wheels: Sequence[Path], toolchain: Mapping[str, str] | Iterable[tuple[str, str | None]],
              timestamp: dt.datetime, inputs: Iterable[Mapping[str, str] | tuple] = ()) -> str:
    """The SBOM as CycloneDX 1.6 JSON. `patches` maps a pin name to its patch files; `toolchain` holds (tool,
    version) pairs as the build jobs reported them (one tool may appear at two versions: two runners)."""
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
    components += [input_component(specs[k]) for k in sorted(specs)]
    seen = {(c.name, c.version) for c in components}
    components += [dist_component(n, v) for n, v in dists if (re.sub(r"[-_.]+", "-", n).lower(), v) not in seen]
    bom = Bom(components=components, metadata=meta, serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"1bit-engine/{tag}"))
    bom.register_dependency(meta.component, components)
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"
