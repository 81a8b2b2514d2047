"""The release merges passing bump branches and records the held ones (builders/release/bumps.py): pure decisions by
table; the merge with real git repositories, bump branches opened by the real pin bot, and CI facts served by the fake
GitHub API (check runs, Actions jobs and logs, commit statuses)."""
from __future__ import annotations

import json

import pytest
from github_fake import REPO, TOKEN, Fake
from pins_fixtures import FakeAPI, Project, Upstream, branch_pin, git

from builders.errors import OnebitError
from builders.io.github import GitHub
from builders.pins.__main__ import main as pins_main
from builders.release import bumps, changes, notes
from builders.release.bumps import GATE, Check
from builders.release.changes import BumpResult

B = "bump/llama.cpp-0123456789ab"
H = "f" * 40
OK = Check("tests", "success")


@pytest.mark.parametrize("checks, gates, needs, expected", [
    ([OK], {}, [], BumpResult(B)),
    ([OK, Check("lint", "success")], {}, [], BumpResult(B)),
    ([OK, Check("build (cpu)", "failure", "Build", "make: *** [all] Error 2")], {}, [],
     BumpResult(B, "build (cpu): Build", "make: *** [all] Error 2", "failure")),
    ([Check("ci/legacy", "failure", None, "exit 1")], {}, [], BumpResult(B, "ci/legacy", "exit 1", "failure")),
    ([], {}, [], BumpResult(B, "CI", f"no CI result on {H[:12]} yet", "pending")),
    ([OK, Check("e2e", "pending")], {}, [], BumpResult(B, "e2e", f"CI has not finished on {H[:12]}", "pending")),
    # a hardware checklist must have passed on its runner: a success status onebit/hardware-checklist/<recipe>
    ([OK], {}, ["vulkan"], BumpResult(B, "hardware checklist of vulkan",
                                      f"waits for the hardware checklist of vulkan to pass on its runner: no success "
                                      f"status {GATE}vulkan on {H[:12]} yet", "hardware")),
    ([OK], {"vulkan": Check(GATE + "vulkan", "pending")}, ["vulkan"], "hardware"),
    ([OK], {"vulkan": Check(GATE + "vulkan", "success")}, ["vulkan", "cuda"], "hardware"),
    ([OK], {"vulkan": Check(GATE + "vulkan", "success"), "cuda": Check(GATE + "cuda", "success")}, ["vulkan", "cuda"],
     BumpResult(B)),
    ([OK], {"vulkan": Check(GATE + "vulkan", "failure", None, "llama-server --list-devices: no Vulkan0")}, ["vulkan"],
     BumpResult(B, "hardware checklist of vulkan", "llama-server --list-devices: no Vulkan0", "failure")),
    ([OK], {"hrx": Check(GATE + "hrx", "success")}, [], BumpResult(B)),  # a gate nobody needs changes nothing
    # CI first: a failing check holds even when the checklist passed
    ([Check("tests", "failure", "pytest", "1 failed")], {"vulkan": Check(GATE + "vulkan", "success")}, ["vulkan"],
     BumpResult(B, "tests: pytest", "1 failed", "failure")),
])
def test_judge(checks, gates, needs, expected):
    got = bumps.judge(B, H, checks, gates, needs)
    assert (got.held_for if isinstance(expected, str) else got) == expected


@pytest.mark.parametrize("run, state", [
    ({"status": "completed", "conclusion": "success"}, "success"),
    ({"status": "completed", "conclusion": "skipped"}, "success"),
    ({"status": "completed", "conclusion": "neutral"}, "success"),
    ({"status": "completed", "conclusion": "failure"}, "failure"),
    ({"status": "completed", "conclusion": "timed_out"}, "failure"),
    ({"status": "completed", "conclusion": "cancelled"}, "failure"),
    ({"status": "completed", "conclusion": "action_required"}, "pending"),
    ({"status": "in_progress", "conclusion": None}, "pending"),
    ({"status": "queued"}, "pending"),
])
def test_run_state(run, state):
    assert bumps.run_state(run) == state


