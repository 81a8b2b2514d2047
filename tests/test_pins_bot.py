"""The pin bot and the pin guard against real local git repositories and a fake GitHub API on 127.0.0.1."""
from __future__ import annotations

import hashlib
import json

import pytest

from builders.pins.__main__ import main
from pins_fixtures import FakeAPI, Project, Upstream, git, make_fork, release_pin

TOKEN = "t0ken-for-tests"


@pytest.fixture
def api(monkeypatch):
    fake = FakeAPI()
    monkeypatch.setenv("ONEBIT_GITHUB_API", fake.url)
    monkeypatch.setenv("ONEBIT_HF_ENDPOINT", fake.url)
    monkeypatch.setenv("ONEBIT_BOT_TOKEN", TOKEN)
    for var in ("GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_REF_NAME", "GITHUB_EVENT_PATH", "GITHUB_STEP_SUMMARY",
                "ONEBIT_PINS_REMOTE", "ONEBIT_PINS_BASE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    yield fake
    fake.close()


def run(project: Project, *argv: str) -> int:
    return main(["--root", str(project.root), *argv])


def branch_pin(name: str, up: Upstream, commit: str, extra: str = "") -> str:
    return f"""
    {name}:
      url: {up.url}
      policy: branch
      branch: {up.branch}
      commit: {commit}   # reviewed by hand
      cadence: daily
      license: MIT
      mirrors: []
    """ + extra


RECIPE = """\
schema_version: 1
name: {name}
summary: x
license: MIT
source:
  pin: {pin}
  patches:
    - file: 0001-fix.patch
      purpose: test
      upstream: none
build: {{kind: cmake}}
stage: {{binaries: {{}}}}
provides: {{backend: cpu}}
hardware_checklist:
  - llama-server --list-devices
"""

PATCH = """\
diff --git a/src.c b/src.c
--- a/src.c
+++ b/src.c
@@ -1,3 +1,3 @@
 line one
-line two
+line two patched
 line three
"""


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b) if x != y]


# --------------------------------------------------------------------------------------------------- status / local


def test_status_and_local_bump_of_a_branch_pin(tmp_path, api, capsys):
    up = Upstream(tmp_path / "zolotukhin" / "zinc")
    old = up.commit("one")
    proj = Project(tmp_path, branch_pin("zinc", up, old))
    assert run(proj, "status") == 0
    assert "current" in capsys.readouterr().out
    new = up.commit("two")
    assert run(proj, "status") == 0
    out = capsys.readouterr().out
    assert "behind" in out and new[:12] in out
    before = proj.text()
    assert run(proj, "bump", "--dry-run") == 0
    assert proj.text() == before and "would-propose" in capsys.readouterr().out
    assert run(proj, "bump") == 0
    assert changed_lines(before, proj.text()) == [(f"    commit: {old}   # reviewed by hand", f"    commit: {new}   # reviewed by hand")]
    assert run(proj, "bump") == 0 and "current" in capsys.readouterr().out


def test_tag_pattern_moves_from_rc_to_final(tmp_path, api):
    up = Upstream(tmp_path / "torvalds" / "linux")
    up.commit("base")
    rc = up.tag("v6.18-rc4", annotated=True)
    proj = Project(tmp_path, f"""
    linux:
      url: {up.url}
      policy: tag-pattern
      tag_pattern: '^v(\\d+)\\.(\\d+)(-rc\\d+)?$'
      tag: v6.18-rc4
      commit: {rc}
      cadence: weekly
      license: GPL-2.0-only
      mirrors: []
    """)
    up.commit("final")
    final = up.tag("v6.18", annotated=True)
    up.tag("junk-v99")
    up.tag("v6.9")
    before = proj.text()
    assert run(proj, "bump") == 0  # v6.18-rc4 < v6.18
    assert changed_lines(before, proj.text()) == [("    tag: v6.18-rc4", "    tag: v6.18"), (f"    commit: {rc}", f"    commit: {final}")]
    up.commit("next")
    rc1 = up.tag("v6.19-rc1")
    assert run(proj, "bump") == 0  # v6.18 < v6.19-rc1
    assert "    tag: v6.19-rc1\n" in proj.text() and f"    commit: {rc1}\n" in proj.text()


