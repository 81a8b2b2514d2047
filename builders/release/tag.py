"""The release tag `v<ISO year>.<ISO week>` (`date +%G.%V`), respins `.1`, `.2`, resuming a draft, and the bundle version
it implies. Pure functions."""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable

from ..errors import OnebitError
from ..project.version import week_version

TAG_RE = re.compile(r"^v(?P<year>\d{4})\.(?P<week>\d{2})(?:\.(?P<respin>[1-9]\d*))?$")


def week_tag(day: dt.date) -> str:
    """`v` + `date +%G.%V`: the ISO year (which early January may give to the previous year) and zero-padded week."""
    return "v" + week_version(day)


def next_tag(day: dt.date, existing: Iterable[str]) -> str:
    """This week's tag, or its next respin when the tag (or a respin) already exists in the release store."""
    base = week_tag(day)
    taken = set(existing)
    if base not in taken:
        return base
    respins = [int(m["respin"]) for t in taken if (m := TAG_RE.match(t)) and m["respin"] and t.startswith(base + ".")]
    return f"{base}.{max(respins, default=0) + 1}"


def release_tag(day: dt.date, published: Iterable[str], drafts: Iterable[str] = ()) -> str:
    """This run's tag, from the release store.

    A published release's tag is taken: the run gets the next respin. An unpublished draft of this week whose tag is
    newer than every published tag of the week is this week's interrupted run: its tag is reused, so a re-run resumes
    that draft instead of starting a respin. A draft older than a published tag is stale and counts as taken; drafts of
    other weeks and other names are ignored."""
    base = week_tag(day)
    published, drafts = list(published), list(drafts)

    def this_week(tags: list[str]) -> list[str]:
        return [t for t in tags if t == base or (t.startswith(base + ".") and TAG_RE.match(t))]

    newest = max(this_week(published), key=parse, default=None)
    open_drafts = [t for t in this_week(drafts) if newest is None or parse(t) > parse(newest)]
    if open_drafts:
        return max(open_drafts, key=parse)
    return next_tag(day, [*published, *drafts])


def parse(tag: str) -> tuple[int, int, int]:
    m = TAG_RE.match(tag)
    if not m:
        raise OnebitError(f"release tag {tag!r} is not v<ISO year>.<ISO week>[.<respin>]",
                          hint="use a tag such as v2026.48 or v2026.48.1")
    year, week = int(m["year"]), int(m["week"])
    weeks = dt.date(year, 12, 28).isocalendar()[1]  # 28 December is always in the year's last ISO week
    if not 1 <= week <= weeks:
        raise OnebitError(f"release tag {tag!r}: ISO year {year} has weeks 01..{weeks:02d}")
    return year, week, int(m["respin"] or 0)


def version(tag: str) -> str:
    """The bundle version: the tag without `v` and without the respin (v2026.48.2 -> 2026.48)."""
    year, week, _ = parse(tag)
    return f"{year}.{week:02d}"


def build_number(tag: str) -> int:
    """The respin count: v2026.48 -> 0, v2026.48.2 -> 2 (a respin sorts above the first build in conda)."""
    return parse(tag)[2]