def test_log_tail_drops_actions_timestamps():
    log = "\ufeff2026-11-29T03:30:00.1234567Z ##[group]Run make\n2026-11-29T03:30:01.0000000Z cc -c x.c\n\n" \
          "2026-11-29T03:30:02.5Z make: *** [all] Error 2\n"
    assert bumps.log_tail(log) == "##[group]Run make\ncc -c x.c\nmake: *** [all] Error 2"
    assert bumps.log_tail(log, 1) == "make: *** [all] Error 2"


@pytest.mark.parametrize("old, new, moved", [
    ({"a": {"commit": "1"}}, {"a": {"commit": "2"}}, ["a"]),
    ({"a": {"commit": "1"}, "b": {"commit": "1"}}, {"a": {"commit": "1"}, "b": {"commit": "1"}}, []),
    ({"f": {"commit": "1", "upstream": {"commit": "u1"}}}, {"f": {"commit": "1", "upstream": {"commit": "u2"}}}, ["f"]),
    ({}, {"new": {"commit": "1"}}, ["new"]),
])
def test_moved_pins(old, new, moved):
    assert bumps.moved_pins(old, new) == moved


def test_held_bumps_are_recorded_in_changes_and_notes():
    results = [BumpResult("bump/a-111111111111"),
               BumpResult("bump/b-222222222222", "build (cpu): Build", "\n".join(f"l{i}" for i in range(30)), "failure"),
               BumpResult("bump/c-333333333333", "hardware checklist of vulkan", "waits", "hardware"),
               BumpResult("bump/d-444444444444", "e2e", "running", "pending"),
               BumpResult("bump/e-555555555555", "merge", "conflict in pins.yaml", "conflict")]
    entries = changes.bump_entries(results)
    assert entries[0] == {"branch": "bump/a-111111111111", "result": "merged", "why": None}
    assert entries[1]["why"] == {"step": "build (cpu): Build", "held_for": "failure", "log": [f"l{i}" for i in range(10, 30)]}
    md = notes.render({"tag": "v2026.48", "date": "2026-11-29", "pins": {}, "patches": {"added": [], "dropped": [], "refreshed": []},
                       "bumps": entries, "artifacts": {}})
    assert "## Merged bumps\n\n- `bump/a-111111111111`" in md
    assert "- `bump/b-222222222222`: failed at step `build (cpu): Build`" in md and "l29" in md
    assert "- `bump/c-333333333333`: waits for its hardware checklist to pass on its runner " \
           "(`hardware checklist of vulkan`)" in md
    assert "- `bump/d-444444444444`: CI has not finished (`e2e`)" in md
    assert "- `bump/e-555555555555`: does not merge cleanly into the release (`merge`)" in md


def test_a_bad_bumps_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bumps.json"
    bad.write_text('{"branch": "x"}')
    with pytest.raises(OnebitError, match="bumps.json: not a bump results file: expected a list"):
        bumps.load(bad)


# ------------------------------------------------------------------------------------------------ with real git