def test_unresolved_tag_pattern_pin_gets_its_first_commit(tmp_path, api):
    up = Upstream(tmp_path / "torvalds" / "linux")
    up.commit("base")
    up.tag("v6.18-rc4")
    up.commit("final")
    final = up.tag("v6.18")
    proj = Project(tmp_path, f"""
    linux:
      url: {up.url}
      policy: tag-pattern
      tag_pattern: '^v(\\d+)\\.(\\d+)(-rc\\d+)?$'
      unresolved: >-
        nothing known yet,
        the first bump resolves it
      cadence: weekly
      license: GPL-2.0-only
      mirrors: []
    """)
    assert run(proj, "bump", "linux") == 0
    text = proj.text()
    assert f"    commit: {final}\n    tag: v6.18\n    cadence: weekly" in text and "unresolved:" not in text


# --------------------------------------------------------------------------------------------------- PRs


def release_project(tmp_path, api, *, patch_ok=True):
    up = Upstream(tmp_path / "ggml-org" / "llama.cpp")
    up.commit("one", {"src.c": "line one\nline two\nline three\n"})
    old = up.tag("b100")
    proj = Project(tmp_path, f"""
    # llama.cpp: shared by the vulkan and cpu backends
    llama.cpp:
      url: {up.url}
      policy: release
      tag: b100
      commit: {old}
      cadence: daily
      license: MIT
      mirrors: []
    """, recipes={"vulkan": RECIPE.format(name="vulkan", pin="llama.cpp")}, patches={"vulkan/0001-fix.patch": PATCH})
    up.commit("two", {"other.c": "x\n"} if patch_ok else {"src.c": "line one\nline 2 rewritten\nline three\n"})
    new = up.tag("b101", annotated=True)
    api.release("ggml-org/llama.cpp", "b101", "## What changed\n* vulkan: faster")
    return up, proj, old, new


def test_release_bump_opens_one_pr_and_is_idempotent(tmp_path, api, capsys):
    up, proj, old, new = release_project(tmp_path, api)
    before = proj.text()
    head_before = git(proj.root, "rev-parse", "HEAD")
    assert run(proj, "bump", "--open-pr") == 0
    [pr] = api.state.opened()
    branch = f"bump/llama.cpp-{new[:12]}"
    assert pr["head"]["ref"] == branch and pr["base"]["ref"] == "main"
    assert pr["title"] == "Bump llama.cpp to b101"
    body = pr["body"]
    assert f"| llama.cpp | `{old[:12]}` (b100) | `{new[:12]}` (b101) | 1 |" in body
    assert "* vulkan: faster" in body and "releases/b101" in body
    assert "| 0001-fix.patch | applies |" in body
    assert "- [ ] `llama-server --list-devices` (vulkan)" in body
    # the branch holds exactly the pin change; the working tree and HEAD are untouched
    pushed = proj.origin.show(f"refs/heads/{branch}", "pins.yaml")
    assert changed_lines(before, pushed) == [("    tag: b100", "    tag: b101"), (f"    commit: {old}", f"    commit: {new}")]
    assert "# llama.cpp: shared by the vulkan and cpu backends" in pushed
    assert proj.text() == before and git(proj.root, "rev-parse", "HEAD") == head_before
    assert all(r[3] == f"Bearer {TOKEN}" for r in api.state.requests if r[0] == "POST")
    # second run: nothing new
    capsys.readouterr()
    assert run(proj, "bump", "--open-pr") == 0
    assert len(api.state.opened()) == 1 and "already-proposed" in capsys.readouterr().out
    # upstream moves on: a new PR, and the old one is closed as superseded (one open PR per pin)
    up.commit("three", {"third.c": "y\n"})
    newer = up.tag("b102")
    api.release("ggml-org/llama.cpp", "b102")
    assert run(proj, "bump", "--open-pr") == 0
    first, second = api.state.opened()
    assert second["head"]["ref"] == f"bump/llama.cpp-{newer[:12]}" and "| 2 |" in second["body"]
    assert first["state"] == "closed" and second["state"] == "open"
    assert api.state.comments == [(1, f"Superseded by #2 (bump/llama.cpp-{newer[:12]}).")]


def test_a_closed_proposal_is_not_proposed_again(tmp_path, api, capsys):
    up, proj, old, new = release_project(tmp_path, api)
    assert run(proj, "bump", "--open-pr") == 0
    api.state.pulls[0]["state"] = "closed"  # a reviewer rejected it and deleted the branch
    git(proj.origin.path, "update-ref", "-d", f"refs/heads/bump/llama.cpp-{new[:12]}")
    capsys.readouterr()
    assert run(proj, "bump", "--open-pr") == 0
    assert len(api.state.opened()) == 1 and "PR #1 (closed)" in capsys.readouterr().out


