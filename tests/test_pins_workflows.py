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
    all_steps = steps(data)
    pick = next(s for s in all_steps if s.get("id") == "pick")["run"]
    assert all(f'"{c}")' in pick for c in crons), "the cadence step must know every cron entry"
    assert 'cadence=daily' in pick and 'cadence=weekly' in pick
    guard = all_steps[0]
    assert "ONEBIT_BOT_TOKEN" in guard["env"] and "exit 1" in guard["run"] and "::error" in guard["run"]
    bump = next(s for s in all_steps if "pins bump" in s.get("run", ""))
    assert "1bit-build pins bump" in bump["run"] and "--open-pr" in bump["run"] and "ONEBIT_BOT_TOKEN" in bump["env"]
    checkout = next(s for s in all_steps if "checkout" in s.get("uses", ""))
    assert "ONEBIT_BOT_TOKEN" in checkout["with"]["token"]


def test_check_workflow_runs_the_guard_on_pull_requests():
    data = load("check-pins.yml")
    assert "labeled" in data["on"]["pull_request"]["types"]
    run = next(s for s in steps(data) if "pins check" in s.get("run", ""))
    assert run["run"] == '1bit-build pins check --base "origin/$BASE_REF"' and run["env"]["BASE_REF"] == "${{ github.base_ref }}"
    checkout = next(s for s in steps(data) if "checkout" in s.get("uses", ""))
    assert checkout["with"]["fetch-depth"] == 0
