#!/usr/bin/env python3
"""Proxy overhead, side by side in one run: direct llama-server vs the same server through the 1bit proxy.

    python bench/bench_proxy.py PREFIX [-m MODEL.gguf | --medium] [-n 300] [--stream-tokens 256] [--stream-runs 7]
                                [--baseline REF]

PREFIX is an installed bundle (PREFIX/share/onebit/manifest.json). The command line of llama-server comes from the
real route function (--device auto); the proxy runs as its own process (`python -m onebit.proxy`), as under
`1bit serve`. Requests alternate direct/proxied so drift hits both equally. Without -m a tiny random model is
written (tests/tiny_gguf.py), which makes the server as fast as it gets, so the proxy's share is at its largest.

With --baseline REF (a git commit of this repository), the proxy of that commit (`git archive REF onebit`) runs as
a third side against the same llama-server, in the same alternation: before and after, side by side in one run.

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
from onebit.launch_plan import LaunchPlan  # noqa: E402
from onebit.route import route  # noqa: E402
from onebit.serve_flags import RouteEnv, ServeFlags  # noqa: E402


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
    ap.add_argument("--baseline", metavar="REF", help="also run the proxy of this git commit, side by side")
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
    sport = free_port()
    plan = route(inspect_model(model),
                 ServeFlags(model=str(model), port=sport, ctx_size=1024, parallel=1,
                            extra=("-t", str(a.threads))),
                 manifest, RouteEnv(env=dict(os.environ)))
    if not isinstance(plan, LaunchPlan):
        raise SystemExit(f"bench: refused: {plan.message}")
    child = plan.children[0]
    env = dict(os.environ, **child.env)
    direct = f"http://127.0.0.1:{sport}"
    # the sides: (name, URL, the directory whose onebit package runs the proxy)
    sources = [("proxy", REPO)]
    if a.baseline:
        base = Path(tmp.name) / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", a.baseline, "onebit"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        sources.append((f"proxy@{a.baseline}", base))
    server = subprocess.Popen(list(child.argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs, sides = [server], [("direct", direct)]
    for name, src in sources:
        port = free_port()
        penv = dict(os.environ, PYTHONPATH=str(src))
        procs.append(subprocess.Popen([sys.executable, "-m", "onebit.proxy", "--port", str(port),
                                       "--upstream", f"default={direct}"], cwd=src, env=penv))
        sides.append((name, f"http://127.0.0.1:{port}"))
    lat = {name: [] for name, _ in sides}
    tps = {name: [] for name, _ in sides}
    try:
        for _, url in sides:
            wait(url + "/health")
        sess = {name: session() for name, _ in sides}
        for _ in range(20):
            for name, url in sides:
                short_completion(sess[name], url)
        for i in range(a.n):  # rotate the order, so drift hits every side equally
            k = i % len(sides)
            for name, url in sides[k:] + sides[:k]:
                lat[name].append(short_completion(sess[name], url))
        for name, url in sides:
            streamed(sess[name], url, 16)
        for i in range(a.stream_runs):
            k = i % len(sides)
            for name, url in sides[k:] + sides[:k]:
                tps[name].append(streamed(sess[name], url, a.stream_tokens))
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            p.wait(10)
        tmp.cleanup()

    p50d, tsd = statistics.median(lat["direct"]), statistics.median(tps["direct"])
    print(f"model: {Path(model).name}   backend: {child.backend}   n={a.n}   "
          f"llama-server: {' '.join(child.argv[1:])}")
    print(f"{'side':<24} {'p50 ms':>8} {'p50 delta':>10} {'p90 ms':>8} {'tok/s':>9} {'tok/s ratio':>11}  goal ok")
    result = {}
    for name, _ in sides:
        p50, p90, ts = statistics.median(lat[name]), pct(lat[name], 0.9), statistics.median(tps[name])
        ok = "" if name == "direct" else ("yes" if p50 - p50d <= 1.0 and ts / tsd >= 0.98 else "NO")
        print(f"{name:<24} {p50:>8.3f} {p50 - p50d:>+10.3f} {p90:>8.3f} {ts:>9.2f} {ts / tsd:>11.3f}  {ok}")
        result[name] = {"p50_ms": p50, "p90_ms": p90, "tok_s": ts, "p50_added_ms": p50 - p50d, "tok_s_ratio": ts / tsd}
    print(f"goal: p50 added <= 1 ms, streamed tok/s ratio >= 0.98 ({a.stream_tokens} tok, median of {a.stream_runs})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
