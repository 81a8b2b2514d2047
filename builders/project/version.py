"""The bundle version: `<ISO year>.<ISO week>` (`date +%G.%V`), the same week the release tag `v<version>` names."""
from __future__ import annotations

import datetime as dt


def week_version(day: dt.date) -> str:
    """The ISO year (which early January may give to the previous year) and the zero-padded ISO week."""
    year, week, _ = day.isocalendar()
    return f"{year:04d}.{week:02d}"


def this_week() -> str:
    """No bundle version is written by hand: this ISO week's (UTC)."""
    return week_version(dt.datetime.now(dt.timezone.utc).date())
