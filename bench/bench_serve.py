#!/usr/bin/env python3
"""`1bit serve` against direct llama-server of the same build, side by side in one run, streamed decode tok/s.

    python bench/bench_serve.py PREFIX [-m MODEL.gguf | --size medium|0.7b] [--device D] [--runs 7] [--tokens 256]
        [--against OTHER_PREFIX:DEVICE ...]

Three servers of the one installed bundle run at once, each on its own port:
  direct   llama-server started by hand with exactly the argv `1bit serve --dry-run` prints;
  exec     `1bit serve -m M` (a single-backend route: serve execs that same llama-server, so the ratio must be 1);
  proxied  `1bit serve -m M --long-model M --long-from 1000000` (two children behind serve's proxy; every request
           here is short, so all of them take the proxy path to the default child).
--against adds, per OTHER_PREFIX:DEVICE, the llama-server another bundle runs for that device, started by hand with the
argv its own `1bit serve --dry-run` prints (`direct-DEVICE`): Vulkan against CUDA on one GPU, in the same run.

Fairness: one client function and one fresh keep-alive session per side (same connection handling), requests in
alternating order so drift hits every side alike, warm-up first, and the server's own decode rate
(`timings.predicted_per_second` of the last stream event) printed beside the client's. Where the client's ratio and
the server's ratio disagree, the difference is the client path (proxy, or the client itself competing for cores).
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
sys.path.insert(0, str(REPO / "tests"))

SIZES = {"tiny": {}, "medium": dict(n_embd=512, n_layer=8, n_ff=1536, f16=True),
         "0.7b": dict(n_embd=1536, n_layer=24, n_ff=4096, f16=True)}  # ~0.7B parameters, F16, random weights


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: the server for {url} exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: {url} never became ready")


def streamed(s: requests.Session, url: str, n: int) -> tuple[float, float]:
    """(client decode tok/s after the first token, the server's own predicted_per_second)."""
    body = {"prompt": "Once upon a time", "n_predict": n, "stream": True, "ignore_eos": True, "temperature": 0,
            "cache_prompt": False}
    tokens, first, server = 0, None, 0.0
    with s.post(url + "/completion", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event.get("content"):
                first = first or time.perf_counter()
                tokens += 1
            if event.get("stop") and "timings" in event:
                server = float(event["timings"].get("predicted_per_second", 0.0))
    end = time.perf_counter()
    client = (tokens - 1) / (end - first) if first and tokens > 1 else 0.0
    return client, server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefix", type=Path)
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="medium", help="without -m: the random model to write")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--against", action="append", default=[], metavar="PREFIX:DEVICE",
                    help="another bundle's direct llama-server for DEVICE, side by side (repeatable)")
    a = ap.parse_args()

    onebit = a.prefix / "bin" / "1bit"
    tmp = tempfile.TemporaryDirectory()
    model = a.model
    if model is None:
        from tiny_gguf import write_tiny_gguf

        model = write_tiny_gguf(Path(tmp.name) / f"{a.size}.gguf", **SIZES[a.size])
    ports = {"direct": free_port(), "exec": free_port(), "proxied": free_port()}
    common = ["-m", str(model), "--device", a.device, "--ctx-size", "2048", "--parallel", "1"]

    def planned(prefix_onebit: Path, device_args: list[str], port: int) -> dict:
        dry = subprocess.run([prefix_onebit, "serve", *device_args, "--port", str(port), "--dry-run"],
                             capture_output=True, text=True, check=True)
        return json.loads(dry.stdout)["children"][0]

    child = planned(onebit, common, ports["direct"])
    env = {**os.environ, **child["env"]}
    others = {}
    for spec in a.against:
        other, _, device = spec.rpartition(":")
        port = ports[f"direct-{device}"] = free_port()
        others[f"direct-{device}"] = planned(Path(other) / "bin" / "1bit", ["-m", str(model), "--device", device,
                                                                        "--ctx-size", "2048", "--parallel", "1"], port)
    procs = {
        "direct": subprocess.Popen(child["argv"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "exec": subprocess.Popen([onebit, "serve", *common, "--port", str(ports["exec"])],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "proxied": subprocess.Popen([onebit, "serve", *common, "--port", str(ports["proxied"]), "--long-model", str(model),
                                     "--long-from", "1000000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        **{k: subprocess.Popen(c["argv"], env={**os.environ, **c["env"]}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for k, c in others.items()},
    }
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in urls}
    try:
        for k in urls:
            wait(urls[k], procs[k])
        sessions = {k: requests.Session() for k in urls}
        for k in urls:  # warm-up: kernels, caches, connections
            streamed(sessions[k], urls[k], 32)
        order = list(urls)
        for i in range(a.runs):
            for k in (order if i % 2 == 0 else order[::-1]):
                results[k].append(streamed(sessions[k], urls[k], a.tokens))
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()

    med = {k: (statistics.median(c for c, _ in v), statistics.median(s for _, s in v)) for k, v in results.items()}
    print(f"model: {Path(model).name} ({Path(model).stat().st_size / 1e9 if Path(model).exists() else 0:.2f} GB)  "
          f"backend: {child['backend']}  device: {child['device']}  runs: {a.runs} x {a.tokens} tokens")
    print(f"llama-server: {' '.join(child['argv'])}")
    for k, c in others.items():
        print(f"{k}: {c['backend']} {' '.join(c['argv'])}")
    print(f"{'side':<10} {'client tok/s':>13} {'server tok/s':>13} {'client ratio':>13} {'server ratio':>13}")
    for k, (c, s) in med.items():
        print(f"{k:<10} {c:>13.1f} {s:>13.1f} {c / med['direct'][0]:>13.3f} {s / med['direct'][1] if med['direct'][1] else 0:>13.3f}")
    figures = {k: {"client_tok_s": c, "server_tok_s": s, "runs": results[k]} for k, (c, s) in med.items()}
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
