"""Pure decisions of the pin bot, as tables."""
from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from builders.errors import OnebitError
from builders.pins import decide
from builders.pins.decide import Edit, Move, Proposal, Verdict
from builders.pins.edit import edit_pins, render_scalar
from builders.pins.versions import newest_tag, version_key

A, B, C = "a" * 40, "b" * 40, "c" * 40


@pytest.mark.parametrize("lower, higher", [
    ("v7.3-rc4", "v7.3"),
    ("v7.3-rc1", "v7.3-rc4"),
    ("v7.3-rc9", "v7.3-rc10"),
    ("v7.3", "v7.3.1"),
    ("v7.3", "v7.4-rc1"),
    ("v7.9", "v7.10"),
    ("v6.18", "v7.0-rc1"),
    ("b6999", "b7000"),
    ("v1.0a1", "v1.0b1"),
    ("v1.0b2", "v1.0rc1"),
    ("v1.0-beta.3", "v1.0-rc.1"),
    ("v1.0", "v1.0-post1"),
    ("v0.20.3", "v0.23.2"),
    ("nightly", "v0.1"),
    # packaging.version reads what follows the prefix (PEP 440)
    ("v1.0.dev1", "v1.0a1"),
    ("v2.0.0-alpha", "v2.0.0-alpha.1"),
    ("release-1.9", "release-1.10"),
    ("llvmorg-17.0.6", "llvmorg-18.1.0-rc1"),
    ("v1.0-1", "v1.0-2"),  # implicit post releases
    ("v1.0.post1", "v1.0.post2"),
    ("v1.0c1", "v1.0"),
    ("v1.0-rc1", "v1.0-preview2"),  # PEP 440 spells preview as rc
    ("v09", "v10"),
    ("v1.0", "v1.0+local"),
    # a suffix packaging cannot read sorts after its release's final, before the next release
    ("v1.0", "v1.0-foo"),
    ("v1.0-foo", "v1.0.1"),
    ("v7.3", "v7.3-rc4-dirty"),
    ("alpha", "beta"),  # no number at all: natural order among themselves, before any version
])
def test_version_order(lower, higher):
    assert version_key(lower) < version_key(higher)


def test_trailing_zeros_compare_equal_release():
    assert version_key("v7.3")[:3] == version_key("v7.3.0")[:3]


def test_version_key_is_a_packaging_version():
    from packaging.version import Version

    assert version_key("v7.3-rc4")[1] == Version("7.3rc4") and version_key("b7000")[1] == Version("7000")
    assert newest_tag(["v6.18-rc4", "v6.18", "v6.17.9"], r"v[\d.]+(-rc\d+)?") == "v6.18"


LINUX = r"^v(\d+)\.(\d+)(-rc\d+)?$"


@pytest.mark.parametrize("tags, pattern, expected", [
    (["v6.17", "v6.18-rc4", "v6.18", "v6.9", "next-20250101"], LINUX, "v6.18"),
    (["v6.17", "v6.18-rc3", "v6.18-rc4"], LINUX, "v6.18-rc4"),
    (["v6.18-rc4", "v6.17.1"], r"^v\d+\.\d+$", None),
    (["v6.18", "v6.18.1"], r"v\d+\.\d+", "v6.18"),  # the whole name must match
    (["b100", "b99", "b1000"], r"b\d+", "b1000"),
    ([], LINUX, None),
])
def test_newest_tag(tags, pattern, expected):
    assert newest_tag(tags, pattern) == expected


@pytest.mark.parametrize("old, new, old_in_new, new_in_old, expected", [
    (None, A, None, None, Verdict.NEW),
    (A, A, True, True, Verdict.IDENTICAL),
    (A, B, True, False, Verdict.AHEAD),
    (A, B, False, True, Verdict.BEHIND),
    (A, B, False, False, Verdict.DIVERGED),
    (A, B, None, None, Verdict.DIVERGED),
])
def test_verdict(old, new, old_in_new, new_in_old, expected):
    assert decide.verdict(old, new, old_in_new=old_in_new, new_in_old=new_in_old) is expected


@pytest.mark.parametrize("v, allow, reason, refused, word", [
    (Verdict.AHEAD, False, None, False, ""),
    (Verdict.NEW, False, None, False, ""),
    (Verdict.IDENTICAL, False, None, False, ""),
    (Verdict.BEHIND, False, None, True, "backwards"),
    (Verdict.DIVERGED, False, None, True, "sideways"),
    (Verdict.DIVERGED, True, None, True, "sideways"),
    (Verdict.DIVERGED, True, "  ", True, "sideways"),
    (Verdict.DIVERGED, False, "why", True, "sideways"),
    (Verdict.BEHIND, True, "upstream reverted a regression", False, ""),
])
def test_refusal(v, allow, reason, refused, word):
    why = decide.refusal(v, what="x", old=A, new=B, allow_rollback=allow, reason=reason)
    assert (why is not None) == refused
    assert word in (why or "")


