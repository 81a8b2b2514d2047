"""lemonade: Lemonade's contract, and its words: the llamacpp backends our variants stand in for, their config.json
settings, the asset names Lemonade asks for, and release.yaml's `lemonade:` section. The parts that act on it, each
with one job: lemonade_archives.py (the release's archives and backend_versions.json fragment), lemonade_install.py
(the offline install into Lemonade's cache), lemonade_config.py (the pins in its config.json), lemonade_onebit.py
(the rows of the engine's `onebit` backend).

What Lemonade does, read from its source (lemonade-sdk/lemonade; the commit is `lemonade.read_from` in release.yaml):

- It installs a backend into `<cache>/bin/<recipe>/<backend>/`: the archive is unpacked with `tar --strip-components`
  (1 when every member lies under one shared top folder, else 0: `compute_tarball_strip_components`), `version.txt` gets
  the tag with no newline, every file is made 0755, and the folder is swapped into place. It finds `llama-server` by a
  recursive search, so the archive carries exactly one, with its libraries reached through `$ORIGIN`.
- Its llamacpp backends on Linux x86_64 are cpu, vulkan (both downloaded from ggml-org/llama.cpp), rocm-stable (named
  with TheRock's major.minor from its own `therock.version`) and cuda (lemonade-sdk/llama.cpp; `get_install_params`).
  Checksums are looked up as `checksums.github.<repo it downloads from>.<tag>.<asset>` (`lookup_expected_asset_hash`).
- It keeps an installed backend only while `version.txt` equals the expected version: the config.json setting
  `llamacpp.<backend>_bin` when that holds a release tag (`rocm_bin` for both rocm channels; `build_bin_config_key`,
  `resolve_user_version`, the `update_required` check in system_info.cpp), else its `backend_versions.json` pin.
  Anything else is "update_required" and is replaced by its stock build whenever it is online.

So `install_all` (lemonade_install.py) records the tag it installed as that `<backend>_bin` setting, in the config.json
Lemonade reads.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OnebitError

RECIPE = "llamacpp"
SERVER = "llama-server"

# Our variant id -> the Lemonade llamacpp backend it stands in for. Only these get an archive: hrx and lean-vulkan have
# no slot in Lemonade (its validate_backend_choice refuses them); they reach Lemonade through the `onebit` backend.
VARIANT_BACKEND = {"cpu": "cpu", "vulkan": "vulkan", "lean-rocm": "rocm-stable", "rocm": "rocm-stable", "cuda": "cuda"}
# Lemonade backend -> its setting in config.json's `llamacpp` section (both rocm channels share `rocm_bin`).
BIN_KEY = {"cpu": "cpu_bin", "vulkan": "vulkan_bin", "rocm-stable": "rocm_bin", "rocm-nightly": "rocm_bin",
           "cuda": "cuda_bin"}

NAME_RE = re.compile(r"^llama-(?P<tag>[A-Za-z0-9][A-Za-z0-9._+]*)-(?:bin-)?ubuntu-(?:(?P<kind>[a-z0-9._]+(?:-[a-z0-9._]+)?)-)?"
                     r"x64\.(?:tar\.gz|tar\.xz)$")
COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
REPO_RE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def check_component(value: str, what: str) -> str:
    """A recipe or backend name must be one path component: `.`, `..`, `a/b` and empty are refused."""
    if not isinstance(value, str) or not COMPONENT_RE.fullmatch(value):
        raise OnebitError(f"{what} {value!r} is not a single folder name (letters, digits, '.', '_', '-'; not '.' or '..')",
                          hint=f"Lemonade installs into <cache>/bin/<recipe>/<backend>/: pass a plain name as {what}")
    return value


def check_tag(value: str, what: str = "the tag") -> str:
    if not isinstance(value, str) or not TAG_RE.fullmatch(value):
        raise OnebitError(f"{what} {value!r} is not a release tag (letters, digits, '.', '_', '+', '-'; one line)",
                          hint="version.txt holds the tag on one line, as Lemonade writes it")
    return value


# ------------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """release.yaml `lemonade:`: what the archive names and the fragment need to know about Lemonade."""

    repos: Mapping[str, str] = field(default_factory=dict)  # Lemonade backend -> owner/repo it downloads it from
    therock: str | None = None  # TheRock major.minor of Lemonade's backend_versions.json: names the rocm archive
    cuda_arch: tuple[str, ...] = ()  # one cuda archive per sm_xx
    read_from: str | None = None  # where the above was read: lemonade-sdk/lemonade@<commit>

    def repo(self, backend: str) -> str:
        repo = self.repos.get(backend)
        if not repo:
            raise OnebitError(f"no download repository for Lemonade's {backend} backend",
                              where="release.yaml: lemonade.download_repo",
                              hint="name the repository Lemonade downloads it from, or set ONEBIT_LEMONADE_REPO")
        return repo


def settings(doc: Any = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read the `lemonade:` section of release.yaml (a yamlio Document, or None); $ONEBIT_LEMONADE_REPO names one
    download repository for every backend. Bad values are one error naming release.yaml:line."""
    env = os.environ if env is None else env
    data = (doc.data or {}) if doc is not None else {}
    section = data.get("lemonade") if isinstance(data, dict) else None
    section = section or {}

    def bad(key: tuple, what: str) -> OnebitError:
        where = doc.where(("lemonade", *key)) if doc is not None else "lemonade." + ".".join(map(str, key))
        return OnebitError(what, where=where)

    if not isinstance(section, dict):
        raise bad((), "must be a mapping (download_repo, therock, cuda_arch, read_from)")
    unknown = sorted(set(map(str, section)) - {"download_repo", "therock", "cuda_arch", "read_from"})
    if unknown:
        raise bad((unknown[0],), f"unknown key {unknown[0]!r} (download_repo, therock, cuda_arch, read_from)")
    raw = section.get("download_repo") or {}
    if isinstance(raw, str):
        raw = {b: raw for b in sorted(set(VARIANT_BACKEND.values()))}
    if not isinstance(raw, dict):
        raise bad(("download_repo",), "must be owner/name or a mapping backend -> owner/name")
    repos = {}
    for backend, repo in raw.items():
        if backend not in BIN_KEY:
            raise bad(("download_repo", backend), f"Lemonade has no llamacpp backend {backend!r} ({', '.join(BIN_KEY)})")
        if not isinstance(repo, str) or not REPO_RE.fullmatch(repo):
            raise bad(("download_repo", backend), f"{repo!r} is not owner/name")
        repos[backend] = repo
    if env.get("ONEBIT_LEMONADE_REPO"):
        one = env["ONEBIT_LEMONADE_REPO"]
        if not REPO_RE.fullmatch(one):
            raise OnebitError(f"ONEBIT_LEMONADE_REPO={one!r} is not owner/name")
        repos = {b: one for b in sorted(set(VARIANT_BACKEND.values()) | set(repos))}
    therock = section.get("therock")
    if therock is not None and (not isinstance(therock, str) or not re.fullmatch(r"\d+\.\d+", therock)):
        raise bad(("therock",), f"{therock!r} is not major.minor in quotes (TheRock's version as Lemonade cuts it, e.g. '7.14')")
    archs = section.get("cuda_arch") or []
    archs = [archs] if isinstance(archs, str) else archs
    if not isinstance(archs, list) or not all(isinstance(a, str) and re.fullmatch(r"sm_\d+", a) for a in archs):
        raise bad(("cuda_arch",), f"{archs!r} is not a list of sm_xx")
    read_from = section.get("read_from")
    return Settings(repos=repos, therock=therock, cuda_arch=tuple(archs),
                    read_from=str(read_from) if read_from is not None else None)


