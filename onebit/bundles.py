"""What each bundle holds (onebit/data/bundles.json): read once, so a refusal can name the bundle to install.

This is package data, not the installed manifest: the manifest says what THIS bundle holds, this file what every
bundle holds. tests/test_route.py checks it against bundles/*.yaml and recipes/*.yaml.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Mapping


@dataclass(frozen=True)
class BundleInfo:
    name: str
    package: str  # the conda metapackage that installs it
    backends: Mapping[str, tuple[str, tuple[str, ...]]]  # backend -> (adapter, programs)


def load() -> dict[str, BundleInfo]:
    data = json.loads(resources.files("onebit").joinpath("data/bundles.json").read_text(encoding="utf-8"))
    return {name: BundleInfo(name=name, package=b["package"],
                             backends={k: (v["adapter"], tuple(v["programs"])) for k, v in b["backends"].items()})
            for name, b in data["bundles"].items()}


BUNDLES: dict[str, BundleInfo] = load()
