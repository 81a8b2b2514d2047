"""release.yml against the real project (read from both files, nothing built): every job body is one command of ours,
every variant of every released bundle is built by exactly one job (CUDA once per architecture of the recipe's release
set), the hardware-gated jobs gate what they build, the final job assembles from every build job's artifact, and every
job that builds or releases works on the one commit the first job (the bump merge) settled on."""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from workflow_replay import classify, load_jobs, substitute

from builders.project import config
from builders.inputs import toolchain
from builders.inputs.host import HostFacts, ToolFact
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout
from builders.release import bumps
from builders.release.changes import BumpResult
from builders.release.cli import _words

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
GATED = {"hrx", "lean", "xdna", "zinc", "ds4-rocm"}  # issue 15: the jobs gated on Strix Halo hardware
PROJECT = config.load_project(ROOT)
COMMIT = "c0ffee" * 6 + "c0ff"  # what the first job's `commit` output stands for here
BUMPS_PERMISSIONS = {"contents": "write", "pull-requests": "read", "checks": "read", "statuses": "read",
                     "actions": "read"}  # the bump merge's needs (docs/pins.md): push; read PRs, checks, statuses, logs


@dataclass
class Body:
    job: str
    runs_on: object
    argv: list[str]

    def opt(self, name: str) -> list[str]:
        return [self.argv[i + 1] for i, a in enumerate(self.argv) if a == name]


