"""release.yml against the real project (read from both files, nothing built): every job body is one command of ours,
every variant of every released bundle is built by exactly one job (CUDA once per architecture of the recipe's release
set), the hardware-gated jobs gate what they build, and the final job assembles from every build job's artifact."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml
from workflow_replay import classify, load_jobs, substitute

from builders import config
from builders.host import HostFacts, ToolFact
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout
from builders.release.cli import _words

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
GATED = {"hrx", "lean", "xdna", "zinc", "ds4-rocm"}  # issue 15: the jobs gated on Strix Halo hardware
PROJECT = config.load_project(ROOT)


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
        ctx = {"matrix": job.matrix, "needs": {"tag": {"outputs": {"tag": "v2026.48"}}}, "github": {}, "vars": {},
               "inputs": {}}
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
    assert kinds.count("body") == len(jobs) + 1  # one body per job; the release job's publish is its second
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
    assert set(jobs["release"]["needs"]) == {"tag", *builders_}
    uploads = [s["with"]["name"] for n in builders_ for s in jobs[n]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert len(uploads) == len(builders_) and all(u.startswith("built-") for u in uploads)
    [download] = [s for s in jobs["release"]["steps"] if "download-artifact" in s.get("uses", "")]
    assert download["with"]["pattern"] == "built-*"
    assert not [s for s in jobs["release"]["steps"] if "release-part" in str(s.get("run", ""))]


def test_every_released_bundle_makes_a_valid_manifest(tmp_path):
    from builders import manifest

    for name in ("cpu", "nvidia", "strix"):
        facts = HostFacts(tools={t.key: ToolFact(t.key, "", False) for t in all_tools(PROJECT, name)})
        plan = make_plan(PROJECT, name, facts, Layout(root=ROOT, cache=tmp_path, work=tmp_path, out=tmp_path))
        entries = [(s.data.backend, s.data.manifest_entry) for s in plan.steps if s.action == "stage"
                   and s.data.manifest_entry]
        manifest.make_manifest(name, plan.version, 0, plan.platform, entries)
