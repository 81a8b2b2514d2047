"""The bundle manifest (share/onebit/manifest.json): the only contract between the build side and `1bit serve`."""
from __future__ import annotations

import json
from typing import Mapping, Sequence

import jsonschema

from ..errors import StageError
from ..project.schemas import schema

MANIFEST_PATH = "share/onebit/manifest.json"


def make_manifest(bundle: str, version: str, build_number: int, platform: str,
                  entries: Sequence[tuple[str, Mapping]]) -> dict:
    """Pure: (backend name, entry) pairs -> the manifest document. Two variants claiming one backend is an error."""
    backends: dict[str, dict] = {}
    for backend, entry in entries:
        if backend in backends:
            raise StageError(f"two variants provide backend {backend!r} in bundle {bundle!r}",
                             hint="give one of them another provides.backend")
        backends[backend] = {k: v for k, v in entry.items() if v is not None}
    doc = {
        "schema_version": 1,
        "bundle": bundle,
        "version": version,
        "build_number": build_number,
        "platform": platform,
        "backends": backends,
    }
    validate_manifest(doc)
    return doc


def validate_manifest(doc: dict) -> None:
    errors = sorted(jsonschema.Draft202012Validator(schema("manifest")).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
        raise StageError("manifest does not match schemas/manifest.schema.json:\n    " + "\n    ".join(lines))


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