def test_drift_report_names_the_failing_hunk(tmp_path, api):
    up, proj, old, new = release_project(tmp_path, api, patch_ok=False)
    assert run(proj, "bump", "--open-pr") == 0
    [pr] = api.state.opened()
    assert "| 0001-fix.patch | fails | `src.c` `@@ -1,3 +1,3 @@` |" in pr["body"]


def test_open_pr_needs_a_token(tmp_path, api, monkeypatch, capsys):
    up, proj, old, new = release_project(tmp_path, api)
    monkeypatch.delenv("ONEBIT_BOT_TOKEN")
    before = proj.text()
    assert run(proj, "bump", "--open-pr") == 2
    assert "needs a token" in capsys.readouterr().err
    assert proj.text() == before and not api.state.pulls and proj.origin.ref("refs/heads/bump/llama.cpp-" + new[:12]) is None


# --------------------------------------------------------------------------------------------------- guard rails


def test_force_pushed_branch_is_refused_then_allowed_as_rollback(tmp_path, api, capsys):
    up = Upstream(tmp_path / "amd" / "xdna-driver")
    base = up.commit("one")
    old = up.commit("two")
    proj = Project(tmp_path, branch_pin("xdna-driver", up, old))
    up.reset_hard(base)
    sideways = up.commit("rewritten two")  # force-pushed history: `old` is gone from the branch
    before = proj.text()
    assert run(proj, "bump", "--open-pr") == 1
    err = capsys.readouterr().err
    assert "would move sideways" in err and "--allow-rollback" in err
    assert proj.text() == before and not api.state.pulls
    assert run(proj, "bump", "--open-pr", "--allow-rollback") == 2
    assert "needs --reason" in capsys.readouterr().err
    assert run(proj, "bump", "--open-pr", "--allow-rollback", "--reason", "upstream rewrote main") == 0
    [pr] = api.state.opened()
    assert pr["head"]["ref"] == f"bump/xdna-driver-{sideways[:12]}" and pr["title"].startswith("Rollback")
    assert "**Rollback** (diverged): upstream rewrote main" in pr["body"]
    assert api.state.labels == {1: ["rollback"]}


def test_backwards_release_is_refused(tmp_path, api, capsys):
    up = Upstream(tmp_path / "huggingface" / "tokenizers")
    up.commit("one")
    older = up.tag("v0.20.3")
    newer = up.commit("two")
    up.tag("v0.21.0")
    proj = Project(tmp_path, release_pin("tokenizers", up.url, "v0.21.0", newer, "Apache-2.0"))
    api.release("huggingface/tokenizers", "v0.20.3")  # "latest" points at an older release
    before = proj.text()
    assert run(proj, "bump") == 1
    assert "would move backwards" in capsys.readouterr().err and proj.text() == before
    assert older != newer


def test_bad_input_leaves_pins_yaml_untouched(tmp_path, api, capsys):
    up, proj, old, new = release_project(tmp_path, api)
    z = Upstream(tmp_path / "zolotukhin" / "zinc")
    z.commit("one")
    extra = branch_pin("zinc", Upstream(tmp_path / "gone" / "repo"), z.head())
    (proj.root / "pins.yaml").write_text(proj.text() + "\n".join("  " + l[4:] if l.strip() else l for l in extra.splitlines()) + "\n")
    proj.commit_all("add zinc")
    import shutil
    shutil.rmtree(tmp_path / "gone")  # unreachable upstream
    before = proj.pins_path.read_bytes()
    assert run(proj, "bump") == 1
    err = capsys.readouterr().err
    assert "zinc: error" in err and "cannot reach" in err
    assert proj.pins_path.read_bytes() == before  # llama.cpp moved fine, but nothing is written when a pin failed
    # a malformed API reply
    api.state.raw["/repos/ggml-org/llama.cpp/releases/latest"] = (200, "<html>not json</html>")
    assert run(proj, "bump", "llama.cpp") == 1
    assert "malformed reply from the GitHub API" in capsys.readouterr().err
    api.state.raw["/repos/ggml-org/llama.cpp/releases/latest"] = (200, json.dumps({"name": "no tag"}))
    assert run(proj, "bump", "llama.cpp") == 1
    assert "malformed API reply: expected 'tag_name'" in capsys.readouterr().err
    assert proj.pins_path.read_bytes() == before
    # a typo in pins.yaml
    typo = before.replace(b"policy: release", b"policy: relase")
    proj.pins_path.write_bytes(typo)
    assert run(proj, "bump") == 2
    err = capsys.readouterr().err
    assert "pins.yaml:" in err and "relase" in err
    assert proj.pins_path.read_bytes() == typo


