"""Version order for tag names, by `packaging.version`: v7.3-rc4 < v7.3 < v7.3.1, b6999 < b7000.

A tag is a prefix (v, b, release-, llvmorg-, ...) and a version from its first digit on. That version is what
`packaging.version.Version` reads (PEP 440, which already knows alpha/beta/preview/pre/rc/c pre-releases, post and
dev releases, `-` and `.` separators and trailing zeros). What it cannot read keeps its release number and sorts
after that release's final, its suffix compared naturally (v1.0 < v1.0-foo).
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

from packaging.version import InvalidVersion, Version

_RELEASE = re.compile(r"\d+(?:\.\d+)*")
_NONE = Version("0")


def _tokens(text: str) -> tuple:
    """Natural-sort tokens: digits compare as numbers, letters as lower-case text; numbers sort after text."""
    return tuple((1, int(p), "") if p.isdigit() else (0, 0, p.lower()) for p in re.findall(r"\d+|[A-Za-z]+", text))


def version_key(tag: str) -> tuple:
    """A sort key for a tag name: (has a number, Version, suffix, tag).

    Tags with no number sort first (naturally among themselves); the tag itself breaks ties last, so v7.3 and
    v7.3.0 compare equal on everything but their spelling.
    """
    m = _RELEASE.search(tag)
    if not m:
        return (0, _NONE, (1, _tokens(tag)), tag)
    try:
        return (1, Version(tag[m.start():]), (0,), tag)
    except InvalidVersion:
        return (1, Version(m.group(0)), (1, _tokens(tag[m.end():])), tag)


def newest_tag(tags: Mapping[str, str] | Iterable[str], pattern: str) -> str | None:
    """The newest tag name whose whole name matches `pattern` (a regular expression), or None."""
    rx = re.compile(pattern)
    matching = [t for t in tags if rx.fullmatch(t)]
    return max(matching, key=version_key) if matching else None
