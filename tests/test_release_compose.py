"""Assembling bundles from the parts CI built (`release --from`): the same bytes one machine builds, and a refusal,
naming what differs, for a part from another week, build number, pin commit or recipe revision. The tag logic of the
release commands (release-tag, release --tag, release-part --tag)."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mini_project import git
from release_fixture import clean_env, make_fixture

from builders.ship import bundle, package
from builders.project import config
from builders.cli import main
from builders.release import compose

TAG = "v2026.48"


def _cli(root: Path, work: Path, *argv: str) -> int:
    return main(["--root", str(root), "--cache", str(work.parent / "cache"), "--work", str(work),
                 "--out", str(work.parent / "built" / work.name), *argv])


ARCH = "cuda.CMAKE_CUDA_ARCHITECTURES=90-real"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture project; the nvidia bundle (one CUDA architecture) built whole on one machine, and built again as
    the release builds it: the cpu bundle's part (cpu + serve) and a cuda part."""
    from release_fixture import shim_versions

    base = tmp_path_factory.mktemp("compose")
    fx = make_fixture(base / "fixture")
    env = {**clean_env(), "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
           "CCACHE_DISABLE": "1", "HOME": str(base / "home"), "ONEBIT_SHIM_VERSIONS": shim_versions(),
           "ONEBIT_SHIM_LOG": str(base / "shim.jsonl")}
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        assert _cli(fx.repo, base / "whole", "release-part", "nvidia", "--tag", TAG, "--set", ARCH) == 0
        assert _cli(fx.repo, base / "part-cpu", "release-part", "cpu", "--tag", TAG) == 0
        assert _cli(fx.repo, base / "part-cuda", "release-part", "nvidia", "--tag", TAG, "--only", "cuda", "--set", ARCH) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"fx": fx, "base": base, "whole": base / "built" / "whole", "parts": base / "built"}


def _project(fx):
    return config.load_project(fx.repo)


def _flavor(project, parts, *, version="2026.48", build_number=0, scratch, bundle_name="cpu"):
    [flavor] = compose.flavors(project, bundle_name, version=version, build_number=build_number, parts=parts,
                               fan_out={}, scratch=scratch)
    return flavor


def test_assembled_from_parts_is_the_bundle_one_machine_builds(built, tmp_path):
    project = _project(built["fx"])
    whole = built["whole"]
    parts = [p for p in compose.find_parts(built["parts"]) if p.dir.name.startswith("part-")]
    assert sorted(p.dir.name for p in parts) == ["part-cpu", "part-cuda"]
    # the release names the flavor by its architecture; the one-machine build has no flavor: plan it the same way
    [flavor] = compose.flavors(project, "nvidia", version="2026.48", build_number=0, parts=parts,
                               fan_out={"cuda": "CMAKE_CUDA_ARCHITECTURES"}, scratch=tmp_path / "plan")
    assert (flavor.name, flavor.fanned) == ("nvidia-sm_90", {"cuda": {"CMAKE_CUDA_ARCHITECTURES": "90-real"}})
    c = compose.compose(project, dataclasses.replace(flavor, label=""), parts, tmp_path / "c")
    assert c.manifest_text == (whole / "manifest.json").read_text()
    [meta] = [p for p in c.packages if p.name.startswith("onebit-bundle-nvidia-")]
    [theirs] = list((whole / "channel").rglob("onebit-bundle-nvidia-*.conda"))
    assert meta.name == theirs.name and meta.read_bytes() == theirs.read_bytes()
    for pkg in c.packages:  # every variant package is the one the whole build made, byte for byte
        assert pkg.read_bytes() == next((whole / "channel").rglob(pkg.name)).read_bytes()
    [tar] = list(whole.glob("onebit-nvidia-*.tar.zst"))
    again = bundle.write_tarball(tmp_path / tar.name, [c.prefix], c.manifest_text,
                                 mtime=int(package.source_date().timestamp()))
    assert again.read_bytes() == tar.read_bytes()
    assert set(c.records) == {"cpu", "cuda", "serve"} and c.records["cpu"]["source"]["commit"] == built["fx"].commit
    assert c.records["cuda"]["tools"]["nvcc"] == "13.0"  # what the cuda job's nvcc said, read from its part
    assert c.upstream_licenses["llama.cpp"].read_text().startswith("MIT License")
    assert c.parts == {p.name: (built["parts"] / ("part-cuda" if "cuda" in p.name else "part-cpu"))
                       for p in c.packages if not p.name.startswith("onebit-bundle-")}


def _copy_part(src: Path, dest: Path, edit=None) -> Path:
    shutil.copytree(src, dest)
    if edit:
        rec = json.loads((dest / "toolchain.json").read_text())
        edit(rec)
        (dest / "toolchain.json").write_text(json.dumps(rec))
    return dest


def _refusal(project, parts, tmp_path, **kw) -> str:
    with pytest.raises(compose.ComposeError) as e:
        flavor = _flavor(project, parts, scratch=tmp_path / "plan", **kw)
        compose.compose(project, flavor, parts, tmp_path / "c")
    return str(e.value)