def test_unknown_pin_name(tmp_path, api, capsys):
    up = Upstream(tmp_path / "a" / "b")
    proj = Project(tmp_path, branch_pin("zinc", up, up.commit("one")))
    assert run(proj, "bump", "zinx") == 2
    assert "no pin named 'zinx'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------- tested pair


def test_tested_pair_moves_both_pins_in_one_pr(tmp_path, api, capsys):
    llama = Upstream(tmp_path / "AaronStGeorge" / "llama.cpp", branch="fix")
    l_old = llama.commit("l1")
    hrx = Upstream(tmp_path / "ROCm" / "hrx-system")
    h_old = hrx.commit("h1")
    source = f"{(tmp_path / 'ROCm' / 'ggml-staging-automation.git').as_uri()}"
    proj = Project(tmp_path, f"""
    hrx-pair-llama.cpp:
      url: {llama.url}
      policy: tested-pair
      branch: fix
      commit: {l_old}
      cadence: daily
      license: MIT
      tested_pair: {{source: '{source}', branch: main, path: llama.cpp, key: llama.cpp, partner: hrx-system}}
      mirrors: []
    hrx-system:
      url: {hrx.url}
      policy: tested-pair
      branch: main
      commit: {h_old}
      cadence: daily
      license: Apache-2.0
      tested_pair:
        source: {source}
        branch: main
        path: pair.env
        key: HRX_SYSTEM
        partner: hrx-pair-llama.cpp
      mirrors: []
    """)
    l_new = llama.commit("l2")
    llama.commit("l3 untested")
    h_new = hrx.commit("h2")
    api.submodule("ROCm/ggml-staging-automation", "llama.cpp", l_new)
    api.file("ROCm/ggml-staging-automation", "pair.env", f"LLAMA={l_new}\nHRX_SYSTEM={h_new}\n")
    before = proj.text()
    assert run(proj, "bump", "--open-pr") == 0
    [pr] = api.state.opened()
    assert pr["head"]["ref"] == f"bump/hrx-pair-llama.cpp-{l_new[:12]}"
    assert f"| hrx-system | `{h_old[:12]}` | `{h_new[:12]}` | 1 |" in pr["body"]
    pushed = proj.origin.show(f"refs/heads/{pr['head']['ref']}", "pins.yaml")
    assert changed_lines(before, pushed) == [(f"    commit: {l_old}", f"    commit: {l_new}"), (f"    commit: {h_old}", f"    commit: {h_new}")]
    assert run(proj, "bump", "--open-pr") == 0 and len(api.state.opened()) == 1
    # a malformed pair file is a clear error
    api.file("ROCm/ggml-staging-automation", "pair.env", "HRX_SYSTEM=main\n")
    assert run(proj, "bump", "hrx-system") == 1
    assert "'HRX_SYSTEM' is 'main', not a 40-hex commit" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------- forks


def fork_project(tmp_path, policy: str, conflict: bool = False):
    up = Upstream(tmp_path / "charlie12345" / "ROCmFPX")
    old_up = up.commit("base", {"kernel.c": "a\nb\nc\n"})
    (tmp_path / "1bit-MONSTER").mkdir()
    fork, tip = make_fork(tmp_path / "1bit-MONSTER", up, "ROCmFPX", "1bit/vulkan-rocmi4", {"kernel.c": "a\nb ours\nc\n"})
    proj = Project(tmp_path, f"""
    rocmfpx:
      url: {fork.url}
      policy: {policy}
      branch: 1bit/vulkan-rocmi4
      commit: {tip}
      cadence: weekly
      license: MIT
      upstream:
        url: {up.url}
        branch: main
        commit: {old_up}
      mirrors: []
    """)
    new_up = up.commit("upstream moves", {"kernel.c": "a\nb theirs\nc\n"} if conflict else {"other.c": "x\n"})
    return up, fork, proj, old_up, new_up, tip


