"""The cpu + vulkan bundle, end to end on Mesa's lavapipe (a CPU Vulkan driver from Debian's packages): built from the
pin (patch 0002 on Debian 12's headers), installed offline into one prefix, served with `1bit serve --device vulkan`
and `--device cpu`, picked by plain `1bit serve`, and checked with `1bit check`.

ggml-vulkan skips CPU-type Vulkan devices unless GGML_VK_VISIBLE_DEVICES selects them: the tests set it, the bundle
never does."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import requests
from rich.console import Console

from builders.project import config
from builders.inputs import host
from builders.build import build
from builders.ship.install import install_bundle
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout
from conftest import live_output, missing_host_tool
from serve_fixtures import free_port, wait_http
from tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent
LAVAPIPE = {"GGML_VK_VISIBLE_DEVICES": "0"}
pytestmark = pytest.mark.e2e


def _missing_toolchain() -> list[str]:
    """What the host must have to run a Vulkan build's tests: the loader and lavapipe. The SDK the build compiles
    with (glslc, headers) is a pinned toolchain input the fetch step provides."""
    missing = []
    if not [p for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib") for p in Path(d).glob("libvulkan.so.1")]:
        missing.append("libvulkan1")
    if not list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json")):
        missing.append("mesa-vulkan-drivers")
    return missing


@pytest.fixture(scope="session")
def vulkan_bundle(cpu_bundle, tmp_path_factory, request):
    missing = _missing_toolchain()
    if missing:
        missing_host_tool(f"the Vulkan toolchain is missing: apt-get install {' '.join(missing)}")
    base = tmp_path_factory.mktemp("vulkan-bundle")
    project = config.load_project(ROOT)
    layout = Layout(root=ROOT, cache=cpu_bundle.layout.cache, work=base / "work", out=base / "out")
    def planned():
        facts = host.gather(all_tools(project, "vulkan"), toolchains=layout.cache / "toolchains")
        return project, make_plan(project, "vulkan", facts, layout)

    old = os.environ.get("GGML_VK_VISIBLE_DEVICES")
    os.environ.update(LAVAPIPE)  # so the recipe test marked `needs: gpu` finds its device and runs
    console = Console(stderr=True, record=True, width=200)  # what the build said, for the tests to read
    try:
        with live_output(request):  # as `1bit-build build`: the pinned Vulkan SDK first, every toolchain or nothing
            plan, report = build(planned, console=console)
        assert plan.missing == [], plan.missing
        report.log, report.plan = console.export_text(), plan
    finally:
        os.environ.pop("GGML_VK_VISIBLE_DEVICES") if old is None else os.environ.update(GGML_VK_VISIBLE_DEVICES=old)
    prefix = base / "prefix"
    install_bundle(layout.out / "channel", prefix, "vulkan", cache_dir=base / "pkgs")
    return prefix, report, base


def _env(**more) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "ONEBIT_MANIFEST")}
    return {**env, **more}


def _serve(prefix: Path, model: Path, log: Path, *args: str):
    port = free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen([prefix / "bin" / "1bit", "serve", "-m", model, "--port", str(port), "--ctx-size", "256",
                                 "-t", "2", "-lv", "4", *args], stdout=subprocess.DEVNULL, stderr=err,
                                env=_env(**LAVAPIPE))
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=180)
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                          json={"max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, r.text
        exe = os.readlink(f"/proc/{proc.pid}/exe")  # serve execs the backend's own llama-server
        return r.json(), exe, log.read_text(errors="replace")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


_PROBE_CALL = re.compile(r'test_shader_extension_support\(\s*"(GL_\w+)"\s*"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([^"]+)"')


def _glslc_drops(build_dir: Path) -> set[str]:
    """What this build's glslc lacks, found without the builder: ggml-vulkan's own probe list (its CMakeLists at the
    pin), each probe shader compiled with the glslc CMake recorded, the way upstream's probe runs it."""
    cache = (build_dir / "CMakeCache.txt").read_text()
    glslc = re.search(r"^Vulkan_GLSLC_EXECUTABLE:FILEPATH=(.+)$", cache, re.M).group(1)
    source = Path(re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.+)$", cache, re.M).group(1))
    vk = source / "ggml/src/ggml-vulkan"
    probes = _PROBE_CALL.findall((vk / "CMakeLists.txt").read_text())
    assert len(probes) >= 5, probes  # the pin probes coopmat, coopmat2, integer dot, bfloat16, ...
    dropped = set()
    for ext, rel in probes:
        proc = subprocess.run([glslc, "-o", "-", "-fshader-stage=compute", "--target-env=vulkan1.3", str(vk / rel)],
                              capture_output=True)  # stdout is the SPIR-V itself
        if f"extension not supported: {ext}" in proc.stderr.decode(errors="replace"):
            dropped.add(ext)
    return dropped


