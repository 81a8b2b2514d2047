"""clean: a clean Debian root, made by Debian's own tool: mmdebstrap (run as root) makes a minbase root plus python3
and ca-certificates, nothing else, from the Debian archive of the host's apt sources (`$ONEBIT_DEBIAN_MIRROR` names
another), with the host's apt options about reaching that archive (`nox -s fresh` makes its roots here)."""
from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import debs

INCLUDE = ("python3", "ca-certificates")
DEBIAN_SUITES = frozenset({"buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid", "oldoldstable",
                           "oldstable", "stable", "testing", "unstable", "experimental"})
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the PATH of a command run in the root
APT_KEYS = re.compile(r"^Acquire::(Check-Valid-Until|Check-Date|(https?|ftp)::Proxy(::[^ ]+)?|ForceIPv4|ForceIPv6) ")


def debian_mirror(env: Mapping[str, str], sources: Sequence[tuple[str, tuple[str, ...]]]) -> str | None:
    """Pure: the Debian archive to make roots from: $ONEBIT_DEBIAN_MIRROR's first, else the first archive of the host's
    apt sources that serves a Debian suite (an Ubuntu host's archive does not)."""
    given = env.get(debs.MIRROR_ENV, "").split()
    if given:
        return given[0].rstrip("/")
    debian = [(uri, suites) for uri, suites in sources
              if any(s.split("-")[0].split("/")[0] in DEBIAN_SUITES for s in suites)]
    archives = debs.debian_archives(debian)
    return archives[0] if archives else None


def apt_options(dump: str) -> list[str]:
    """Pure: the host's apt options that are about reaching its archive (`apt-config dump` lines): whether an expired
    Release file is accepted, proxies; each as an apt.conf line for mmdebstrap's --aptopt, which also keeps them in
    the root for its own apt."""
    return [line.strip() for line in dump.splitlines() if APT_KEYS.match(line.strip())]


def mmdebstrap_argv(suite: str, root: str, mirror: str, aptopts: Sequence[str]) -> list[str]:
    """Pure: Debian's own tool making the minbase root with python3 and ca-certificates (run as root)."""
    return ["mmdebstrap", "--mode=root", "--variant=minbase", f"--include={','.join(INCLUDE)}",
            *(f"--aptopt={o}" for o in aptopts), suite, root, mirror]


def host_apt_options() -> list[str]:
    """The host's apt options about reaching its archive (apt_options over `apt-config dump`; none without apt)."""
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True).stdout \
        if shutil.which("apt-config") else ""
    return apt_options(dump)


def make(suite: str, root: Path, mirror: str, aptopts: Sequence[str]) -> int:
    """Make the root with mmdebstrap (as root; its output on the console); its exit status."""
    return subprocess.run(mmdebstrap_argv(suite, str(root), mirror, aptopts)).returncode
