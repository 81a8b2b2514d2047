"""The pin bot delivers build roots like pins: `pins bump --report` (no token) leaves roots.json and writes nothing into
the checkout; `--from-report --open-pr` (the token holder) reads it back strictly against the committed
roots/<name>.yaml and opens one PR per moved root. Real git (a bare origin on disk), the fake GitHub of the pins tests
on 127.0.0.1, and a Debian archive on disk (a real Packages.xz that moves between runs)."""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builders.roots import assemble as roots
from builders.pins import roots as roots_bump
from builders.pins.__main__ import main
from builders.project.root_pins import Change, load_roots
from pins_fixtures import (FakeAPI, Project, Upstream, bot_env, branch_pin, branches, bump, evaluate_report, git,
                           refused_tampered, refused_unread)

TOKEN = "t0ken-for-root-tests"
HEAD = ("# a test root: this comment and the requests above the generated part are kept byte for byte\n"
        "schema_version: 1\nname: t\nsummary: test\nessential: false\nsuites: [{suite: sid}]\npackages: [app]\n")
V1 = (("app", "1.0-1", "libx1"), ("libx1", "1.0-1", ""))
V2 = (("app", "1.1-1", "libx1 (>= 1.1), liby"), ("libx1", "1.1-1", ""), ("liby", "2-1", ""))
V3 = (("app", "1.2-1", "libx1 (>= 1.1), liby"), ("libx1", "1.1-1", ""), ("liby", "2-1", ""))


def packages(entries) -> bytes:
    text = "\n".join(f"Package: {n}\nVersion: {v}\nArchitecture: amd64\n" + (f"Depends: {d}\n" if d else "")
                     + f"Filename: pool/main/{n[0]}/{n}/{n}_{v}_amd64.deb\nSize: 100\n"
                     + f"SHA256: {hashlib.sha256(f'{n} {v}'.encode()).hexdigest()}\n"
                     for n, v, d in entries)
    return lzma.compress(text.encode())


