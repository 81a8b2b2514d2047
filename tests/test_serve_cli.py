"""`1bit serve` through the CLI against the stub llama-server, which records its argv and environment."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from serve_fixtures import free_port, models, wait_http, write_manifest, write_stub_bundle  # noqa: F401

ONEBIT = [sys.executable, "-m", "onebit.cli"]


@pytest.fixture()
def bundle(tmp_path):
    prefix = tmp_path / "prefix"
    write_stub_bundle(prefix)
    # an installed `1bit` at P/bin/1bit, so serve finds P/share/onebit/manifest.json on its own
    b = prefix / "bin" / "1bit"
    b.parent.mkdir(parents=True, exist_ok=True)
    b.write_text(f"#!{sys.executable}\nimport sys\nfrom onebit.cli import main\nsys.exit(main())\n")
    b.chmod(0o755)
    rec = tmp_path / "rec"
    rec.mkdir()
    return prefix, rec


def env_for(rec: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env["ONEBIT_STUB_RECORD"] = str(rec)
    env.update(extra)
    return env


def record(rec: Path, port: int, timeout: float = 10.0) -> dict:
    p = rec / f"{port}.json"
    deadline = time.monotonic() + timeout
    while not p.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"stub on port {port} never started")
        time.sleep(0.05)
    return json.loads(p.read_text())


def onebit(prefix: Path, *args, env, **kw):
    return subprocess.run([str(prefix / "bin" / "1bit"), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=60, **kw)


def test_exec_single_backend_exact_argv_env(bundle, models):
    prefix, rec = bundle
    port = free_port()
    env = env_for(rec, GGML_W4A4_TENSORS="attn")  # the user's value must survive
    r = onebit(prefix, "serve", "-m", models["rot-moe"], "--port", port, "-c", "512", env=env)
    assert r.returncode == 0, r.stderr
    got = record(rec, port)
    binary = str(prefix / "libexec/onebit/rocm/llama-server")
    assert got["argv"][0] == binary
    assert got["argv"][1:] == ["-m", str(models["rot-moe"]), "--host", "127.0.0.1", "--port", str(port),
                               "--device", "ROCm0", "-ngl", "99", "--jinja", "-c", "512", "-ub", "1024"]
    assert got["env"]["GGML_W4A4_TENSORS"] == "attn"
    # exec: llama-server replaced serve, so its parent is the test (no proxy process in between)
    assert got["ppid"] == os.getpid()


def test_exec_sets_route_env(bundle, models):
    prefix, rec = bundle
    port = free_port()
    r = onebit(prefix, "serve", "-m", models["moe"], "--port", port, "--moe-slots", "3", env=env_for(rec))
    assert r.returncode == 0, r.stderr
    got = record(rec, port)
    assert got["argv"][1:] == ["-m", str(models["moe"]), "--host", "127.0.0.1", "--port", str(port),
                               "--device", "Vulkan0", "-ngl", "99", "--jinja", "-ot", "exps=CPU"]
    assert got["env"]["ONEBIT_MOE_FILE"] == str(models["moe"]) and got["env"]["ONEBIT_MOE_SLOTS"] == "3"


def test_binary_from_env_var(bundle, models, tmp_path):
    prefix, rec = bundle
    port = free_port()
    alt = tmp_path / "alt-llama-server"
    alt.write_text((prefix / "libexec/onebit/vulkan/llama-server").read_text())
    alt.chmod(0o755)
    r = onebit(prefix, "serve", "-m", models["dense"], "--port", port, env=env_for(rec, ONEBIT_LLAMA_SERVER=str(alt)))
    assert r.returncode == 0, r.stderr
    assert record(rec, port)["argv"][0] == str(alt)


def test_lemonade_command_line(bundle, models):
    """Lemonade: 1bit serve -m <gguf> --port P --device auto --alias NAME --ctx-size N --embedding <args>; polls /health."""
    prefix, rec = bundle
    port = free_port()
    env = env_for(rec, ONEBIT_STUB_SERVE="1")
    p = subprocess.Popen([str(prefix / "bin" / "1bit"), "serve", "-m", str(models["dense"]), "--port", str(port),
                          "--device", "auto", "--alias", "lemon", "--ctx-size", "1024", "--embedding",
                          "--pooling", "mean", "--seed", "-1"], env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
        got = record(rec, port)
        assert got["argv"][1:] == ["-m", str(models["dense"]), "--host", "127.0.0.1", "--port", str(port),
                                   "--device", "Vulkan0", "-ngl", "99", "--jinja", "-c", "1024", "--alias", "lemon",
                                   "--embedding", "--pooling", "mean", "--seed", "-1"]
        assert got["pid"] == p.pid  # exec'd in place
    finally:
        p.terminate()
        p.wait(10)


def test_dry_run_prints_plan_and_runs_nothing(bundle, models):
    prefix, rec = bundle
    r = onebit(prefix, "serve", "-m", models["dense"], "--dflash", models["draft16"], "--device", "rocm", "--dry-run",
               env=env_for(rec))
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["ok"] and plan["mode"] == "exec" and plan["proxy"] is None
    c = plan["children"][0]
    assert c["argv"][-10:] == ["--spec-type", "draft-dflash", "-md", str(models["draft16"]), "-ngld", "99",
                               "--spec-draft-n-max", "15", "--spec-draft-p-min", "0.4"]
    assert c["recipes"] == ["rocm-dflash-p-min-0.4"]
    assert list(rec.iterdir()) == []


def test_dry_run_no_recipes_and_custom_recipes(bundle, models, tmp_path):
    prefix, rec = bundle
    r = onebit(prefix, "serve", "-m", models["rot-moe"], "--dry-run", "--no-recipes", env=env_for(rec))
    assert "-ub" not in json.loads(r.stdout)["children"][0]["argv"]
    custom = tmp_path / "r.json"
    custom.write_text(json.dumps({"recipes": [{"name": "t", "match": {"device": "rocm"}, "args": ["-ub", "2048"],
                                               "env": {"X_Y": "1"}, "measured": "by hand"}]}))
    r = onebit(prefix, "serve", "-m", models["rot-moe"], "--dry-run", "--recipes", custom, env=env_for(rec))
    c = json.loads(r.stdout)["children"][0]
    assert c["argv"][-2:] == ["-ub", "2048"] and c["env"] == {"GGML_W4A4_TENSORS": "all", "X_Y": "1"}


def test_bundle_recipes_from_manifest(tmp_path, models):
    prefix = tmp_path / "p"
    (prefix / "share/onebit").mkdir(parents=True)
    (prefix / "share/onebit/serve-recipes.json").write_text(json.dumps({"recipes": [
        {"name": "cpu-threads", "match": {"device": "cpu"}, "args": ["-t", "2"], "measured": "m"}]}))
    m = write_manifest(prefix, ["cpu"], recipes="share/onebit/serve-recipes.json")
    r = subprocess.run(ONEBIT + ["serve", "-m", str(models["dense"]), "--manifest", str(m), "--dry-run"],
                       capture_output=True, text=True, env=env_for(tmp_path))
    assert json.loads(r.stdout)["children"][0]["argv"][-2:] == ["-t", "2"]


@pytest.mark.parametrize(
    "args,code,text",
    [
        (["--device", "vulkan", "-m", "@rot"], 3, "refused: rot.gguf is Hadamard-rotated"),
        (["-m", "@dense", "--laya", "--adaptive"], 3, "refused: --laya and --adaptive cannot be combined"),
        (["-m", "@dense", "--mtp", "h", "--dflash", "@draft"], 3, "cannot be combined"),
        (["-m", "@dense", "--recipes", "/nonexistent/r.json"], 2, "serve recipes file not found"),
        (["-m", "/nonexistent/model.gguf"], 2, "error: model file not found"),
        (["-m", "@trunc"], 2, "malformed or truncated GGUF"),
        (["-m", "@dense", "--port", "abc"], 2, "error: argument --port: invalid int value: 'abc'"),
        (["-m", "@dense", "--device", "tpu"], 2, "argument --device: invalid choice: 'tpu'"),
    ],
)
def test_user_mistakes_are_one_line(bundle, models, tmp_path, args, code, text):
    from tiny_gguf import write_truncated_gguf

    prefix, rec = bundle
    trunc = write_truncated_gguf(tmp_path / "trunc.gguf", 300)
    m = dict(models, trunc=trunc)
    args = [str(m[a[1:]]) if a.startswith("@") else a for a in args]
    for dry in ([], ["--dry-run"]):
        r = onebit(prefix, "serve", *args, *dry, env=env_for(rec))
        assert r.returncode == code, r.stderr
        assert "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], r.stderr


def test_missing_manifest(tmp_path, models):
    r = subprocess.run(ONEBIT + ["serve", "-m", str(models["dense"]), "--manifest", str(tmp_path / "none.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no bundle manifest at" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "bundle": "x"}')
    r = subprocess.run(ONEBIT + ["serve", "-m", str(models["dense"]), "--manifest", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid manifest" in r.stderr and "Traceback" not in r.stderr


def test_manifest_env_override(bundle, models, tmp_path):
    prefix, rec = bundle
    other = tmp_path / "other"
    m = write_manifest(other, ["cpu"])
    r = onebit(prefix, "serve", "-m", models["dense"], "--dry-run", env=env_for(rec, ONEBIT_MANIFEST=str(m)))
    assert json.loads(r.stdout)["children"][0]["backend"] == "cpu"
    r = onebit(prefix, "serve", "-m", models["dense"], "--dry-run", env=env_for(rec))
    assert json.loads(r.stdout)["children"][0]["backend"] == "vulkan"


def test_version_is_one_line(bundle):
    """Lemonade's onebit backend (onebit_server.cpp resolve_version) runs `1bit version 2>/dev/null` and takes the text
    after the first space of ALL of stdout as the version: exactly one line, `1bit <version>`."""
    prefix, rec = bundle
    r = onebit(prefix, "version", env=env_for(rec))
    assert (r.returncode, r.stdout, r.stderr) == (0, "1bit 1.2.3\n", "")
    out = r.stdout
    assert out[out.find(" ") + 1:].rstrip("\n") == "1.2.3"  # what Lemonade reads


def test_version_verbose(bundle):
    prefix, rec = bundle
    r = onebit(prefix, "version", "--verbose", env=env_for(rec))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "1bit 1.2.3"
    assert out[1] == f"bundle test 1.2.3 (build 4, linux-64) at {prefix.resolve()}"
    assert out[2].startswith("  cpu 0.0.1 000000000000")
    assert out[-1].startswith("onebit ") and "unknown" not in out[-1]


def test_version_inside_a_bundle_is_the_bundles(tmp_path):
    """In a bundle the onebit package is plain files under <prefix>/lib/onebit/python (no dist-info): its version is
    the bundle's, from the manifest, never `unknown` and never a checkout's."""
    import shutil

    prefix = tmp_path / "prefix"
    write_manifest(prefix, ["cpu"], version="2026.49")
    site = prefix / "lib" / "onebit" / "python"
    shutil.copytree(Path(__file__).resolve().parent.parent / "onebit", site / "onebit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    launcher = prefix / "bin" / "1bit"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(f"#!{sys.executable}\nimport os, sys\n"
                        "sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),"
                        " 'lib', 'onebit', 'python'))\nfrom onebit.cli import main\nsys.exit(main())\n")
    launcher.chmod(0o755)
    env = env_for(tmp_path)
    r = onebit(prefix, "version", env=env)
    assert (r.returncode, r.stdout) == (0, "1bit 2026.49\n")
    r = onebit(prefix, "version", "--verbose", env=env)
    assert r.stdout.splitlines()[-1] == "onebit 2026.49", r.stdout


def test_version_without_a_bundle(tmp_path):
    r = subprocess.run(ONEBIT + ["version", "--manifest", str(tmp_path / "none.json")], capture_output=True, text=True)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 and r.stdout.startswith("1bit ")
    assert "unknown" not in r.stdout


def test_proxied_long_model_with_stubs(bundle, models):
    """Two stub children behind the real proxy: readiness, routing, alias rewrite, SSE, relays, guards."""
    prefix, rec = bundle
    port = free_port()
    env = env_for(rec, ONEBIT_STUB_SERVE="1", ONEBIT_STUB_HEALTH_DELAY="1.5", ONEBIT_STUB_CHUNKS="4",
                  ONEBIT_STUB_DELAY="0.3")
    p = subprocess.Popen([str(prefix / "bin" / "1bit"), "serve", "-m", str(models["dense"]), "--long-model",
                          str(models["moe"]), "--long-from", "100", "--port", str(port), "--alias", "pub",
                          "--device", "cpu"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=20, status=503)
        r = requests.get(url + "/health")
        assert r.status_code == 503 and r.headers["X-1bit-Route"] == "proxy"
        wait_http(url + "/health", timeout=20)
        recs = sorted((json.loads(f.read_text()) for f in rec.glob("*.json")), key=lambda d: d["argv"][2] != str(models["dense"]))
        assert [d["argv"][2] for d in recs] == [str(models["dense"]), str(models["moe"])]
        assert all(d["ppid"] == p.pid for d in recs)  # children of serve
        ports = [int(d["argv"][d["argv"].index("--port") + 1]) for d in recs]
        assert port not in ports

        short = requests.post(url + "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
        assert short.headers["X-1bit-Route"] == "default" and short.json()["port"] == ports[0]
        assert short.json()["model"] == "pub"
        long = requests.post(url + "/v1/chat/completions",
                             json={"model": "x", "messages": [{"role": "user", "content": "y" * 150}]})
        assert long.headers["X-1bit-Route"] == "long" and long.json()["port"] == ports[1]

        t0 = time.monotonic()
        arrivals = []
        with requests.post(url + "/v1/chat/completions", stream=True,
                           json={"messages": [{"role": "user", "content": "hi"}], "stream": True}) as s:
            assert s.headers["X-1bit-Route"] == "default"
            assert s.headers["Content-Type"].startswith("text/event-stream")
            for line in s.iter_lines():
                if line.startswith(b"data: {"):
                    arrivals.append(time.monotonic() - t0)
        assert len(arrivals) == 4
        # not buffered: the first event arrived long before the last one was produced
        assert arrivals[-1] - arrivals[0] > 0.6

        for path in ("/props", "/slots", "/metrics", "/v1/models"):
            r = requests.get(url + path)
            assert r.status_code == 200 and r.headers["X-1bit-Route"] == "default", path
        r = requests.post(url + "/tokenize", json={"content": "abc"})
        assert r.json() == {"tokens": [97, 98, 99]}
        r = requests.get(url + "/not-relayed")
        assert r.status_code == 404 and r.headers["X-1bit-Route"] == "proxy"
        r = requests.get(url + "/props", headers={"Host": "evil.example:80"})
        assert r.status_code == 403 and r.headers["X-1bit-Route"] == "proxy"
        r = requests.get(url + "/props", headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        r = requests.get(url + "/props", headers={"Origin": f"http://localhost:{port}"})
        assert r.status_code == 200

        pids = [d["pid"] for d in recs]
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(15)
    assert rc == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def test_sigkill_serve_kills_stub_children(bundle, models):
    prefix, rec = bundle
    port = free_port()
    env = env_for(rec, ONEBIT_STUB_SERVE="1")
    p = subprocess.Popen([str(prefix / "bin" / "1bit"), "serve", "-m", str(models["moe"]), "--adaptive",
                          "--port", str(port)], env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
        pids = [json.loads(f.read_text())["pid"] for f in rec.glob("*.json")]
        assert len(pids) == 2
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        deadline = time.monotonic() + 5
        while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
            assert time.monotonic() < deadline, "children outlived a SIGKILLed serve"
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            p.kill()


# --- `1bit serve --help`: what the installed bundle can do, every option with a line ----------------------------------


def test_every_serve_option_has_a_help_line():
    from onebit.cli import _serve_parser

    for action in _serve_parser()._actions:
        assert action.help and action.help.strip() and action.help != argparse.SUPPRESS, action.option_strings


def _help(manifest: Path, tmp_path) -> str:
    r = subprocess.run(ONEBIT + ["serve", "--help", "--manifest", str(manifest)], capture_output=True, text=True,
                       env=env_for(tmp_path, COLUMNS="200"), timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


BUNDLE_ONLY = ("--prefill-device", "--prefill-min-tokens", "--moe-slots", "--adaptive", "--adaptive-at", "--laya",
               "--laya-model", "--route-policy")


def test_help_lists_only_what_a_cpu_bundle_can_do(tmp_path):
    out = _help(write_manifest(tmp_path / "cpu", ["cpu"], layout="per-backend"), tmp_path)
    assert "--device {auto,cpu}" in out
    for opt in BUNDLE_ONLY:
        assert opt not in out, opt
    assert "every option is listed" not in out


def test_help_on_strix_offers_no_npu_and_no_laya_without_its_checkpoint(tmp_path):
    prefix = tmp_path / "strix"
    m = write_manifest(prefix, ["vulkan", "hrx", "rocm", "lean-vulkan", "npu", "zinc", "ds4", "cpu"],
                       layout="per-backend")
    out = _help(m, tmp_path)
    # npu: the backend ships the driver, no program that serves a model
    assert "--device {auto,vulkan,hrx,rocm,zinc,ds4,cpu}" in out and "npu" not in out
    for opt in ("--prefill-device", "--moe-slots", "--adaptive"):
        assert opt in out, opt
    assert "--laya" not in out and "--route-policy" not in out
    (prefix / "share" / "laya" / "checkpoint").mkdir(parents=True)  # the bundle's Laya checkpoint: Laya is offered
    out = _help(m, tmp_path)
    assert "--laya " in out and "--route-policy" in out


def test_help_without_a_manifest_lists_everything_and_says_so(tmp_path):
    out = _help(tmp_path / "none.json", tmp_path)
    assert "every option is listed" in " ".join(out.split())
    for opt in BUNDLE_ONLY:
        assert opt in out, opt
    assert "npu" in out


@pytest.mark.parametrize("name, text, shown", [("%(prog)s %d", None, "%(prog)s %d/manifest.json"),
                                               ("m", '["%(prog)s %d"]', "['%(prog)s %d'] is not of type 'object'"),
                                               ("100%", '{"x": 1', "100%/manifest.json:1")])
def test_help_never_percent_formats_foreign_text(tmp_path, name, text, shown):
    """The manifest's path and text reach --help's description: shown as they are, never %-formatted."""
    d = tmp_path / name
    d.mkdir()
    manifest = d / "manifest.json"
    if text is not None:
        manifest.write_text(text)
    out = " ".join(_help(manifest, tmp_path).split())
    assert "every option is listed" in out and shown in out


def test_hidden_options_are_still_refused_by_route_not_passed_through(bundle, models, tmp_path):
    """An option --help hides on this bundle is still parsed (never handed to llama-server as an unknown one):
    route refuses it in one line."""
    m = write_manifest(tmp_path / "cpu", ["cpu"], layout="per-backend")
    r = subprocess.run(ONEBIT + ["serve", "-m", str(models["moe"]), "--moe-slots", "4", "--manifest", str(m),
                                 "--dry-run"], capture_output=True, text=True, env=env_for(tmp_path), timeout=60)
    assert r.returncode == 3 and "--moe-slots works on vulkan only" in r.stderr
