"""The bump-pins and check-pins workflows: actions pinned by full SHA, triggers, token guard, commands."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"
FILES = ["bump-pins.yml", "check-pins.yml"]


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on:` as true
    return data


def steps(data: dict) -> list[dict]:
    return [s for job in data["jobs"].values() for s in job["steps"]]


@pytest.mark.parametrize("name", FILES)
def test_every_action_is_pinned_by_sha_with_a_version_comment(name):
    uses = [s["uses"] for s in steps(load(name)) if "uses" in s]
    assert uses, "expected at least one action"
    for u in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", u), f"{name}: {u} is not pinned by a full commit SHA"
    for line in (WORKFLOWS / name).read_text().splitlines():
        if re.match(r"\s*-?\s*uses:", line):
            assert re.search(r"@[0-9a-f]{40} # v\d", line), f"{name}: {line.strip()} lacks a '# vX' comment"


def test_bump_workflow_schedules_each_cadence_and_guards_the_token():
    data = load("bump-pins.yml")
    crons = [c["cron"] for c in data["on"]["schedule"]]
    assert len(crons) == 2 and "workflow_dispatch" in data["on"]
    assert data["concurrency"]["group"] == "bump-pins"
    ev = data["jobs"]["evaluate"]["steps"]
    pick = next(s for s in ev if s.get("id") == "pick")["run"]
    assert all(f'"{c}")' in pick for c in crons), "the cadence step must know every cron entry"
    assert 'cadence=daily' in pick and 'cadence=weekly' in pick
    guard = data["jobs"]["open-prs"]["steps"][0]
    assert "ONEBIT_BOT_TOKEN" in guard["env"] and "exit 1" in guard["run"] and "::error" in guard["run"]


def test_bump_workflow_is_split_like_dependabot():
    """The job that fetches and evaluates upstream content has no permission and no secret and hands over only its
    report; the job with the token downloads that report, checks out only this repository, and runs no evaluation."""
    text = (WORKFLOWS / "bump-pins.yml").read_text()
    data = load("bump-pins.yml")
    assert data["permissions"] == {} and set(data["jobs"]) == {"evaluate", "open-prs"}
    ev, pr = data["jobs"]["evaluate"], data["jobs"]["open-prs"]
    assert ev["permissions"] == {} and "secrets." not in yaml.safe_dump(ev) and "github.token" not in yaml.safe_dump(ev)
    run = next(s for s in ev["steps"] if "pins bump" in s.get("run", ""))["run"]
    assert "--report" in run and "--open-pr" not in run and "--from-report" not in run
    upload = next(s for s in ev["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["name"] == "pins-report"
    # every file the token holder reads back (builders/pins/bump.py, builders/pins/roots.py) travels in the artifact
    from builders.pins import bump as bumpmod, isolate, roots as roots_bump
    paths = upload["with"]["path"].split()
    assert {p.rsplit("/", 1)[-1] for p in paths} >= {isolate.REPORT, bumpmod.DRIFT, roots_bump.REPORT}
    checkout = next(s for s in ev["steps"] if "checkout" in s.get("uses", ""))
    assert checkout["with"]["persist-credentials"] is False and "token" not in checkout["with"]
    assert pr["needs"] == "evaluate" and pr["permissions"] == {"contents": "read"}
    uses = [s.get("uses", "").split("@")[0] for s in pr["steps"]]
    assert "actions/download-artifact" in uses and "actions/upload-artifact" not in uses
    download = next(s for s in pr["steps"] if "download-artifact" in s.get("uses", ""))
    assert download["with"]["name"] == "pins-report"
    runs = [s["run"] for s in pr["steps"] if "run" in s]
    bump = next(r for r in runs if "pins bump" in r)
    assert "--from-report" in bump and "--report " not in bump.replace("--from-report", "")
    assert not any(w in r for r in runs for w in ("make", "git clone", "git fetch", "--cadence"))
    token_steps = [s for s in pr["steps"] if "ONEBIT_BOT_TOKEN" in yaml.safe_dump(s)]
    assert all("pins bump --from-report" in s.get("run", "") or s is pr["steps"][0] or "checkout" in s.get("uses", "")
               for s in token_steps)
    assert text.count("secrets.ONEBIT_BOT_TOKEN") == 3  # the guard, this repository's checkout, the PR step


def test_check_workflow_runs_the_guard_on_pull_requests():
    data = load("check-pins.yml")
    assert "labeled" in data["on"]["pull_request"]["types"]
    run = next(s for s in steps(data) if "pins check" in s.get("run", ""))
    assert run["run"] == '1bit-build pins check --base "origin/$BASE_REF"' and run["env"]["BASE_REF"] == "${{ github.base_ref }}"
    checkout = next(s for s in steps(data) if "checkout" in s.get("uses", ""))
    assert checkout["with"]["fetch-depth"] == 0