class Archive:
    def __init__(self, tmp: Path):
        self.root = tmp / "debian"
        self.index = self.root / "dists" / "sid" / "main" / "binary-amd64" / "Packages.xz"
        self.index.parent.mkdir(parents=True)

    def publish(self, entries) -> None:
        self.index.write_bytes(packages(entries))


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A git project (pins.yaml with one current pin, roots/t.yaml resolved against V1 and committed) with a bare
    origin, the Debian archive, and the fake GitHub."""
    api = FakeAPI()
    archive = Archive(tmp_path)
    archive.publish(V1)
    bot_env(monkeypatch, api, TOKEN, archive=archive.root)
    up = Upstream(tmp_path / "owner" / "tool")
    sha = up.commit("one")
    proj = Project(tmp_path, branch_pin("tool", up.url, sha))
    (proj.root / "roots").mkdir()
    (proj.root / "roots" / "t.yaml").write_text(HEAD)
    assert main(["--root", str(proj.root), "bump", "root:t"]) == 0  # the first resolution, written in place
    proj.commit_all("the root t")
    git(proj.root, "push", "--quiet", "origin", "main")
    yield proj, archive, api
    api.close()


def root_text(proj: Project) -> str:
    return (proj.root / "roots" / "t.yaml").read_text()


def evaluate(proj: Project, out: Path, monkeypatch, *names: str) -> dict:
    """The evaluating job: no token in the environment."""
    return evaluate_report(proj, out, monkeypatch, TOKEN, roots_bump.REPORT, *names)


def resolve_in_place(proj: Project, tmp: Path) -> str:
    """What `roots resolve` (builders.roots.assemble.resolve_file, write=True) writes for the committed file now."""
    copy = tmp / "copy"
    shutil.copytree(proj.root / "roots", copy)
    found, problems = load_roots(copy)
    assert not problems
    roots.resolve_file(found["t"], write=True)
    return (copy / "t.yaml").read_text()


def without_snapshot(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("snapshot:"))


# ---- pure decisions ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, older, allowed, want", [
    (0, [], False, "current"),
    (0, [], True, "current"),
    (2, [], False, "would-propose"),
    (2, ["app: 1.1-1 (sid) -> 1.0-1 (sid)"], False, "held"),
    (2, ["app: 1.1-1 (sid) -> 1.0-1 (sid)"], True, "would-propose"),
])
def test_what_a_re_resolution_does_to_a_root(changes, older, allowed, want):
    assert roots_bump.decision(changes, older, allowed) == want


@pytest.mark.parametrize("name, ref, want", [
    ("t", "onebit/bump-root-t-0123456789ab", True),
    ("t", "onebit/bump-root-t-x-0123456789ab", False),  # root t-x's
    ("t-x", "onebit/bump-root-t-x-0123456789ab", True),
    ("t", "onebit/bump-root-t-0123456789", False),
    ("t", "bump/t-0123456789ab", False),  # a pin's
])
def test_a_root_knows_its_own_branches(name, ref, want):
    assert roots_bump.is_branch_of(name, ref) is want


def test_the_branch_is_named_by_the_new_file():
    assert roots_bump.branch_name("t", "x") == "onebit/bump-root-t-" + roots_bump.digest("x")[:12]
    assert roots_bump.branch_name("t", "x") != roots_bump.branch_name("t", "y")


def test_the_pr_body_lists_the_changes_and_the_snapshot():
    changes = [Change("app", "1.0-1 (sid)", "1.1-1 (sid)"), Change("liby", None, "2-1 (sid)")]
    body = roots_bump.pr_body("t", changes, "20261201T000000Z", "text")
    assert "- `app: 1.0-1 (sid) -> 1.1-1 (sid)`" in body and "- `liby: added 2-1 (sid)`" in body
    assert "`20261201T000000Z`" in body and "### Changes (2)" in body and "Rollback" not in body
    assert roots_bump.pr_title("t", 2) == "roots: move t (2 packages changed)"


# ---- the two jobs -------------------------------------------------------------------------------------------------------------
def test_evaluate_then_deliver_opens_one_pr_holding_exactly_the_new_root(world, tmp_path, monkeypatch, capsys):
    proj, archive, api = world
    committed = root_text(proj)
    head = git(proj.root, "rev-parse", "HEAD")
    archive.publish(V2)
    out = tmp_path / "artifact"
    data = evaluate(proj, out, monkeypatch)  # the workflow's evaluating job (every pin and root of its cadence)
    assert {"report.json", "drift-results.json", "roots.json"} <= {p.name for p in out.iterdir()}
    [entry] = data["roots"]
    assert entry["name"] == "t" and entry["state"] == "would-propose"
    assert entry["base_sha256"] == roots_bump.digest(committed)
    # nothing is written into the checkout: the move lives only in the report
    assert root_text(proj) == committed and git(proj.root, "status", "--porcelain") == ""
    assert not api.state.opened() and branches(proj) == ["main"]
    # the report's file is exactly what `roots resolve` writes (but for the timestamp of the run)
    assert without_snapshot(entry["text"]) == without_snapshot(resolve_in_place(proj, tmp_path))
    assert entry["text"].startswith(HEAD)

    assert bump(proj, "--from-report", str(out), "--open-pr") == 0
    [pr] = api.state.opened()
    branch = roots_bump.branch_name("t", entry["text"])
    assert pr["head"]["ref"] == branch and pr["base"]["ref"] == "main"
    assert pr["title"] == "roots: move t (3 packages changed)"
    for line in ("app: 1.0-1 (sid) -> 1.1-1 (sid)", "libx1: 1.0-1 (sid) -> 1.1-1 (sid)", "liby: added 2-1 (sid)"):
        assert f"- `{line}`" in pr["body"]
    snapshot = next(ln for ln in entry["text"].splitlines() if ln.startswith("snapshot:")).split('"')[1]
    assert f"Snapshot: `{snapshot}`" in pr["body"]
    # the branch is one commit on main that changes exactly roots/t.yaml, to the report's text
    origin = proj.origin.path
    assert git(origin, "rev-parse", f"refs/heads/{branch}^") == head
    assert git(origin, "diff", "--name-only", "main", f"refs/heads/{branch}") == "roots/t.yaml"
    assert proj.origin.show(f"refs/heads/{branch}", "roots/t.yaml") == entry["text"]
    assert root_text(proj) == committed and git(proj.root, "rev-parse", "HEAD") == head  # the checkout untouched

    capsys.readouterr()
    assert bump(proj, "--from-report", str(out), "--open-pr") == 0  # delivered twice: nothing new
    assert len(api.state.opened()) == 1 and "already-proposed" in capsys.readouterr().out

    archive.publish(V3)  # the suite moves on: a new PR, and the older one of the same root is superseded
    out2 = tmp_path / "artifact2"
    newer = evaluate(proj, out2, monkeypatch)["roots"][0]
    assert bump(proj, "--from-report", str(out2), "--open-pr") == 0
    first, second = api.state.opened()
    assert second["head"]["ref"] == roots_bump.branch_name("t", newer["text"]) != first["head"]["ref"]
    assert second["title"] == "roots: move t (3 packages changed)" and "app: 1.0-1 (sid) -> 1.2-1 (sid)" in second["body"]
    assert (first["state"], second["state"]) == ("closed", "open")
    assert api.state.comments == [(1, f"Superseded by #2 ({second['head']['ref']}).")]


def test_open_pr_evaluates_and_delivers_in_one_process(world, capsys):
    proj, archive, api = world
    committed = root_text(proj)
    archive.publish(V2)
    assert bump(proj, "root:t", "--open-pr", "--dry-run") == 0
    assert "would-propose" in capsys.readouterr().out and not api.state.opened() and branches(proj) == ["main"]
    assert bump(proj, "root:t", "--open-pr") == 0
    [pr] = api.state.opened()
    assert roots_bump.is_branch_of("t", pr["head"]["ref"]) and pr["title"] == "roots: move t (3 packages changed)"
    assert root_text(proj) == committed


def test_a_root_edited_but_not_committed_is_not_proposed(world, capsys):
    proj, archive, api = world
    archive.publish(V2)
    (proj.root / "roots" / "t.yaml").write_text(root_text(proj).replace("summary: test", "summary: changed"))
    assert bump(proj, "root:t", "--open-pr") == 2
    err = capsys.readouterr().err
    assert "made from another roots/t.yaml" in err and "Traceback" not in err
    assert not api.state.opened() and branches(proj) == ["main"]


def test_a_held_root_opens_no_pr_unless_a_rollback_is_allowed(world, tmp_path, monkeypatch, capsys):
    proj, archive, api = world
    archive.publish(V2)
    assert bump(proj, "root:t") == 0  # a local run writes the file in place, as before
    proj.commit_all("t moved")
    git(proj.root, "push", "--quiet", "origin", "main")
    archive.publish(V1)  # the suite went back
    out = tmp_path / "artifact"
    [entry] = evaluate(proj, out, monkeypatch, "root:t")["roots"]
    assert entry["state"] == "held" and "app: 1.1-1 (sid) -> 1.0-1 (sid)" in entry["detail"]
    capsys.readouterr()
    assert bump(proj, "root:t", "--from-report", str(out), "--open-pr") == 1
    res = capsys.readouterr()
    assert "held" in res.out and "app: 1.1-1 (sid) -> 1.0-1 (sid)" in res.err and "--allow-rollback" in res.out
    assert not api.state.opened() and branches(proj) == ["main"]

    assert bump(proj, "root:t", "--from-report", str(out), "--open-pr", "--allow-rollback",
                "--reason", "experimental dropped the upload") == 0
    [pr] = api.state.opened()
    assert "**Rollback**: experimental dropped the upload" in pr["body"] and "> - app: 1.1-1 (sid) -> 1.0-1 (sid)" in pr["body"]
    assert api.state.labels[pr["number"]] == ["rollback"]


# ---- a report tampered with -------------------------------------------------------------------------------------------------
def _other_base(e: dict) -> None:
    e["base_sha256"] = "0" * 64


def _other_name(e: dict) -> None:
    e["text"] = e["text"].replace("name: t\n", "name: u\n")


def _schema_invalid(e: dict) -> None:
    e["text"] = e["text"].replace("sha256: ", "sha256: X", 1)


def _unknown_root(e: dict) -> None:
    e["name"] = "nonesuch"


def _oversize(e: dict) -> None:
    e["text"] = e["text"] + "#" * (roots_bump.MAX_FILE + 1)


def _hand_part(e: dict) -> None:
    e["text"] = e["text"].replace("packages: [app]", "packages: [app, liby]")


def _not_json_shape(e: dict) -> None:
    e["extra"] = 1


def _current_with_text(e: dict) -> None:
    e["state"] = "current"


@pytest.mark.parametrize("tamper, says", [
    (_other_base, "made from another roots/t.yaml"),
    (_other_name, "root name 'u' must match its file name 't'"),
    (_schema_invalid, "sha256"),
    (_unknown_root, "'nonesuch' is not a build root of this checkout"),
    (_oversize, "text longer than"),
    (_hand_part, "the bot changes only the generated snapshot and resolved part"),
    (_not_json_shape, "unknown field 'extra'"),
    (_current_with_text, "a current root carries no new file"),
])
def test_a_tampered_roots_report_is_refused_in_one_line_and_nothing_is_pushed(world, tmp_path, monkeypatch, capsys,
                                                                             tamper, says):
    proj, archive, api = world
    archive.publish(V2)
    out = tmp_path / "artifact"
    data = evaluate(proj, out, monkeypatch, "root:t")
    tamper(data["roots"][0])
    (out / roots_bump.REPORT).write_text(json.dumps(data))
    refused_tampered(proj, api, capsys, out / roots_bump.REPORT, says, "root:t")


def test_a_report_without_roots_json_is_refused(world, tmp_path, capsys):
    proj, _, api = world
    (tmp_path / "empty").mkdir()
    assert bump(proj, "root:t", "--from-report", str(tmp_path / "empty"), "--open-pr") == 2
    assert "cannot read roots.json" in capsys.readouterr().err and not api.state.opened()


def test_the_cli_module_runs_as_the_workflow_runs_it(world, tmp_path):
    """`1bit-build pins bump ... --report` as its own process without any token: exit 0 and roots.json."""
    proj, archive, _ = world
    archive.publish(V2)
    top = Path(__file__).resolve().parents[1]
    env = {**{k: v for k, v in os.environ.items() if k != "ONEBIT_BOT_TOKEN"}, "PYTHONPATH": str(top)}
    proc = subprocess.run([sys.executable, "-c", "import sys; from builders.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "--root", str(proj.root), "pins", "bump", "root:t",
                           "--report", str(tmp_path / "r")], env=env, capture_output=True, text=True, timeout=300, cwd=top)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r" / "roots.json").read_text())["roots"][0]["state"] == "would-propose"


@pytest.mark.parametrize("entry, says", [
    ({"name": "*", "state": "error", "detail": "roots/x.yaml:3: bad", "base_sha256": None, "text": None}, None),
    ({"name": "*", "state": "error", "detail": "d", "base_sha256": "0" * 64, "text": None}, "carries no text"),
    ({"name": "t", "state": "refused", "detail": "d", "base_sha256": roots_bump.digest("committed"), "text": None}, None),
    ({"name": "t", "state": "proposed", "detail": "d", "base_sha256": None, "text": None}, "unknown state 'proposed'"),
    ({"name": "t", "state": "current", "detail": 3, "base_sha256": None, "text": None}, "expected text"),
])
def test_roots_json_entries_read_without_a_file_to_move(entry, says):
    """The entries that move nothing: an evaluating side's error is told again (a roots/ that does not load does not
    stop the pins' PRs), a refusal passes with its base checked; any other shape is one ReportError."""
    from builders.pins.report import ReportError

    data = {"version": 1, "roots": [entry]}
    if says is None:
        [move] = roots_bump.read_report(data, {"t"}, lambda name: "committed", False)
        assert (move.name, move.state, move.detail, move.text) == (entry["name"], entry["state"], entry["detail"], None)
    else:
        with pytest.raises(ReportError, match=says):
            roots_bump.read_report(data, {"t"}, lambda name: "committed", False)


