"""The proxy's pure policies and guards, and the adaptive lock under a real burst (in-process aiohttp upstreams)."""

from __future__ import annotations

import asyncio
import collections

import aiohttp
import pytest
from aiohttp import web

from onebit.proxy import (Proxy, Upstream, choose_adaptive, choose_long, host_allowed, origin_allowed, prompt_text,
                          serve_forever, token_upper_bound)
from serve_fixtures import free_port, start_app


@pytest.mark.parametrize("tokens,want", [(0, "default"), (99, "default"), (100, "long"), (5000, "long")])
def test_choose_long(tokens, want):
    assert choose_long(tokens, 100) == want


@pytest.mark.parametrize(
    "inflight,slots,want",
    [
        ([0, 0], [8, None], 0),
        ([7, 0], [8, None], 0),
        ([8, 0], [8, None], 1),
        ([8, 30], [8, None], 1),
        ([2, 2], [2, 2], 1),  # all full: fewest in flight, ties to the overflow
        ([3, 2], [2, 2], 1),
        ([1, 4], [2, 2], 0),
    ],
)
def test_choose_adaptive(inflight, slots, want):
    assert choose_adaptive(inflight, slots) == want


@pytest.mark.parametrize(
    "host,ok",
    [
        ("127.0.0.1:8080", True), ("localhost:1", True), ("localhost", True), ("[::1]:8080", True),
        ("127.1.2.3", True), ("app.localhost:9", True), ("evil.example", False), ("10.0.0.1:8080", False),
        ("evil.example:8080", False), ("", False), (None, False), ("127.0.0.1.evil.example", False),
    ],
)
def test_host_guard(host, ok):
    assert host_allowed(host) is ok


@pytest.mark.parametrize(
    "origin,ok",
    [
        (None, True), ("http://localhost:3000", True), ("https://127.0.0.1", True), ("http://[::1]:80", True),
        ("http://evil.example", False), ("null", False), ("file://", False), ("http://localhost.evil.example", False),
    ],
)
def test_origin_guard(origin, ok):
    assert origin_allowed(origin) is ok


def test_bound_host_is_allowed():
    assert host_allowed("box.lan:8080", frozenset({"box.lan"}))
    assert origin_allowed("http://box.lan:8080", frozenset({"box.lan"}))


def test_prompt_text_and_bound():
    text, n = prompt_text("/v1/chat/completions", {"messages": [
        {"role": "system", "content": "ab"}, {"role": "user", "content": [{"type": "text", "text": "cd"}]}]})
    assert (text, n) == ("ab\ncd", 2)
    assert prompt_text("/completion", {"prompt": [1, 2, 3]}) == ("", -3)
    assert prompt_text("/v1/completions", {"prompt": "héllo"}) == ("héllo", 1)
    assert token_upper_bound("héllo", 1) == 6 + 8 + 2


async def _fake_upstream(name: str, hold: asyncio.Event, seen: collections.Counter, peak: dict):
    inflight = {"n": 0}

    async def health(request):
        return web.json_response({"status": "ok"})

    async def chat(request):
        body = await request.json()
        seen[name] += 1
        inflight["n"] += 1
        peak[name] = max(peak.get(name, 0), inflight["n"])
        await hold.wait()
        inflight["n"] -= 1
        return web.json_response({"from": name, "model": body.get("model")})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    return await start_app(app)


def test_adaptive_burst_fills_slots_then_overflows():
    async def main():
        hold = asyncio.Event()
        seen, peak = collections.Counter(), {}
        r1, u1 = await _fake_upstream("vulkan", hold, seen, peak)
        r2, u2 = await _fake_upstream("rocm", hold, seen, peak)
        proxy = Proxy([Upstream("vulkan", u1, slots=3), Upstream("rocm", u2)], policy="adaptive", alias="pub",
                      health_interval=0.02)
        stop = asyncio.Event()
        port = free_port()
        task = asyncio.create_task(serve_forever(proxy, "127.0.0.1", port, stop))
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                try:
                    async with s.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)

            async def one():
                async with s.post(url + "/v1/chat/completions", json={"model": "m", "messages": []}) as r:
                    return r.headers["X-1bit-Route"], await r.json()

            burst = [asyncio.create_task(one()) for _ in range(10)]
            for _ in range(200):
                if sum(seen.values()) == 10:
                    break
                await asyncio.sleep(0.01)
            inflight = [u.inflight for u in proxy.upstreams]
            during = dict(seen)
            hold.set()
            results = await asyncio.gather(*burst)
            after = [u.inflight for u in proxy.upstreams]
            # once released, a new request goes to vulkan again
            hold.clear()
            hold.set()
            again = await one()
        stop.set()
        await task
        await r1.cleanup()
        await r2.cleanup()
        return during, peak, inflight, after, results, again

    seen, peak, inflight, after, results, again = asyncio.run(main())
    assert seen["vulkan"] == 3 and seen["rocm"] == 7
    assert peak["vulkan"] == 3
    assert inflight == [3, 7] and after == [0, 0]
    assert all(route == body["from"] and body["model"] == "pub" for route, body in results)
    assert again[0] == "vulkan"