def test_fork_rebase_keeps_old_tip_and_is_idempotent(tmp_path, api):
    up, fork, proj, old_up, new_up, tip = fork_project(tmp_path, "fork-rebase")
    before = proj.text()
    assert run(proj, "bump", "--open-pr") == 0
    new_tip = fork.ref("refs/heads/1bit/vulkan-rocmi4")
    assert new_tip != tip
    assert fork.ref(f"refs/tags/rocmfpx-{tip[:12]}") == tip  # the old tip is kept
    assert git(fork.path, "rev-parse", f"{new_tip}^") == new_up  # our commit replayed on the new upstream
    [pr] = api.state.opened()
    assert pr["head"]["ref"] == f"bump/rocmfpx-{new_tip[:12]}"
    assert f"tag `rocmfpx-{tip[:12]}`" in pr["body"] and f"| upstream main | `{old_up[:12]}` | `{new_up[:12]}` | 1 |" in pr["body"]
    pushed = proj.origin.show(f"refs/heads/bump/rocmfpx-{new_tip[:12]}", "pins.yaml")
    assert changed_lines(before, pushed) == [(f"    commit: {tip}", f"    commit: {new_tip}"),
                                             (f"      commit: {old_up}", f"      commit: {new_up}")]
    assert run(proj, "bump", "--open-pr") == 0  # the fork already holds new_up: no second rebase, no second PR
    assert len(api.state.opened()) == 1 and fork.ref("refs/heads/1bit/vulkan-rocmi4") == new_tip


def test_fork_rebase_conflict_stops_that_pin_with_the_files(tmp_path, api, capsys):
    up, fork, proj, old_up, new_up, tip = fork_project(tmp_path, "fork-rebase", conflict=True)
    before = proj.text()
    assert run(proj, "bump", "--open-pr") == 1
    err = capsys.readouterr().err
    assert "rebase of rocmfpx onto the new upstream stopped on a conflict" in err and "kernel.c" in err and "our change" in err
    assert fork.ref("refs/heads/1bit/vulkan-rocmi4") == tip and fork.ref(f"refs/tags/rocmfpx-{tip[:12]}") is None
    assert proj.text() == before and not api.state.pulls


def test_fork_merge(tmp_path, api):
    up, fork, proj, old_up, new_up, tip = fork_project(tmp_path, "fork-merge")
    assert run(proj, "bump") == 0
    new_tip = fork.ref("refs/heads/1bit/vulkan-rocmi4")
    assert git(fork.path, "rev-parse", f"{new_tip}^1") == tip and git(fork.path, "rev-parse", f"{new_tip}^2") == new_up
    assert f"commit: {new_tip}" in proj.text() and f"commit: {new_up}" in proj.text()


def test_force_pushed_fork_is_refused(tmp_path, api, capsys):
    up, fork, proj, old_up, new_up, tip = fork_project(tmp_path, "fork-merge")
    git(fork.path, "update-ref", "refs/heads/1bit/vulkan-rocmi4", old_up)  # someone reset our branch
    assert run(proj, "bump") == 1
    err = capsys.readouterr().err
    assert "fork branch 1bit/vulkan-rocmi4" in err and "would move sideways" in err


# --------------------------------------------------------------------------------------------------- companions


def test_companions_move_with_the_source_pin(tmp_path, api):
    up = Upstream(tmp_path / "NandhaKishorM" / "laya")
    old = up.commit("one")
    rev_old, rev_new = "1" * 39 + "a", "2" * 39 + "b"
    files = {"model.safetensors": b"weights v2", "encoder/config.json": b'{"v": 2}'}
    hashes = api.hf_model("conv/laya", rev_new, files, lfs={"model.safetensors"})
    proj = Project(tmp_path, branch_pin("laya", up, old).replace("      mirrors: []", f"""\
      companions:
        huggingface:
          repo: conv/laya
          revision: {rev_old}
          files:
            model.safetensors: {'a' * 64}
            encoder/config.json: null
      mirrors: []"""))
    new = up.commit("two")
    before = proj.text()
    assert run(proj, "bump", "--open-pr") == 0
    [pr] = api.state.opened()
    pushed = proj.origin.show(f"refs/heads/bump/laya-{new[:12]}", "pins.yaml")
    assert [b for _, b in changed_lines(before, pushed)] == [
        f"    commit: {new}   # reviewed by hand", f"        revision: {rev_new}",
        f"          model.safetensors: {hashes['model.safetensors']}", f"          encoder/config.json: {hashes['encoder/config.json']}"]
    assert hashes["encoder/config.json"] == hashlib.sha256(b'{"v": 2}').hexdigest()
    assert f"| huggingface conv/laya revision | `{rev_old}` | `{rev_new}` |" in pr["body"]


# --------------------------------------------------------------------------------------------------- pins check


