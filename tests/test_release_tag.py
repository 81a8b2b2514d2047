"""The release tag: ISO year and week (`date +%G.%V`), respins, and the version and build number it implies."""
from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from builders.errors import OnebitError
from builders.release import tag

D = dt.date


@pytest.mark.parametrize("day, expected", [
    (D(2026, 11, 29), "v2026.48"),   # a Sunday: the release cron's day
    (D(2026, 11, 23), "v2026.48"),   # the Monday of the same ISO week
    (D(2026, 1, 1), "v2026.01"),     # a Thursday: week 01 of its own year
    (D(2027, 1, 1), "v2026.53"),     # a Friday: still the last week of ISO 2026, which has 53 weeks
    (D(2027, 1, 3), "v2026.53"),
    (D(2027, 1, 4), "v2027.01"),
    (D(2021, 1, 3), "v2020.53"),     # 2020 is a 53-week year
    (D(2022, 1, 2), "v2021.52"),     # early January belongs to the previous ISO year
    (D(2024, 12, 30), "v2025.01"),   # late December belongs to the next ISO year
    (D(2026, 3, 2), "v2026.10"),
])
def test_week_tag(day, expected):
    assert tag.week_tag(day) == expected


@pytest.mark.parametrize("day", [D(2027, 1, 1), D(2024, 12, 30), D(2026, 3, 2), D(2021, 1, 3)])
def test_week_tag_matches_date_G_V(day):
    out = subprocess.run(["date", "-d", day.isoformat(), "+%G.%V"], capture_output=True, text=True, check=True).stdout
    assert tag.week_tag(day) == "v" + out.strip()


@pytest.mark.parametrize("existing, expected", [
    ([], "v2026.48"),
    (["v2026.47", "v2026.47.1"], "v2026.48"),
    (["v2026.48"], "v2026.48.1"),
    (["v2026.48", "v2026.48.1"], "v2026.48.2"),
    (["v2026.48", "v2026.48.3", "v2026.48.1"], "v2026.48.4"),
    (["v2026.48", "v2026.480", "nightly"], "v2026.48.1"),
])
def test_respins(existing, expected):
    assert tag.next_tag(D(2026, 11, 29), existing) == expected


@pytest.mark.parametrize("t, version, build", [
    ("v2026.48", "2026.48", 0), ("v2026.48.2", "2026.48", 2), ("v2026.01", "2026.01", 0), ("v2026.53", "2026.53", 0),
])
def test_version_and_build_number(t, version, build):
    assert (tag.version(t), tag.build_number(t)) == (version, build)


@pytest.mark.parametrize("bad", ["2026.48", "v2026.4", "v2026.48.0", "v2025.53", "v2026.00", "v2026.48-rc1"])
def test_bad_tags(bad):
    with pytest.raises(OnebitError):
        tag.parse(bad)


@pytest.mark.parametrize("published, drafts, expected", [
    ([], [], "v2026.48"),
    (["v2026.47"], ["v2026.47.1"], "v2026.48"),                 # last week's draft is not this week's run
    ([], ["v2026.48"], "v2026.48"),                             # an interrupted run: its draft is resumed, same tag
    (["v2026.48"], [], "v2026.48.1"),                           # published: taken, so a respin
    (["v2026.48"], ["v2026.48.1"], "v2026.48.1"),               # an interrupted respin is resumed
    (["v2026.48", "v2026.48.1"], [], "v2026.48.2"),
    (["v2026.48.1"], ["v2026.48"], "v2026.48.2"),               # a draft older than a published respin is stale: taken
    (["v2026.48"], ["v2026.48.1", "v2026.48.2"], "v2026.48.2"),  # the newest open draft
    ([], ["v2026.480", "nightly"], "v2026.48"),                 # other names are ignored
    (["v2026.48"], ["v2026.49"], "v2026.48.1"),
])
def test_release_tag_resumes_a_draft_and_respins_a_published_release(published, drafts, expected):
    assert tag.release_tag(D(2026, 11, 29), published, drafts) == expected
    assert tag.release_tag(D(2026, 11, 29), published) == tag.next_tag(D(2026, 11, 29), published)  # no drafts: as before
