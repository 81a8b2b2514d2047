"""passthrough: the host's environment-only settings that cross into a root, and nothing else: pip's environment
(PIP_*) and configuration files, the CA bundle variables, the proxy variables, the Debian mirror (no ONEBIT_CACHE, no
PATH, no VIRTUAL_ENV: nothing of the product). A host file such a setting names is copied in at the same path; a
folder is bound read-only at the same path unless the root has its own (`nox -s fresh` names each on the console)."""
from __future__ import annotations

import configparser
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import debs

# the host's environment-only settings, by kind: exact names, and prefixes
CA_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
PROXY_VARS = tuple(n for v in ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy") for n in (v, v.upper()))
MIRROR_VARS = (debs.MIRROR_ENV,)
PIP_PREFIX = "PIP_"
# pip settings whose values may name host paths (a CA bundle, a wheel folder, a file: index)
PIP_PATH_KEYS = ("cert", "client-cert", "find-links", "index-url", "extra-index-url")


def passed_env(env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the host's environment-only variables that cross into the root (pip's, CA bundles, proxies, the Debian
    mirror), and nothing else (no ONEBIT_CACHE, no PATH, no VIRTUAL_ENV: nothing of the product)."""
    names = set(CA_VARS) | set(PROXY_VARS) | set(MIRROR_VARS)
    return {k: v for k, v in sorted(env.items()) if v and (k in names or k.startswith(PIP_PREFIX))}


def setting_kinds(env: Mapping[str, str]) -> dict[str, list[str]]:
    """Pure: the names of the passed variables, by kind (what the console says)."""
    out: dict[str, list[str]] = {"pip": [], "CA bundle": [], "proxy": [], "Debian mirror": []}
    for k in passed_env(env):
        kind = ("pip" if k.startswith(PIP_PREFIX) else "CA bundle" if k in CA_VARS else "proxy" if k in PROXY_VARS
                else "Debian mirror")
        out[kind].append(k)
    return out


def named_paths(values: Sequence[str]) -> list[str]:
    """Pure: the absolute host paths that settings' values name (whitespace-separated lists, file: URLs). A local
    package index (a PEP 503 `simple/` folder) links to its files relative to itself (`../files/...`), so its parent
    folder is named instead."""
    out: list[str] = []
    for value in values:
        for word in value.split():
            path = word[len("file://"):] if word.startswith("file://") else word[len("file:"):] \
                if word.startswith("file:") else word
            path = path.rstrip("/") or "/"
            if path.endswith("/simple"):
                path = path.rsplit("/", 1)[0] or "/"
            if path.startswith("/") and path not in out:
                out.append(path)
    return out


def pip_config_files(env: Mapping[str, str], home: str) -> list[tuple[str, str]]:
    """Pure: (host path, path in the root) of every file pip would read its configuration from, global and user
    (pip's own order); a user's file lands under the root's /root."""
    xdg = env.get("XDG_CONFIG_HOME") or f"{home}/.config"
    out = [("/etc/xdg/pip/pip.conf", "/etc/xdg/pip/pip.conf"), ("/etc/pip.conf", "/etc/pip.conf"),
           (f"{home}/.pip/pip.conf", "/root/.pip/pip.conf"), (f"{xdg}/pip/pip.conf", "/root/.config/pip/pip.conf")]
    if env.get("PIP_CONFIG_FILE") and env["PIP_CONFIG_FILE"] != os.devnull:
        out.append((env["PIP_CONFIG_FILE"], env["PIP_CONFIG_FILE"]))
    return out


def pip_config_values(text: str) -> list[str]:
    """Pure: the values of a pip configuration file's settings that may name host paths."""
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string(text)
    except configparser.Error:
        return []
    return [cp[s][k] for s in cp.sections() for k in PIP_PATH_KEYS if k in cp[s]]


@dataclass(frozen=True)
class Carry:
    copy: tuple[tuple[str, str], ...] = ()  # (host file, path in the root)
    bind: tuple[str, ...] = ()  # host folders bound read-only at the same path
    own: tuple[str, ...] = ()  # named folders the root has itself: the root's are used
    missing: tuple[str, ...] = ()  # named paths the host does not have


def carry(paths: Sequence[str], *, is_file: Callable[[str], bool], is_dir: Callable[[str], bool],
          in_root: Callable[[str], bool], configs: Sequence[tuple[str, str]] = ()) -> Carry:
    """Pure given the predicates: how each host path a setting names reaches the root. A file is copied (a CA bundle:
    the root's apt may rewrite its own, so it is no mount); a folder is bound read-only unless the root has one."""
    copy, bind, own, missing = [(h, r) for h, r in configs if is_file(h)], [], [], []
    for p in paths:
        if is_file(p):
            copy.append((p, p))
        elif is_dir(p):
            (own if in_root(p) else bind).append(p)
        else:
            missing.append(p)
    return Carry(tuple(dict.fromkeys(copy)), tuple(bind), tuple(own), tuple(missing))


def carry_into(root: Path, env: Mapping[str, str], host_env: Mapping[str, str], home: str) -> Carry:
    """How the host paths the passed settings (`env`) and pip's configuration files (read from the host's environment
    and home) name reach the root, with the files copied in; the folders are for the caller to bind."""
    configs = pip_config_files(host_env, home)
    values = list(env.values()) + [v for h, _ in configs if os.path.isfile(h)
                                   for v in pip_config_values(Path(h).read_text(errors="replace"))]
    c = carry(named_paths(values), is_file=os.path.isfile, is_dir=os.path.isdir,
              in_root=lambda p: (root / p.lstrip("/")).is_dir(), configs=configs)
    for host, inside in c.copy:
        target = root / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(host, target)
    return c