def test_the_build_reports_its_shader_features_and_ran_the_gpu_test(vulkan_bundle):
    prefix, report, base = vulkan_bundle
    manifest = json.loads((prefix / "share/onebit/manifest.json").read_text())
    vk = manifest["backends"]["vulkan"]
    assert vk["devices"] == ["Vulkan0"] and vk["root"] == "libexec/onebit/vulkan"
    assert vk["source"]["patches"][1].startswith("0002-")
    assert set(manifest["backends"]) == {"cpu", "vulkan"}
    # the manifest names exactly the features this glslc cannot compile (none is recorded when it has them all)
    build_dir = Path(report.plan.step("build:vulkan").data.build_dir)
    assert set(vk.get("dropped_shader_features", [])) == _glslc_drops(build_dir)
    # and the recipe test marked `needs: gpu` did run on lavapipe's Vulkan0, not skip
    gpu_tests = [t["name"] for t in config.load_project(ROOT).recipes["vulkan"].data["tests"] if t.get("needs") == "gpu"]
    assert gpu_tests
    for name in gpu_tests:
        assert f"test '{name}' of vulkan needs gpu: Vulkan0 present, running it" in report.log, report.log[-3000:]
        assert f"ok test '{name}' of vulkan" in report.log


def test_serve_device_vulkan_offloads_to_vulkan0(vulkan_bundle, tmp_path):
    prefix, _, _ = vulkan_bundle
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    reply, exe, log = _serve(prefix, model, tmp_path / "vk.log", "--device", "vulkan")
    assert reply["usage"]["completion_tokens"] > 0
    assert exe == str(prefix / "libexec/onebit/vulkan/bin/llama-server")
    device_lines = [line for line in log.splitlines() if "Vulkan0" in line]
    assert any("llvmpipe" in line for line in device_lines), log[-3000:]
    offload = [line for line in log.splitlines() if "offloaded" in line or ("Vulkan0" in line and "buffer" in line)]
    assert offload, log[-3000:]
    print("\n".join(["lavapipe proof:", *device_lines[:3], *offload[:3]]))


def test_serve_device_cpu_from_the_same_prefix(vulkan_bundle, tmp_path):
    prefix, _, _ = vulkan_bundle
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    reply, exe, log = _serve(prefix, model, tmp_path / "cpu.log", "--device", "cpu")
    assert reply["usage"]["completion_tokens"] > 0
    assert exe == str(prefix / "libexec/onebit/cpu/bin/llama-server")
    assert not [line for line in log.splitlines() if "Vulkan0" in line and "buffer" in line], log[-2000:]


def test_plain_serve_picks_vulkan(vulkan_bundle, tmp_path):
    prefix, _, _ = vulkan_bundle
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = subprocess.run([prefix / "bin" / "1bit", "serve", "-m", model, "--dry-run"], capture_output=True, text=True,
                         env=_env())
    child = json.loads(out.stdout)["children"][0]
    assert child["backend"] == "vulkan" and child["binary"] == str(prefix / "libexec/onebit/vulkan/bin/llama-server")


def test_1bit_check_passes(vulkan_bundle):
    prefix, _, _ = vulkan_bundle
    out = subprocess.run([prefix / "bin" / "1bit", "check"], capture_output=True, text=True, env=_env(**LAVAPIPE),
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    row = next(line for line in out.stdout.splitlines() if line.lstrip("│ ").startswith("vulkan"))
    assert "Vulkan0" in row.split("│")[4] if "│" in row else "Vulkan0" in row


def test_each_backend_loads_its_own_libraries(vulkan_bundle):
    """Two llama.cpp builds in one prefix: each server loads libggml-base and its backends from its own subtree."""
    prefix, _, _ = vulkan_bundle
    for variant in ("cpu", "vulkan"):
        exe = prefix / f"libexec/onebit/{variant}/bin/llama-server"
        trace = subprocess.run([exe, "--list-devices"], capture_output=True, text=True,
                               env=_env(LD_DEBUG="libs", **LAVAPIPE), timeout=120).stderr
        inits = [line.split("calling init: ")[1] for line in trace.splitlines() if "calling init: " in line]
        ggml = [p for p in inits if "libggml" in p or "libllama" in p]
        assert ggml and all(f"libexec/onebit/{variant}/" in p for p in ggml), ggml
        names = [Path(p).name for p in ggml]
        assert ("libggml-vulkan.so" in names) == (variant == "vulkan"), ggml
