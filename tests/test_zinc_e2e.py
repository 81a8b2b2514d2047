"""ZINC end to end on Mesa's lavapipe: the strix bundle's zinc (zig from its pinned wheel, the pinned Vulkan SDK) built
from the pin, installed, checked by `1bit check` through zinc's own `--check`, and serving a chat completion through
`1bit serve --device zinc`.

zinc's source is on GitHub only (no package registry carries it), which CI cannot reach: the fetch step takes the pinned
commit from a git mirror directory (ONEBIT_GIT_MIRRORS; `nox -s tests` points it at ../shared/mirrors when it exists),
verified like any mirror, and the test says so where no mirror directory holds zinc.git."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

from builders.project import config
from builders.inputs import host
from builders.build import build
from builders.inputs.fetch import cached, mirror_dirs, read_record
from builders.ship.install import install_bundle
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout
from conftest import live_output, missing_host_tool
from serve_fixtures import free_port, wait_http
from tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def zinc_prefix(cpu_bundle, tmp_path_factory, request):
    project = config.load_project(ROOT)
    pin = project.pins["zinc"]
    cache = cpu_bundle.layout.cache
    dest = cache / "git" / f"{pin.commit}.git"
    if not cached(dest, pin.commit) and not any(
            (d / n).is_dir() for d in mirror_dirs((), os.environ) for n in config.repo_names(pin.name, pin.url)):
        pytest.skip(f"zinc {pin.short} comes from GitHub only ({pin.url}), which this host cannot reach; set "
                    f"{config.MIRRORS_ENV} to a directory holding zinc.git (`nox -s tests` uses ../shared/mirrors)")
    if not list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json")):
        missing_host_tool("Mesa's lavapipe is missing: apt-get install mesa-vulkan-drivers")
    base = tmp_path_factory.mktemp("zinc-bundle")
    layout = Layout(root=ROOT, cache=cache, work=base / "work", out=base / "out")

    def planned():
        facts = host.gather(all_tools(project, "strix"), toolchains=cache / "toolchains")
        return project, make_plan(project, "strix", facts, layout, only={"zinc", "serve"})

    with live_output(request):  # zig and the Vulkan SDK are pinned toolchain inputs: assembled first
        plan, _ = build(planned)
    assert plan.missing == [], plan.missing
    assert read_record(dest)["commit"] == pin.commit  # verified, and which mirror served it is recorded
    prefix = base / "prefix"
    install_bundle(layout.out / "channel", prefix, "strix", cache_dir=base / "pkgs")
    return prefix


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "ONEBIT_MANIFEST")}


def test_what_ships_names_no_build_path_and_has_no_debug_info(zinc_prefix):
    zinc = zinc_prefix / "libexec/onebit/zinc/bin/zinc"
    sections = subprocess.run(["readelf", "-S", "-W", str(zinc)], capture_output=True, text=True).stdout
    assert ".debug_info" not in sections and ".text" in sections
    dynamic = subprocess.run(["readelf", "-d", str(zinc)], capture_output=True, text=True).stdout
    assert "libvulkan.so.1" in dynamic and "[$ORIGIN/../lib]" in dynamic and "toolchains" not in dynamic


def test_1bit_check_sees_lavapipe_through_zinc_check(zinc_prefix):
    out = subprocess.run([zinc_prefix / "bin" / "1bit", "check"], capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    row = next(line for line in out.stdout.splitlines() if line.lstrip("│ ").startswith("zinc"))
    assert row.count("Vulkan0") == 2, out.stdout  # claimed and seen
    raw = subprocess.run([zinc_prefix / "libexec/onebit/zinc/bin/zinc", "--check"], capture_output=True, text=True,
                         cwd=zinc_prefix / "libexec/onebit/zinc", env=_env(), timeout=300).stdout
    assert "Selected GPU: #0 llvmpipe" in raw and "Required shaders" in raw and "present [OK]" in raw, raw


def test_serve_device_zinc_answers_a_chat_completion(zinc_prefix, tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    port = free_port()
    dry = subprocess.run([zinc_prefix / "bin" / "1bit", "serve", "-m", model, "--device", "zinc", "--allow-remote",
                          "--port", str(port), "--dry-run"], capture_output=True, text=True, env=_env())
    child = json.loads(dry.stdout)["children"][0]
    assert child["adapter"] == "zinc" and child["cwd"] == str(zinc_prefix / "libexec/onebit/zinc")
    log = tmp_path / "zinc.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([zinc_prefix / "bin" / "1bit", "serve", "-m", model, "--device", "zinc", "--allow-remote",
                                 "--port", str(port), "--alias", "tiny"], stdout=err, stderr=subprocess.STDOUT, env=_env())
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=240)
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=240,
                          json={"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, r.text + log.read_text()[-3000:]
        assert r.json()["usage"]["completion_tokens"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert "GPU: llvmpipe" in text, text[-3000:]
    assert "dmmv_f32.spv': FileNotFound" not in text  # it ran in its root, where its shaders are
