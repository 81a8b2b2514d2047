"""Find, load and validate the installed bundle's share/onebit/manifest.json."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping

from .errors import ManifestError
from .hostlibs import HostLibrary

MANIFEST_RELPATH = Path("share") / "onebit" / "manifest.json"
MANIFEST_ENV = "ONEBIT_MANIFEST"


@dataclass(frozen=True)
class Backend:
    name: str
    binaries: Mapping[str, str]  # logical name -> path relative to the prefix
    devices: tuple[str, ...]
    features: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    version: str = ""
    commit: str = ""
    adapter: str = "llama-server"  # which launch adapter speaks this backend's command line (onebit.adapters)
    root: str | None = None  # the backend's own subtree of the prefix, if the manifest names one
    host_libraries: tuple[HostLibrary, ...] = ()  # SONAMEs its programs need from the host (the ROCm runtime)

    def binary(self, prefix: Path, name: str = "llama-server") -> Path | None:
        """The binary the manifest lists under `name`, or None. Never another one: a backend whose program is
        missing must not run whatever else it ships (the npu backend ships amdxdna.ko)."""
        rel = self.binaries.get(name)
        return (prefix / rel) if rel else None


@dataclass(frozen=True)
class Manifest:
    path: Path
    prefix: Path
    bundle: str
    version: str
    build_number: int
    platform: str
    backends: Mapping[str, Backend]
    recipes: Path | None = None  # absolute path of the bundle's serve recipes, if it names one

    def has(self, backend: str) -> bool:
        return backend in self.backends

    def host_sonames(self) -> tuple[str, ...]:
        """Every SONAME some backend needs from the host, each once."""
        return tuple(dict.fromkeys(h.soname for b in self.backends.values() for h in b.host_libraries))


# The adapter a backend uses when its manifest entry names none (manifests written before `adapter` existed).
# Only the llama.cpp builds default to llama-server: zinc, ds4 and the NPU never speak its command line.
DEFAULT_ADAPTERS = {"zinc": "zinc", "ds4": "ds4", "npu": "npu"}


def default_adapter(backend: str) -> str:
    return DEFAULT_ADAPTERS.get(backend, "llama-server")


def schema() -> dict:
    """The manifest JSON Schema shipped as package data (a symlink in the repo, a file once packaged)."""
    text = resources.files("onebit").joinpath("data/manifest.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def default_manifest_path(
    flag: str | None = None,
    env: Mapping[str, str] | None = None,
    argv0: str | None = None,
    prefix: str | None = None,
) -> Path:
    """--manifest, then $ONEBIT_MANIFEST, then <bin>/../share/onebit/manifest.json of argv[0], then sys.prefix."""
    env = os.environ if env is None else env
    if flag:
        return Path(flag)
    if env.get(MANIFEST_ENV):
        return Path(env[MANIFEST_ENV])
    argv0 = sys.argv[0] if argv0 is None else argv0
    candidates = []
    if argv0:
        candidates.append(Path(argv0).resolve().parent.parent / MANIFEST_RELPATH)
    candidates.append(Path(sys.prefix if prefix is None else prefix) / MANIFEST_RELPATH)
    for c in candidates:
        if c.is_file():
            return c
    return candidates[-1]


def load_manifest(path: str | os.PathLike) -> Manifest:
    import jsonschema

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(
            f"no bundle manifest at {path}; pass --manifest PATH or set {MANIFEST_ENV}"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"cannot read manifest {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}:{e.lineno}: manifest is not valid JSON: {e.msg}") from None

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ManifestError(f"{path}: invalid manifest at {where}: {e.message}")

    # share/onebit/manifest.json -> prefix
    prefix = path.resolve().parent.parent.parent
    backends = {}
    for name, b in data["backends"].items():
        libs = tuple(HostLibrary(h["soname"], h["provided_by"], h["set"]) for h in b.get("host_libraries", ()))
        twice = sorted({h.soname for h in libs if sum(o.soname == h.soname for o in libs) > 1})
        if twice:
            raise ManifestError(f"{path}: invalid manifest at backends/{name}/host_libraries: "
                                f"{', '.join(twice)} listed twice")
        backends[name] = Backend(
            name=name,
            binaries=dict(b["binaries"]),
            devices=tuple(b["devices"]),
            features=tuple(b.get("features", ())),
            env=dict(b.get("env", {})),
            version=b["version"],
            commit=b["source"]["commit"],
            adapter=b.get("adapter") or default_adapter(name),
            root=b.get("root"),
            host_libraries=libs,
        )
    recipes = data.get("serve", {}).get("recipes")
    return Manifest(
        path=path,
        prefix=prefix,
        bundle=data["bundle"],
        version=data["version"],
        build_number=data["build_number"],
        platform=data["platform"],
        backends=backends,
        recipes=(prefix / recipes) if recipes else None,
    )
