"""Assembling a release directory from built bundles: names, licenses, Lemonade archives, sums, SBOM, changes."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import tarfile

import pytest
from test_lemonade import build_prefix
from test_release_changes import commit, git

from builders.project.config import file_sha256
from builders.errors import OnebitError
from builders.release import flow, lemonade, lemonade_archives
from builders.io import tarball as tarballs

TAG = "v2026.48"
MTIME = 1767225600
LEMONADE = lemonade.Settings(repos={"cpu": "ggml-org/llama.cpp"})


@pytest.fixture
def world(tmp_path):
    up = tmp_path / "upstream"
    up.mkdir()
    git(up, "init", "-q", "-b", "main")
    c1 = commit(up, "llama 1", {"LICENSE": "MIT License\n", "a.c": "1"})
    cache = tmp_path / "cache" / "git"
    cache.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(up), str(cache / f"{c1}.git")], check=True)
    root = tmp_path / "project"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    commit(root, "project", {
        "LICENSE": "Apache-2.0\n", "NOTICE": "1bit engine\n",
        "pins.yaml": f"schema_version: 1\npins:\n  llama.cpp:\n    url: https://github.com/ggml-org/llama.cpp.git\n"
                     f"    commit: {c1}\n    license: MIT\n",
        "recipes/cpu.yaml": "name: cpu\nsource:\n  pin: llama.cpp\n  patches:\n    - file: 0001-x.patch\n",
        "recipes/patches/cpu/0001-x.patch": "diff\n"})
    prefix = build_prefix(tmp_path / "b", ("cpu",))
    (prefix / "bin").mkdir()
    (prefix / "bin/llama-server-cpu").symlink_to("../libexec/onebit/cpu/bin/llama-server")
    tarball = tarballs.write(tmp_path / "onebit-cpu-2026.48-0-linux-64.tar.zst", "onebit-cpu",
                             tarballs.tree_entries(prefix), mtime=0)
    pkg = tmp_path / "onebit-cpu-2026.48-cpu_habc_0.conda"
    pkg.write_bytes(b"conda")
    records = {"cpu": {"package": "onebit-cpu", "build_string": "cpu_habc_0",
                       "source": {"pin": "llama.cpp", "commit": c1}, "tools": {"c++": "12.2.0", "cmake": "3.31.6"},
                       "inputs": []}}
    built = flow.BuiltBundle(name="cpu", tarball=tarball, packages=[pkg], pins=["llama.cpp"], records=records,
                             gates={"cpu": {"passed": True, "items": [{"line": "1bit check", "result": "ok"}]}})
    return {"root": root, "cache": cache, "built": built, "c1": c1}


def run(world, out):
    return flow.assemble(root=world["root"], out=out, tag=TAG, previous_tag=None, date=dt.date(2026, 11, 29),
                         config=flow.ReleaseConfig(repo="1bit-MONSTER/1bit-engine", lemonade=LEMONADE),
                         built=[world["built"]],
                         git_cache=lambda c: world["cache"] / f"{c}.git", mtime=MTIME)


def test_release_directory(world, tmp_path):
    out = tmp_path / "release"
    files = run(world, out)
    names = [p.name for p in files]
    assert names == ["1bit-v2026.48-linux-x86_64.tar.zst", "backend_versions.json", "changes.json",
                     "llama-v2026.48-bin-ubuntu-x64.tar.gz", "notes.md", "onebit-cpu-2026.48-cpu_habc_0.conda",
                     "sbom.cdx.json", "SHA256SUMS"]
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == set(names) - {"SHA256SUMS"}
    assert all(sums[n] == file_sha256(out / n) for n in sums)
    members = {m.name: (m, data) for m, data in tarballs.members(out / "1bit-v2026.48-linux-x86_64.tar.zst")}
    top = "1bit-v2026.48-linux-x86_64"
    assert {n.split("/")[0] for n in members} == {top}
    assert members[f"{top}/LICENSE"][1] == b"Apache-2.0\n" and members[f"{top}/NOTICE"][1] == b"1bit engine\n"
    assert members[f"{top}/licenses/llama.cpp/LICENSE"][1] == b"MIT License\n"
    link = members[f"{top}/bin/llama-server-cpu"][0]
    assert link.issym() and link.linkname == "../libexec/onebit/cpu/bin/llama-server"
    assert lemonade_archives.contract_problems(out / "llama-v2026.48-bin-ubuntu-x64.tar.gz") == []
    with tarfile.open(out / "llama-v2026.48-bin-ubuntu-x64.tar.gz") as tar:
        assert "llama-v2026.48-bin-ubuntu-x64/licenses/llama.cpp/LICENSE" in tar.getnames()
    frag = json.loads((out / "backend_versions.json").read_text())
    assert frag["llamacpp"] == {"cpu": TAG}
    # keyed under the repository Lemonade downloads the cpu backend from, not the one the release is published to
    assert list(frag["checksums"]["github"]) == ["ggml-org/llama.cpp"]
    assert frag["checksums"]["github"]["ggml-org/llama.cpp"][TAG]["llama-v2026.48-bin-ubuntu-x64.tar.gz"] == \
        "sha256:" + sums["llama-v2026.48-bin-ubuntu-x64.tar.gz"]
    # the engine's Lemonade `onebit` backend: what this bundle serves through `1bit serve --device`, from its manifest
    # (its families come from the manifest's devices, which this fixture's leaves out: tests/test_lemonade_onebit.py)
    assert frag["onebit"] == {"cpu": "2026.48"} and frag["onebit_support"]["cpu"]["bundles"] == ["cpu"]
    doc = json.loads((out / "changes.json").read_text())
    assert doc["tag"] == TAG and doc["pins"]["llama.cpp"]["to"] == world["c1"]
    assert doc["artifacts"]["llama-v2026.48-bin-ubuntu-x64.tar.gz"] == sums["llama-v2026.48-bin-ubuntu-x64.tar.gz"]
    bom = json.loads((out / "sbom.cdx.json").read_text())
    assert bom["components"][0]["pedigree"]["patches"][0]["diff"]["text"]["content"] == "diff\n"
    notes = (out / "notes.md").read_text()
    assert "## Held back" in notes
    # what the build job knew, not this machine: its compilers in the notes and the SBOM, its gate in the notes
    assert "| cpu | cpu | c++ 12.2.0 | passed |" in notes
    assert doc["builds"]["cpu"]["cpu"]["tools"] == {"c++": "12.2.0", "cmake": "3.31.6"}
    assert {(t["name"], t["version"]) for t in bom["metadata"]["tools"]["components"]} == {("c++", "12.2.0"),
                                                                                          ("cmake", "3.31.6")}
    # the same inputs again: the same bytes, written by a swap
    first = {p.name: p.read_bytes() for p in files}
    again = run(world, out)
    assert {p.name: p.read_bytes() for p in again} == first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".release", "release"))) == ["release"]


def test_the_cuda_runtime_ships_licensed_and_named_in_every_asset(world, tmp_path):
    """NVIDIA's cudart, cuBLAS and cuBLASLt in the nvidia bundle's cuda subtree (laid out by the real toolchain.ship):
    the bundle tarball and the Lemonade cuda archive carry them with their license text, and the SBOM names each."""
    from test_lemonade import CUDA_RUNTIME, ship_cuda_runtime, toolkit_root

    prefix = build_prefix(tmp_path / "nv", ("cpu", "cuda"))
    ship_cuda_runtime(prefix, toolkit_root(tmp_path / "tk"))
    pkg = tmp_path / "onebit-cuda-2026.48-cuda_habc_0.conda"
    pkg.write_bytes(b"conda")
    built = flow.BuiltBundle(name="nvidia", prefix=prefix, packages=[pkg], pins=["llama.cpp"],
                             records=world["built"].records)
    settings = lemonade.Settings(repos={"cpu": "ggml-org/llama.cpp", "cuda": "lemonade-sdk/llama.cpp"},
                                 cuda_arch=("sm_90",))
    out = tmp_path / "release"
    flow.assemble(root=world["root"], out=out, tag=TAG, previous_tag=None, date=dt.date(2026, 11, 29),
                  config=flow.ReleaseConfig(repo="1bit-MONSTER/1bit-engine", lemonade=settings), built=[built],
                  git_cache=lambda c: world["cache"] / f"{c}.git", mtime=MTIME)
    lic = "share/licenses/nvidia-cublas/License.txt"
    top = "1bit-v2026.48-linux-x86_64"
    members = {m.name for m, _ in tarballs.members(out / f"{top}.tar.zst")}
    assert {f"{top}/libexec/onebit/cuda/{lic}", f"{top}/libexec/onebit/cuda/lib/libcublasLt.so.13"} <= members
    archive = out / "llama-v2026.48-ubuntu-cuda-sm_90-x64.tar.xz"
    assert lemonade_archives.contract_problems(archive) == []
    with tarfile.open(archive) as tar:
        assert f"llama-v2026.48-ubuntu-cuda-sm_90-x64/{lic}" in tar.getnames()
    bom = json.loads((out / "sbom.cdx.json").read_text())
    named = {c["name"]: c for c in bom["components"] if c["bom-ref"].startswith("redist:")}
    assert set(named) == set(CUDA_RUNTIME)
    assert named["nvidia-cublas"]["licenses"][0]["license"]["text"]["content"].startswith("NVIDIA Software License")


def test_missing_upstream_license_refuses_and_keeps_the_previous_release(world, tmp_path):
    out = tmp_path / "release"
    run(world, out)
    before = sorted(p.name for p in out.iterdir())
    world["cache"] = tmp_path / "nowhere"
    with pytest.raises(OnebitError, match="no license file"):
        run(world, out)
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("existing, current, prev", [
    (["v2026.46", "v2026.47", "v2026.47.1", "v2026.48"], "v2026.48", "v2026.47.1"),
    (["v2026.48"], "v2026.48.1", "v2026.48"),
    ([], "v2026.48", None),
    (["nightly", "v2027.01"], "v2026.48", None),
])
def test_previous(existing, current, prev):
    assert flow.previous(existing, current) == prev


def test_config(tmp_path):
    with pytest.raises(OnebitError, match="no release repository"):
        flow.load_config(tmp_path, {})
    (tmp_path / "release.yaml").write_text("repo: o/r\nlemonade:\n  therock: '7.14'\n  download_repo: {cpu: a/b}\n"
                                           "fan_out:\n  cuda: CMAKE_CUDA_ARCHITECTURES\n")
    assert flow.load_config(tmp_path, {}).lemonade == lemonade.Settings(repos={"cpu": "a/b"}, therock="7.14")
    assert flow.load_config(tmp_path, {}).fan_out == {"cuda": "CMAKE_CUDA_ARCHITECTURES"}
    assert flow.load_config(tmp_path, {"ONEBIT_RELEASE_REPO": "x/y"}).repo == "x/y"
    (tmp_path / "release.yaml").write_text("repo: o/r\nlemonade:\n  therock: 7.1\n")
    with pytest.raises(OnebitError, match="release.yaml:3: lemonade.therock"):
        flow.load_config(tmp_path, {})


def test_installed_dists_and_manifest_pins(tmp_path):
    meta = tmp_path / "lib/onebit/python/numpy-2.4.6.dist-info/METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 2.4.6\n\nlong text: with colon\n")
    (tmp_path / "share/onebit").mkdir(parents=True)
    (tmp_path / "share/onebit/manifest.json").write_text(
        '{"backends": {"cpu": {"source": {"pin": "llama.cpp"}}, "x": {"source": null}}}')
    assert flow.installed_dists(tmp_path) == {("numpy", "2.4.6")}
    assert flow.manifest_pins(tmp_path) == {"llama.cpp"}