@pytest.mark.parametrize("pin, ref, expected", [
    ("llama.cpp", "bump/llama.cpp-aaaaaaaaaaaa", True),
    ("llama.cpp", "bump/llama.cpp-1bit-hrx-aaaaaaaaaaaa", False),
    ("llama.cpp-1bit-hrx", "bump/llama.cpp-1bit-hrx-aaaaaaaaaaaa", True),
    ("zinc", "bump/zinc-xyz", False),
    ("zinc", "main", False),
])
def test_is_branch_of(pin, ref, expected):
    assert decide.is_branch_of(pin, ref) is expected
    assert decide.branch_name("zinc", A) == "bump/zinc-aaaaaaaaaaaa"
    assert decide.fork_tag("rocmfpx", B) == "rocmfpx-bbbbbbbbbbbb"


@pytest.mark.parametrize("url, slug, link", [
    ("https://github.com/ggml-org/llama.cpp.git", "ggml-org/llama.cpp", "https://github.com/ggml-org/llama.cpp/compare/aaaaaaaaaaaa...bbbbbbbbbbbb"),
    ("https://github.com/amd/xdna-driver", "amd/xdna-driver", "https://github.com/amd/xdna-driver/compare/aaaaaaaaaaaa...bbbbbbbbbbbb"),
    ("git@github.com:zolotukhin/zinc.git", "zolotukhin/zinc", "https://github.com/zolotukhin/zinc/compare/aaaaaaaaaaaa...bbbbbbbbbbbb"),
    ("file:///tmp/x/ROCm/hrx-system", "ROCm/hrx-system", None),
    ("file:///x", None, None),
])
def test_slug_and_compare(url, slug, link):
    assert decide.repo_slug(url) == slug
    assert decide.compare_url(url, A, B) == link


@pytest.mark.parametrize("text, key, expected", [
    (f"llama.cpp: {A}\nhrx-system: {B}\n", "hrx-system", B),
    (f'{{"pair": {{"llama": "{A.upper()}"}}}}', "pair.llama", A),
    (f"# pair\nexport LLAMA_CPP_COMMIT={A}\nHRX_COMMIT='{B}'\n", "HRX_COMMIT", B),
    (f"llama.cpp: {A}\n", "hrx-system", ValueError),
    ("llama.cpp: main\n", "llama.cpp", ValueError),
])
def test_pair_commit(text, key, expected):
    if expected is ValueError:
        with pytest.raises(ValueError):
            decide.pair_commit(text, key)
    else:
        assert decide.pair_commit(text, key) == expected


def test_pin_changes():
    old = {"a": {"commit": A, "url": "u", "policy": "branch"}, "b": {"commit": A, "url": "u", "policy": "branch"},
           "f": {"commit": A, "url": "f", "policy": "fork-rebase", "upstream": {"url": "up", "commit": A}},
           "gone": {"commit": A, "url": "u", "policy": "branch"}}
    new = {"a": {"commit": B, "url": "u", "policy": "branch"}, "b": {"unresolved": "x", "url": "u", "policy": "branch"},
           "f": {"commit": C, "url": "f", "policy": "fork-rebase", "upstream": {"url": "up", "commit": B}},
           "n": {"commit": C, "url": "u", "policy": "branch"}}
    got = [(c.pin, c.field, c.old, c.new, c.url) for c in decide.pin_changes(old, new)]
    assert got == [("a", "commit", A, B, "u"), ("b", "unresolved", A, None, "u"), ("f", "commit", A, C, "f"),
                   ("f", "upstream.commit", A, B, "up"), ("n", "added", None, C, "u"), ("gone", "removed", A, None, "u")]


@pytest.mark.parametrize("names, cadence, expected", [
    ((), None, ["a", "w"]),
    ((), "all", ["a", "w"]),
    ((), "daily", ["a"]),
    ((), "weekly", ["w"]),
    ((), "manual", ["m"]),
    (("m", "a"), "weekly", ["a", "m"]),
])
def test_select_pins(names, cadence, expected):
    assert decide.select_pins(["a", "m", "w"], names, {"a": "daily", "m": "manual", "w": "weekly"}, cadence) == expected


