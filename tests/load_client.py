"""A mixed chat load against a `1bit serve` proxy: used by tests/test_proxy_load.py and bench/bench_serve_load.py
(and `healthy`, the wait for a proxy's /health, by the proxy tests too).

Request i (of n, from `clients` concurrent clients) is long when i % long_every == 0 (its prompt reaches the long
model's threshold), streamed when i % stream_every == 0, and alternates /v1/chat/completions and /completion.
Each outcome is classified:
  ok                      200 from a child, stream complete (ends with [DONE] or a final stop event)
  child <status>          an error the child itself answered (X-1bit-Route names the child), relayed as is
  proxy <status>: <msg>   an error the proxy answered itself (X-1bit-Route: proxy)
  client: <exception>     the connection to the proxy failed or a stream was cut
"""

from __future__ import annotations

import asyncio
import collections
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

LONG_WORDS = "the quick brown fox jumps over the lazy dog and keeps running far away "



async def healthy(session: aiohttp.ClientSession, url: str, *, timeout: float = 10.0, pause: float = 0.02) -> bool:
    """Ask url/health until it answers 200 (a request that fails counts as not yet): whether it did within timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/health") as r:
                if r.status == 200:
                    return True
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(pause)
    return False

@dataclass
class Outcome:
    i: int
    path: str
    long: bool
    stream: bool
    status: int = 0
    route: str = ""
    kind: str = ""
    body: bytes = b""
    latency: float = 0.0
    events: list = field(default_factory=list)


def request_for(i: int, *, long_every: int, stream_every: int, long_chars: int, n_predict: int,
                fail_every: int = 0, fail_text: str = "") -> tuple[str, dict, bool, bool]:
    long = i % long_every == 0
    stream = i % stream_every == 0
    text = f"request {i}: say hi."
    if long:
        text = f"request {i}: " + (LONG_WORDS * (long_chars // len(LONG_WORDS) + 1))[:long_chars]
    if fail_every and i % fail_every == 1:
        text += " " + fail_text
    if i % 4 < 2:
        path = "/v1/chat/completions"
        body = {"model": "any", "messages": [{"role": "user", "content": text}], "max_tokens": n_predict,
                "stream": stream, "temperature": 0}
    else:
        path = "/completion"
        body = {"prompt": text, "n_predict": n_predict, "stream": stream, "temperature": 0}
    return path, body, long, stream


async def _one(s: aiohttp.ClientSession, url: str, i: int, spec) -> Outcome:
    path, body, long, stream = spec
    o = Outcome(i=i, path=path, long=long, stream=stream)
    t0 = time.perf_counter()
    try:
        async with s.post(url + path, json=body) as r:
            o.status, o.route = r.status, r.headers.get("X-1bit-Route", "")
            o.body = await r.read()
    except (TimeoutError, aiohttp.ClientError) as e:
        o.kind = f"client: {type(e).__name__}: {e}"
        o.latency = time.perf_counter() - t0
        return o
    o.latency = time.perf_counter() - t0
    if o.route == "proxy" or not o.route:
        try:
            msg = json.loads(o.body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = o.body[:80].decode("utf-8", "replace")
        o.kind = f"proxy {o.status}: {msg}"
    elif o.status != 200:
        o.kind = f"child {o.status}"
    elif stream:
        o.events = [ln[6:] for ln in o.body.decode("utf-8", "replace").splitlines() if ln.startswith("data: ")]
        done = bool(o.events) and (o.events[-1] == "[DONE]" or '"stop":true' in o.events[-1].replace(" ", ""))
        o.kind = "ok" if done else "client: stream cut short"
    else:
        o.kind = "ok"
    return o


async def run_load(url: str, *, n: int = 400, clients: int = 32, long_every: int = 3, stream_every: int = 2,
                   long_chars: int = 600, n_predict: int = 4, fail_every: int = 0, fail_text: str = "",
                   timeout: float = 300) -> list[Outcome]:
    """n requests from `clients` concurrent clients, each with its own keep-alive connection to the proxy."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    out: list[Outcome] = []

    async def client() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                spec = request_for(i, long_every=long_every, stream_every=stream_every, long_chars=long_chars,
                                   n_predict=n_predict, fail_every=fail_every, fail_text=fail_text)
                out.append(await _one(s, url, i, spec))

    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), timeout)
    return sorted(out, key=lambda o: o.i)


def summary(outcomes: list[Outcome]) -> dict:
    lat = sorted(o.latency for o in outcomes)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, round(q * (len(lat) - 1)))] * 1000 if lat else 0.0

    kinds = collections.Counter(o.kind for o in outcomes)
    return {
        "requests": len(outcomes),
        "outcomes": dict(sorted(kinds.items())),
        "routes": dict(sorted(collections.Counter(o.route for o in outcomes).items())),
        "p50_ms": round(pct(0.50), 1),
        "p99_ms": round(pct(0.99), 1),
        "mean_ms": round(statistics.fmean(lat) * 1000, 1) if lat else 0.0,
    }
