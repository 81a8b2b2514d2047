"""Natural version order for tag names, without `packaging`: v7.3-rc4 < v7.3 < v7.3.1 < b7000 style tags."""
from __future__ import annotations

import re
from typing import Iterable, Mapping

_RELEASE = re.compile(r"(?P<num>\d+(?:\.\d+)*)")
_PRE = re.compile(r"^[-._]?(?P<kind>alpha|beta|preview|pre|rc|a|b|c)[-._]?(?P<n>\d*)$", re.I)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "pre": 2, "preview": 2, "c": 3, "rc": 3}


def _tokens(text: str) -> tuple:
    """Natural-sort tokens: digits compare as numbers, letters as lower-case text; numbers sort after text."""
    out = []
    for part in re.findall(r"\d+|[A-Za-z]+", text):
        out.append((1, int(part), "") if part.isdigit() else (0, 0, part.lower()))
    return tuple(out)


def version_key(tag: str) -> tuple:
    """A sort key for a tag name.

    The first run of dotted numbers is the release (trailing zeros ignored, so v7.3 == v7.3.0); what follows
    decides the rest: a pre-release marker (alpha/beta/pre/rc with an optional number) sorts before the final,
    the final sorts before any other suffix (v1.0-post1, v1.0-1). Tags with no number sort first.
    """
    m = _RELEASE.search(tag)
    if not m:
        return ((), -1, _tokens(tag), tag)
    release = [int(x) for x in m.group("num").split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    rest = tag[m.end():]
    if not rest:
        phase = (1, 0, 0, ())
    else:
        pre = _PRE.match(rest)
        if pre:
            phase = (0, _PRE_RANK[pre.group("kind").lower()], int(pre.group("n") or 0), ())
        else:
            phase = (2, 0, 0, _tokens(rest))
    return (tuple(release), phase[0], phase[1:], tag)


def newest_tag(tags: Mapping[str, str] | Iterable[str], pattern: str) -> str | None:
    """The newest tag name whose whole name matches `pattern` (a regular expression), or None."""
    rx = re.compile(pattern)
    matching = [t for t in tags if rx.fullmatch(t)]
    return max(matching, key=version_key) if matching else None
