"""End to end with the real installed CPU bundle and real llama-server children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from serve_fixtures import alive, children_of, free_port, models, serve_prefix, wait_http  # noqa: F401
from tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.e2e
FAST = ["-t", "2", "-c", "512", "-np", "1"]


def serve(prefix: Path, *args) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    manifest = prefix / "share" / "onebit" / "manifest.json"
    return subprocess.Popen([sys.executable, "-m", "onebit.cli", "serve", "--manifest", str(manifest), *map(str, args)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def chat(url: str, content: str = "hi", **kw) -> requests.Response:
    return requests.post(url + "/v1/chat/completions", timeout=60,
                         json={"model": "whatever", "messages": [{"role": "user", "content": content}],
                               "max_tokens": 4, **kw}, stream=kw.get("stream", False))


def sse_events(r: requests.Response) -> list:
    events = []
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            data = line[6:]
            events.append(data if data == b"[DONE]" else json.loads(data))
    return events


def test_single_backend_execs_and_answers(serve_prefix, models):
    port = free_port()
    p = serve(serve_prefix, "-m", models["dense"], "--port", port, "--alias", "tiny", *FAST)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=60)
        assert requests.get(url + "/health").json() == {"status": "ok"}
        # exec: the process we started is llama-server itself, with no children
        exe = os.readlink(f"/proc/{p.pid}/exe")
        assert Path(exe).name == "llama-server" and children_of(p.pid) == []
        r = chat(url)
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "chat.completion" and body["model"] == "tiny"
        assert body["usage"]["completion_tokens"] >= 1
        with chat(url, stream=True) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            ev = sse_events(r)
        assert ev[-1] == b"[DONE]" and ev[0]["object"] == "chat.completion.chunk"
    finally:
        stop(p)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("long") / "long-moe.gguf", experts=4, seed=1)


def test_long_model_routes_by_prompt_length(serve_prefix, models, long_model):
    port = free_port()
    p = serve(serve_prefix, "-m", models["dense"], "--long-model", long_model, "--long-from", "64",
              "--port", port, "--alias", "pub", *FAST)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=60)
        kids = children_of(p.pid)
        assert len(kids) == 2 and all(Path(os.readlink(f"/proc/{k}/exe")).name == "llama-server" for k in kids)

        r = chat(url, "short prompt")
        assert r.status_code == 200 and r.headers["X-1bit-Route"] == "default"
        assert r.json()["model"] == "pub"
        r = chat(url, "a much longer prompt " * 10)
        assert r.status_code == 200 and r.headers["X-1bit-Route"] == "long"
        with chat(url, "x" * 200, stream=True) as r:
            assert r.headers["X-1bit-Route"] == "long"
            ev = sse_events(r)
        assert ev[-1] == b"[DONE]" and len(ev) >= 3
        r = requests.post(url + "/completion", json={"prompt": "hello", "n_predict": 2})
        assert r.status_code == 200 and r.headers["X-1bit-Route"] == "default"
        r = requests.get(url + "/props")
        assert r.status_code == 200 and r.headers["X-1bit-Route"] == "default"
        r = requests.post(url + "/tokenize", json={"content": "ab"})
        assert r.status_code == 200 and len(r.json()["tokens"]) >= 2
    finally:
        stop(p)
    for k in kids:
        deadline = time.monotonic() + 10
        while alive(k):
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_sigkill_of_serve_leaves_no_child(serve_prefix, models, long_model):
    port = free_port()
    p = serve(serve_prefix, "-m", models["dense"], "--long-model", long_model, "--port", port, *FAST)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        kids = children_of(p.pid)
        assert len(kids) == 2
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        deadline = time.monotonic() + 5
        while any(alive(k) for k in kids):
            assert time.monotonic() < deadline, "llama-server children outlived a SIGKILLed serve"
            time.sleep(0.05)
    finally:
        stop(p)
