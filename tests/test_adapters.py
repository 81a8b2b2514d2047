"""Each launch adapter's exact argv and env, through the pure route, and one real launch through a recording stub."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from serve_fixtures import STRIX, bundle_maker, install_stub, models, write_manifest  # noqa: F401  (models is a fixture)

from onebit.adapters import ADAPTERS, _llama_devices, _zinc_devices, list_devices
from onebit.inspect import inspect_model
from onebit.manifest import load_manifest
from onebit.launch_plan import LaunchPlan, Refusal
from onebit.route import route
from onebit.serve_flags import RouteEnv, ServeFlags

SRC = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    make = bundle_maker(tmp_path_factory)
    return {
        "strix": make("strix", STRIX, envs={"ds4": {"HSA_OVERRIDE_GFX_VERSION": "11.5.1"}}),
        "ds4-cuda": make("ds4-cuda", ["ds4", "cuda"], devices={"ds4": ["CUDA0"]}),
        "ds4-cpu": make("ds4-cpu", ["ds4", "cpu"], devices={"ds4": ["CPU"]}),
        "npu-runtime": make("npu-runtime", ["npu", "vulkan"],
                            binaries={"npu": "libexec/onebit/xdna/bin/npu-server"}),
        # a manifest written before `adapter` existed: zinc, ds4 and npu still get their own adapters
        "old": load_manifest(write_manifest(tmp_path_factory.mktemp("old"), ["zinc", "ds4", "npu", "vulkan"])),
    }


def plan(models, bundles, model="dense", bundle="strix", env=None, **flags):
    facts = inspect_model(models[model])
    f = ServeFlags(model=str(models[model]), **flags)
    return route(facts, f, bundles[bundle], RouteEnv(env=env or {}, path_llama_server="/usr/bin/llama-server",
                                                     free_ports=(41001, 41002)))


def prog(m, rel):
    return str(m.prefix / rel)


ZINC = "libexec/onebit/zinc/bin/zinc"
REMOTE = {"allow_remote": True}
DS4 = "libexec/onebit/ds4-rocm/bin/ds4-server"

# (id, model, bundle, serve flags, program (prefix-relative), argv after argv[0] ("@m" = the model path), env)
ADAPTER_TABLE = [
    # zinc always listens on 0.0.0.0 (it has no --host): every zinc launch needs --allow-remote
    ("zinc-plain", "dense", "strix", {"device": "zinc", **REMOTE}, ZINC, ["-m", "@m", "-p", "8080", "-d", "0"], {}),
    ("zinc-ctx-parallel-port", "dense", "strix",
     {"device": "zinc", "ctx_size": 8192, "parallel": 2, "port": 9090, **REMOTE},
     ZINC, ["-m", "@m", "-p", "9090", "-d", "0", "-c", "8192", "--parallel", "2"], {}),
    ("zinc-pass-through", "dense", "strix", {"device": "zinc", "extra": ("--kv-quant", "3"), **REMOTE}, ZINC,
     ["-m", "@m", "-p", "8080", "-d", "0", "--kv-quant", "3"], {}),
    ("zinc-old-manifest", "dense", "old", {"device": "zinc", **REMOTE}, "libexec/onebit/zinc/zinc",
     ["-m", "@m", "-p", "8080", "-d", "0"], {}),
    ("ds4-1bp-auto", "pkg", "strix", {}, DS4,
     ["-m", "@m", "--host", "127.0.0.1", "--port", "8080", "--backend", "cuda"], {"HSA_OVERRIDE_GFX_VERSION": "11.5.1"}),
    ("ds4-1bp-explicit-ctx", "pkg", "strix",
     {"device": "ds4", "ctx_size": 65536, "host": "0.0.0.0", "port": 8001, **REMOTE},
     DS4, ["-m", "@m", "--host", "0.0.0.0", "--port", "8001", "--backend", "cuda", "--ctx", "65536"],
     {"HSA_OVERRIDE_GFX_VERSION": "11.5.1"}),
    ("ds4-cuda-build", "pkg", "ds4-cuda", {}, "libexec/onebit/ds4-rocm/bin/ds4-server",
     ["-m", "@m", "--host", "127.0.0.1", "--port", "8080", "--backend", "cuda"], {}),
    ("ds4-cpu-build", "pkg", "ds4-cpu", {}, "libexec/onebit/ds4-rocm/bin/ds4-server",
     ["-m", "@m", "--host", "127.0.0.1", "--port", "8080", "--backend", "cpu"], {}),
    ("ds4-old-manifest", "pkg", "old", {}, "libexec/onebit/ds4/ds4-server",
     ["-m", "@m", "--host", "127.0.0.1", "--port", "8080", "--backend", "cuda"], {}),
    ("npu-unproven", "dense", "npu-runtime", {"device": "npu"}, "libexec/onebit/xdna/bin/npu-server",
     ["serve", "-m", "@m", "--device", "npu", "--host", "127.0.0.1", "--port", "8080"], {}),
]


@pytest.mark.parametrize("case", ADAPTER_TABLE, ids=[c[0] for c in ADAPTER_TABLE])
def test_adapter_argv_and_env(models, bundles, case):
    _, model, bundle, flags, rel, tail, env = case
    p = plan(models, bundles, model=model, bundle=bundle, **flags)
    assert isinstance(p, LaunchPlan), p
    (c,) = p.children
    m = bundles[bundle]
    want = [prog(m, rel)] + [str(models[model]) if t == "@m" else t for t in tail]
    assert list(c.argv) == want
    assert dict(c.env) == env
    assert c.binary == prog(m, rel) and c.recipes == ()


@pytest.mark.parametrize("bundle", ["strix", "old"])
def test_zinc_never_gets_llama_server_flags(models, bundles, bundle):
    c = plan(models, bundles, bundle=bundle, device="zinc", allow_remote=True).children[0]
    assert c.adapter == "zinc"
    for foreign in ("--host", "--jinja", "-ngl", "--device", "Vulkan0", "--port"):
        assert foreign not in c.argv
    assert c.notes == ("zinc has no --host option: it listens on 0.0.0.0:8080, not only on 127.0.0.1",)


def test_adapter_ignores_llama_server_overrides(models, bundles):
    """--llama-server and $ONEBIT_LLAMA_SERVER name llama-servers: zinc and ds4 still run their own programs."""
    env = {"ONEBIT_LLAMA_SERVER": "/x/llama-server", "ONEBIT_LLAMA_SERVER_ZINC": "/x/zinc-llama"}
    c = plan(models, bundles, device="zinc", llama_server="/y/llama-server", env=env, allow_remote=True).children[0]
    assert c.binary == prog(bundles["strix"], ZINC)
    c = plan(models, bundles, model="pkg", llama_server="/y/llama-server", env=env).children[0]
    assert c.binary == prog(bundles["strix"], DS4)


# (id, model, bundle, flags, rule, text)
ADAPTER_REFUSALS = [
    ("npu-ships-only-the-driver", "dense", "strix", {"device": "npu"}, "no-program",
     "the npu backend of this bundle lists no npu-server program for its npu adapter (it ships: amdxdna.ko)"),
    ("npu-old-manifest", "dense", "old", {"device": "npu"}, "no-program", "lists no npu-server program"),
    ("zinc-dflash", "dense", "strix", {"device": "zinc", "dflash": "d.gguf"}, "adapter-option",
     "--dflash: zinc (the zinc backend) has no such option"),
    ("zinc-flash-attn-dflash", "dense", "strix", {"device": "zinc", "flash_attn": "on", "dflash": "d.gguf"},
     "adapter-option", "--flash-attn, --dflash: zinc (the zinc backend) has no such option; drop them"),
    ("zinc-mmproj", "dense", "strix", {"device": "zinc", "mmproj": "mm.gguf"}, "adapter-option", "--mmproj"),
    ("zinc-moe-slots", "moe", "strix", {"device": "zinc", "moe_slots": 2}, "adapter-option", "--moe-slots"),
    ("zinc-long-model", "dense", "strix", {"device": "zinc", "long_model": "x.gguf"}, "adapter-option",
     "--long-model needs llama-server children; the zinc backend runs zinc"),
    ("ds4-parallel", "pkg", "strix", {"parallel": 4}, "adapter-option", "--parallel: ds4-server (the ds4 backend)"),
    ("ds4-mtp", "pkg", "strix", {"mtp": "h.gguf"}, "adapter-option", "--mtp: ds4-server"),
]


@pytest.mark.parametrize("case", ADAPTER_REFUSALS, ids=[c[0] for c in ADAPTER_REFUSALS])
def test_adapter_refusals(models, bundles, case, tmp_path):
    _, model, bundle, flags, rule, text = case
    if flags.get("long_model"):
        facts = inspect_model(models[model])
        r = route(facts, ServeFlags(model=str(models[model]), **flags), bundles[bundle],
                  RouteEnv(free_ports=(1, 2)), long_facts=facts)
    else:
        r = plan(models, bundles, model=model, bundle=bundle, **flags)
    assert isinstance(r, Refusal), r
    assert (r.rule, "\n" in r.message) == (rule, False)
    assert text in r.message


def test_manifest_never_falls_back_to_the_only_binary(bundles):
    npu = bundles["strix"].backends["npu"]
    assert npu.binaries == {"amdxdna.ko": "libexec/onebit/xdna/lib/modules/amdxdna.ko"}
    assert npu.binary(bundles["strix"].prefix, "llama-server") is None
    assert npu.binary(bundles["strix"].prefix, "npu-server") is None
    assert (npu.adapter, bundles["old"].backends["zinc"].adapter, bundles["old"].backends["vulkan"].adapter) == (
        "npu", "zinc", "llama-server")


# --- what each adapter reads from its program's device listing -----------------------------------------------------

LLAMA_LIST = """ggml_vulkan: Found 1 Vulkan devices:
ggml_vulkan: 0 = Radeon 8060S Graphics (RADV GFX1151) | uma: 1 | fp16: 1
Available devices:
  Vulkan0: Radeon 8060S Graphics (RADV GFX1151) (65536 MiB, 60000 MiB free)
  HRX0: AMD gfx1151 (HRX) (65536 MiB, 60000 MiB free)
