"""The engine's Lemonade `onebit` backend against the real `1bit serve` of an installed CPU bundle, without lemond.

Every load below is the argv the fork builds, line for line, with the lifecycle it drives: 1bit-MONSTER/lemonade
3a35b35b, src/cpp/server/backends/onebit/onebit_server.cpp (lines named in each row), with the patches onebit-build
carries for it (docs/lemonade/patches/: 0002 passes the chosen device as is, 0003 sets ONEBIT_SERVE_REFUSAL_FILE and
reads the refusal). The lifecycle: start `<onebit_bin> serve ...` (:127, ProcessManager::start_process), poll
`/health` until it answers or the process is gone (:129, WrappedServer::wait_for_ready), forward one request, stop with
SIGTERM then SIGKILL after a grace (:132, ProcessManager::stop_process), and nothing may be left running. The version
read is `1bit version`, everything it prints, the text after the first space, newlines cut (:63-73).

The onebit rows of the release fragment (builders/release/lemonade_onebit.py onebit_rows) are checked against the support
rows patch 0001 gives the fork's descriptor, for the bundles this repository defines.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from serve_fixtures import alive, descendants, free_port, models, serve_prefix  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "docs" / "lemonade" / "patches"
FORK = "onebit_server.cpp@3a35b35b"
THREADS = "-t 2 -np 1"  # the load option onebit_args (:124), so the test keeps to two cores


def fork_argv(model: Path, port: int, name: str, *, device: str = "", ctx_size: int = 0, kind: str = "chat",
              onebit_args: str = THREADS) -> list[str]:
    """OnebitServer::load()'s argv (onebit_server.cpp:102-124 at 3a35b35b, with patch 0002)."""
    device = device or "auto"  # :106-107, only a device someone chose; 0002 drops :108's cuda -> zinc
    argv = ["serve", "-m", str(model), "--port", str(port), "--device", device, "--alias", name]  # :114-115
    if ctx_size > 0:  # :116-119
        argv += ["--ctx-size", str(ctx_size)]
    if kind == "embedding":  # :122
        argv.append("--embedding")
    if kind == "reranking":  # :123
        argv.append("--reranking")
    return argv + onebit_args.split()  # :124


@dataclass(frozen=True)
class Load:
    id: str
    lines: str  # the fork's lines this row exercises
    options: dict = field(default_factory=dict)
    request: tuple[str, dict] | None = None  # what Lemonade forwards once the model is up


