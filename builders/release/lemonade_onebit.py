"""lemonade_onebit: the rows of the engine's `onebit` backend in the release's backend_versions.json fragment, derived
from what the release's bundles can serve (docs/lemonade.md).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onebit.devices import DEVICE_FLAG, capabilities
from onebit.devices import backend_for as _backend_for
from onebit.manifest import Backend, Manifest, default_adapter

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