def recipe(name: str, pin: str, checklist: bool = False) -> str:
    text = f"schema_version: 1\nname: {name}\nsummary: x\nlicense: MIT\nsource:\n  pin: {pin}\nbuild: {{kind: cmake}}\n"
    return text + ("hardware_checklist:\n  - llama-server --list-devices\n" if checklist else "")


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A project with three pins whose upstreams moved, the pin bot's bump PRs for them, and the fake GitHub."""
    bot_api = FakeAPI()
    monkeypatch.setenv("ONEBIT_GITHUB_API", bot_api.url)
    monkeypatch.setenv("ONEBIT_BOT_TOKEN", TOKEN)
    for var in ("GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_REF_NAME", "ONEBIT_PINS_BASE", "ONEBIT_PINS_REMOTE"):
        monkeypatch.delenv(var, raising=False)
    ups = {name: Upstream(tmp_path / owner / name) for owner, name in
           (("ggml-org", "llama.cpp"), ("huggingface", "tokenizers"), ("zolotukhin", "zinc"))}
    old = {name: up.commit("one") for name, up in ups.items()}
    body = "".join(branch_pin(n, up.url, old[n]) for n, up in ups.items())
    proj = Project(tmp_path, body, recipes={"vulkan": recipe("vulkan", "llama.cpp", checklist=True),
                                            "cpu": recipe("cpu", "llama.cpp"), "tokenizers": recipe("tokenizers", "tokenizers"),
                                            "zinc": recipe("zinc", "zinc")})
    new = {name: up.commit("two") for name, up in ups.items()}
    assert pins_main(["--root", str(proj.root), "bump", "--open-pr", "--repo", REPO]) == 0  # the real bot
    fake = Fake()
    heads = {}
    for pr in bot_api.state.opened():  # the same pull requests, now as the release sees them
        ref = pr["head"]["ref"]
        heads[ref.split("/")[1].rsplit("-", 1)[0]] = head = proj.origin.ref(f"refs/heads/{ref}")
        fake.pull(ref, head)
    bot_api.close()
    yield proj, fake, heads, new
    fake.close()


def client(fake):
    return GitHub(fake.url, TOKEN)


def pins_at_head(proj) -> dict:
    import yaml

    return {n: p["commit"] for n, p in yaml.safe_load(git(proj.root, "show", "HEAD:pins.yaml"))["pins"].items()}


def test_passing_bumps_are_merged_failing_and_unchecked_ones_held(world, monkeypatch, capsys):
    proj, fake, heads, new = world
    assert sorted(heads) == ["llama.cpp", "tokenizers", "zinc"]
    for pin in heads:
        fake.check(heads[pin], "pins check", "success")
    fake.check(heads["tokenizers"], "tests", "success")
    fake.check(heads["llama.cpp"], "tests", "success")
    fake.check(heads["zinc"], "build (cpu)", "failure",
               job={"steps": [{"name": "Set up job", "conclusion": "success"}, {"name": "Build", "conclusion": "failure"},
                              {"name": "Post", "conclusion": "skipped"}]},
               log="".join(f"2026-11-29T03:30:{i:02d}.0000000Z line {i}\n" for i in range(40)) + "make: *** Error 2\n")
    base_before = proj.origin.ref("refs/heads/main")

    m = bumps.merge_passing(proj.root, github=client(fake), slug=REPO, base="main")
    got = {r.branch.split("/")[1].rsplit("-", 1)[0]: r for r in m.results}
    assert got["tokenizers"] == BumpResult(f"bump/tokenizers-{new['tokenizers'][:12]}")
    assert got["llama.cpp"].held_for == "hardware" and got["llama.cpp"].failed_step == "hardware checklist of vulkan"
    assert got["zinc"].held_for == "failure" and got["zinc"].failed_step == "build (cpu): Build"
    assert got["zinc"].log.splitlines()[-2:] == ["line 39", "make: *** Error 2"]  # the log's last lines, no timestamps
    assert m.merged == [f"bump/tokenizers-{new['tokenizers'][:12]}"]
    # the merge is real: one merge commit on top of main, and pins.yaml moved only the merged pin
    assert pins_at_head(proj)["tokenizers"] == new["tokenizers"] and pins_at_head(proj)["zinc"] != new["zinc"]
    assert git(proj.root, "log", "-1", "--format=%P").count(" ") == 1
    assert git(proj.root, "log", "-1", "--format=%s") == f"Merge bump/tokenizers-{new['tokenizers'][:12]} (#2)"
    assert git(proj.root, "status", "--porcelain", "--untracked-files=no") == ""
    assert m.ahead() and proj.origin.ref("refs/heads/main") == base_before  # nothing pushed yet
    assert m.push() == git(proj.root, "rev-parse", "HEAD") == proj.origin.ref("refs/heads/main")

    # the hardware checklist passes on its runner: the gate job records it on the bump's head commit
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("ONEBIT_GITHUB_API", fake.url)
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO)
    assert bumps.main(["gate", "--repo", REPO, "--sha", heads["llama.cpp"], "--recipe", "vulkan",
                       "--description", "passed on strix-halo-1"]) == 0
    assert fake.statuses[heads["llama.cpp"]][-1]["context"] == "onebit/hardware-checklist/vulkan"
    out = proj.root.parent / "bumps.json"
    assert bumps.main(["merge", "--root", str(proj.root), "--push", "--json", str(out)]) == 0
    again = {r.branch.split("/")[1].rsplit("-", 1)[0]: r for r in bumps.load(out)}
    assert sorted(again) == ["llama.cpp", "zinc"]  # tokenizers was merged by the earlier release
    assert again["llama.cpp"] == BumpResult(f"bump/llama.cpp-{new['llama.cpp'][:12]}")
    assert again["zinc"].held_for == "failure"
    assert pins_at_head(proj)["llama.cpp"] == new["llama.cpp"]
    assert "hardware checklist passed: vulkan" in git(proj.root, "log", "-1", "--format=%b")
    assert proj.origin.ref("refs/heads/main") == git(proj.root, "rev-parse", "HEAD")
    assert capsys.readouterr().out.splitlines()[-1] == git(proj.root, "rev-parse", "HEAD")


