"""The proxy's pure policies and guards, and the adaptive lock under a real burst (in-process aiohttp upstreams)."""

from __future__ import annotations

import asyncio
import collections
import gzip
import json
import urllib.parse
import zlib

import aiohttp
import pytest
from aiohttp import web

from onebit.proxy import (RELAY_EXACT, Proxy, Upstream, choose_adaptive, choose_long, host_allowed, origin_allowed, prompt_text,
                          serve_forever, token_upper_bound)
from load_client import healthy
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
            await healthy(s, url)

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


# --- issue 16: one canonical path, bodies as sent or decoded, hostile JSON, slow clients ---------------------------------
# The client side is a raw socket that sends the exact bytes (aiohttp's and requests' clients normalise a URL before it
# leaves); the child is a recording upstream that keeps the request-target, headers and body exactly as they arrived.


async def _recording_upstream(seen: list):
    async def health(request):
        return web.json_response({"status": "ok"})

    async def record(request):
        body = await request.read()
        seen.append({"target": request.raw_path, "headers": dict(request.headers), "body": body})
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=1024**3)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None, auto_decompress=False)  # record the body as it came, not decoded
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """Send `data` as is; (status, headers, body) of the reply (the proxy answers with Content-Length or closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
        n = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(reader.readexactly(n), timeout) if n else b""
        return status, headers, body
    finally:
        writer.close()


def _request(target: str, body: bytes = b"{}", headers: dict | None = None, method: str = "POST") -> bytes:
    h = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body)),
         "Connection": "close", **(headers or {})}
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    return head.encode("latin-1") + b"\r\n" + body


async def _with_recording_proxy(body, *, child: str = "default", drop_model: bool = False, **kw):
    """body(port, seen) against a proxy (kw) in front of one recording child, once the proxy answers /health."""
    seen: list = []
    up_runner, up_url = await _recording_upstream(seen)
    proxy = Proxy([Upstream(child, up_url, drop_model=drop_model)], health_interval=0.02, **kw)
    stop = asyncio.Event()
    port = free_port()
    task = asyncio.create_task(serve_forever(proxy, "127.0.0.1", port, stop))
    try:
        for _ in range(250):
            try:
                status, _, _ = await _raw_exchange(port, _request("/health", b"", method="GET"), timeout=1)
                if status == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.02)
        return await body(port, seen)
    finally:
        stop.set()
        await task
        await up_runner.cleanup()


# (request-target as sent, what the proxy answers, the request-target the child must see or None: nothing reaches it)
PATHS = [
    ("/v1/../slots/0?action=erase", 404, None),
    ("/v1/%2e%2e/slots/0?action=erase", 404, None),
    ("/v1/%2E%2E/%2e%2E/slots/0", 404, None),
    ("/v1%2f..%2fslots/0?action=erase", 404, None),
    ("/v1/./../slots/0", 404, None),
    ("/v1/chat/../../slots/0", 404, None),
    ("/v1/chat/completions/../../slots/0", 200, "/v1/slots/0"),  # under /v1/: relayed, and seen as checked
    ("//slots/0", 404, None),
    ("/tokenize/..", 404, None),
    ("/v1/chat%00/../../slots/0", 400, None),  # a control character
    ("/v1/%ff", 400, None),  # not UTF-8
    ("http://127.0.0.1/slots/0", 404, None),  # absolute-form
    ("/v1/./models", 200, "/v1/models"),
    ("//v1//models", 200, "/v1/models"),
    ("/v1/models%2fx?a=%2f&b=1", 200, "/v1/models/x?a=%2f&b=1"),
    ("/v1/%252e%252e/slots/0", 200, "/v1/%252e%252e/slots/0"),  # decodes once to a literal "%2e%2e" segment
    ("/slots/%2e%2e/v1/models?x=1", 200, "/v1/models?x=1"),
    ("/v1/chat/completions", 200, "/v1/chat/completions"),
]


def test_the_child_sees_exactly_the_path_the_allowlist_checked():
    async def body(port, seen):
        out = []
        for target, _, _ in PATHS:
            before = len(seen)
            status, headers, _ = await _raw_exchange(port, _request(target))
            out.append((target, status, headers.get("x-1bit-route"), seen[before]["target"] if len(seen) > before
                        else None))
        return out

    got = asyncio.run(_with_recording_proxy(body))
    want = [(t, status, "default" if status == 200 else "proxy", child) for t, status, child in PATHS]
    assert got == want
    for _, _, _, child in got:  # what the child sees, decoded once as it decodes it, is a path the proxy relays
        if child is not None:
            path = urllib.parse.unquote(child.split("?", 1)[0])
            assert path.startswith("/v1/") or path in RELAY_EXACT


def _gzip_chunks(data: bytes, size: int = 4096) -> bytes:
    """`data` as a chunked transfer-coding body."""
    out = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size]) for i in range(0, len(data), size))
    return out + b"0\r\n\r\n"


def test_gzip_bodies_reach_the_child_decoded_and_other_encodings_byte_for_byte():
    small = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode()
    large = json.dumps({"model": "x", "prompt": "y" * 300_000}).encode()  # over inspect_limit: streamed
    cases = {
        "gzip": (small, "gzip", gzip.compress(small), False),
        "gzip-streamed": (large, "gzip", gzip.compress(large), False),
        "gzip-chunked": (large, "GZIP", gzip.compress(large), True),
        "deflate": (small, "deflate", zlib.compress(small), False),
        "unknown": (small, "x-custom", b"opaque bytes the proxy cannot decode", False),
    }

    async def body(port, seen):
        out = {}
        for name, (_, enc, wire, chunked) in cases.items():
            before = len(seen)
            headers = {"Content-Encoding": enc}
            if chunked:
                headers.update({"Content-Length": None, "Transfer-Encoding": "chunked"})
                data = _request("/v1/chat/completions", b"", headers) + _gzip_chunks(wire)
            else:
                data = _request("/v1/chat/completions", wire, headers)
            status, _, _ = await _raw_exchange(port, data)
            got = seen[before] if len(seen) > before else None
            out[name] = (status, got)
        return out

    got = asyncio.run(_with_recording_proxy(body, inspect_limit=64 * 1024))
    for name, (plain, enc, wire, _) in cases.items():
        status, rec = got[name]
        assert status == 200 and rec is not None, name
        sent = {k.lower(): v for k, v in rec["headers"].items()}
        if name == "unknown":  # aiohttp does not decode it: forwarded byte for byte, with its header
            assert rec["body"] == wire and sent["content-encoding"] == enc and sent["content-length"] == str(len(wire))
        else:  # decoded: the header and the compressed length are gone
            assert rec["body"] == plain, name
            assert "content-encoding" not in sent, name
            assert sent.get("content-length", str(len(plain))) == str(len(plain)), name


HOSTILE = {
    "deep-array": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "truncated": b'{"messages": [',
    "not-an-object": b"[1, 2, 3]",
    "not-utf8": b'{"prompt": "\xff\xfe"}',
    "trailing": b'{"prompt": "x"} {}',
}


@pytest.mark.parametrize("alias", [None, "pub"])
@pytest.mark.parametrize("ctype", ["application/json", "text/plain", None])
def test_hostile_json_is_the_proxys_400(alias, ctype):
    async def body(port, seen):
        out = {}
        for name, data in HOSTILE.items():
            status, headers, reply = await _raw_exchange(
                port, _request("/v1/chat/completions", data, {"Content-Type": ctype}))
            out[name] = (status, headers.get("x-1bit-route"), json.loads(reply)["error"]["message"])
        return out, len(seen)

    got, reached = asyncio.run(_with_recording_proxy(body, alias=alias))
    assert reached == 0  # none of them reached the child
    for name, (status, route, message) in got.items():
        assert (status, route) == (400, "proxy"), (name, status, message)
        assert message.startswith("request body is not a valid JSON object") and "\n" not in message
    assert got["deep-array"][2].endswith("nested too deeply")


def test_slow_clients_are_closed_within_the_timeouts():
    """Eight trickling connections (four request heads, four bodies), one byte every 0.1 s: each is closed within
    header/body timeout plus slack; the body ones get 408 first. Every loop stops by itself after 10 s."""
    head = _request("/v1/chat/completions", b"", {"Content-Length": "100000"})

    async def trickle(port, what):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if what == "body":
            writer.write(head + b"{")
        else:
            writer.write(head[:20])  # part of the request line
        got = b""
        try:
            while loop.time() - t0 < 10:
                writer.write(b"x")
                await writer.drain()
                try:
                    chunk = await asyncio.wait_for(reader.read(4096), 0.1)
                except TimeoutError:
                    continue
                if not chunk:
                    return loop.time() - t0, got  # the proxy closed the connection
                got += chunk
        except (ConnectionError, OSError):
            return loop.time() - t0, got
        finally:
            writer.close()
        return None, got  # still open after 10 s

    async def body(port, seen):
        return await asyncio.gather(*(trickle(port, "head" if i % 2 else "body") for i in range(8))), len(seen)

    results, reached = asyncio.run(_with_recording_proxy(body, header_timeout=1.0, body_timeout=1.0))
    assert reached == 0
    for i, (closed_after, reply) in enumerate(results):
        assert closed_after is not None and closed_after < 4.0, (i, closed_after, reply[:300])
        if i % 2 == 0:  # a body: the proxy said why
            assert reply.startswith(b"HTTP/1.1 408 ") and b"X-1bit-Route: proxy" in reply, reply[:200]


def test_a_keepalive_client_is_not_cut_by_the_header_timeout_while_it_is_served():
    """The header timer runs only while a connection waits for a request head: a slow child is not a slow client."""
    async def body(port, seen):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            statuses = []
            for _ in range(3):
                writer.write(_request("/v1/chat/completions", b"{}", {"Connection": None}))
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                n = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
                await reader.readexactly(n)
                statuses.append(int(head.split()[1]))
                await asyncio.sleep(0.3)
            return statuses
        finally:
            writer.close()

    assert asyncio.run(_with_recording_proxy(body, header_timeout=1.0)) == [200, 200, 200]


def test_a_child_that_loads_the_model_a_request_names_never_sees_model():
    """zinc reads a request's "model" as a managed model to load: behind the proxy (alias) it gets none."""
    async def body(port, seen):
        data = json.dumps({"model": "Qwen3-0.6B-GGUF", "messages": [{"role": "user", "content": "hi"}]}).encode()
        status, headers, _ = await _raw_exchange(port, _request("/v1/chat/completions", data))
        return status, headers.get("x-1bit-route"), seen

    status, route, seen = asyncio.run(_with_recording_proxy(body, child="main", drop_model=True, alias="Qwen3-0.6B-GGUF"))
    assert (status, route) == (200, "main")
    assert json.loads(seen[0]["body"]) == {"messages": [{"role": "user", "content": "hi"}]}