def test_labels_from_event():
    assert decide.labels_from_event({"pull_request": {"labels": [{"name": "rollback"}, {"name": "x"}]}}) == ["rollback", "x"]
    assert decide.labels_from_event({}) == [] and decide.labels_from_event(None) == []


def _proposal(**kw) -> Proposal:
    base = dict(pin="llama.cpp", policy="release", branch="bump/llama.cpp-bbbbbbbbbbbb",
                moves=(Move("llama.cpp", A, B, "b1", "b2", "https://github.com/o/r/compare/x...y", 42),),
                release_notes="* fixed vulkan", release_url="https://github.com/o/r/releases/b2",
                patch_reports=(("vulkan", "| patch | result | where |\n|---|---|---|\n| 0001-x.patch | applies |  |"),),
                checklist=(("vulkan", ("llama-server --list-devices",)),))
    base.update(kw)
    return Proposal(**base)


def test_pr_body_has_every_section():
    body = decide.render_pr_body(_proposal())
    assert "| llama.cpp | `aaaaaaaaaaaa` (b1) | `bbbbbbbbbbbb` (b2) | 42 | [aaaaaaaaaaaa...bbbbbbbbbbbb](https://github.com/o/r/compare/x...y) |" in body
    assert "### Release notes" in body and "* fixed vulkan" in body and "releases/b2" in body
    assert "### Patch report" in body and "0001-x.patch | applies" in body
    assert "### Hardware checklist" in body and "- [ ] `llama-server --list-devices` (vulkan)" in body
    assert f"<!-- onebit-pins pin=llama.cpp commit={B} -->" in body
    assert "Rollback" not in body
    assert _proposal().title == "Bump llama.cpp to b2"


def test_pr_body_variants():
    branch = decide.render_pr_body(_proposal(policy="branch", release_notes=None, patch_reports=(), checklist=()))
    assert "Release notes" not in branch and "No recipe carries patch files" in branch and "no recipe lists" in branch
    rb = _proposal(rollback_reason="upstream reverted", verdict=Verdict.DIVERGED)
    assert "**Rollback** (diverged): upstream reverted" in decide.render_pr_body(rb) and rb.title.startswith("Rollback")
    huge = decide.render_pr_body(_proposal(release_notes="x" * 100_000))
    assert len(huge) < decide.BODY_LIMIT and "(truncated)" in huge
    fork = decide.render_pr_body(_proposal(policy="fork-rebase", kept_tag="rocmfpx-aaaaaaaaaaaa",
                                           companions=(("huggingface r revision", A, B),)))
    assert "tag `rocmfpx-aaaaaaaaaaaa`" in fork and "| huggingface r revision | `" in fork


def test_pr_body_build_flag_report_and_hold():
    plain = decide.render_pr_body(_proposal())
    assert "### Build-flag report" in plain and "No recipe builds from this pin." in plain and "Held" not in plain
    held = _proposal(flag_reports=("**ds4-cpu**: `make cpu` at `a` → `b`\n\n| result | ...",),
                     held=("ds4-cpu: -O3: dropped by our `make cpu` (Makefile:11)",))
    body = decide.render_pr_body(held)
    assert held.title == "Bump llama.cpp to b2 (held)"
    assert body.index("> **Held**") < body.index("| what | old | new |")  # the reason comes first
    assert "> - ds4-cpu: -O3: dropped by our `make cpu` (Makefile:11)" in body and "`held` label" in body
    assert body.index("### Patch report") < body.index("**ds4-cpu**: `make cpu`") < body.index("### Hardware checklist")


@pytest.mark.parametrize("value, rendered", [
    (A, A), ("v6.18-rc4", "v6.18-rc4"), ("b7000", "b7000"), ("1.0", '"1.0"'), ("true", '"true"'),
    ("null", '"null"'), ("a: b", '"a: b"'), ("#x", '"#x"'), (None, "null"), ("x y", "x y"),
])
def test_render_scalar(value, rendered):
    assert render_scalar(value) == rendered


PINS = """\
# top comment
schema_version: 1
pins:
  # the zinc pin
  zinc:
    url: https://github.com/zolotukhin/zinc.git   # canonical
    policy: branch
    branch: main
    commit: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'  # pinned
    cadence: daily
    license: MIT
    mirrors: []
  linux:
    url: https://github.com/torvalds/linux.git
    policy: tag-pattern
    tag_pattern: '^v(\\d+)\\.(\\d+)(-rc\\d+)?$'
    unresolved: >-
      nothing known yet, a long
      folded reason
    # keep me
    cadence: weekly
    license: GPL-2.0-only
    mirrors: []
  laya:
    url: https://github.com/x/laya.git
    policy: branch
    branch: main
    commit: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    cadence: daily
    license: Apache-2.0
    companions:
      huggingface:
        repo: o/laya
        unresolved: not known
        files:
          model.safetensors: null
          tokenizer/tokenizer.json: 111111111111111111111111111111111111111111111111111111111111111f
    mirrors: []
"""