def test_a_rerun_after_an_unpushed_merge_records_it_again(world):
    proj, fake, heads, new = world
    for sha in heads.values():
        fake.check(sha, "tests", "success")
    first = bumps.merge_passing(proj.root, github=client(fake), slug=REPO, base="main")
    head = git(proj.root, "rev-parse", "HEAD")
    second = bumps.merge_passing(proj.root, github=client(fake), slug=REPO, base="main")  # interrupted before the push
    assert second.results == first.results and second.merged == first.merged
    assert git(proj.root, "rev-parse", "HEAD") == head and second.ahead()


def test_two_bumps_of_one_line_the_second_conflicts_and_is_held(tmp_path, monkeypatch):
    up = Upstream(tmp_path / "zolotukhin" / "zinc")
    one = up.commit("one")
    proj = Project(tmp_path, branch_pin("zinc", up.url, one), recipes={"zinc": recipe("zinc", "zinc")})
    fake = Fake()
    try:
        for n in ("two", "three"):  # two proposals for one pin, both open (a reopened PR, say)
            sha = up.commit(n)
            branch = f"bump/zinc-{sha[:12]}"
            git(proj.root, "checkout", "-q", "-b", branch, "main")
            (proj.root / "pins.yaml").write_text(proj.text().replace(one, sha))
            head = proj.commit_all(f"Bump zinc to {sha[:12]}")
            git(proj.root, "push", "-q", "origin", branch)
            git(proj.root, "checkout", "-q", "main")
            fake.pull(branch, head)
            fake.check(head, "tests", "success")
        m = bumps.merge_passing(proj.root, github=client(fake), slug=REPO, base="main")
        [merged, held] = sorted(m.results, key=lambda r: r.failed_step is not None)
        assert merged.failed_step is None
        assert (held.failed_step, held.held_for) == ("merge", "conflict") and "conflict in pins.yaml" in held.log
        assert git(proj.root, "status", "--porcelain", "--untracked-files=no") == ""  # the failed merge was undone
    finally:
        fake.close()


def test_a_dirty_checkout_is_refused(world):
    proj, fake, heads, new = world
    (proj.root / "pins.yaml").write_text(proj.text() + "# local edit\n")
    with pytest.raises(OnebitError, match="uncommitted changes"):
        bumps.merge_passing(proj.root, github=client(fake), slug=REPO, base="main")


def test_the_bumps_json_round_trips(tmp_path):
    results = [BumpResult("bump/a-111111111111"), BumpResult("bump/b-222222222222", "x", "y", "pending")]
    path = tmp_path / "b.json"
    path.write_text(bumps.dump(results))
    assert bumps.load(path) == results
    assert json.loads(path.read_text())[0] == {"branch": "bump/a-111111111111", "failed_step": None, "log": "",
                                               "held_for": None}
