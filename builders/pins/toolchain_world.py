"""toolchain_world: what the toolchain inputs' moves are read from: the package index's JSON (at the base of the
index pip downloads from) and the Debian suites' Packages indexes, each read once per run.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..errors import OnebitError
from .toolchain_moves import Deb, index_debs

# the suites a pinned Debian package is looked for in, in this order (the first that holds the pinned pool path is its
# suite): the Vulkan SDK's point releases, then the build roots' suites (roots/*.yaml)
DEB_SUITES = ("bookworm", "trixie")

Log = Callable[[str], None]


def no_log(_: str) -> None:
    pass


def index_setting(config_list: str) -> str | None:
    """Pure: the index-url of `pip config list`'s output (`global.index-url='...'`; download's or install's else)."""
    found = {}
    for line in config_list.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip().endswith(".index-url") and not key.strip().endswith("extra-index-url"):
            found[key.strip().split(".")[0]] = value.strip().strip("'\"")
    return next((found[k] for k in ("download", "install", "global", ":env:") if found.get(k)), None)


def json_base(index: str) -> str:
    """Pure: the base of an index's JSON API from its simple index URL (`<base>/simple` -> `<base>`)."""
    url = index.split()[0].rstrip("/")
    return url[: -len("/simple")] if url.endswith("/simple") else url


def pypi_base(env: Mapping[str, str] | None = None) -> str:
    """The package index whose JSON API is asked (`<base>/pypi/<name>/json`): the index of the pip that downloads the
    wheels (builders/inputs/fetch.py runs `python -m pip`): $PIP_INDEX_URL, else pip's configured index-url, else pip's
    default; its `/simple` dropped."""
    import sys

    from ..io import runner

    env = os.environ if env is None else env
    url = (env.get("PIP_INDEX_URL") or "").strip()
    if not url:
        proc = runner.run([sys.executable, "-m", "pip", "config", "list"], timeout=120)
        url = index_setting(proc.stdout) or ""
    if not url:
        proc = runner.run([sys.executable, "-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"],
                          timeout=120)
        url = proc.stdout.strip()
        if proc.returncode != 0 or not url:
            raise OnebitError("cannot tell pip's package index", hint="set PIP_INDEX_URL")
    return json_base(url)


def read_releases(package: str, *, base: str | None = None, session=None) -> dict:
    """`releases` of the index's JSON for `package` (version -> files)."""
    from ..io.http import make_session

    url = f"{(base or pypi_base()).rstrip('/')}/pypi/{package}/json"
    try:
        resp = (session or make_session()).get(url, timeout=(15, 120))
    except Exception as exc:  # requests' errors
        raise OnebitError(f"cannot read the package index's JSON for {package}: {type(exc).__name__}") from None
    if resp.status_code != 200:
        raise OnebitError(f"the package index answered HTTP {resp.status_code} for {package}'s JSON",
                          hint="set PIP_INDEX_URL to an index that serves /pypi/<name>/json")
    try:
        data = resp.json()
    except ValueError:
        raise OnebitError(f"the package index's JSON for {package} is not JSON") from None
    rel = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(rel, dict):
        raise OnebitError(f"the package index's JSON for {package} has no releases")
    return rel


def deb_suites(root: Path) -> list[str]:
    """The suites pinned packages are looked for in: bookworm, trixie, then the build roots' (roots/*.yaml) suites."""
    from ..project.root_pins import load_roots

    out = list(DEB_SUITES)
    found, _ = load_roots(Path(root) / "roots") if (Path(root) / "roots").is_dir() else ({}, [])
    for name in sorted(found):
        for suite, _component in found[name].suites:
            if suite not in out:
                out.append(suite)
    for s in ("sid", "experimental"):
        if s not in out:
            out.append(s)
    return out


class World:
    """What the moves are read from: the package index's JSON and the Debian suites' indexes (each read once)."""

    def __init__(self, root: Path, *, archives: Sequence[str] | None = None, log: Log = no_log):
        self.root = Path(root)
        self.archives = archives
        self.log = log
        self._debs: list | None = None
        self._releases: dict[str, dict] = {}
        self._session = None
        self._base: str | None = None

    def session(self):
        if self._session is None:
            from ..io.http import make_session

            self._session = make_session()
        return self._session

    def releases(self, package: str) -> dict:
        if package not in self._releases:
            self.log(f"read {package}'s releases from the package index")
            if self._base is None:
                self._base = pypi_base()
            self._releases[package] = read_releases(package, base=self._base, session=self.session())
        return self._releases[package]

    def deb_indexes(self) -> list[tuple[str, list[Deb]]]:
        if self._debs is None:
            from ..roots import debs
            from ..roots.assemble import parse_packages, read_index

            archives = debs.mirrors() if self.archives is None else list(self.archives)
            self._debs = [(s, index_debs(parse_packages(read_index(s, "main", archives, session=self.session(),
                                                                    log=self.log))))
                          for s in deb_suites(self.root)]
        return self._debs

