"""release.yml, replayed: its job graph read from the file (tests/workflow_replay.py), every job in its own clone with
its own cache, on a fixture project whose recipes carry the names the workflow uses (tests/release_fixture.py).

The hosted jobs build for real (cmake, ninja, cc, make); the Strix Halo jobs run on recording toolchains (TheRock,
XRT, the kernel build, zig) and pass their recipes' checklists against the fake hardware the runner model lists; the
CUDA jobs fan out once per architecture. Only what a job uploads reaches the jobs that download it. The final job
assembles the release from those artifacts, builds nothing (its build tools record every call: none), and publishes
to the fake GitHub API.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from release_fixture import REPO, clean_env, make_fixture, shim_versions
from workflow_replay import Replay, RunnerModel

from builders import tarball

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
BUILD_TOOLS = ("cmake", "ninja", "make", "cc", "c++", "gcc", "g++", "ld", "zig", "cargo", "rustc", "nvcc", "glslc")
APT_TOOLS = {"glslc": ["glslc"]}  # the apt packages a job names -> the programs they would put on PATH


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    from test_release_publish import TOKEN, Fake

    base = tmp_path_factory.mktemp("replay")
    fx = make_fixture(base / "fixture")
    fake = Fake()
    venv_bin = str(Path(sys.executable).parent)
    logs = base / "shim-logs"
    logs.mkdir()

    def apt(packages, jobdir):
        return [str(fx.shim_dir(jobdir / "apt-bin", [t for p in packages for t in APT_TOOLS.get(p, [])]))]

    def runner(job):
        env = {**clean_env(), "ONEBIT_SHIM_VERSIONS": shim_versions(), "ONEBIT_GITHUB_API": fake.url,
               "CCACHE_DISABLE": "1", "ONEBIT_SHIM_LOG": str(logs / (re.sub(r"\W+", "_", job.key) + ".jsonl")),
               "ONEBIT_SHIM_ENV": "CC,CXX,KERNEL_SRC,DESTDIR"}
        system = ["/usr/local/bin", "/usr/bin", "/bin"]
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

    github = {"token": TOKEN, "repository": REPO, "event_name": "schedule", "sha": "", "ref": "refs/heads/main"}
    # jobs whose needs are met run at once, as on GitHub; ONEBIT_REPLAY_PARALLEL=1 runs them one by one (each job's
    # own time, uncontended: what the GitHub model below is best fed with)
    parallel = int(os.environ.get("ONEBIT_REPLAY_PARALLEL") or 16)
    rp = Replay(WORKFLOW, repo_url=fx.url, base=base, runner=runner, github=github, max_parallel=parallel)
    try:
        results = rp.run()
        yield rp, results, fake, logs, base
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
    rp, results, fake, logs, base = replay
    failed = {k: r.error for k, r in results.items() if r.status != "success"}
    assert not failed, failed
    assert sorted(results) == sorted([
        "decide the tag", "build cpu", "build strix-hosted",
        *[f"build cuda {a}" for a in ("80-virtual", "86-real", "89-real", "90-real", "120-real")],
        *[f"build and gate {p} (Strix Halo)" for p in ("hrx", "lean-rocm", "xdna", "zinc", "ds4-rocm")],
        "release"])
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
    assert set(rel.downloaded) == {f"built-{p}" for p in parts}
    # only what the jobs uploaded reached it: its built/ holds exactly the downloaded files
    here = sorted(p.relative_to(rel.workspace / "built").as_posix() for p in (rel.workspace / "built").rglob("*")
                  if p.is_file())
    assert here == sorted(f"{name}/{f}" for name, files in rel.downloaded.items() for f in files)
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


def test_what_the_builds_knew_reached_the_release(replay):
    rp, results, fake, logs, base = replay
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


def test_report_the_graph(replay, capsys):
    """The note's job list: each job, what it uploaded and built, and the release's wall time against its longest job
    (measured here with the jobs of one level running at once; and modelled as GitHub runs them, one runner each)."""
    rp, results, fake, logs, base = replay
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
