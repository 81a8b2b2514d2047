"""Helpers and fixtures for the serve tests: hand-made manifests, tiny models, the stub llama-server.

The e2e tests use the `cpu_bundle_prefix` fixture from tests/conftest.py (a real installed CPU bundle). As a
development fallback only, `serve_prefix` below also accepts ONEBIT_TEST_PREFIX (a prefix with
share/onebit/manifest.json and the real llama-server) when that fixture is not defined.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from tiny_gguf import write_onebp, write_tiny_gguf

from onebit.manifest import load_manifest

HERE = Path(__file__).resolve().parent
STUB = HERE / "stubs" / "llama_server_stub.py"
SHA = "0" * 40
STRIX = ("vulkan", "hrx", "rocm", "lean-vulkan", "npu", "zinc", "ds4", "cpu")
DEVICES = {
    "cpu": ["CPU"], "vulkan": ["Vulkan0"], "lean-vulkan": ["Vulkan0"], "hrx": ["HRX0", "Vulkan0"], "rocm": ["ROCm0"],
    "cuda": ["CUDA0"], "npu": ["NPU0"], "zinc": ["Vulkan0"], "ds4": ["ROCm0"],
    "ds4-cpu": ["CPU"], "ds4-rocm": ["ROCm0"], "ds4-cuda": ["CUDA0"],  # the ds4 recipes' variants (recipes/ds4*.yaml)
}
# each backend's program (the key its adapter looks up), adapter and variant id (its libexec/onebit/<variant> subtree)
PROGRAM = {"zinc": "zinc", "ds4": "ds4-server", "ds4-cpu": "ds4-server", "ds4-rocm": "ds4-server",
           "ds4-cuda": "ds4-server", "npu": "amdxdna.ko"}
ADAPTER = {"zinc": "zinc", "ds4": "ds4", "ds4-cpu": "ds4", "ds4-rocm": "ds4", "ds4-cuda": "ds4", "npu": "npu"}
VARIANT = {"rocm": "lean-rocm", "ds4": "ds4-rocm", "npu": "xdna"}


def per_backend_layout(name: str) -> tuple[str, dict]:
    """(root, binaries) as the per-backend prefix layout stages them (issue #7)."""
    root = f"libexec/onebit/{VARIANT.get(name, name)}"
    prog = PROGRAM.get(name, "llama-server")
    rel = "lib/modules/amdxdna.ko" if name == "npu" else f"bin/{prog}"
    return root, {prog: f"{root}/{rel}"}


def backend_entry(name: str, binary: str | None = None, env: dict | None = None, features=None,
                  layout: str = "flat") -> dict:
    if features is None:
        features = ["hadamard_w4a4"] if name == "rocm" else []
    prog = PROGRAM.get(name, "llama-server")
    binaries = {prog: binary or f"libexec/onebit/{name}/{prog}"}
    e = {
        "recipe": name,
        "package": f"onebit-{name}",
        "version": "0.0.1",
        "build_number": 0,
        "binaries": binaries,
        "devices": DEVICES[name],
        "source": {"pin": "llama.cpp", "url": "https://example.invalid/llama.cpp.git", "commit": SHA},
        "features": features,
    }
    if env:
        e["env"] = env
    if layout == "per-backend":
        root, e["binaries"] = per_backend_layout(name)
        if binary:  # named by its file name: a test can give the npu backend an `npu-server`
            e["binaries"] = {Path(binary).name: binary}
        e["root"] = root
        e["adapter"] = ADAPTER.get(name, "llama-server")
    return e


def write_manifest(prefix: Path, backends, *, bundle: str = "test", version: str = "1.2.3", build_number: int = 4,
                   binaries: dict | None = None, envs: dict | None = None, features: dict | None = None,
                   recipes: str | None = None, layout: str = "flat", devices: dict | None = None) -> Path:
    """Write prefix/share/onebit/manifest.json naming `backends` (names or full entries)."""
    binaries, envs, features = binaries or {}, envs or {}, features or {}
    data = {
        "schema_version": 1,
        "bundle": bundle,
        "version": version,
        "build_number": build_number,
        "platform": "linux-64",
        "backends": {
            b: backend_entry(b, binaries.get(b), envs.get(b), features.get(b), layout) for b in backends
        },
    }
    for b, devs in (devices or {}).items():
        data["backends"][b]["devices"] = devs
    if recipes:
        data["serve"] = {"recipes": recipes}
    path = prefix / "share" / "onebit" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def install_stub(path: Path) -> Path:
    """The recording stub as an executable script at path (so it can be exec'd as any program)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + STUB.read_text())
    path.chmod(0o755)
    return path


def write_stub_bundle(prefix: Path, backends=STRIX, **kw) -> Path:
    """A bundle whose every llama-server is the recording stub."""
    binaries = {b: f"libexec/onebit/{b}/llama-server" for b in backends}
    for rel in binaries.values():
        install_stub(prefix / rel)
    return write_manifest(prefix, backends, binaries=binaries, **kw)


def bundle_maker(tmp_path_factory):
    """make(name, backends, **write_manifest's options): the loaded Manifest of a per-backend bundle in a new folder."""
    def make(name, backends, **kw):
        p = tmp_path_factory.mktemp(name)
        return load_manifest(write_manifest(p, backends, bundle=name, layout="per-backend", **kw))

    return make


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    m = {
        "dense": write_tiny_gguf(d / "dense.gguf"),
        "moe": write_tiny_gguf(d / "moe.gguf", experts=4),
        "rot": write_tiny_gguf(d / "rot.gguf", hadamard=32),
        "rot-moe": write_tiny_gguf(d / "rot-moe.gguf", hadamard=32, experts=4),
        "rot64": write_tiny_gguf(d / "rot64.gguf", hadamard=64),
        "draft16": write_tiny_gguf(d / "draft16.gguf", dflash_block_size=16),
        "draft": write_tiny_gguf(d / "draft.gguf"),
        "qwen": write_tiny_gguf(d / "qwen.gguf", arch="qwen3"),
        "pkg": write_onebp(d / "model.1bp"),
    }
    return m


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, status: int = 200) -> None:
    import requests

    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = requests.get(url, timeout=1)
            if r.status_code == status:
                return
            last = r.status_code
        except requests.RequestException as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s (last: {last})")


def _live_children() -> dict[int, list[int]]:
    """Every live (not zombie) process under /proc, by its parent's pid."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                kids.setdefault(int(fields[1]), []).append(int(d.name))
    return kids


def children_of(pid: int) -> list[int]:
    """The live children of pid."""
    return _live_children().get(pid, [])


def descendants(pid: int) -> set[int]:
    """Every live process under pid: its children, theirs, and so on."""
    kids = _live_children()
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def alive(pid: int) -> bool:
    """Whether pid is a live process (a zombie is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="session")
def serve_prefix(request) -> Path:
    """The installed CPU bundle: conftest's cpu_bundle_prefix, else (dev only) $ONEBIT_TEST_PREFIX."""
    try:
        return Path(request.getfixturevalue("cpu_bundle_prefix"))
    except pytest.FixtureLookupError:
        pass
    dev = os.environ.get("ONEBIT_TEST_PREFIX")
    if dev and (Path(dev) / "share" / "onebit" / "manifest.json").is_file():
        return Path(dev)
    pytest.skip("no installed CPU bundle (cpu_bundle_prefix fixture or ONEBIT_TEST_PREFIX)")


async def start_app(app):
    """Run an aiohttp app on a free loopback port: (runner, base URL). The caller cleans the runner up."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"