def test_check_guards_pull_requests(tmp_path, api, monkeypatch, capsys):
    up = Upstream(tmp_path / "amd" / "xdna-driver")
    base = up.commit("one")
    old = up.commit("two")
    proj = Project(tmp_path, branch_pin("xdna-driver", up, old))
    git(proj.root, "fetch", "--quiet", "origin")
    assert run(proj, "check", "--base", "origin/main") == 0
    assert "no pin moved" in capsys.readouterr().out
    forward = up.commit("three")
    proj.pins_path.write_text(proj.text().replace(old, forward))
    assert run(proj, "check", "--base", "origin/main") == 0
    assert "ahead" in capsys.readouterr().out
    proj.pins_path.write_text(proj.text().replace(forward, base))
    assert run(proj, "check", "--base", "origin/main") == 1
    assert "moved behind" in capsys.readouterr().err
    up.reset_hard(base)
    sideways = up.commit("rewritten")
    proj.pins_path.write_text(proj.text().replace(base, sideways))
    assert run(proj, "check", "--base", "origin/main") == 1
    assert "moved diverged" in capsys.readouterr().err
    assert run(proj, "check", "--base", "origin/main", "--label", "rollback") == 0
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"labels": [{"name": "rollback"}]}}))
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    assert run(proj, "check", "--base", "origin/main") == 0
    assert run(proj, "check", "--base", "origin/nope") == 2


def test_check_accepts_a_rebased_fork_whose_old_tip_is_kept(tmp_path, api, capsys):
    up, fork, proj, old_up, new_up, tip = fork_project(tmp_path, "fork-rebase")
    assert run(proj, "bump") == 0  # local edit + fork push
    assert run(proj, "check", "--base", "HEAD") == 0
    out = capsys.readouterr().out
    assert "rebased" in out and "ahead" in out
    git(fork.path, "tag", "-d", f"rocmfpx-{tip[:12]}")
    assert run(proj, "check", "--base", "HEAD") == 1


def test_the_1bit_build_cli_carries_the_pins_command(tmp_path, api, capsys):
    cli = pytest.importorskip("builders.cli")
    up = Upstream(tmp_path / "zolotukhin" / "zinc")
    old = up.commit("one")
    proj = Project(tmp_path, branch_pin("zinc", up, old))
    new = up.commit("two")
    assert cli.main(["--root", str(proj.root), "pins", "status", "zinc"]) == 0
    assert "behind" in capsys.readouterr().out
    assert cli.main(["--root", str(proj.root), "pins", "bump", "zinc"]) == 0
    assert f"commit: {new}" in proj.text()


def test_held_patch_drift_through_an_upstream_symlink_writes_nothing_outside(tmp_path, api):
    """Upstream makes the patched file a link to a file outside its tree: git apply refuses it (the report says the
    patch fails), and the file outside is untouched."""
    import os

    up, proj, old, new = release_project(tmp_path, api)
    victim = tmp_path / "victim.c"
    victim.write_text("line one\nline two\nline three\n")
    (up.path / "src.c").unlink()
    os.symlink(str(victim), up.path / "src.c")
    git(up.path, "add", "src.c")
    git(up.path, "commit", "-qm", "link")
    up.tag("b102")
    api.release("ggml-org/llama.cpp", "b102", "links")
    assert run(proj, "bump", "--open-pr") == 0
    [pr] = api.state.opened()
    assert "| 0001-fix.patch | fails |" in pr["body"]
    assert victim.read_text() == "line one\nline two\nline three\n"


def test_a_failing_pin_fails_the_delivering_half_not_the_evaluating_one(tmp_path, api, capsys, monkeypatch):
    """The workflow's evaluate job succeeds with a conflict in its report (so the PR job still runs for the other
    pins); the PR job states the conflict and fails."""
    up, fork, proj, old_up, new_up, tip = fork_project(tmp_path, "fork-rebase", conflict=True)
    monkeypatch.delenv("ONEBIT_BOT_TOKEN")
    assert run(proj, "bump", "--report", str(tmp_path / "report")) == 0
    assert "rebase of rocmfpx onto the new upstream stopped on a conflict" in capsys.readouterr().err
    monkeypatch.setenv("ONEBIT_BOT_TOKEN", TOKEN)
    assert run(proj, "bump", "--from-report", str(tmp_path / "report"), "--open-pr") == 1
    assert "conflict" in capsys.readouterr().err and not api.state.pulls
    assert fork.ref("refs/heads/1bit/vulkan-rocmi4") == tip