CHAT = ("/v1/chat/completions", {"model": "M", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
LOADS = [
    Load("chat, device unset", ":106-107 auto, :114-115", {}, CHAT),
    Load("chat, cpu chosen, ctx_size", ":106 onebit_backend=cpu, :116-119", {"device": "cpu", "ctx_size": 512}, CHAT),
    # the tiny llama names no pooling of its own (an embedding model's GGUF does): the user's onebit_args gives one
    Load("embedding model", ":122 --embedding", {"kind": "embedding", "onebit_args": THREADS + " --pooling mean"},
         ("/v1/embeddings", {"model": "M", "input": "hello"})),
    Load("reranking model", ":123 --reranking", {"kind": "reranking"},
         ("/v1/rerank", {"model": "M", "query": "a", "documents": ["a", "b"]})),
]
# a refused load: 1bit serve exits before /health, its first stderr line says why, and (0003) the same line reaches
# the file the fork reads; Lemonade then reports it and does not retry
REFUSED = [
    ("cuda on the cpu bundle", ":106 onebit_backend=cuda (0002: passed as is)", {"device": "cuda"}, 3,
     "1bit serve: refused: "),
    ("vulkan on the cpu bundle", ":106 onebit_backend=vulkan", {"device": "vulkan"}, 3, "1bit serve: refused: "),
    ("a file that is no model", ":102-104, :114", {"model": "not-a-model"}, 2, "1bit serve: error: "),
]


def _start(prefix: Path, argv: list[str], refusal: Path) -> subprocess.Popen:
    """ProcessManager::start_process: the program Lemonade resolved (onebit_bin: the bundle's bin/1bit), its argv,
    and (0003) ONEBIT_SERVE_REFUSAL_FILE; nothing else of ours in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env["ONEBIT_SERVE_REFUSAL_FILE"] = str(refusal)
    return subprocess.Popen([str(prefix / "bin" / "1bit"), *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_ready(proc: subprocess.Popen, port: int, timeout: float = 120) -> bool:
    """WrappedServer::wait_for_ready("/health"): true once /health answers 200, false as soon as the process is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """ProcessManager::stop_process: SIGTERM, then SIGKILL after a grace."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.e2e
@pytest.mark.parametrize("load", LOADS, ids=[x.id for x in LOADS])
def test_a_load_as_the_fork_drives_it(serve_prefix, models, tmp_path, load):  # noqa: F811
    port, refusal = free_port(), tmp_path / "refusal"
    options = dict(load.options)
    argv = fork_argv(models["dense"], port, "user.Tiny-GGUF", **options)
    proc = _start(serve_prefix, argv, refusal)
    seen: set[int] = set()
    try:
        assert _wait_for_ready(proc, port), f"{FORK} {load.lines}: {proc.stderr.read() if proc.poll() is not None else ''}"
        seen = {proc.pid, *descendants(proc.pid)}
        path, body = load.request
        r = requests.post(f"http://127.0.0.1:{port}{path}", json=body, timeout=60)
        assert r.status_code == 200, f"{FORK} {load.lines}: {path} answered {r.status_code}: {r.text[:300]}"
        if path == "/v1/chat/completions":
            assert r.json()["model"] == "user.Tiny-GGUF"  # --alias (:114-115): replies carry Lemonade's name
    finally:
        _stop(proc)
    deadline = time.monotonic() + 10
    while [p for p in seen if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in seen if alive(p)], f"{FORK} :132: a process outlived SIGTERM"
    assert not refusal.exists()  # a load that started refuses nothing


@pytest.mark.e2e
@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_refused_load_says_why_once(serve_prefix, models, tmp_path, case):  # noqa: F811
    _, lines, options, code, prefix = case
    options = dict(options)
    model = models["dense"]
    if options.pop("model", None):
        model = tmp_path / "model.gguf"
        model.write_text("this is not a GGUF file\n")
    port, refusal = free_port(), tmp_path / "refusal"
    proc = _start(serve_prefix, fork_argv(model, port, "user.Tiny-GGUF", **options), refusal)
    try:
        assert not _wait_for_ready(proc, port, timeout=60)  # :129: the process is gone, no /health
        err = proc.stderr.read()
    finally:
        _stop(proc)
    assert proc.returncode == code, f"{FORK} {lines}: exit {proc.returncode}: {err}"
    first = err.splitlines()[0]
    assert first.startswith(prefix) and "Traceback" not in err
    assert refusal.read_text() == first + "\n"  # 0003 reads this line and makes it the load error


@pytest.mark.parametrize("device, model_ok, code, first", [
    ("cuda", True, 3, "1bit serve: refused: --device cuda: this bundle (test) has no cuda backend (has: cpu)"),
    ("auto", False, 2, "1bit serve: error: "),
])
def test_the_refusal_line_is_first_on_stderr_and_in_the_file(tmp_path, models, device, model_ok, code, first):  # noqa: F811
    """The contract patch 0003 reads, on a stub bundle (no build needed): exit status, first stderr line, the file."""
    from serve_fixtures import write_stub_bundle

    manifest = write_stub_bundle(tmp_path / "p", ["cpu"])
    model = models["dense"] if model_ok else tmp_path / "x.gguf"
    if not model_ok:
        model.write_text("no model\n")
    refusal = tmp_path / "refusal"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}, "ONEBIT_SERVE_REFUSAL_FILE": str(refusal)}
    r = subprocess.run([sys.executable, "-m", "onebit.cli", "serve", "--manifest", str(manifest),
                        *fork_argv(model, free_port(), "user.Tiny-GGUF", device=device)[1:]],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == code and r.stderr.startswith(first), r.stderr
    assert refusal.read_text() == r.stderr.splitlines()[0] + "\n"
    # unwritable: the refusal still reaches stderr, nothing half-written is left
    env["ONEBIT_SERVE_REFUSAL_FILE"] = str(tmp_path / "no-such-dir" / "refusal")
    r2 = subprocess.run(r.args, capture_output=True, text=True, env=env, cwd=ROOT)
    assert r2.returncode == code and r2.stderr == r.stderr and not (tmp_path / "no-such-dir").exists()


def test_version_is_one_line_the_fork_reads_whole(serve_prefix):  # noqa: F811
    """OnebitOps::resolve_version (:63-73): all of `1bit version`'s output, the text after the first space, trailing
    newlines cut: that must be the bundle's version, so `1bit version` prints exactly one line."""
    out = subprocess.run([str(serve_prefix / "bin" / "1bit"), "version"], capture_output=True, text=True, check=True)
    assert len(out.stdout.splitlines()) == 1 and out.stderr == ""
    sp = out.stdout.find(" ")
    version = out.stdout[sp + 1:].rstrip("\r\n")
    manifest = json.loads((serve_prefix / "share" / "onebit" / "manifest.json").read_text())
    assert version == manifest["version"] and "\n" not in version


# ---- the onebit rows of the release fragment, and the fork's support rows (patch 0001) ----------------------------
ROW = re.compile(r'^\+\s*\{"(?P<device>[a-z0-9]+)", \{"linux"\}, (?P<families>.*)$')
FAMILY = re.compile(r'\{"(?P<family>[a-z_]+)", \{(?P<archs>[^}]*)\}\}')


def patch_support_rows() -> dict[str, dict[str, list[str]]]:
    """The support rows patch 0001 leaves in the fork's descriptor (its kept and added lines)."""
    text = (PATCHES / "0001-onebit-support-every-bundle-device.patch").read_text()
    rows = {}
    for line in text.splitlines():
        m = ROW.match("+" + line[1:]) if line.startswith((" ", "+")) else None
        if m:
            rows[m["device"]] = {f["family"]: sorted(a.strip().strip('"') for a in f["archs"].split(",") if a.strip())
                                 for f in FAMILY.finditer(m["families"])}
    return rows


def planned_manifests(tmp_path: Path) -> dict:
    """Each bundle of this repository as its plan stages it (every toolchain found): name -> (Manifest, sm_xx)."""
    from builders.project import config
    from builders.ship import manifest as bm
    from builders.plan import make_plan
    from builders.project import yamlio
    from builders.release import lemonade
    from onebit.manifest import load_manifest
    from test_plan import LAYOUT, facts

    project = config.load_project(ROOT)
    arch = lemonade.settings(yamlio.load(ROOT / "release.yaml")).cuda_arch  # the release's CUDA architectures
    out = {}
    for name in sorted(project.bundles):
        plan = make_plan(project, name, facts(), LAYOUT)
        entries = [(s.data.backend, dict(s.data.manifest_entry)) for s in plan.steps
                   if s.action == "stage" and s.data.manifest_entry]
        path = tmp_path / name / "share" / "onebit" / "manifest.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(bm.make_manifest(name, plan.version, plan.build_number, plan.platform, entries)))
        out[name] = (load_manifest(path), arch)
    return out


def test_the_fragment_rows_are_the_forks_support_rows(tmp_path):
    from builders.release import lemonade_onebit

    rows = lemonade_onebit.onebit_rows(planned_manifests(tmp_path), "2026.49")
    support = rows[lemonade_onebit.ONEBIT_SUPPORT]
    # every bundle serves the cpu device: no host is left without a onebit backend (no disable_model_filtering)
    assert set(support["cpu"]["bundles"]) == set(config_bundles()) and support["cpu"]["families"] == {"cpu": ["x86_64"]}
    assert rows[lemonade_onebit.ONEBIT] == {d: "2026.49" for d in support}
    fork = patch_support_rows()
    for device, row in support.items():
        assert fork.get(device) == row["families"], f"patch 0001's {device} row differs from the fragment's"
    # the fork's own NPU row stays (the engine's NPU model directories), and nothing else is in the patch
    assert set(fork) == set(support) | {"npu"}
    # the H200 (sm_90) is served through the nvidia bundle's cuda device
    assert "sm_90" in support["cuda"]["families"]["nvidia_gpu"] and support["cuda"]["bundles"] == ["nvidia"]


def config_bundles() -> list[str]:
    from builders.project import config
    return sorted(config.load_project(ROOT).bundles)


@pytest.mark.parametrize("backends, want", [
    (["cpu"], {"cpu": ("CPU",)}),
    (["cpu", "cuda"], {"cpu": ("CPU",), "cuda": ("CUDA0",)}),
    (["hrx"], {"hrx": ("HRX0",)}),  # only the device --device hrx names, not hrx's Vulkan0
    (["vulkan", "lean-vulkan", "zinc"], {"vulkan": ("Vulkan0",), "zinc": ("Vulkan0",)}),
    (["npu", "cpu"], {"cpu": ("CPU",)}),  # the NPU backend ships the driver, no program to serve with
])
def test_onebit_devices_from_a_manifest(tmp_path, backends, want):
    from builders.release import lemonade_onebit
    from onebit.manifest import load_manifest
    from serve_fixtures import write_manifest

    path = write_manifest(tmp_path, backends, layout="per-backend")
    assert lemonade_onebit.onebit_devices(load_manifest(path)) == want


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_the_refusal_file_never_writes_through_a_planted_link(tmp_path):
    """The file may sit in a shared directory: a link planted at its aside name (or at its own name) never makes the
    refusal write anywhere else; the line still reaches stderr, and a link at the name itself is replaced, not
    followed."""
    from onebit.cli import REFUSAL_FILE_ENV, refuse

    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path = tmp_path / "onebit-8001.refusal"
    (tmp_path / f"onebit-8001.refusal.{os.getpid()}.tmp").symlink_to(victim)
    refuse("1bit serve: refused: planted aside", env={REFUSAL_FILE_ENV: str(path)})
    assert victim.read_text() == "keep\n" and not path.exists()
    (tmp_path / f"onebit-8001.refusal.{os.getpid()}.tmp").unlink()
    path.symlink_to(victim)
    refuse("1bit serve: refused: planted at the name", env={REFUSAL_FILE_ENV: str(path)})
    assert victim.read_text() == "keep\n"
    assert not path.is_symlink() and path.read_text() == "1bit serve: refused: planted at the name\n"
    assert (path.stat().st_mode & 0o777) == 0o600
