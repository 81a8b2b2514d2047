"""`1bit-build release` on the mini project: two clones in two work dirs give byte-identical artifacts."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard
from mini_project import git, make_mini

from builders.cli import main
from builders.ship import repro
from builders.release import lemonade_archives

TAG = "v2026.48"


def clone(mini, dest: Path) -> Path:
    """A separate checkout of the mini project (its own path), committed like a real clone."""
    shutil.copytree(mini.root, dest)
    (dest / "LICENSE").write_text("Apache-2.0\n")
    (dest / "NOTICE").write_text("mini\n")
    (dest / "release.yaml").write_text("repo: 1bit-MONSTER/mini\nlemonade:\n  download_repo: {cpu: ggml-org/llama.cpp}\n")
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", ".")
    git(dest, "commit", "-qm", "mini")
    return dest


def release(root: Path, base: Path) -> Path:
    rel = base / "release"
    code = main(["--root", str(root), "--cache", str(base / "cache"), "--work", str(base / "w"), "--out", str(base / "o"),
                 "release", "mini", "--tag", TAG, "--date", "2026-11-29", "--out", str(rel), "--offline"])
    assert code == 0
    return rel


@pytest.fixture
def mini(tmp_path):
    m = make_mini(tmp_path / "mini").without_sysroot()  # built --offline from a fresh cache
    shutil.copy(Path(__file__).resolve().parent.parent / "LICENSE", m.upstream / "LICENSE")
    # __FILE__ is an absolute path under the work dir unless the build maps it away
    main_c = (m.upstream / "main.c").read_text().replace('greet();', 'greet(); if (argc > 2) puts(__FILE__);')
    (m.upstream / "main.c").write_text(main_c)
    cmake = (m.upstream / "CMakeLists.txt").read_text() + "set_target_properties(hello PROPERTIES OUTPUT_NAME llama-server)\n"
    (m.upstream / "CMakeLists.txt").write_text(cmake)
    git(m.upstream, "add", "LICENSE", "main.c", "CMakeLists.txt")
    git(m.upstream, "commit", "-qm", "license")
    commit = git(m.upstream, "rev-parse", "HEAD")
    git(m.upstream, "tag", "-f", "v1.0")
    m.set_pin(commit=commit)
    recipe = m.recipe()
    recipe["build"]["build_type"] = "RelWithDebInfo"  # debug info records the build dir
    # installed as the cpu backend: Lemonade archives are made only for the backends Lemonade has
    recipe["stage"] = {"root": "libexec/onebit/cpu", "keep": ["bin/llama-server", "lib/libgreet.so*"],
                       "binaries": {"llama-server": "bin/llama-server"},
                       "links": {"bin/llama-server-{variant}": "bin/llama-server"}}
    recipe["tests"] = [{"name": "the patched greeting", "run": ["bin/llama-server"], "expect": "hello from onebit"}]
    m.write_recipe(recipe)
    m.commit = commit
    return m


def test_two_release_builds_are_byte_identical(mini, tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("ONEBIT_RELEASE_REPO", raising=False)
    monkeypatch.setenv("CCACHE_DISABLE", "1")  # ccache's base_dir would hide absolute paths
    a = release(clone(mini, tmp_path / "clone-a"), tmp_path / "a")
    b = release(clone(mini, tmp_path / "clone-b-with-a-longer-path"), tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert f"1bit-{TAG}-linux-x86_64.tar.zst" in names
    assert any(n.endswith(".conda") for n in names)
    shipped = [n for n in names if n.endswith((".conda", ".tar.zst", ".tar.gz", ".tar.xz"))]
    assert repro.compare_dirs(a, b, shipped) == []
    assert (a / "SHA256SUMS").read_text() == (b / "SHA256SUMS").read_text()
    assert os.path.getsize(a / "sbom.cdx.json") > 0
    assert f"llama-{TAG}-bin-ubuntu-x64.tar.gz" in names
    assert lemonade_archives.contract_problems(a / f"llama-{TAG}-bin-ubuntu-x64.tar.gz") == []
    # every .conda carries its upstream's license under info/licenses/
    for conda in (a / n for n in names if n.startswith("onebit-hello")):
        with zipfile.ZipFile(conda) as z:
            info = next(n for n in z.namelist() if n.startswith("info-"))
            raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(z.read(info))).read()
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                assert "info/licenses/LICENSE" in tar.getnames()
                assert b"Apache License" in tar.extractfile("info/licenses/LICENSE").read()
            assert not any(n.endswith(".pyc") for n in z.namelist())

    # Lemonade's layout, offline, checked against the fragment; the installed server runs with no LD_LIBRARY_PATH
    cache = tmp_path / "lemonade"
    assert main(["lemonade", "install", str(a / f"llama-{TAG}-bin-ubuntu-x64.tar.gz"), "--cache", str(cache),
                 "--fragment", str(a / "backend_versions.json")]) == 0
    server = cache / "bin/llamacpp/cpu/bin/llama-server"
    run = subprocess.run([server], capture_output=True, text=True, check=True, env={"PATH": os.defpath})
    assert run.stdout == "hello from onebit\n"
    assert (cache / "bin/llamacpp/cpu/version.txt").read_text() == TAG


def test_release_publish_and_respin(mini, tmp_path, monkeypatch):
    from test_release_publish import REPO, TOKEN, Fake

    fake = Fake()
    try:
        monkeypatch.setenv("ONEBIT_GITHUB_API", fake.url)
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        monkeypatch.setenv("ONEBIT_RELEASE_REPO", REPO)
        root = clone(mini, tmp_path / "clone")
        base = tmp_path / "b"
        argv = ["--root", str(root), "--cache", str(base / "cache"), "--work", str(base / "w"), "--out", str(base / "o"),
                "release", "mini", "--date", "2026-11-29", "--offline", "--publish"]
        assert main([*argv, "--out", str(base / "r1")]) == 0
        rel = fake.releases[1]
        assert (rel["tag_name"], rel["draft"]) == (TAG, False)
        assert sorted(a["name"] for a in fake.assets.values()) == sorted(p.name for p in (base / "r1").iterdir())
        assert (base / "r1" / "notes.md").read_text() == rel["body"]
        # the same week again: the tag exists in the release store, so this is the first respin
        assert main([*argv, "--out", str(base / "r2")]) == 0
        assert fake.releases[2]["tag_name"] == f"{TAG}.1"
        assert (base / "r2" / f"1bit-{TAG}.1-linux-x86_64.tar.zst").is_file()
        changes = (base / "r2" / "changes.json").read_text()
        assert f'"previous_tag": "{TAG}"' in changes
    finally:
        fake.close()