def _diff(a: str, b: str) -> list[str]:
    return [l for l in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0) if l[:1] in "+-" and l[:3] not in ("+++", "---")]


def test_edit_touches_only_the_intended_lines():
    new = edit_pins(PINS, [Edit(("pins", "zinc", "commit"), B, replaces="unresolved")])
    assert _diff(PINS, new) == [f"-    commit: '{A}'  # pinned", f"+    commit: {B}  # pinned"]
    new = edit_pins(PINS, [Edit(("pins", "linux", "commit"), C, replaces="unresolved", after=("policy",)),
                           Edit(("pins", "linux", "tag"), "v6.18", after=("commit",))])
    assert _diff(PINS, new) == ["-    unresolved: >-", "-      nothing known yet, a long", "-      folded reason",
                                f"+    commit: {C}", "+    tag: v6.18"]
    assert "    # keep me\n" in new
    base = ("pins", "laya", "companions", "huggingface")
    new = edit_pins(PINS, [Edit(base + ("revision",), B, replaces="unresolved", after=("repo",)),
                           Edit(base + ("files", "model.safetensors"), "2" * 64)])
    assert _diff(PINS, new) == ["-        unresolved: not known", f"+        revision: {B}",
                                "-          model.safetensors: null", f'+          model.safetensors: "{"2" * 64}"']  # all digits: quoted so it stays a string


def test_edit_of_the_real_pins_file_is_one_line():
    path = Path(__file__).resolve().parent.parent / "pins.yaml"
    text = path.read_text()
    new = edit_pins(text, [Edit(("pins", "llama.cpp", "commit"), B, replaces="unresolved")], where=path)
    assert len(_diff(text, new)) == 2 and all("commit:" in l for l in _diff(text, new))


def test_edit_refuses_what_it_cannot_do_exactly():
    with pytest.raises(OnebitError, match="not be valid"):
        edit_pins(PINS, [Edit(("pins", "zinc", "commit"), "not-a-sha")])
    weird = PINS.replace(f"commit: '{A}'  # pinned", f"commit:\n      {A}")
    with pytest.raises(OnebitError, match="one-line scalar"):
        edit_pins(weird, [Edit(("pins", "zinc", "commit"), B)])


def test_edits_of_the_real_pins_file_insert_and_replace_cleanly():
    path = Path(__file__).resolve().parent.parent / "pins.yaml"
    text = path.read_text()
    from builders.project.yamlio import load_text
    pins = load_text(text, path).data["pins"]
    edits = []
    for name, pin in pins.items():
        if pin.get("policy") in ("fork-rebase", "fork-merge") and "commit" not in pin["upstream"]:
            edits.append(Edit(("pins", name, "upstream", "commit"), C, after=("branch", "url")))
        if "unresolved" in pin:
            edits.append(Edit(("pins", name, "commit"), B, replaces="unresolved", after=("policy",)))
    if not edits:
        pytest.skip("pins.yaml has no unresolved pin and no fork without upstream.commit")
    new = edit_pins(text, edits, where=path)
    added = [l for l in _diff(text, new) if l.startswith("+")]
    assert sorted(added) == sorted(f"+{' ' * (6 if len(e.path) == 4 else 4)}commit: {e.value}" for e in edits)
    assert all(l.startswith("-") and ("unresolved" in l or l.startswith("-      ")) for l in _diff(text, new) if not l.startswith("+"))


@pytest.mark.parametrize("names, want", [
    ([], {"pins": [], "roots": [], "toolchains": []}),
    (["llama.cpp", "root:strix-sid", "toolchain:zig", "zinc"],
     {"pins": ["llama.cpp", "zinc"], "roots": ["strix-sid"], "toolchains": ["zig"]}),
    (["root:toolchain:x", "toolchain:root:y"], {"pins": [], "roots": ["toolchain:x"], "toolchains": ["root:y"]}),
])
def test_a_name_picks_its_mover_by_prefix(names, want):
    """`pins bump NAME...`: each kind of the registry (pins, then roots, then toolchain inputs) takes its own names."""
    from builders.pins import movers

    assert list(movers.MOVERS) == ["pins", "roots", "toolchains"]
    assert {k: movers.picked(names, m.prefix) for k, m in movers.MOVERS.items()} == want
