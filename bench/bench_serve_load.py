#!/usr/bin/env python3
"""The proxy under load: memory under big uploads, and errors/latency under a mixed chat load.

    python bench/bench_serve_load.py uploads [--n 20] [--mb 100] [--max-body 256M]
    python bench/bench_serve_load.py load PREFIX [-m A.gguf --long-model B.gguf] [--long-from 64] [--n 400]
                                          [--clients 8 32] [--n-predict 8]

uploads: the proxy (`python -m onebit.proxy`, its own process) in front of a sink child that discards what it reads;
  --n clients upload --mb MB each at the same time (Content-Length set, body generated, never held whole). The
  proxy's RSS is sampled from /proc every 20 ms: baseline, peak (VmHWM), and the statuses. With --max-body under
  --mb every upload gets 413.
load: `1bit serve -m A --long-model B --long-from N` from an installed bundle PREFIX (real llama-server children),
  then --n chat requests (one in three long, half streamed, chat and /completion) from each --clients count.
  Prints requests, clients, outcomes by kind (tests/load_client.py), p50 and p99. Without -m, tiny random models
  are written (tests/tiny_gguf.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from load_client import healthy, run_load, summary  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, timeout: float = 120) -> None:
    async with aiohttp.ClientSession() as s:
        if not await healthy(s, url, timeout=timeout, pause=0.2):
            raise SystemExit(f"bench: {url} never became ready")


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


# --- uploads ---------------------------------------------------------------------------------------------------------


def sink_main(port: int) -> int:
    """A child that reads every body chunk by chunk and answers how many bytes it got."""
    from aiohttp import web

    async def health(request):
        return web.json_response({"status": "ok"})

    async def sink(request):
        n = 0
        async for chunk in request.content.iter_any():
            n += len(chunk)
        return web.json_response({"bytes": n})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", sink)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
    return 0


async def _upload(url: str, size: int) -> tuple[int, str]:
    chunk = b"{" + b" " * (1024 * 1024 - 1)  # looks like JSON to the proxy: the case it would want to read

    async def body():
        sent = 0
        while sent < size:
            part = chunk[: min(len(chunk), size - sent)]
            sent += len(part)
            yield part

    async with aiohttp.ClientSession() as s:
        try:
            async with s.post(url + "/v1/chat/completions", data=body(),
                              headers={"Content-Length": str(size), "Content-Type": "application/json"}) as r:
                return r.status, (await r.text())[:120]
        except aiohttp.ClientError as e:
            return 0, f"{type(e).__name__}: {e}"


async def uploads(args) -> dict:
    sink_port, proxy_port = free_port(), free_port()
    sink = await asyncio.create_subprocess_exec(sys.executable, __file__, "_sink", str(sink_port))
    cmd = [sys.executable, "-m", "onebit.proxy", "--port", str(proxy_port), "--alias", "pub",
           "--upstream", f"default=http://127.0.0.1:{sink_port}"]
    if args.max_body:
        cmd += ["--max-body", str(args.max_body)]
    proxy = await asyncio.create_subprocess_exec(*cmd, cwd=REPO)
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        await wait_ready(url)
        base = rss_kib(proxy.pid)["VmRSS"]
        samples = []
        stop = asyncio.Event()

        async def sample():
            while not stop.is_set():
                samples.append(rss_kib(proxy.pid)["VmRSS"])
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        t0 = time.monotonic()
        results = await asyncio.gather(*(_upload(url, args.mb * 1000 * 1000) for _ in range(args.n)))
        wall = time.monotonic() - t0
        stop.set()
        await sampler
        hwm = rss_kib(proxy.pid)["VmHWM"]
        statuses = collections.Counter(f"{st} {txt[:60]}" for st, txt in results)
        t1 = time.monotonic()
        proxy.terminate()
        await asyncio.wait_for(proxy.wait(), 120)
        return {"proxy_exit_s": round(time.monotonic() - t1, 1),"uploads": args.n, "mb_each": args.mb, "max_body": args.max_body or "default",
                "proxy_rss_baseline_mib": round(base / 1024, 1),
                "proxy_rss_peak_sampled_mib": round(max(samples) / 1024, 1),
                "proxy_rss_hwm_mib": round(hwm / 1024, 1), "wall_s": round(wall, 1),
                "statuses": dict(statuses)}
    finally:
        for p in (proxy, sink):
            if p.returncode is None:
                p.terminate()
                await asyncio.wait_for(p.wait(), 30)


# --- mixed load on real children ---------------------------------------------------------------------------------------


async def load(args) -> list[dict]:
    prefix = Path(args.prefix)
    tmp = Path(tempfile.mkdtemp(prefix="onebit-load-"))
    a, b = args.model, args.long_model
    if not a:
        from tiny_gguf import write_tiny_gguf

        a = str(write_tiny_gguf(tmp / "a.gguf"))
        b = b or str(write_tiny_gguf(tmp / "b.gguf", seed=1))
    port = free_port()
    # --installed: the prefix's own bin/1bit (its onebit); else this checkout's onebit, side by side
    cmd = [str(prefix / "bin" / "1bit")] if args.installed else [sys.executable, "-m", "onebit.cli"]
    cmd += ["serve", "-m", a, "--long-model", b, "--long-from", str(args.long_from), "--port", str(port),
            "-c", str(args.ctx), "-np", str(args.parallel)]
    env = dict(os.environ, ONEBIT_MANIFEST=str(prefix / "share" / "onebit" / "manifest.json"))
    serve = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                 stderr=asyncio.subprocess.DEVNULL, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    out = []
    try:
        await wait_ready(url, timeout=300)
        for clients in args.clients:
            t0 = time.monotonic()
            outcomes = await run_load(url, n=args.n, clients=clients, long_chars=args.long_chars,
                                      n_predict=args.n_predict, timeout=args.timeout)
            s = summary(outcomes)
            s.update(clients=clients, wall_s=round(time.monotonic() - t0, 1))
            out.append(s)
            print(json.dumps(s), flush=True)
    finally:
        serve.terminate()
        await asyncio.wait_for(serve.wait(), 60)
    return out


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "_sink":
        return sink_main(int(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("uploads")
    u.add_argument("--n", type=int, default=20)
    u.add_argument("--mb", type=int, default=100)
    u.add_argument("--max-body", type=int, default=None, help="bytes (the proxy's default if not given)")
    ld = sub.add_parser("load")
    ld.add_argument("prefix")
    ld.add_argument("-m", "--model")
    ld.add_argument("--long-model")
    ld.add_argument("--long-from", type=int, default=64)
    ld.add_argument("--long-chars", type=int, default=600)
    ld.add_argument("--n", type=int, default=400)
    ld.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    ld.add_argument("--n-predict", type=int, default=8)
    ld.add_argument("--ctx", type=int, default=4096)
    ld.add_argument("--parallel", type=int, default=4)
    ld.add_argument("--timeout", type=float, default=600)
    ld.add_argument("--installed", action="store_true", help="run the prefix's bin/1bit instead of this checkout's")
    args = ap.parse_args()
    if args.cmd == "uploads":
        print(json.dumps(asyncio.run(uploads(args))))
    else:
        asyncio.run(load(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