"""
ZINC_PIN = """info: GPU 0: AMD Radeon 8060S | VRAM: 65536 MB | vendor: 0x1002
info: GPU 1: llvmpipe | VRAM: 0 MB | vendor: 0x10005
"""
# `zinc --check` of the ReleaseFast build at the pin, as it printed on Mesa's lavapipe (Debian 12, one Vulkan device)
ZINC_CHECK_LAVAPIPE = """
=== ZINC System Diagnostics ===

[4/5] Vulkan Device
  Checking Vulkan loader, device enumeration, and logical device init...
  Vulkan: Instance and logical device initialized [OK]
  Visible GPUs: 1
  Selected GPU: #0 llvmpipe (LLVM 15.0.6, 256 bits)
  Queue family: 0
  GPU tuning: unknown | 2048 MB VRAM | 0 GB/s | wave32 | coopmat=no [OK]
  Step time: 309.50 ms
"""


# --- the ONE `llama-server --list-devices` parser (onebit.adapters.list_devices; builders/ship/stage.py uses it) ----------
# (id, stdout, stderr, devices). stdout as common/arg.cpp common_print_available_devices() prints it at the llama.cpp
# pin; stderr as ggml logs while loading backends (ggml-cuda.cu ggml_cuda_init, ggml-vulkan.cpp). The CPU row is this
# machine's CPU build; the lavapipe and H200 lines are the ones recorded in tests/test_layout.py and issue 17.
CUDA_LOG = ("ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143156 MiB):\n"
            "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143156 MiB\n"
            "load_backend: loaded CUDA backend from /p/libexec/onebit/cuda/bin/libggml-cuda.so\n")
VULKAN_LOG = ("ggml_vulkan: Found 1 Vulkan devices:\n"
              "ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6, 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0 | fp4: 0 | "
              "warp size: 8 | shared memory: 32768 | int dot: 0 | matrix cores: none\n")
LIST_DEVICES = [
    ("cpu-build-none", "Available devices:\n  (none)\n", "", ()),
    ("lavapipe", "Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (23936 MiB, 23936 MiB free)\n",
     VULKAN_LOG, ("Vulkan0",)),
    ("h200-cuda", "Available devices:\n  CUDA0: NVIDIA H200 (143156 MiB, 142523 MiB free)\n", CUDA_LOG, ("CUDA0",)),
    ("h200-vulkan", "Available devices:\n  Vulkan0: NVIDIA H200 (143771 MiB, 143000 MiB free)\n", VULKAN_LOG,
     ("Vulkan0",)),
    ("strix-hrx-build", "Available devices:\n  HRX0: AMD gfx1151 (HRX) (65536 MiB, 60000 MiB free)\n"
     "  Vulkan0: Radeon 8060S Graphics (RADV GFX1151) (65536 MiB, 60000 MiB free)\n", "", ("HRX0", "Vulkan0")),
    ("log-lines-on-both-streams", LLAMA_LIST, VULKAN_LOG, ("Vulkan0", "HRX0")),
    ("no-listing-at-all", "", "error: unknown argument: --list-devices\n", ()),
]


@pytest.mark.parametrize("case", LIST_DEVICES, ids=[c[0] for c in LIST_DEVICES])
def test_the_one_list_devices_parser(case):
    from builders.ship.stage import parse_list_devices

    _, stdout, stderr, want = case
    assert list_devices(stdout + stderr) == want
    assert ADAPTERS["llama-server"].parse_devices(stdout, stderr) == want  # `1bit check`'s probe
    assert parse_list_devices(stdout + stderr) == sorted(want)  # the build's recipe-test check, sorted as before
    # the two parsers this one replaced (onebit/adapters.py and builders/ship/stage.py at 1fb465c) read the same
    old_adapter = re.compile(r"^\s+([A-Za-z]+[0-9]+):\s", re.MULTILINE)
    old_stage = re.compile(r"^\s*([A-Za-z]+[0-9]+):", re.M)
    assert tuple(dict.fromkeys(old_adapter.findall(stdout + "\n" + stderr))) == want
    assert sorted(set(old_stage.findall(stdout + stderr))) == sorted(want)


def test_stage_uses_the_one_parser():
    import builders.ship.stage as stage

    assert stage.list_devices is list_devices and not hasattr(stage, "_DEVICE_LINE")


def test_device_parsers():
    assert _llama_devices(LLAMA_LIST, "") == ("Vulkan0", "HRX0")
    assert _llama_devices("Available devices:\n", "") == ()
    assert _zinc_devices("", ZINC_PIN) == ("Vulkan0", "Vulkan1")  # zinc's -d is the Vulkan index
    assert _zinc_devices(ZINC_CHECK_LAVAPIPE, "") == ("Vulkan0",)
    assert _zinc_devices(ZINC_CHECK_LAVAPIPE.replace("Visible GPUs: 1", "Visible GPUs: 2"), "") == ("Vulkan0", "Vulkan1")
    assert _zinc_devices("  Visible GPUs: 0\n", "") == ()
    assert ADAPTERS["llama-server"].probe("/p/llama-server") == ["/p/llama-server", "--list-devices"]
    assert ADAPTERS["zinc"].probe("/p/zinc") == ["/p/zinc", "--check"]
    assert ADAPTERS["ds4"].parse_devices is None and not ADAPTERS["npu"].proven


# --- a real launch: `1bit serve --device zinc` execs the recording stub as zinc ---------------------------------------


def _zinc_stub_bundle(tmp_path):
    """A per-backend bundle whose zinc is the recording stub: (its manifest, the folder the stub records into)."""
    prefix = tmp_path / "prefix"
    install_stub(prefix / "libexec/onebit/zinc/bin/zinc")
    rec = tmp_path / "rec"
    rec.mkdir()
    return write_manifest(prefix, ["zinc"], layout="per-backend"), rec


def test_serve_execs_zinc_with_its_own_argv(models, tmp_path):
    manifest, rec = _zinc_stub_bundle(tmp_path)
    env = {**os.environ, "ONEBIT_STUB_RECORD": str(rec), "PYTHONPATH": str(SRC)}
    serve = [sys.executable, "-m", "onebit.cli", "serve", "-m", str(models["dense"]), "--device", "zinc",
             "--port", "8123", "-c", "2048", "--manifest", str(manifest)]
    r = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 3 and list(rec.iterdir()) == []  # zinc listens on every interface: refused, nothing ran
    assert r.stderr == ("1bit serve: refused: --device zinc: zinc has no --host option and listens on 0.0.0.0:8123 "
                        "(every interface, no authentication); add --allow-remote to run it anyway\n")
    r = subprocess.run(serve + ["--allow-remote"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "1bit serve: zinc: zinc has no --host option: it listens on 0.0.0.0:8123, not only on 127.0.0.1\n"
    got = json.loads((rec / "8123.json").read_text())
    assert got["argv"][1:] == ["-m", str(models["dense"]), "-p", "8123", "-d", "0", "-c", "2048"]


@pytest.fixture(scope="module")
def real_ds4_server(tmp_path_factory, request) -> str:
    """The real ds4-server: the ds4 recipe's cpu variant built through the project's own plan and executor from the
    pinned commit, fetched from a git mirror directory (ONEBIT_GIT_MIRRORS; `nox -s tests` points it at
    ../shared/mirrors), since antirez/ds4 is on GitHub only. ONEBIT_TEST_DS4_SERVER names a ready binary instead."""
    if os.environ.get("ONEBIT_TEST_DS4_SERVER"):
        return os.environ["ONEBIT_TEST_DS4_SERVER"]
    from dataclasses import replace

    from builders.project import config
    from builders.inputs import fetch, host
    from builders.execute import Executor
    from builders.plan import make_plan
    from builders.plan_types import Layout
    from conftest import live_output

    project = config.load_project(SRC)
    pin = project.pins["ds4"]
    dirs = fetch.mirror_dirs((), os.environ)
    if not any((d / n).is_dir() for d in dirs for n in config.repo_names(pin.name, pin.url)):
        pytest.skip(f"ds4 {pin.short} comes from GitHub only ({pin.url}), which this host cannot reach; set "
                    f"{config.MIRRORS_ENV} to a directory holding ds4.git (`nox -s tests` uses ../shared/mirrors), "
                    "or ONEBIT_TEST_DS4_SERVER to a ds4-server")
    base = tmp_path_factory.mktemp("ds4")
    layout = Layout(root=SRC, cache=base / "cache", work=base / "work", out=base / "out")
    plan = make_plan(project, "strix", host.gather(project.recipes["ds4"].variant("cpu").toolchain), layout,
                     only={"ds4-cpu"})
    assert plan.missing == [], plan.missing
    need: set[str] = set()

    def walk(step_id: str) -> None:
        if step_id not in need:
            need.add(step_id)
            for n in plan.step(step_id).needs:
                walk(n)

    walk("stage:ds4-cpu")  # fetch, check out, make cpu, stage: what a bundle ships, without packaging it
    with live_output(request):
        Executor(replace(plan, steps=[s for s in plan.steps if s.id in need]), project).run()
    record = fetch.read_record(layout.git_cache(pin.commit))
    assert record["commit"] == pin.commit and record["served_by"].startswith("mirror dir "), record
    return str(layout.staged_prefix("ds4-cpu") / "libexec/onebit/ds4-cpu/bin/ds4-server")


@pytest.mark.e2e
def test_ds4_argv_is_accepted_by_the_real_parser(models, tmp_path, real_ds4_server):
    """The adapter's argv gets past ds4-server's parse_options() to opening the model (CPU build: --backend cpu)."""
    real = tmp_path / DS4
    real.parent.mkdir(parents=True)
    real.symlink_to(real_ds4_server)
    real = str(real)
    m = load_manifest(write_manifest(tmp_path, ["ds4"], layout="per-backend", devices={"ds4": ["CPU"]}))
    facts = inspect_model(models["pkg"])
    p = route(facts, ServeFlags(model=facts.path, port=free_port_for_test(), ctx_size=1024), m, RouteEnv())
    assert isinstance(p, LaunchPlan), p
    (c,) = p.children
    assert c.argv[0] == real and c.argv[-4:] == ("--backend", "cpu", "--ctx", "1024")
    r = subprocess.run(list(c.argv), capture_output=True, text=True, timeout=60, check=False)
    out = r.stdout + r.stderr
    assert "unknown option" not in out and "invalid" not in out, out
    assert "model" in out  # it went on to load the model (upstream ds4 reads GGUF only; the 1bit fork reads 1BP)


def free_port_for_test() -> int:
    from serve_fixtures import free_port

    return free_port()


def test_serve_runs_zinc_behind_the_proxy_under_an_alias(models, tmp_path):
    """`1bit serve --device zinc --alias NAME --allow-remote` (Lemonade's form, with its onebit_args): the proxy
    answers /health and chat under the alias on the public port; zinc (the recording stub) gets no "model"."""
    import requests
    from serve_fixtures import free_port, wait_http

    manifest, rec = _zinc_stub_bundle(tmp_path)
    port = free_port()
    env = {**os.environ, "ONEBIT_STUB_RECORD": str(rec), "ONEBIT_STUB_SERVE": "1", "PYTHONPATH": str(SRC)}
    serve = subprocess.Popen([sys.executable, "-m", "onebit.cli", "serve", "-m", str(models["dense"]), "--device",
                              "zinc", "--port", str(port), "--alias", "Qwen3-0.6B-GGUF", "--allow-remote",
                              "--manifest", str(manifest)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                          json={"model": "Qwen3-0.6B-GGUF", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["X-1bit-Route"] == "main"
        assert r.json()["received"] == {"messages": [{"role": "user", "content": "hi"}]}  # no "model" reached zinc
        (child,) = [json.loads(f.read_text()) for f in rec.glob("*.json")]
        zinc_port = child["argv"][child["argv"].index("-p") + 1]
        assert child["argv"][1:] == ["-m", str(models["dense"]), "-p", zinc_port, "-d", "0"]
        assert int(zinc_port) != port and r.json()["port"] == int(zinc_port)
    finally:
        serve.terminate()
        _, err = serve.communicate(timeout=20)
    assert "zinc has no --host option" in err