def test_a_part_from_another_week_or_build_number_is_refused(built, tmp_path):
    project = _project(built["fx"])
    parts = compose.find_parts(built["parts"] / "part-cpu")
    msg = _refusal(project, parts, tmp_path, version="2026.49")
    assert "built at version 2026.48, this release is 2026.49" in msg
    assert "onebit-cpu-2026.49-default_h" in msg  # the file this release needs, named
    msg = _refusal(project, parts, tmp_path, build_number=1)  # a respin: its tag asks for build number 1
    assert "built at build number 0, this release's tag asks for 1" in msg


def test_a_part_from_another_pin_commit_or_recipe_revision_is_refused(built, tmp_path):
    fx = built["fx"]
    project = _project(fx)
    parts = compose.find_parts(built["parts"] / "part-cpu")
    moved = fx.upstream
    (moved / "greet.c").write_text((moved / "greet.c").read_text() + "/* moved */\n")
    git(moved, "commit", "-qam", "move")
    new = git(moved, "rev-parse", "HEAD")
    pins = {**project.pins, "llama.cpp": dataclasses.replace(project.pins["llama.cpp"], commit=new)}
    msg = _refusal(dataclasses.replace(project, pins=pins), parts, tmp_path)
    assert f"cpu was built from llama.cpp @ {fx.commit}; this checkout pins {new}" in msg
    # the same commit, but the recipe changed since (what the manifest says the backend can do)
    cpu = project.recipes["cpu"]
    data = json.loads(json.dumps(cpu.data))
    data["provides"]["features"] = ["embedding", "reranking"]
    recipes = {**project.recipes, "cpu": dataclasses.replace(cpu, data=data)}
    msg = _refusal(dataclasses.replace(project, recipes=recipes), parts, tmp_path)
    assert "its manifest entry for cpu differs from this checkout's recipe in features" in msg


def test_missing_or_conflicting_parts_are_refused(built, tmp_path):
    project = _project(built["fx"])
    cuda_only = compose.find_parts(built["parts"] / "part-cuda")
    msg = _refusal(project, cuda_only, tmp_path)
    assert "onebit-serve-2026.48-default_h" in msg and "no part built it" in msg
    other = _copy_part(built["parts"] / "part-cpu", tmp_path / "parts" / "again")
    [conda] = [p for p in (other / "channel").rglob("onebit-cpu-*.conda")]
    conda.write_bytes(conda.read_bytes() + b"\0")
    parts = compose.find_parts(built["parts"] / "part-cpu") + compose.find_parts(tmp_path / "parts")
    assert "2 parts hold it with different bytes" in _refusal(project, parts, tmp_path / "x")
    stale = _copy_part(built["parts"] / "part-cpu", tmp_path / "stale" / "old")
    (stale / "toolchain.json").unlink()
    with pytest.raises(compose.ComposeError, match="built before builds recorded what they knew"):
        compose.find_parts(tmp_path / "stale")


