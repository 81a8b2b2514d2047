"""release.yml, replayed: its job graph read from the file (tests/workflow_replay.py), every job in its own clone with
its own cache, on a fixture project whose recipes carry the names the workflow uses (tests/release_fixture.py).

The hosted jobs build for real (cmake, ninja, cc, make); the Strix Halo jobs run on recording toolchains (TheRock,
XRT, the kernel build, zig) and pass their recipes' checklists against the fake hardware the runner model lists; the
CUDA jobs fan out once per architecture. Only what a job uploads reaches the jobs that download it. The final job
assembles the release from those artifacts, builds nothing (its build tools record every call: none), and publishes
to the fake GitHub API.

Before all that, the first job merges the pin bot's bump pull requests: the jobs clone from, and that job pushes to, a
real bare git "origin" of the fixture project holding three bump branches, whose CI results the fake GitHub API serves
(one passing, with its hardware checklist passed; one failing CI; one waiting for its hardware checklist). The passing
one is merged and pushed, every later job builds the merged commit, and the release is created at it. The first job
alone is replayed again with no bump open, with the push refused by the origin, and in a run that does not publish.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from dataclasses import dataclass

import pytest
import yaml
from github_fake import TOKEN, Fake
from mini_project import git
from release_fixture import REPO, Fixture, clean_env, make_fixture, shim_versions
from workflow_replay import Replay, RunnerModel

from builders.io import tarball
from builders.release import bumps as bump_merge
from builders.release import changes as release_changes
from builders.release import notes as release_notes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
BUILD_TOOLS = ("cmake", "ninja", "make", "cc", "c++", "gcc", "g++", "ld", "zig", "cargo", "rustc", "nvcc", "glslc")
APT_TOOLS = {"glslc": ["glslc"]}  # the apt packages a job names -> the programs they would put on PATH


BUMPS = "merge the passing bumps"  # the first job's name in release.yml
NEW_TAG = "v1.1"  # the upstream release the pin bot's bumps move to


@dataclass
class Bumps:
    """The bump pull requests of a replay: pin -> (branch, head commit), and the commit they move their pin to."""
    heads: dict[str, tuple[str, str]]
    new: str

    def branch(self, pin: str) -> str:
        return self.heads[pin][0]


def open_bumps(fx: Fixture, fake: Fake, pins=("llama.cpp", "ds4", "rocmfpx")) -> Bumps:
    """Bump branches for `pins` (all to the upstream's new release) and their pull requests, with what CI recorded:
    llama.cpp passes, and vulkan's hardware checklist (llama.cpp feeds it) passed on its runner; ds4 fails a CI job;
    rocmfpx passes CI but lean's hardware checklist has not run on it."""
    new = fx.upstream_release(NEW_TAG)
    heads = {pin: fx.bump_branch(pin, new, NEW_TAG) for pin in pins}
    for pin, (branch, head) in heads.items():
        fake.pull(branch, head)
        fake.check(head, "tests", "success")
    if "llama.cpp" in heads:
        fake.status(heads["llama.cpp"][1], bump_merge.GATE + "vulkan", "success", "passed on strix-halo-1")
    if "ds4" in heads:
        fake.check(heads["ds4"][1], "build (cpu)", "failure",
                   job={"steps": [{"name": "Set up job", "conclusion": "success"},
                                  {"name": "Build", "conclusion": "failure"}]},
                   log="2026-11-29T03:30:00.0000000Z cc -O2 -o ds4 ds4.c\n"
                       "2026-11-29T03:30:01.0000000Z ds4.c:1:10: fatal error: ds4.h: No such file or directory\n"
                       "2026-11-29T03:30:01.5000000Z make: *** [Makefile:2: cpu] Error 1\n")
    return Bumps(heads, new)


def runner_for(fx: Fixture, fake: Fake, base: Path, logs: Path):
    """The runner model of each job: hosted runners with the test's environment, the Strix Halo runner with its
    recording toolchains, the assembling job with build tools that only record."""
    venv_bin = str(Path(sys.executable).parent)

    def apt(packages, jobdir):
        return [str(fx.shim_dir(jobdir / "apt-bin", [t for p in packages for t in APT_TOOLS.get(p, [])]))]

    def runner(job):
        env = {**clean_env(), "ONEBIT_SHIM_VERSIONS": shim_versions(), "ONEBIT_GITHUB_API": fake.url,
               "CCACHE_DISABLE": "1", "ONEBIT_SHIM_LOG": str(logs / (re.sub(r"\W+", "_", job.key) + ".jsonl")),
               "ONEBIT_SHIM_ENV": "CC,CXX,KERNEL_SRC,DESTDIR"}
        system = ["/usr/local/bin", "/usr/bin", "/bin"]
        if job.job == "fresh":
            # the README on fresh Debian roots: the job runs builders.fresh for real up to its plan (each root's
            # mmdebstrap command and steps) and makes no root: tests/test_fresh.py covers what it decides, and
            # `nox -s fresh` makes the roots
            env["ONEBIT_FRESH_DRY_RUN"] = "1"
        if job.runs_on == "ubuntu-24.04":
            path = [venv_bin, *system]  # setup-python + `pip install -e .`: the test's own environment
            if job.job == "release":  # the assembling job must build nothing: its build tools only record
                path.insert(0, str(fx.shim_dir(base / "shims" / "release", BUILD_TOOLS)))
            return RunnerModel(env={**env, "PATH": ":".join(path)}, apt=apt)
        if job.runs_on == ["self-hosted", "strix-halo"]:
            shims = fx.shim_dir(base / "shims" / "strix", ["cmake", "make", "zig", "glslc"])
            return RunnerModel(env={**env, **fx.strix_env(), "PATH": ":".join([str(shims), *system])},
                               venv=fx.strix_venv(base / "strix-venv", Path(sys.prefix)))
        raise AssertionError(f"{job.key}: no runner model for runs-on {job.runs_on!r}")

    return runner


def github_context(start: str, event: str = "schedule") -> dict:
    return {"token": TOKEN, "repository": REPO, "event_name": event, "sha": start, "ref": "refs/heads/main"}


@dataclass
class Run:
    rp: Replay
    results: dict
    fake: Fake
    logs: Path
    base: Path
    origin: Path
    start: str  # the branch's commit when the run began (what actions/checkout of github.ref gets)
    pinned: str  # the upstream commit every pin is at before a bump
    bumps: Bumps | None


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    base = tmp_path_factory.mktemp("replay")
    fx = make_fixture(base / "fixture")
    fake = Fake()
    logs = base / "shim-logs"
    logs.mkdir()
    opened = open_bumps(fx, fake)
    origin = fx.origin(base / "origin.git")
    start = git(origin, "rev-parse", "refs/heads/main")
    # jobs whose needs are met run at once, as on GitHub; ONEBIT_REPLAY_PARALLEL=1 runs them one by one (each job's
    # own time, uncontended: what the GitHub model below is best fed with)
    parallel = int(os.environ.get("ONEBIT_REPLAY_PARALLEL") or 16)
    rp = Replay(WORKFLOW, repo_url=f"file://{origin}", base=base, runner=runner_for(fx, fake, base, logs),
                github=github_context(start), max_parallel=parallel)
    try:
        results = rp.run()
        yield Run(rp, results, fake, logs, base, origin, start, fx.commit, opened)
    finally:
        fake.close()


def calls(logs: Path, key: str) -> list[dict]:
    log = logs / (re.sub(r"\W+", "_", key) + ".jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def built_steps(res) -> tuple[int, int]:
    """(steps run, build steps) as the job's release-part reported them."""
    for step in res.steps:
        if step.kind == "body" and step.log:
            m = re.search(r"(\d+) step\(s\) ran \((\d+) build\)", step.log.read_text())
            if m:
                return int(m[1]), int(m[2])
    return 0, 0


def test_the_job_graph_runs_and_the_final_job_builds_nothing(replay):
    results, fake, logs = replay.results, replay.fake, replay.logs
    failed = {k: r.error for k, r in results.items() if r.status != "success"}
    assert not failed, failed
    assert sorted(results) == sorted([
        BUMPS, "decide the tag", "build cpu", "build strix-hosted",
        *[f"build cuda {a}" for a in ("80-virtual", "86-real", "89-real", "90-real", "120-real")],
        *[f"build and gate {p} (Strix Halo)" for p in ("hrx", "lean-rocm", "xdna", "zinc", "ds4-rocm")],
        "the README on fresh Debian roots", "release"])
    tag = results["decide the tag"].outputs["tag"]
    assert re.fullmatch(r"v\d{4}\.\d{2}", tag)

    # every build job uploaded its own part and nothing else: its packages, manifest, toolchain.json (no hidden files)
    parts = {}
    for key, res in results.items():
        if res.job.job in ("hosted", "cuda", "strix-halo"):
            [(name, files)] = res.uploaded.items()
            part = res.job.matrix.get("part") or f"cuda-{res.job.matrix['arch']}"
            assert name == f"built-{part}"
            assert {"toolchain.json", "manifest.json", "SHA256SUMS"} <= set(files)
            top = {f.split("/")[0] for f in files} - {"toolchain.json", "manifest.json", "SHA256SUMS", "gate.json", "channel"}
            assert len(top) == 1 and re.fullmatch(rf"onebit-(cpu|nvidia|strix)-{tag[1:]}-0-linux-64\.tar\.zst", top.pop())
            assert not [f for f in files if f.startswith(".") or "/." in f]  # hidden files stay behind
            parts[part] = sorted(Path(f).name for f in files if f.endswith(".conda") and "onebit-bundle-" not in f)
            assert built_steps(res)[1] >= 1  # it built
    assert parts["cpu"] == sorted(p for p in parts["cpu"] if p.startswith(("onebit-cpu-", "onebit-serve-")))
    assert len(parts["cpu"]) == 2 and all(len(parts[f"cuda-{a}"]) == 1 for a in ("80-virtual", "90-real"))

    # the hardware jobs ran on recording toolchains, with the recipe's own commands, and passed their gates
    hrx = [c["argv"] for c in calls(logs, "build and gate hrx (Strix Halo)") if c["tool"] == "cmake" and "-S" in c["argv"]]
    assert len(hrx) == 1 and {"-DGGML_HRX=ON", "-DGGML_VULKAN=ON"} <= set(hrx[0])
    assert {c["tool"] for c in calls(logs, "build and gate zinc (Strix Halo)")} >= {"zig"}
    xdna = calls(logs, "build and gate xdna (Strix Halo)")
    assert [c["argv"] for c in xdna if c["tool"] == "xrt-smi"][-2:] == [["examine"], ["validate"]]
    for part in ("hrx", "lean-rocm", "xdna", "zinc", "ds4-rocm"):
        ws = results[f"build and gate {part} (Strix Halo)"].workspace
        gate = json.loads((ws / "built" / part / "gate.json").read_text())
        assert gate["passed"], gate
    # the CUDA jobs asked the pinned nvcc its version, and built their one architecture
    assert {c["tool"] for c in calls(logs, "build cuda 90-real")} == {"nvcc"}

    # the final job: artifacts in, nothing built (no build tool was called, no build dir, no step stamp)
    rel = results["release"]
    assert calls(logs, "release") == []
    assert not (rel.workspace / ".onebit" / "work").exists()
    assert not list((rel.home / ".cache").rglob("steps/*.json")) if (rel.home / ".cache").exists() else True
    assert set(rel.downloaded) == {f"built-{p}" for p in parts} | {"bumps"}
    assert rel.downloaded["bumps"] == ["bumps.json"]
    # only what the jobs uploaded reached it: its built/ holds exactly the downloaded parts
    here = sorted(p.relative_to(rel.workspace / "built").as_posix() for p in (rel.workspace / "built").rglob("*")
                  if p.is_file())
    assert here == sorted(f"{name}/{f}" for name, files in rel.downloaded.items() if name != "bumps" for f in files)
    dist = rel.workspace / "dist"
    names = sorted(p.name for p in dist.iterdir())
    assert set(rel.attested) == set(names)
    # published to the (fake) GitHub API: the tag the first job decided, every file once
    [release] = fake.releases.values()
    assert (release["tag_name"], release["draft"]) == (tag, False)
    assert sorted(a["name"] for a in fake.assets.values()) == names
    # what was attested is what was published (the publish step assembled the same bytes again)
    assert {a["name"]: a["digest"].removeprefix("sha256:") for a in fake.assets.values()} == rel.attested
    assert release["body"] == (dist / "notes.md").read_text()


def test_the_readme_on_fresh_roots_runs_before_the_release(replay):
    res = replay.results["the README on fresh Debian roots"]
    [body] = [st for st in res.steps if st.kind == "body"]
    assert body.rc == 0 and body.command == "python -m builders.fresh --sudo bookworm trixie"
    log = body.log.read_text()
    for suite in ("bookworm", "trixie"):
        assert f"fresh: {suite}: would run mmdebstrap --mode=root --variant=minbase" in log
        assert f"fresh: {suite}: would run, as root in the root at /src/onebit-build: python3 scripts/nox.py -s build-cpu" \
            in log


def test_what_the_builds_knew_reached_the_release(replay):
    results, base = replay.results, replay.base
    tag = results["decide the tag"].outputs["tag"]
    dist = results["release"].workspace / "dist"
    names = {p.name for p in dist.iterdir()}
    assert {f"1bit-cpu-{tag}-linux-x86_64.tar.zst", f"1bit-strix-{tag}-linux-x86_64.tar.zst"} <= names
    assert {f"1bit-nvidia-sm_{a}-{tag}-linux-x86_64.tar.zst" for a in (80, 86, 89, 90, 120)} <= names
    # lean-rocm's archive is named with the TheRock major.minor Lemonade asks for (release.yaml, read from Lemonade's
    # source), not the ROCm any runner has
    therock = yaml.safe_load((ROOT / "release.yaml").read_text())["lemonade"]["therock"]
    assert f"llama-{tag}-bin-ubuntu-rocm-{therock}-x64.tar.gz" in names
    # one Lemonade cuda archive per architecture, each holding that architecture's own build
    for arch in ("80-virtual", "90-real", "120-real"):
        sm = f"sm_{arch.split('-')[0]}"
        archive = dist / f"llama-{tag}-ubuntu-cuda-{sm}-x64.tar.xz"
        out = base / "unpacked" / sm
        out.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter="data")
        [server] = list(out.rglob("llama-server"))
        assert subprocess.run([server, "--archs"], capture_output=True, text=True, check=True).stdout.strip() == arch
    changes = json.loads((dist / "changes.json").read_text())
    strix = changes["builds"]["strix"]
    assert strix["vulkan"]["dropped_shader_features"] == ["GL_EXT_bfloat16"]
    assert strix["lean-rocm"]["tools"]["hipconfig"] == "7.1.25424" and strix["hrx"]["gate"]["passed"]
    assert changes["builds"]["nvidia-sm_90"]["cuda"]["overrides"] == {"CMAKE_CUDA_ARCHITECTURES": "90-real"}
    notes = (dist / "notes.md").read_text()
    assert "- strix vulkan: built without `GL_EXT_bfloat16` shaders (this glslc lacks it)" in notes
    bom = json.loads((dist / "sbom.cdx.json").read_text())
    tools = {(t["name"], t.get("version")) for t in bom["metadata"]["tools"]["components"]}
    assert {("hipconfig", "7.1.25424"), ("nvcc", "13.0"), ("amdclang++", "20.0.0")} <= tools
    # the strix bundle holds every backend its parts built, each from the job that built it
    members = dict((m.name, data) for m, data in tarball.members(dist / f"1bit-strix-{tag}-linux-x86_64.tar.zst"))
    manifest = json.loads(members[f"1bit-strix-{tag}-linux-x86_64/share/onebit/manifest.json"])
    assert sorted(manifest["backends"]) == ["cpu", "ds4", "hrx", "lean-vulkan", "npu", "rocm", "vulkan", "zinc"]


def records(res) -> dict[str, dict]:
    """variant -> what its build knew (toolchain.json), in the part a build job uploaded."""
    [name] = res.uploaded
    return json.loads((res.workspace / "built" / name.removeprefix("built-") / "toolchain.json").read_text())["variants"]


def body_log(res) -> str:
    return "".join(st.log.read_text() for st in res.steps if st.kind == "body" and st.log)


def test_the_passing_bump_is_merged_pushed_built_and_released_at(replay):
    results, fake, origin, start, b = replay.results, replay.fake, replay.origin, replay.start, replay.bumps
    first = results[BUMPS]
    commit = first.outputs["commit"]
    # the passing bump merged (one merge commit on the branch as it was) and pushed: main on the origin is that commit
    assert commit == git(origin, "rev-parse", "refs/heads/main") != start
    assert git(origin, "log", "-1", "--format=%P", commit).split() == [start, b.heads["llama.cpp"][1]]
    assert first.uploaded == {"bumps": ["bumps.json"]}
    assert [st.kind for st in first.steps if st.name.startswith(("Merge the passing", "Judge the bumps"))] == \
        ["body", "skipped"]  # a scheduled run pushes; the dry run is for a run that does not publish
    log = body_log(first)
    assert f"merged {b.branch('llama.cpp')}" in log and f"pushed {commit} to main" in log
    assert f"held {b.branch('ds4')}: build (cpu): Build" in log

    # every later job checked out that commit, and built from its pins: llama.cpp at the bump's commit, the held
    # bumps' pins (ds4, rocmfpx) where they were
    later = [r for r in results.values() if r.job.job in ("hosted", "cuda", "strix-halo", "release")]
    assert len(later) == 13
    assert {r.job.key: git(r.workspace, "rev-parse", "HEAD") for r in later} == {r.job.key: commit for r in later}
    built: dict[str, set[str]] = {}
    for res in later:
        if res.job.job != "release":  # each part records the commit it was built from, which the release checks
            [name] = res.uploaded
            part = json.loads((res.workspace / "built" / name.removeprefix("built-") / "toolchain.json").read_text())
            assert part["project"] == {"commit": commit, "modified": []}, res.job.key
            for rec in records(res).values():
                if (rec.get("source") or {}).get("pin"):  # serve is built from the project itself
                    built.setdefault(rec["source"]["pin"], set()).add(rec["source"]["commit"])
    assert built.pop("llama.cpp") == {b.new}  # cpu, vulkan and every CUDA architecture
    assert {"ds4", "rocmfpx"} <= set(built) and all(c == {replay.pinned} for c in built.values()), built

    # the release is created at the commit that was built
    [release] = fake.releases.values()
    assert release["target_commitish"] == commit
    created = [c for c in fake.calls if c == ("POST", f"/repos/{REPO}/releases")]
    assert len(created) == 1

    # changes.json and the notes: the merged bump, the held ones with why
    dist = results["release"].workspace / "dist"
    changes = json.loads((dist / "changes.json").read_text())
    rocm_head = b.heads["rocmfpx"][1]
    assert changes["bumps"] == [
        {"branch": b.branch("ds4"), "result": "held",
         "why": {"step": "build (cpu): Build", "held_for": "failure",
                 "log": ["cc -O2 -o ds4 ds4.c", "ds4.c:1:10: fatal error: ds4.h: No such file or directory",
                         "make: *** [Makefile:2: cpu] Error 1"]}},
        {"branch": b.branch("llama.cpp"), "result": "merged", "why": None},
        {"branch": b.branch("rocmfpx"), "result": "held",
         "why": {"step": "hardware checklist of lean", "held_for": "hardware",
                 "log": [f"waits for the hardware checklist of lean to pass on its runner: no success status "
                         f"{bump_merge.GATE}lean on {rocm_head[:12]} yet"]}},
    ]
    assert changes["pins"]["llama.cpp"]["to"] == b.new and changes["pins"]["rocmfpx"]["to"] == replay.pinned
    notes = (dist / "notes.md").read_text()
    assert f"## Merged bumps\n\n- `{b.branch('llama.cpp')}`\n" in notes
    assert f"- `{b.branch('ds4')}`: failed at step `build (cpu): Build`" in notes
    assert f"- `{b.branch('rocmfpx')}`: waits for its hardware checklist to pass on its runner " \
           f"(`hardware checklist of lean`)" in notes


# ---- the first job alone: nothing to merge, a refused push, a run that does not publish


@pytest.fixture
def first_job(tmp_path):
    """Replay release.yml's first job (read from the file, alone) on a fresh fixture and origin."""
    fakes = []

    def run(*, pins=(), refuse: bool = False, event: str = "schedule", inputs: dict | None = None):
        base = tmp_path / f"run{len(fakes)}"
        fx = make_fixture(base / "fixture")
        fake = Fake()
        fakes.append(fake)
        opened = open_bumps(fx, fake, pins) if pins else None
        origin = fx.origin(base / "origin.git")
        if refuse:  # the branch is protected, as GitHub answers a push that is not through a pull request
            hook = origin / "hooks" / "pre-receive"
            hook.write_text("#!/bin/sh\necho 'error: GH006: Protected branch update failed for refs/heads/main.' >&2\n"
                            "echo 'error: Changes must be made through a pull request.' >&2\nexit 1\n")
            hook.chmod(0o755)
        start = git(origin, "rev-parse", "refs/heads/main")
        logs = base / "shim-logs"
        logs.mkdir()
        rp = Replay(WORKFLOW, repo_url=f"file://{origin}", base=base, runner=runner_for(fx, fake, base, logs),
                    github=github_context(start, event), inputs=inputs or {}, only={"bumps"})
        results = rp.run()
        assert list(results) == [BUMPS]
        res = results[BUMPS]
        assert res.status == "success", res.error
        assert res.uploaded == {"bumps": ["bumps.json"]}
        run_ = Run(rp, results, fake, logs, base, origin, start, fx.commit, opened)
        return run_, res, bump_merge.load(rp.artifacts.base / "bumps" / "bumps.json")

    yield run
    for fake in fakes:
        fake.close()


def test_no_bump_open_the_release_builds_the_branch_as_it_is(first_job):
    run, res, results = first_job()
    assert results == []
    assert res.outputs["commit"] == run.start == git(run.origin, "rev-parse", "refs/heads/main")
    log = body_log(res)
    assert "no bump pull request is open against main" in log
    assert f"the release builds {run.start}: 0 bump(s) merged, 0 held" in log and "pushed" not in log


def test_a_refused_push_leaves_the_branch_and_the_release_builds_it(first_job):
    run, res, results = first_job(pins=("llama.cpp", "ds4"), refuse=True)
    # the branch is as it was, and the release builds (and will point at) the commit checked out
    assert res.outputs["commit"] == run.start == git(run.origin, "rev-parse", "refs/heads/main")
    got = {r.branch: r for r in results}
    passed = got[run.bumps.branch("llama.cpp")]
    assert (passed.failed_step, passed.held_for) == ("push to main", "unpushed")
    assert passed.log.startswith(f"passed and merged cleanly, but the push to main was refused, so the release builds "
                                 f"{run.start[:12]} as checked out, without this bump; git said:\n")
    said = passed.log.splitlines()[1:]  # the remote's own words, then the refused ref (the undone merge commit)
    assert said[:2] == ["remote: error: GH006: Protected branch update failed for refs/heads/main.",
                        "remote: error: Changes must be made through a pull request."]
    assert re.fullmatch(r"! \[remote rejected\] [0-9a-f]{40} -> main \(pre-receive hook declined\)", said[2])
    assert said[3:] == [f"error: failed to push some refs to 'file://{run.origin}'"]
    assert got[run.bumps.branch("ds4")].held_for == "failure"  # held for its own reason, as before
    # the job log says so: a warning, and an annotation on the run's page
    log = body_log(res)
    assert f"warning: the push to main was refused; the release builds {run.start} as checked out" in log
    assert "::warning title=bumps not pushed::the push to main was refused" in log
    assert f"the release builds {run.start}: 0 bump(s) merged, 2 held" in log
    # and the notes say why the bump that passed is not in the release
    md = release_notes.render({"tag": "v2026.48", "date": "2026-11-29", "pins": {},
                               "patches": {"added": [], "dropped": [], "refreshed": []},
                               "bumps": release_changes.bump_entries(results), "artifacts": {}})
    assert f"- `{passed.branch}`: passed, but was not pushed, so it is not in this release (`push to main`)" in md
    assert "remote: error: GH006: Protected branch update failed for refs/heads/main." in md


def test_a_run_that_does_not_publish_pushes_nothing(first_job):
    run, res, results = first_job(pins=("llama.cpp",), event="workflow_dispatch", inputs={"publish": False})
    assert [st.kind for st in res.steps if st.name.startswith(("Merge the passing", "Judge the bumps"))] == \
        ["skipped", "body"]
    assert res.outputs["commit"] == run.start == git(run.origin, "rev-parse", "refs/heads/main")
    [held] = results
    assert (held.branch, held.failed_step, held.held_for) == (run.bumps.branch("llama.cpp"), "push to main", "unpushed")
    assert "a release run that does not publish pushes nothing" in held.log


def test_report_the_graph(replay, capsys):
    """The note's job list: each job, what it uploaded and built, and the release's wall time against its longest job
    (measured here with the jobs of one level running at once; and modelled as GitHub runs them, one runner each)."""
    rp, results, base = replay.rp, replay.results, replay.base
    rows = []
    for key, res in sorted(results.items(), key=lambda kv: kv[1].started):
        ran, built = built_steps(res)
        pkgs = sorted(Path(f).name for files in res.uploaded.values() for f in files if f.endswith(".conda")
                      and "onebit-bundle-" not in f)
        rows.append({"job": key, "seconds": round(res.seconds, 1), "start": round(res.started, 1),
                     "uploaded": list(res.uploaded), "files": sum(len(v) for v in res.uploaded.values()),
                     "build_steps": built, "packages": pkgs, "downloaded": list(res.downloaded)})
    wall = max(r.ended for r in results.values())
    longest = max(results.values(), key=lambda r: r.seconds)
    report = {"jobs": rows, "wall_seconds": round(wall, 1), "longest_job": longest.job.key,
              "longest_job_seconds": round(longest.seconds, 1), "github_model_seconds": round(rp.critical_path(), 1),
              "sum_of_jobs_seconds": round(sum(r.seconds for r in results.values()), 1)}
    (base / "replay-report.json").write_text(json.dumps(report, indent=2))
    with capsys.disabled():
        print("\nrelease.yml replayed:")
        for r in rows:
            print(f"  {r['start']:>6.1f}+{r['seconds']:>5.1f}s  {r['job']:<70} build steps {r['build_steps']:>2}  "
                  f"{', '.join(r['uploaded']) or '-'}  {' '.join(r['packages'])}")
        print(f"  wall {report['wall_seconds']} s here; longest job {report['longest_job']} "
              f"{report['longest_job_seconds']} s; modelled on GitHub (a runner per job): "
              f"{report['github_model_seconds']} s; all jobs one after another: {report['sum_of_jobs_seconds']} s")
    assert rows and report["longest_job_seconds"] > 0
