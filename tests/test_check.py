"""`1bit check` against bundles whose programs are the recording stub (it answers --list-devices, zinc's --check and
ds4-server's --help, and records every probe it was asked): proven, unproven and failed kept apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serve_fixtures import STRIX, STUB, per_backend_layout, write_manifest

from onebit.check import check, render, render_plain, self_test
from onebit.manifest import load_manifest

SRC = Path(__file__).resolve().parent.parent
SEES = {"cpu": "", "vulkan": "Vulkan0", "lean-vulkan": "Vulkan0", "hrx": "HRX0,Vulkan0", "rocm": "ROCm0",
        "cuda": "CUDA0", "zinc": "Vulkan0", "ds4": ""}


def stub_bundle(prefix: Path, backends=STRIX, sees=None, missing=(), **kw) -> Path:
    """A per-backend-layout bundle whose every program is the stub; the stub sees `sees[backend]` devices."""
    sees = {**SEES, **(sees or {})}
    for b in backends:
        (rel,) = per_backend_layout(b)[1].values()
        if b in missing:
            continue
        p = prefix / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if b == "npu":
            p.write_bytes(b"\x7fELF kernel module, never run")
        else:
            p.write_text(f"#!{sys.executable}\n" + STUB.read_text())
            p.chmod(0o755)
    envs = {b: {"ONEBIT_STUB_DEVICES": sees[b]} for b in backends if b != "npu"}
    return write_manifest(prefix, backends, layout="per-backend", envs=envs, **kw)


def rows_by_backend(manifest):
    env = {k: v for k, v in os.environ.items() if k != "ONEBIT_STUB_DEVICES"}
    return {r.backend: r for r in check(manifest, env=env)}


def test_strix_bundle_table(tmp_path):
    m = load_manifest(stub_bundle(tmp_path, STRIX))
    rows = rows_by_backend(m)
    got = {b: (r.binary, r.claimed, r.seen, r.unproven, r.self_test, r.ok) for b, r in rows.items()}
    assert got == {
        "cpu": ("libexec/onebit/cpu/bin/llama-server", ("CPU",), "CPU", "", "ok: cpu", True),
        # ds4-server ran (--help) but cannot say which device it uses: its GPU is unproven, not failed
        "ds4": ("libexec/onebit/ds4-rocm/bin/ds4-server", ("ROCm0",), "none",
                "ROCm0: ds4-server cannot say which device it uses", "ok: ds4, 1bp", True),
        "hrx": ("libexec/onebit/hrx/bin/llama-server", ("HRX0", "Vulkan0"), "HRX0, Vulkan0", "", "ok: hrx, prefill hrx",
                True),
        "lean-vulkan": ("libexec/onebit/lean-vulkan/bin/llama-server", ("Vulkan0",), "Vulkan0", "",
                        "not routed (another backend serves its devices)", True),
        # the npu backend ships the driver, no program that serves a model: nothing to ask, unproven
        "npu": ("(no npu-server)", ("NPU0",), "none", "NPU0: no npu-server to ask (the backend ships amdxdna.ko)",
                "--device npu refused: no npu-server in this backend", True),
        "rocm": ("libexec/onebit/lean-rocm/bin/llama-server", ("ROCm0",), "ROCm0", "", "ok: rocm", True),
        "vulkan": ("libexec/onebit/vulkan/bin/llama-server", ("Vulkan0",), "Vulkan0", "", "ok: vulkan", True),
        "zinc": ("libexec/onebit/zinc/bin/zinc", ("Vulkan0",), "Vulkan0", "", "ok: zinc", True),
    }


# (id, backends, sees, missing, the failing backend, its "devices seen" cell)
FAILURES = [
    ("hrx-without-vulkan0", ["hrx", "vulkan"], {"hrx": "HRX0"}, (), "hrx", "HRX0 — FAIL: missing Vulkan0"),
    ("vulkan-sees-nothing", ["vulkan", "cpu"], {"vulkan": ""}, (), "vulkan", "none — FAIL: missing Vulkan0"),
    ("program-missing", ["vulkan", "cpu"], {}, ("vulkan",), "vulkan", "FAIL: {prefix}/libexec/onebit/vulkan/bin/llama-server is missing"),
    ("zinc-sees-no-gpu", ["zinc"], {"zinc": ""}, (), "zinc", "none — FAIL: missing Vulkan0"),
    ("ds4-program-missing", ["ds4", "cpu"], {}, ("ds4",), "ds4",
     "FAIL: {prefix}/libexec/onebit/ds4-rocm/bin/ds4-server is missing"),
]


@pytest.mark.parametrize("case", FAILURES, ids=[c[0] for c in FAILURES])
def test_probe_failures(tmp_path, case):
    _, backends, sees, missing, bad, cell = case
    m = load_manifest(stub_bundle(tmp_path, backends, sees, missing))
    rows = rows_by_backend(m)
    assert [b for b, r in rows.items() if not r.ok] == [bad]
    assert rows[bad].seen == cell.format(prefix=m.prefix)


def test_self_test_catches_a_binary_outside_its_subtree(tmp_path):
    path = stub_bundle(tmp_path, ["vulkan", "cpu"])
    data = json.loads(path.read_text())
    data["backends"]["vulkan"]["binaries"]["llama-server"] = "libexec/onebit/cpu/bin/llama-server"
    path.write_text(json.dumps(data))
    m = load_manifest(path)
    ok, text = self_test(m, "vulkan")
    assert not ok
    assert text == (f"--device vulkan ran {m.prefix}/libexec/onebit/cpu/bin/llama-server, outside the backend's root "
                    "libexec/onebit/vulkan")


def test_self_test_catches_a_device_the_backend_does_not_list(tmp_path):
    path = stub_bundle(tmp_path, ["rocm"])
    data = json.loads(path.read_text())
    data["backends"]["rocm"]["devices"] = ["CPU"]
    path.write_text(json.dumps(data))
    ok, text = self_test(load_manifest(path), "rocm")
    assert (ok, text) == (True, "ok: rocm")  # the route falls back to no --device for a CPU-only entry


def test_render_is_one_table(tmp_path):
    import io

    m = load_manifest(stub_bundle(tmp_path, ["vulkan", "cpu"]))
    buf = io.StringIO()
    render(m, check(m), file=buf)
    out = buf.getvalue()
    assert out.startswith(f"1bit check: test 1.2.3 ({m.prefix})")
    header = next(line for line in out.splitlines() if "backend" in line)
    for col in ("backend", "binary", "devices claimed", "devices seen", "route self-test"):
        assert col in header
    assert sum("libexec/onebit/" in line for line in out.splitlines()) == 2


# (backends, what the stub sees, exit status, stderr, the unproven summary line on stdout)
COMMAND = [
    (["vulkan", "cpu"], {}, 0, "", None),
    (["vulkan", "npu"], {}, 0, "", "1bit check: 1 backend(s) unproven: npu"),
    (["vulkan", "npu"], {"vulkan": ""}, 1, "1bit check: 1 backend(s) failed: vulkan\n",
     "1bit check: 1 backend(s) unproven: npu"),
]


@pytest.mark.parametrize("backends,sees,rc,stderr,unproven", COMMAND)
def test_1bit_check_command(tmp_path, backends, sees, rc, stderr, unproven):
    path = stub_bundle(tmp_path, backends, sees)
    env = {k: v for k, v in os.environ.items() if k != "ONEBIT_STUB_DEVICES"}
    env.update(PYTHONPATH=str(SRC), COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "onebit.cli", "check", "--manifest", str(path)],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == rc, r.stdout + r.stderr
    assert "devices seen" in r.stdout and "unproven" in r.stdout.splitlines()[1 if "─" not in r.stdout else 2]
    assert r.stderr == stderr
    assert (unproven in r.stdout.splitlines()) if unproven else "unproven:" not in r.stdout


def _strix_check(tmp_path, sees=None):
    """`1bit check` (the CLI) on a strix-like bundle of recording stubs: (result, the probes the stubs were asked)."""
    path = stub_bundle(tmp_path, STRIX, sees)
    rec = tmp_path / "rec"
    rec.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env.update(PYTHONPATH=str(SRC), COLUMNS="250", ONEBIT_STUB_RECORD=str(rec))
    r = subprocess.run([sys.executable, "-m", "onebit.cli", "check", "--manifest", str(path)],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    probes = sorted(json.loads(line) for line in (rec / "probes.jsonl").read_text().splitlines())
    return r, [[str(Path(a[0]).relative_to(tmp_path)), *a[1:]] for a in probes]


# what each adapter asks its program (onebit.adapters): llama-server --list-devices, zinc --check, ds4-server --help;
# the npu backend has no program to ask
STRIX_PROBES = sorted([
    ["libexec/onebit/cpu/bin/llama-server", "--list-devices"],
    ["libexec/onebit/ds4-rocm/bin/ds4-server", "--help"],
    ["libexec/onebit/hrx/bin/llama-server", "--list-devices"],
    ["libexec/onebit/lean-rocm/bin/llama-server", "--list-devices"],
    ["libexec/onebit/lean-vulkan/bin/llama-server", "--list-devices"],
    ["libexec/onebit/vulkan/bin/llama-server", "--list-devices"],
    ["libexec/onebit/zinc/bin/zinc", "--check"],
])


def test_strix_like_bundle_passes_with_npu_and_ds4_unproven(tmp_path):
    r, probes = _strix_check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert probes == STRIX_PROBES
    assert r.stderr == ""
    assert "1bit check: 2 backend(s) unproven: ds4, npu" in r.stdout.splitlines()
    rows = {b: line for line in r.stdout.splitlines() for b in STRIX if line.lstrip("│| ").startswith(b + " ")}
    assert "no npu-server to ask" in rows["npu"] and "ds4-server cannot say which device" in rows["ds4"]
    assert "FAIL" not in r.stdout


def test_strix_like_bundle_fails_when_a_claimed_device_is_missing(tmp_path):
    r, probes = _strix_check(tmp_path, sees={"hrx": "HRX0"})  # the hrx build does not see its Vulkan0
    assert r.returncode == 1, r.stdout + r.stderr
    assert probes == STRIX_PROBES
    assert r.stderr == "1bit check: 1 backend(s) failed: hrx\n"
    assert "HRX0 — FAIL: missing Vulkan0" in r.stdout


def test_plain_table_without_rich(tmp_path):
    import io

    m = load_manifest(stub_bundle(tmp_path, ["vulkan", "cpu"]))
    buf = io.StringIO()
    render_plain(m, check(m), file=buf)
    lines = buf.getvalue().splitlines()
    assert lines[0] == f"1bit check: test 1.2.3 ({m.prefix})"
    assert lines[1].split() == ["backend", "binary", "devices", "claimed", "devices", "seen", "unproven", "route",
                                "self-test"]
    assert lines[3].split() == ["cpu", "libexec/onebit/cpu/bin/llama-server", "CPU", "CPU", "ok:", "cpu"]
    assert lines[4].split() == ["vulkan", "libexec/onebit/vulkan/bin/llama-server", "Vulkan0", "Vulkan0", "ok:",
                                "vulkan"]


def test_off_a_terminal_check_prints_plain_rows_whatever_the_width_and_json_on_request(tmp_path):
    """nox's log is a pipe 80 columns wide: the rows stay whole (one line per backend, no box drawing), as in a
    file; --json gives the same rows as data."""
    path = stub_bundle(tmp_path, STRIX)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env.update(PYTHONPATH=str(SRC), COLUMNS="80", TERM="xterm-256color")
    r = subprocess.run([sys.executable, "-m", "onebit.cli", "check", "--manifest", str(path)],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(ch in r.stdout for ch in "─│┃━┏┡└"), r.stdout
    lines = r.stdout.splitlines()
    for backend in STRIX:
        [line] = [ln for ln in lines if ln.split()[:1] == [backend]]
        assert line.split()[-1] != "self-test" and len(line.split()) > 4, line  # the whole row on one line
    j = subprocess.run([sys.executable, "-m", "onebit.cli", "check", "--manifest", str(path), "--json"],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(j.stdout)
    assert j.returncode == 0 and doc["bundle"] == "test"
    assert sorted(b["backend"] for b in doc["backends"]) == sorted(STRIX)
    assert all(b["ok"] for b in doc["backends"])