def test_release_from_parts_and_its_tag(built, tmp_path, capsys, monkeypatch):
    fx = built["fx"]
    monkeypatch.delenv("ONEBIT_RELEASE_REPO", raising=False)
    monkeypatch.setenv("ONEBIT_CACHE", str(tmp_path / "cache"))
    parts = tmp_path / "from"
    for name in ("part-cpu", "part-cuda"):
        shutil.copytree(built["parts"] / name, parts / f"built-{name}")
    out = tmp_path / "dist"
    assert main(["--root", str(fx.repo), "release", "cpu", "--from", str(parts), "--tag", TAG, "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert f"1bit-{TAG}-linux-x86_64.tar.zst" in names and f"llama-{TAG}-bin-ubuntu-x64.tar.gz" in names
    assert not (fx.repo / ".onebit" / "work").exists()  # nothing was built
    # a respin's tag wants build number 1: these parts were built for the first release of the week
    capsys.readouterr()
    assert main(["--root", str(fx.repo), "release", "cpu", "--from", str(parts), "--tag", f"{TAG}.1",
                 "--out", str(tmp_path / "dist1")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot assemble bundle cpu at 2026.48 build 1 from the built parts:")
    assert "Traceback" not in err and not (tmp_path / "dist1").exists()
    assert main(["--root", str(fx.repo), "release", "cpu", "--tag", "v2026.60", "--from", str(parts)]) == 2
    assert "ISO year 2026 has weeks 01..53" in capsys.readouterr().err


def test_release_from_parts_points_at_the_commit_they_were_built_from(built, tmp_path, capsys, monkeypatch):
    from github_fake import REPO, TOKEN, Fake

    fx = built["fx"]
    head = git(fx.repo, "rev-parse", "HEAD")
    monkeypatch.setenv("ONEBIT_CACHE", str(tmp_path / "cache"))
    for name in ("part-cpu", "part-cuda"):  # every build recorded the project commit it ran from
        assert json.loads((built["parts"] / name / "toolchain.json").read_text())["project"] == {"commit": head,
                                                                                                 "modified": []}
    parts = tmp_path / "from"
    _copy_part(built["parts"] / "part-cpu", parts / "built-cpu")

    def release(root, parts_dir, *extra):
        capsys.readouterr()
        code = main(["--root", str(root), "release", "cpu", "--from", str(parts_dir), "--tag", TAG,
                     "--out", str(tmp_path / "dist"), *extra])
        return code, capsys.readouterr().err

    assert release(fx.repo, parts, "--target", head[:10])[0] == 0
    code, err = release(fx.repo, parts, "--target", fx.commit)  # a commit, but not the one the parts were built from
    assert code == 2 and f"--target {fx.commit} is not the commit the parts were built from: {head}" in err
    assert err.count("\n") == 2 and "Traceback" not in err  # one line, and its hint

    # a part built from another commit, or from uncommitted changes, cannot be in a release that points at one
    other = tmp_path / "other"
    _copy_part(built["parts"] / "part-cpu", other / "built-cpu")
    _copy_part(built["parts"] / "part-cuda", other / "built-cuda",
               edit=lambda rec: rec.update(project={"commit": "0" * 40, "modified": []}))
    code, err = release(fx.repo, other, "--target", head)
    assert code == 2 and f"the parts were built from 2 commits: {'0' * 40} ({other / 'built-cuda'}); {head}" in err
    dirty = tmp_path / "dirty"
    _copy_part(built["parts"] / "part-cpu", dirty / "built-cpu",
               edit=lambda rec: rec.update(project={"commit": head, "modified": ["recipes/cpu.yaml"]}))
    code, err = release(fx.repo, dirty, "--target", head)
    assert code == 2 and "was built from uncommitted changes on top of" in err and "(recipes/cpu.yaml)" in err

    # assembled in a checkout of another commit: its recipes and history are not what the release points at
    moved = tmp_path / "moved"
    subprocess.run(["git", "clone", "-q", str(fx.repo), str(moved)], check=True)
    (moved / "NOTICE").write_text("moved on\n")
    git(moved, "commit", "-qam", "moved on")
    code, err = release(moved, parts, "--target", head)
    assert code == 2 and f"this checkout is at {git(moved, 'rev-parse', 'HEAD')}, the parts were built from {head}" in err

    # published without --target: the release is created at the commit the parts recorded
    fake = Fake()
    try:
        monkeypatch.setenv("ONEBIT_GITHUB_API", fake.url)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("ONEBIT_RELEASE_REPO", REPO)
        assert release(fx.repo, parts, "--publish")[0] == 0
        [rel] = fake.releases.values()
        assert (rel["tag_name"], rel["target_commitish"]) == (TAG, head)
    finally:
        fake.close()


def test_release_tag_decides_once(built, tmp_path, capsys, monkeypatch):
    from test_release_publish import REPO, TOKEN, Fake

    fx = built["fx"]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(fx.repo), str(clone)], check=True)
    out = tmp_path / "github-output"
    assert main(["--root", str(clone), "release-tag", "--offline", "--date", "2026-11-29", "--output", str(out)]) == 0
    assert out.read_text() == "tag=v2026.48\nversion=2026.48\nbuild_number=0\n"
    git(clone, "tag", "v2026.48")
    assert main(["--root", str(clone), "release-tag", "--offline", "--date", "2026-11-29"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "v2026.48.1"
    # against the release store: a published release is taken (respin), a draft left by an interrupted run resumed
    fake = Fake()
    try:
        monkeypatch.setenv("ONEBIT_GITHUB_API", fake.url)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("ONEBIT_RELEASE_REPO", REPO)
        fake.releases[1] = {"id": 1, "tag_name": "v2026.48", "draft": False, "upload_url": "", "html_url": ""}
        assert main(["--root", str(clone), "release-tag", "--date", "2026-11-29"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "v2026.48.1"
        fake.releases[2] = {"id": 2, "tag_name": "v2026.48.1", "draft": True, "upload_url": "", "html_url": ""}
        assert main(["--root", str(clone), "release-tag", "--date", "2026-11-29"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "v2026.48.1"
    finally:
        fake.close()


def test_release_part_builds_at_the_tags_build_number(built, tmp_path, monkeypatch):
    fx = built["fx"]
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    monkeypatch.setenv("CCACHE_DISABLE", "1")
    assert _cli(fx.repo, tmp_path / "w", "release-part", "cpu", "--tag", f"{TAG}.2", "--only", "cpu") == 0
    part = tmp_path / "built" / "w"
    rec = json.loads((part / "toolchain.json").read_text())
    assert (rec["version"], rec["build_number"]) == ("2026.48", 2)
    assert rec["variants"]["cpu"]["build_string"].endswith("_2")
    assert [p.name for p in (part / "channel").rglob("onebit-cpu-*.conda")] == [
        f"onebit-cpu-2026.48-{rec['variants']['cpu']['build_string']}.conda"]