def bodies() -> list[Body]:
    """Each job's body with its matrix and env filled in (shell variables expanded as bash would)."""
    wf, jobs = load_jobs(WORKFLOW)
    out = []
    for job in jobs:
        ctx = {"matrix": job.matrix, "needs": {"tag": {"outputs": {"tag": "v2026.48"}},
                                               "bumps": {"outputs": {"commit": COMMIT}}},
               "github": {}, "vars": {}, "inputs": {}}
        for step in job.spec["steps"]:
            if "run" not in step or classify(step["run"]) != "body":
                continue
            env = {k: substitute(v, ctx, {}) for k, v in (step.get("env") or {}).items()}
            text = step["run"]
            for k, v in sorted(env.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(f'"${k}"', shlex.quote(v)).replace(f"${k}", v)
            out.append(Body(job.key, job.runs_on, shlex.split(text)))
    return out


def test_every_run_step_is_one_command_or_known_runner_setup():
    wf, jobs = load_jobs(WORKFLOW)
    kinds = [classify(s["run"]) for j in jobs for s in j.spec["steps"] if "run" in s]
    # one body per job; the release job's publish is its second, the bump merge has one for a run that does not publish
    assert kinds.count("body") == len(jobs) + 2
    assert all(k in ("body", "pip-install", "venv", "github-path", "apt") for k in kinds)


def test_every_released_variant_is_built_by_exactly_one_job():
    parts = [b for b in bodies() if "release-part" in b.argv]
    [assemble, publish] = [b for b in bodies() if b.argv[1] == "release"]
    released = assemble.argv[2:assemble.argv.index("--from")]
    assert released == ["cpu", "nvidia", "strix"] and publish.argv[:len(assemble.argv)] == assemble.argv
    built: dict[str, list[str]] = {}
    for b in parts:
        bundle = b.argv[b.argv.index("release-part") + 1]
        only = set(_words(b.opt("--only")))
        variants = [v for v in PROJECT.variants(PROJECT.bundle(bundle))
                    if not only or v.id in only or v.recipe.name in only]
        assert only <= {v.id for v in variants} | {v.recipe.name for v in variants}, f"{b.job}: unknown --only {only}"
        assert any(v.backend for v in variants), f"{b.job}: a part needs a backend (its manifest must name one)"
        for v in variants:
            built.setdefault(v.id, []).append(b.job)
    wanted = {v.id for name in released for v in PROJECT.variants(PROJECT.bundle(name))}
    assert set(built) == wanted
    twice = {v: jobs for v, jobs in built.items() if len(jobs) > 1 and v != "cuda"}
    assert not twice, f"each package must come from one job: {twice}"


def test_cuda_fans_out_over_the_recipes_release_architectures():
    archs = str(PROJECT.recipes["cuda"].data["build"]["options"]["CMAKE_CUDA_ARCHITECTURES"]).split(";")
    cuda = [b for b in bodies() if "--set" in b.argv]
    assert sorted(s for b in cuda for s in b.opt("--set")) == sorted(f"cuda.CMAKE_CUDA_ARCHITECTURES={a}" for a in archs)
    assert all(b.opt("--only") == ["cuda"] and b.runs_on == "ubuntu-24.04" for b in cuda)
    fan_out = yaml.safe_load((ROOT / "release.yaml").read_text())["fan_out"]
    assert fan_out == {"cuda": "CMAKE_CUDA_ARCHITECTURES"}
    wf = yaml.safe_load(WORKFLOW.read_text())
    assert not [s for s in wf["jobs"]["cuda"]["steps"] if "apt" in str(s.get("run", ""))]  # nothing from apt


CUDA_ENV = ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT", "CUDACXX", "CONDA_OVERRIDE_CUDA")


def test_the_cuda_jobs_build_from_the_pinned_wheels_on_a_runner_without_cuda(tmp_path):
    """Each cuda job installs nothing CUDA (no apt step, no toolkit variable) and runs `release-part nvidia --only cuda
    --set cuda.CMAKE_CUDA_ARCHITECTURES=<arch>`; planned as that command plans on a hosted runner (no toolkit, no
    driver), it fetches NVIDIA's wheels the recipe pins, compiles with their nvcc for that one architecture, and links
    VMM's driver API (GGML_CUDA_NO_VMM OFF) against the link stub the toolchain step generates in the same root."""
    from builders.inputs import host
    from builders.session import parse_overrides

    wf = yaml.safe_load(WORKFLOW.read_text())
    job = wf["jobs"]["cuda"]
    assert job["runs-on"] == "ubuntu-24.04"
    scopes = [wf.get("env") or {}, job.get("env") or {}, *[st.get("env") or {} for st in job["steps"]]]
    assert not [k for scope in scopes for k in scope if k in CUDA_ENV]
    runs = [st["run"] for st in job["steps"] if "run" in st]
    assert [classify(r) for r in runs] == ["pip-install", "body"]  # nothing from apt, nothing else installed
    assert not [r for r in runs if "cuda" in r.lower() and "release-part" not in r]
    nvcc = next(t for t in PROJECT.recipes["cuda"].variant("default").toolchain if t.tool == "nvcc")
    env = {k: v for k, v in os.environ.items() if k not in CUDA_ENV}
    toolchains = tmp_path / "cache" / "toolchains"  # a fresh runner's cache: no toolkit assembled yet
    facts = host.gather(all_tools(PROJECT, "nvidia"), env, toolchains=toolchains)
    archs = []
    for b in [b for b in bodies() if b.job.startswith("build cuda ")]:
        assert b.argv[b.argv.index("release-part") + 1:b.argv.index("--tag")] == ["nvidia"] and b.opt("--only") == ["cuda"]
        [setting] = b.opt("--set")
        arch = setting.removeprefix("cuda.CMAKE_CUDA_ARCHITECTURES=")
        archs.append(arch)
        plan = make_plan(PROJECT, "nvidia", facts, Layout(root=ROOT, cache=tmp_path / "cache", work=tmp_path / "w",
                                                         out=tmp_path / "o"),
                         only=set(_words(b.opt("--only"))), overrides=parse_overrides([setting]))
        fetch = plan.step("toolchain:nvcc").data
        assert [(w.package, w.version, w.sha256) for w in fetch.wheels] == [(w.package, w.version, w.sha256)
                                                                             for w in nvcc.wheels]
        root = Path(fetch.dest)
        assert root == host.pinned_root(nvcc, toolchains)
        [fetched] = [m for m in plan.to_fetch if m.startswith("nvcc: ")]  # release-part's toolchain step fetches it
        assert "nvidia-cuda-nvcc==13.0.88" in fetched and not plan.missing
        configure = plan.step("build:cuda").commands[0].argv
        assert {f"-DCMAKE_CUDA_ARCHITECTURES={arch}", f"-DCMAKE_CUDA_COMPILER={root}/bin/nvcc", "-DGGML_CUDA_NO_VMM=OFF",
                f"-DCUDA_cuda_driver_LIBRARY={root}/lib64/stubs/libcuda.so"} <= set(configure)
        assert f"{root}/lib64/stubs/libcuda.so" == f"{root}/lib64/{Path(toolchain.DRIVER_STUB).relative_to('lib')}"
        assert {r.root for r in plan.step("stage:cuda").data.runtime} == {str(root)}  # cudart, cuBLAS shipped from it
    assert sorted(archs) == sorted(PROJECT.recipes["cuda"].data["build"]["options"]["CMAKE_CUDA_ARCHITECTURES"].split(";"))


def test_hardware_jobs_gate_what_they_build():
    gated = [b for b in bodies() if b.runs_on == ["self-hosted", "strix-halo"]]
    assert {r for b in gated for r in _words(b.opt("--checklist"))} == GATED
    for b in gated:
        recipes = set(_words(b.opt("--checklist")))
        only = set(_words(b.opt("--only")))
        assert {PROJECT.recipes[r].name for r in recipes} == {v.recipe.name for v in PROJECT.variants(PROJECT.bundle("strix"))
                                                             if v.id in only or v.recipe.name in only}
        assert all(PROJECT.recipes[r].data.get("hardware_checklist") for r in recipes)
    hosted = [b for b in bodies() if b.runs_on == "ubuntu-24.04"]
    assert not [b for b in hosted if b.opt("--checklist")]


def test_the_final_job_takes_every_build_jobs_artifact():
    wf = yaml.safe_load(WORKFLOW.read_text())
    jobs = wf["jobs"]
    builders_ = [name for name, j in jobs.items() if any("release-part" in str(s.get("run", "")) for s in j["steps"])]
    # and the README on fresh Debian roots (builders/fresh.py) passed before anything is published
    assert set(jobs["release"]["needs"]) == {"bumps", "tag", "fresh", *builders_}
    uploads = [s["with"]["name"] for n in builders_ for s in jobs[n]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert len(uploads) == len(builders_) and all(u.startswith("built-") for u in uploads)
    [parts, bumps] = [s for s in jobs["release"]["steps"] if "download-artifact" in s.get("uses", "")]
    assert parts["with"]["pattern"] == "built-*" and bumps["with"] == {"name": "bumps", "path": "bumps"}
    assert not [s for s in jobs["release"]["steps"] if "release-part" in str(s.get("run", ""))]


def test_every_released_bundle_makes_a_valid_manifest(tmp_path):
    from builders.ship import manifest

    for name in ("cpu", "nvidia", "strix"):
        facts = HostFacts(tools={t.key: ToolFact(t.key, "", False) for t in all_tools(PROJECT, name)})
        plan = make_plan(PROJECT, name, facts, Layout(root=ROOT, cache=tmp_path, work=tmp_path, out=tmp_path))
        entries = [(s.data.backend, s.data.manifest_entry) for s in plan.steps if s.action == "stage"
                   and s.data.manifest_entry]
        manifest.make_manifest(name, plan.version, 0, plan.platform, entries)


def test_the_first_job_merges_the_bumps_and_every_later_job_takes_its_commit():
    wf = yaml.safe_load(WORKFLOW.read_text())
    jobs = wf["jobs"]
    first = jobs["bumps"]
    assert first["permissions"] == BUMPS_PERMISSIONS and "needs" not in first
    merges = [b for b in bodies() if b.argv[:3] == ["python", "-m", "builders.release.bumps"]]
    assert [b.argv[3:] for b in merges] == [
        ["merge", "--push", "--json", "bumps.json", "--output", "$GITHUB_OUTPUT"],
        ["merge", "--dry-run", "--json", "bumps.json", "--output", "$GITHUB_OUTPUT"]]
    # it pushes exactly when the release publishes; a run that does not publish pushes nothing
    push, dry = [s for s in first["steps"] if "builders.release.bumps" in str(s.get("run"))]
    [publish] = [s for s in jobs["release"]["steps"] if "--publish" in str(s.get("run"))]
    assert push["if"] == publish["if"] == "github.event_name == 'schedule' || inputs.publish"
    assert dry["if"] == "github.event_name != 'schedule' && !inputs.publish"
    assert first["outputs"] == {"commit": f"${{{{ steps.{push['id']}.outputs.commit || steps.{dry['id']}.outputs.commit }}}}"}
    [upload] = [s for s in first["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload["with"]["name"] == "bumps" and upload["with"]["path"] == "bumps.json"
    # every job after it checks out that commit (the tag job needs no checkout of it: it reads the releases)
    for name, job in jobs.items():
        if name in ("bumps", "tag"):
            continue
        assert "bumps" in job["needs"], name
        [checkout] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
        assert checkout["with"]["ref"] == "${{ needs.bumps.outputs.commit }}", name
    # the release assembles and publishes with the bump results, at that commit
    released = [b for b in bodies() if b.argv[:2] == ["1bit-build", "release"]]
    assert len(released) == 2
    for b in released:
        assert b.opt("--bumps") == ["bumps/bumps.json"] and b.opt("--target") == [COMMIT], b.argv



# ---- the first job's decisions when its push is refused (builders/release/bumps.py; replayed in test_release_replay)

PROTECTED = """remote: error: GH006: Protected branch update failed for refs/heads/main.
remote: error: Changes must be made through a pull request.
To https://github.com/1bit-MONSTER/1bit-engine
 ! [remote rejected] 8e72bbf0af0fb05eb3c72154220c4ee651401e0f -> main (protected branch hook declined)
error: failed to push some refs to 'https://github.com/1bit-MONSTER/1bit-engine'
"""
MOVED = """To https://github.com/1bit-MONSTER/1bit-engine
 ! [rejected]        8e72bbf0af0fb05eb3c72154220c4ee651401e0f -> main (fetch first)
error: failed to push some refs to 'https://github.com/1bit-MONSTER/1bit-engine'
hint: Updates were rejected because the remote contains work that you do not
hint: have locally. This is usually caused by another repository pushing to
"""


@pytest.mark.parametrize("stderr, said", [
    (PROTECTED, ["remote: error: GH006: Protected branch update failed for refs/heads/main.",
                 "remote: error: Changes must be made through a pull request.",
                 "! [remote rejected] 8e72bbf0af0fb05eb3c72154220c4ee651401e0f -> main (protected branch hook declined)",
                 "error: failed to push some refs to 'https://github.com/1bit-MONSTER/1bit-engine'"]),
    (MOVED, ["! [rejected]        8e72bbf0af0fb05eb3c72154220c4ee651401e0f -> main (fetch first)",
             "error: failed to push some refs to 'https://github.com/1bit-MONSTER/1bit-engine'"]),
    ("fatal: could not read Username for 'https://github.com': terminal prompts disabled\n",
     ["fatal: could not read Username for 'https://github.com': terminal prompts disabled"]),
    ("something else\n", ["something else"]),
])
def test_a_refused_push_is_reported_in_the_remotes_words(stderr, said):
    assert bumps.push_refusal(stderr) == said


def test_only_the_merged_bumps_become_unpushed():
    results = [BumpResult("bump/a-1"), BumpResult("bump/b-2", "tests", "1 failed", "failure"), BumpResult("bump/c-3")]
    assert bumps.unpushed(results, ["bump/a-1"], "push to main", "refused") == [
        BumpResult("bump/a-1", "push to main", "refused", "unpushed"), results[1], results[2]]
    assert bumps.unpushed(results, [], "push to main", "refused") == results


def test_docs_pins_says_what_the_first_job_runs_and_what_its_commit_is_for():
    """docs/pins.md names the first job's command as release.yml runs it, and what its `commit` output does."""
    doc = (ROOT / "docs" / "pins.md").read_text()
    section = doc[doc.index("## The release merges passing bumps"):doc.index("## Configuration")]
    [push] = [s for s in yaml.safe_load(WORKFLOW.read_text())["jobs"]["bumps"]["steps"] if s.get("id") == "push"]
    assert push["run"].replace('"$GITHUB_OUTPUT"', "$GITHUB_OUTPUT") in section
    assert "${{ needs.bumps.outputs.commit }}" in section and '--target "$COMMIT"' in section
    released = [b for b in bodies() if b.argv[:2] == ["1bit-build", "release"]]
    assert all(b.opt("--target") == [COMMIT] for b in released)
    for case in ("the pushed merge", "the push is refused", "`unpushed`", "(`--dry-run`), the commit checked out",
                 "lets the workflow's token push", "a repository setting"):
        assert case in section, case