# ---- a roots.json (or report.json, drift-results.json) that is not the artifact's plain file ---------------------------
@pytest.mark.parametrize("form", ["dev_zero", "fifo", "directory", "too_large", "link"])
def test_a_roots_json_that_is_not_a_plain_file_is_refused_in_one_line_without_reading_it(world, tmp_path, monkeypatch,
                                                                                      form):
    """The token holder as its own process under an address-space limit: a link to /dev/zero is never read (it was
    a MemoryError), a FIFO never blocks, a file past the bound is refused on the bytes read, not on a stat."""
    proj, archive, api = world
    archive.publish(V2)
    out = tmp_path / "artifact"
    evaluate(proj, out, monkeypatch, "root:t")
    refused_unread(proj, api, out / roots_bump.REPORT, roots_bump.MAX_REPORT, form, "root:t")


@pytest.mark.parametrize("name", ["report.json", "drift-results.json"])
@pytest.mark.parametrize("form", ["dev_zero", "fifo"])
def test_the_pins_report_files_are_read_back_bounded_too(world, tmp_path, monkeypatch, name, form):
    """report.json and drift-results.json of the same artifact, through the same reader (builders/io/readfile.py)."""
    from builders.pins.report import MAX_FILE

    proj, _, api = world
    out = tmp_path / "artifact"
    evaluate(proj, out, monkeypatch, "tool")
    refused_unread(proj, api, out / name, MAX_FILE, form, "tool")
