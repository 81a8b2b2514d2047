#!/usr/bin/env python3
"""Proxy overhead, side by side in one run: direct llama-server vs the same server through the 1bit proxy.

    python bench/bench_proxy.py PREFIX [-m MODEL.gguf | --medium] [-n 300] [--stream-tokens 256] [--stream-runs 7]

PREFIX is an installed bundle (PREFIX/share/onebit/manifest.json). The command line of llama-server comes from the
real route function (--device auto); the proxy runs as its own process (`python -m onebit.proxy`), as under
`1bit serve`. Requests alternate direct/proxied so drift hits both equally. Without -m a tiny random model is
written (tests/tiny_gguf.py), which makes the server as fast as it gets, so the proxy's share is at its largest.

Goal: <= 1 ms added p50 latency on a short completion, <= 2% lower streamed tok/s.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from onebit.inspect import inspect_model  # noqa: E402
from onebit.manifest import load_manifest  # noqa: E402
from onebit.route import LaunchPlan, RouteEnv, ServeFlags, route  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: {url} never became ready")


def short_completion(s: requests.Session, url: str) -> float:
    t0 = time.perf_counter()
    r = s.post(url + "/completion", json={"prompt": "Hello", "n_predict": 1, "temperature": 0, "cache_prompt": True})
    r.raise_for_status()
    r.content
    return (time.perf_counter() - t0) * 1000.0


def streamed(s: requests.Session, url: str, n: int) -> float:
    body = {"prompt": "Once upon a time", "n_predict": n, "stream": True, "ignore_eos": True, "temperature": 0}
    t0 = time.perf_counter()
    tokens = 0
    first = None
    with s.post(url + "/completion", json=body, stream=True) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and b'"content"' in line:
                if first is None:
                    first = time.perf_counter()
                tokens += 1
    end = time.perf_counter()
    # decode rate: tokens after the first over the time after the first (prefill excluded)
    return (tokens - 1) / (end - first) if first and tokens > 1 else tokens / (end - t0)


def session() -> requests.Session:
    """Keep-alive session that retries a request the server's closed keep-alive connection dropped
    (llama-server's HTTP library closes a connection after a fixed number of requests)."""
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    s = requests.Session()
    s.mount("http://", HTTPAdapter(max_retries=Retry(total=2, connect=2, read=2, allowed_methods=None, status=0)))
    return s


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("prefix", type=Path)
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("-n", type=int, default=300, help="short completions per side")
    ap.add_argument("--stream-tokens", type=int, default=256)
    ap.add_argument("--stream-runs", type=int, default=7)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--medium", action="store_true",
                    help="without -m: a wider random model (512 wide, 8 layers, F16) that decodes at a realistic rate")
    a = ap.parse_args()

    manifest = load_manifest(a.prefix / "share" / "onebit" / "manifest.json")
    tmp = tempfile.TemporaryDirectory()
    model = a.model
    if model is None:
        from tiny_gguf import write_tiny_gguf

        if a.medium:
            model = write_tiny_gguf(Path(tmp.name) / "medium.gguf", n_embd=512, n_layer=8, n_ff=1536, f16=True)
        else:
            model = write_tiny_gguf(Path(tmp.name) / "tiny.gguf")
    sport, pport = free_port(), free_port()
    plan = route(inspect_model(model),
                 ServeFlags(model=str(model), port=sport, ctx_size=1024, parallel=1,
                            extra=("-t", str(a.threads))),
                 manifest, RouteEnv(env=dict(os.environ)))
    if not isinstance(plan, LaunchPlan):
        raise SystemExit(f"bench: refused: {plan.message}")
    child = plan.children[0]
    env = dict(os.environ, **child.env)
    server = subprocess.Popen(list(child.argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([sys.executable, "-m", "onebit.proxy", "--port", str(pport),
                              "--upstream", f"default=http://127.0.0.1:{sport}"], cwd=REPO)
    direct, proxied = f"http://127.0.0.1:{sport}", f"http://127.0.0.1:{pport}"
    try:
        wait(direct + "/health")
        wait(proxied + "/health")
        sd, sp = session(), session()
        for _ in range(20):
            short_completion(sd, direct)
            short_completion(sp, proxied)
        lat_d, lat_p = [], []
        for i in range(a.n):
            if i % 2:
                lat_d.append(short_completion(sd, direct))
                lat_p.append(short_completion(sp, proxied))
            else:
                lat_p.append(short_completion(sp, proxied))
                lat_d.append(short_completion(sd, direct))
        streamed(sd, direct, 16)
        streamed(sp, proxied, 16)
        tps_d, tps_p = [], []
        for i in range(a.stream_runs):
            order = [(sd, direct, tps_d), (sp, proxied, tps_p)]
            for s, url, out in (order if i % 2 == 0 else order[::-1]):
                out.append(streamed(s, url, a.stream_tokens))
    finally:
        for p in (proxy, server):
            p.terminate()
        for p in (proxy, server):
            p.wait(10)
        tmp.cleanup()

    p50d, p50p = statistics.median(lat_d), statistics.median(lat_p)
    p90d, p90p = pct(lat_d, 0.9), pct(lat_p, 0.9)
    tsd, tsp = statistics.median(tps_d), statistics.median(tps_p)
    rows = [
        ("short completion p50 (ms)", p50d, p50p, f"+{p50p - p50d:.3f} ms", "<= +1 ms", p50p - p50d <= 1.0),
        ("short completion p90 (ms)", p90d, p90p, f"+{p90p - p90d:.3f} ms", "", None),
        (f"streamed tok/s ({a.stream_tokens} tok, median of {a.stream_runs})", tsd, tsp,
         f"{(tsp / tsd - 1) * 100:+.2f} %", ">= -2 %", tsp / tsd >= 0.98),
    ]
    print(f"model: {Path(model).name}   backend: {child.backend}   n={a.n}   "
          f"llama-server: {' '.join(child.argv[1:])}")
    print(f"{'metric':<44} {'direct':>10} {'proxy':>10} {'ratio':>8} {'delta':>12} {'goal':>9}  ok")
    for name, d, p, delta, goal, ok in rows:
        print(f"{name:<44} {d:>10.3f} {p:>10.3f} {p / d:>8.3f} {delta:>12} {goal:>9}  "
              f"{'' if ok is None else ('yes' if ok else 'NO')}")
    print(json.dumps({"p50_direct_ms": p50d, "p50_proxy_ms": p50p, "tok_s_direct": tsd, "tok_s_proxy": tsp}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