# ---------------------------------------------------------------------------------------------------------- names


def asset_name(backend: str, tag: str, *, therock: str | None = None, cuda_arch: str | None = None) -> str:
    """Pure: Lemonade's asset name for one of its llamacpp backends on Linux x86_64 (get_install_params)."""
    if backend == "cpu":
        return f"llama-{tag}-bin-ubuntu-x64.tar.gz"
    if backend == "vulkan":
        return f"llama-{tag}-bin-ubuntu-vulkan-x64.tar.gz"
    if backend == "rocm-stable":
        if not therock or not re.fullmatch(r"\d+\.\d+", therock):
            raise OnebitError(f"Lemonade's rocm archive is named with its TheRock major.minor, got {therock!r}",
                              where="release.yaml: lemonade.therock",
                              hint="copy therock.version from Lemonade's backend_versions.json, cut to major.minor")
        return f"llama-{tag}-bin-ubuntu-rocm-{therock}-x64.tar.gz"
    if backend == "cuda":
        if not cuda_arch or not re.fullmatch(r"sm_\d+", cuda_arch):
            raise OnebitError(f"Lemonade's cuda archive is named with the CUDA architecture as sm_xx, got {cuda_arch!r}",
                              where="release.yaml: lemonade.cuda_arch")
        return f"llama-{tag}-ubuntu-cuda-{cuda_arch}-x64.tar.xz"
    raise OnebitError(f"Lemonade has no llamacpp backend {backend!r} on Linux x86_64 (cpu, vulkan, rocm-stable, cuda)")


@dataclass(frozen=True)
class Parsed:
    tag: str
    recipe: str
    backend: str


def parse_name(name: str) -> Parsed:
    """Pure: an archive's file name -> (tag, Lemonade recipe, Lemonade backend); only names Lemonade itself asks for."""
    m = NAME_RE.match(name)
    kind = (m["kind"] or "") if m else None
    backend, kw = None, {}
    if kind == "":
        backend = "cpu"
    elif kind == "vulkan":
        backend = "vulkan"
    elif kind is not None and kind.startswith("rocm-"):
        backend, kw = "rocm-stable", {"therock": kind.removeprefix("rocm-")}
    elif kind is not None and kind.startswith("cuda-"):
        backend, kw = "cuda", {"cuda_arch": kind.removeprefix("cuda-")}
    try:
        if backend is None or asset_name(backend, m["tag"], **kw) != name:
            raise OnebitError("no match")
    except OnebitError:
        raise OnebitError(f"{name}: not the name of a Lemonade llama.cpp archive (llama-<tag>-bin-ubuntu[-vulkan|"
                          "-rocm-<major.minor>]-x64.tar.gz, llama-<tag>-ubuntu-cuda-sm_<nn>-x64.tar.xz)",
                          hint="pass --recipe, --backend and --tag to install it anyway") from None
    return Parsed(tag=m["tag"], recipe=RECIPE, backend=backend)

