"""A bounded load through the real proxy process on loopback: two stub children that close keep-alive connections
under the proxy's feet, 32 clients, long and short prompts, streamed and not. The proxy itself answers no error;
the children's own errors reach the client unchanged."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from load_client import run_load, summary
from serve_fixtures import STUB, free_port, wait_http

REPO = Path(__file__).resolve().parent.parent
FAIL = "STUB-FAIL"


@pytest.fixture()
def children(tmp_path):
    procs, ports = [], []
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env.update(ONEBIT_STUB_SERVE="1", ONEBIT_STUB_CHUNKS="3", ONEBIT_STUB_KEEPALIVE_MAX="3", ONEBIT_STUB_FAIL=FAIL)
    try:
        for _ in range(2):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, str(STUB), "--host", "127.0.0.1", "--port", str(port)],
                                          env=env))
            ports.append(port)
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
        yield ports
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


@pytest.fixture()
def proxy(children):
    port = free_port()
    default, long = children
    p = subprocess.Popen([sys.executable, "-m", "onebit.proxy", "--port", str(port), "--policy", "long",
                          "--long-from", "64", "--alias", "pub", "--upstream", f"default=http://127.0.0.1:{default}",
                          "--upstream", f"long=http://127.0.0.1:{long}"], cwd=REPO)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
        yield f"http://127.0.0.1:{port}", {"default": default, "long": long}
    finally:
        p.terminate()
        p.wait(10)


def test_mixed_load_32_clients_no_proxy_errors(proxy):
    url, ports = proxy
    outcomes = asyncio.run(run_load(url, n=320, clients=32, long_every=3, stream_every=2, long_chars=300,
                                    fail_every=16, fail_text=FAIL, timeout=240))
    s = summary(outcomes)
    assert s["requests"] == 320
    bad = {k: v for k, v in s["outcomes"].items() if k.startswith(("proxy", "client"))}
    assert bad == {}, s  # zero errors from the proxy itself
    for o in outcomes:
        role = "long" if o.long else "default"
        assert o.route == role, (o.i, o.route, o.kind)
        if o.i % 16 == 1:
            # the child's own error, relayed unchanged: status, body, and which child said it
            assert o.kind == "child 500", (o.i, o.kind)
            assert json.loads(o.body) == {"error": {"code": 500, "message": f"stub failure on port {ports[role]}",
                                                    "type": "server_error"}}
        else:
            assert o.kind == "ok", (o.i, o.kind)
            if o.stream:
                assert len(o.events) == 4 and o.events[-1] == "[DONE]"
                want = "pub" if o.path == "/v1/chat/completions" else None  # the alias replaced the client's "model"
                assert all(json.loads(e)["model"] == want for e in o.events[:-1])
            else:
                assert json.loads(o.body)["port"] == ports[role]
    assert s["outcomes"]["child 500"] == 20 and s["outcomes"]["ok"] == 300
