"""The asyncio (aiohttp) proxy in front of several llama-server children.

- /health answers 503 until every child answered its own /health with 200, then 200.
- /v1/*, /tokenize, /detokenize, /slots, /props, /metrics (and llama-server's native /completion, /embedding,
  /rerank, /infill, /apply-template) are relayed; SSE is streamed chunk by chunk, never buffered.
- A JSON body's "model" is rewritten to the alias the children serve under.
- A non-loopback Host or a foreign Origin gets 403 (DNS-rebinding / browser cross-origin guard).
- Every reply carries X-1bit-Route: the role of the child that answered, or "proxy" for the proxy's own replies.

Routing policies are pure functions (choose_long, choose_adaptive); the proxy only wires them to the network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

ROUTE_HEADER = "X-1bit-Route"
RELAY_EXACT = {
    "/tokenize", "/detokenize", "/slots", "/props", "/metrics", "/completion", "/completions",
    "/chat/completions", "/embedding", "/embeddings", "/rerank", "/reranking", "/infill", "/apply-template",
    "/models",
}
GENERATION = {
    "/completion", "/completions", "/chat/completions", "/v1/completions", "/v1/chat/completions", "/infill",
}
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "content-length", "host",
}
# tokens <= UTF-8 bytes of the text (every BPE/SPM token covers at least one byte), plus template/special tokens
PER_MESSAGE_ALLOWANCE = 8


@dataclass
class Upstream:
    role: str
    url: str  # http://127.0.0.1:PORT
    slots: int | None = None  # adaptive: requests it takes before the next overflows
    inflight: int = 0
    ready: bool = False


# --- pure policies --------------------------------------------------------------------------------------------------


def choose_long(prompt_tokens: int, long_from: int) -> str:
    """A prompt that reaches the threshold goes to the long model."""
    return "long" if prompt_tokens >= long_from else "default"


def choose_adaptive(inflight: Sequence[int], slots: Sequence[int | None]) -> int:
    """First upstream with a free slot; when all are full, the one with the fewest requests in flight (the last wins ties)."""
    for i, (n, cap) in enumerate(zip(inflight, slots)):
        if cap is None or n < cap:
            return i
    return min(range(len(inflight)), key=lambda i: (inflight[i], -i))


def prompt_text(path: str, body: dict) -> tuple[str, int]:
    """The prompt text of a generation request and how many messages it has (for the token upper bound)."""
    if "messages" in body and isinstance(body["messages"], list):
        parts = []
        for m in body["messages"]:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        return "\n".join(parts), len(body["messages"])
    p = body.get("prompt", body.get("content", ""))
    if isinstance(p, list):
        if all(isinstance(t, int) for t in p):
            return "", -len(p)  # already tokens: the count is exact
        p = "\n".join(x for x in p if isinstance(x, str))
    return (p if isinstance(p, str) else ""), 1


def token_upper_bound(text: str, n_messages: int) -> int:
    return len(text.encode("utf-8")) + PER_MESSAGE_ALLOWANCE * max(n_messages, 1) + 2


# --- host / origin guard -------------------------------------------------------------------------------------------


def _is_loopback_name(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host_header: str | None, extra: frozenset[str] = frozenset()) -> bool:
    if not host_header:
        return False
    h = host_header.strip()
    if h.startswith("["):
        name = h[: h.find("]") + 1] if "]" in h else h
    else:
        name = h.rsplit(":", 1)[0] if h.count(":") == 1 else h
    return _is_loopback_name(name) or name.strip("[]").lower() in extra


def origin_allowed(origin: str | None, extra: frozenset[str] = frozenset()) -> bool:
    if origin is None:
        return True  # not a browser cross-origin request
    u = urlsplit(origin)
    if u.scheme not in ("http", "https") or not u.hostname:
        return False  # includes "null"
    return _is_loopback_name(u.hostname) or u.hostname.lower() in extra


# --- the proxy -----------------------------------------------------------------------------------------------------


class Proxy:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        policy: str = "single",
        alias: str | None = None,
        long_from: int | None = None,
        public_host: str = "127.0.0.1",
        health_interval: float = 0.1,
        laya=None,  # onebit.laya.Router: picks the child per conversation (policy "laya")
    ) -> None:
        self.laya = laya
        self.upstreams = list(upstreams)
        self.by_role = {u.role: u for u in self.upstreams}
        self.policy = policy
        self.alias = alias
        self.long_from = long_from
        self.lock = asyncio.Lock()
        self.health_interval = health_interval
        extra = set()
        if public_host and public_host not in ("0.0.0.0", "::", ""):
            extra.add(public_host.lower())
        self.extra_hosts = frozenset(extra)
        self.session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        return all(u.ready for u in self.upstreams)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1024**3)
        app.router.add_get("/health", self._health)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        self._health_task = asyncio.create_task(self._watch_health())

    async def _cleanup(self, app) -> None:
        if self._health_task:
            self._health_task.cancel()
        if self.session:
            await self.session.close()

    async def _watch_health(self) -> None:
        while not self.ready:
            for u in self.upstreams:
                if u.ready:
                    continue
                try:
                    async with self.session.get(u.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        u.ready = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
            if not self.ready:
                await asyncio.sleep(self.health_interval)

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if not host_allowed(request.headers.get("Host"), self.extra_hosts) or not origin_allowed(
            request.headers.get("Origin"), self.extra_hosts
        ):
            resp = web.json_response({"error": {"code": 403, "message": "forbidden: non-loopback Host or foreign Origin"}},
                                     status=403)
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                e.headers.setdefault(ROUTE_HEADER, "proxy")
                raise
        resp.headers.setdefault(ROUTE_HEADER, "proxy")
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.json_response({"status": "ok"})
        loading = [u.role for u in self.upstreams if not u.ready]
        return web.json_response({"status": "loading", "loading": loading,
                                  "error": {"code": 503, "message": "Loading model"}}, status=503)

    def _relayable(self, path: str) -> bool:
        return path.startswith("/v1/") or path in RELAY_EXACT

    async def _count_tokens(self, text: str) -> int:
        # Exact count from the default child's tokenizer; only called when the cheap upper bound reaches the threshold.
        u = self.by_role["default"]
        async with self.session.post(u.url + "/tokenize", json={"content": text}) as r:
            data = await r.json()
        return len(data.get("tokens", []))

    async def _pick(self, path: str, body: dict | None) -> tuple[Upstream, bool]:
        """Choose the child for a request; returns (upstream, reserved)."""
        if self.policy == "long" and body is not None and path in GENERATION:
            text, n = prompt_text(path, body)
            if n < 0:
                tokens = -n
            else:
                tokens = token_upper_bound(text, n)
                if tokens >= self.long_from:
                    tokens = await self._count_tokens(text) + 2 * n
            return self.by_role[choose_long(tokens, self.long_from)], False
        if self.policy == "adaptive" and path in GENERATION:
            async with self.lock:  # choose + reserve as one step, so a burst never piles onto one slot
                i = choose_adaptive([u.inflight for u in self.upstreams], [u.slots for u in self.upstreams])
                u = self.upstreams[i]
                u.inflight += 1
            return u, True
        return self.upstreams[0], False

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if not self._relayable(path):
            return web.json_response({"error": {"code": 404, "message": f"not found: {path}"}}, status=404)
        if not self.ready:
            return web.json_response({"error": {"code": 503, "message": "Loading model"}}, status=503)

        raw = await request.read()
        body = None
        if raw and (request.content_type == "application/json" or raw[:1] == b"{"):
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if isinstance(body, dict):
                if self.alias and "model" in body:
                    body["model"] = self.alias
                    raw = json.dumps(body).encode()
            else:
                body = None

        try:
            decision = await self.laya.pick(body) if self.laya is not None and path in GENERATION else None
            if decision is not None:  # Laya: the conversation's child, and `<class> <confidence> <device>` for the header
                request["onebit_route"] = decision.header()
                up, reserved = self.by_role[decision.device], False
            else:
                up, reserved = await self._pick(path, body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return web.json_response({"error": {"code": 502, "message": f"upstream tokenize failed: {e}"}}, status=502)
        try:
            return await self._forward(request, up, raw)
        finally:
            if reserved:
                async with self.lock:
                    up.inflight -= 1

    async def _forward(self, request: web.Request, up: Upstream, raw: bytes) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = up.url + request.rel_url.path_qs
        # A pooled keep-alive connection the child has just closed fails before any response byte; the body is
        # buffered, so one retry on a fresh connection is safe and invisible to the client.
        for attempt in (1, 2):
            try:
                return await self._forward_once(request, up, url, headers, raw)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if attempt == 2 or request.get("onebit_prepared", False):
                    return _bad_gateway(up, e)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                return _bad_gateway(up, e)

    async def _forward_once(self, request, up, url, headers, raw) -> web.StreamResponse:
        async with self.session.request(request.method, url, data=raw or None, headers=headers) as r:
            out_headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP}
            out_headers[ROUTE_HEADER] = request.get("onebit_route", up.role)
            if r.headers.get("Content-Length") is not None and "text/event-stream" not in r.content_type:
                data = await r.read()
                return web.Response(status=r.status, headers=out_headers, body=data)
            resp = web.StreamResponse(status=r.status, headers=out_headers)
            await resp.prepare(request)
            request["onebit_prepared"] = True
            try:
                async for chunk in r.content.iter_any():  # each chunk goes out as it arrives: no buffering
                    await resp.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass  # headers are out: all we can do is end the stream; the client sees it cut short
            await resp.write_eof()
            return resp


def _bad_gateway(up: Upstream, e: Exception) -> web.Response:
    return web.json_response({"error": {"code": 502, "message": f"{up.role} backend: {e}"}}, status=502,
                             headers={ROUTE_HEADER: up.role})


async def serve_forever(proxy: Proxy, host: str, port: int, stop: asyncio.Event) -> None:
    runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """`python -m onebit.proxy --port P --upstream ROLE=URL ...` (used by bench/bench_proxy.py)."""
    import argparse

    ap = argparse.ArgumentParser(description="run the 1bit proxy in front of running llama-servers")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", action="append", required=True, metavar="ROLE=URL")
    ap.add_argument("--policy", default="single", choices=["single", "long", "adaptive"])
    ap.add_argument("--alias")
    ap.add_argument("--long-from", type=int, default=2048)
    a = ap.parse_args(argv)
    ups = [Upstream(role=s.split("=", 1)[0], url=s.split("=", 1)[1]) for s in a.upstream]
    proxy = Proxy(ups, policy=a.policy, alias=a.alias, long_from=a.long_from, public_host=a.host)

    async def run() -> None:
        stop = asyncio.Event()
        import signal

        loop = asyncio.get_running_loop()
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, stop.set)
        await serve_forever(proxy, a.host, a.port, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
