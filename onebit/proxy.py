"""The asyncio (aiohttp) proxy in front of several llama-server children.

- /health answers 503 until every child answered its own /health with 200, then 200.
- /v1/*, /tokenize, /detokenize, /slots, /props, /metrics (and llama-server's native /completion, /embedding,
  /rerank, /infill, /apply-template) are relayed; SSE is streamed chunk by chunk, never buffered.
- A JSON body's "model" is rewritten to the alias the children serve under; a child that reads "model" as a model to
  load (zinc: Upstream.drop_model) gets the body without it (a body over inspect_limit, streamed, goes as sent).
- A Host or Origin the proxy does not answer to gets 403 (DNS-rebinding / browser cross-origin guard); which names
  it answers to is defined in onebit/hosts.py.
- ONE canonical path: the request's path is percent-decoded once and its dot segments and empty segments removed
  (RFC 3986 5.2.4); that path is what the allowlist checks, and exactly that path (re-encoded) is what the child is
  sent. `/v1/../slots/0`, `/v1/%2e%2e/slots/0` and `/v1%2f..%2fslots/0` are all `/slots/0`: refused here as the child
  would see them. A path that does not decode (invalid UTF-8, control characters) is a 400.
- Request bodies: a body whose declared length is at most inspect_limit is read whole (and sent on a pooled
  connection); a larger or chunked one is streamed to the child, up to max_body (413 above it), and routed as long
  when the route needs its prompt. A body the proxy holds (any but multipart/*: llama-server parses every body as
  JSON, whatever its Content-Type) must parse as a JSON object: malformed or hostile JSON (deep nesting included) is
  the proxy's own 400, never a 500 from the proxy or the child.
- A body is forwarded either byte for byte with its headers, or, when aiohttp decoded it (Content-Encoding gzip,
  deflate, br, zstd), decoded with Content-Encoding and the compressed Content-Length removed. A body in another
  encoding is opaque to the proxy: forwarded as is, neither checked nor rewritten.
- Slow clients: a connection must deliver its request head within header_timeout of connecting (or of its previous
  response; aiohttp's keep-alive timer, which closes a connection still waiting for a complete head); a body must
  arrive at body_timeout plus one second per MIN_BODY_RATE bytes received (Apache mod_reqtimeout's rule), else 408
  and the connection is closed.
- Every upstream call (tokenize, relay, streaming) survives a pooled keep-alive connection the child has closed: pooled
  connections idle for less than the child's keep-alive timeout, and a call that failed before any reply byte is
  retried once on a fresh connection when its body can be sent again.
- Every reply carries X-1bit-Route: the role of the child that answered, or "proxy" for the proxy's own replies.

Routing policies are pure functions (choose_long, choose_adaptive); the proxy only wires them to the network.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

import aiohttp
from aiohttp import web
from yarl import URL

from .hosts import (
    host_allowed,
    is_loopback_name,
    normalize_name,
    origin_allowed,
    static_allowed_names,
)

__all__ = ["Proxy", "Upstream", "canonical_path", "choose_adaptive", "choose_long", "host_allowed", "origin_allowed",
           "prompt_text", "serve_forever", "token_upper_bound"]

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
MAX_BODY = 256 * 1024**2  # largest request body relayed (--max-body)
INSPECT_LIMIT = 16 * 1024**2  # largest body read whole to rewrite "model" / route by prompt length
# llama-server (cpp-httplib) closes a keep-alive connection after 5 s idle; reusing one it is closing fails with
# "Server disconnected" / "Can not write request body". Pooled connections are dropped well before that.
KEEPALIVE_S = 2.0
CONNECTION_LIMIT = 256  # connections to all children together; more requests wait in the proxy
# a connection that failed before any reply byte: the child closed it (or was not there); safe to send again
RETRYABLE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError)
HEADER_TIMEOUT = 15.0  # seconds a connection has to deliver a complete request head
BODY_TIMEOUT = 20.0  # seconds a body has, plus one per MIN_BODY_RATE bytes received
MIN_BODY_RATE = 500  # bytes per second (mod_reqtimeout's default MinRate)
# the Content-Encodings aiohttp's request parser decodes (aiohttp/http_parser.py, parse_headers: "gzip", "deflate",
# "br", "zstd", one token, ASCII, any case); a body in any other encoding arrives as sent, with its header
DECODED_ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
# what quote() leaves alone in a path: RFC 3986 pchar and "/", so an encoded path decodes to the canonical one
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


@dataclass
class Upstream:
    role: str
    url: str  # http://127.0.0.1:PORT
    slots: int | None = None  # adaptive: requests it takes before the next overflows
    drop_model: bool = False  # remove "model" from JSON bodies sent to it (a child that loads the model it names: zinc)
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


def canonical_path(raw_path: str) -> str | None:
    """The one path a request names: percent-decoded once, dot and empty segments removed; None when it does not
    decode (invalid UTF-8 or a control character). `raw_path` is the request-target's path, without its query."""
    if "%" not in raw_path and "/." not in raw_path and "//" not in raw_path:
        return raw_path  # the common case: nothing to decode or remove
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(c < " " or c == "\x7f" for c in path):
        return None
    out: list[str] = []
    for seg in path.split("/"):
        if seg == "..":
            if out:
                out.pop()
        elif seg and seg != ".":
            out.append(seg)
    trailing = path.endswith("/") and bool(out)
    return "/" + "/".join(out) + ("/" if trailing else "")


def encoded_path(path: str) -> str:
    """The canonical path as the child is sent it: it decodes back to exactly `path`."""
    return quote(path, safe=_PATH_SAFE)


def _decoded(request: web.Request) -> bool:
    """Whether aiohttp decoded this request's body (see DECODED_ENCODINGS)."""
    enc = request.headers.get("Content-Encoding", "")
    return enc.isascii() and enc.lower() in DECODED_ENCODINGS


# --- the proxy -----------------------------------------------------------------------------------------------------


class BodyTooLarge(Exception):
    pass


class BodyTimeout(Exception):
    pass


class _BadJson(Exception):
    pass


class Proxy:
    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        policy: str = "single",
        alias: str | None = None,
        long_from: int | None = None,
        public_host: str = "127.0.0.1",
        allowed_hosts: Sequence[str] = (),
        health_interval: float = 0.1,
        laya=None,  # onebit.laya.Router: picks the child per conversation (policy "laya")
        max_body: int = MAX_BODY,
        inspect_limit: int = INSPECT_LIMIT,
        connection_limit: int = CONNECTION_LIMIT,
        keepalive_s: float = KEEPALIVE_S,
        header_timeout: float = HEADER_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self.laya = laya
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.drop_model = any(u.drop_model for u in upstreams)
        self.upstreams = list(upstreams)
        self.by_role = {u.role: u for u in self.upstreams}
        self.policy = policy
        self.alias = alias
        self.long_from = long_from
        self.lock = asyncio.Lock()
        self.health_interval = health_interval
        self.max_body = max_body
        self.inspect_limit = min(inspect_limit, max_body)
        self.connection_limit = connection_limit
        self.keepalive_s = keepalive_s
        machine = () if is_loopback_name(public_host or "0.0.0.0") else _machine_names()
        self.allowed_names = static_allowed_names(public_host, machine, allowed_hosts)
        self._allowed_cache: dict[tuple, bool] = {}
        self.session: aiohttp.ClientSession | None = None  # pooled keep-alive connections
        self.fresh: aiohttp.ClientSession | None = None  # one new connection per request (retries, big bodies)
        self._health_task: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        return all(u.ready for u in self.upstreams)

    def app(self) -> web.Application:
        # bodies are streamed (request.content), never read through client_max_size; it only bounds stray reads
        app = web.Application(middlewares=[self._guard], client_max_size=self.inspect_limit + 1)
        app.router.add_get("/health", self._health)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    def _session(self, connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def _startup(self, app) -> None:
        self.session = self._session(aiohttp.TCPConnector(
            limit=self.connection_limit, ttl_dns_cache=None, keepalive_timeout=self.keepalive_s))
        self.fresh = self._session(aiohttp.TCPConnector(limit=self.connection_limit, ttl_dns_cache=None,
                                                        force_close=True))
        self._health_task = asyncio.create_task(self._watch_health())

    async def _cleanup(self, app) -> None:
        if self._health_task:
            self._health_task.cancel()
        for s in (self.session, self.fresh):
            if s:
                await s.close()

    async def _watch_health(self) -> None:
        while not self.ready:
            for u in self.upstreams:
                if u.ready:
                    continue
                try:
                    async with self.fresh.get(u.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        u.ready = r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    pass
            if not self.ready:
                await asyncio.sleep(self.health_interval)

    def _allowed(self, request: web.Request) -> bool:
        """Host and Origin allowed: the allowed names plus the local address this connection arrived on (see
        onebit/hosts.py). The answer for a (Host, Origin, local address) is remembered: they repeat on every request."""
        transport = request.transport
        sock = transport.get_extra_info("sockname") if transport is not None else None
        local = sock[0] if isinstance(sock, tuple) and sock and isinstance(sock[0], str) else None
        key = (request.headers.get("Host"), request.headers.get("Origin"), local)
        ok = self._allowed_cache.get(key)
        if ok is None:
            names = self.allowed_names | {normalize_name(local)} if local is not None else self.allowed_names
            ok = host_allowed(key[0], names) and origin_allowed(key[1], names)
            if len(self._allowed_cache) >= 1024:  # bounded: hostile clients can send any number of names
                self._allowed_cache.clear()
            self._allowed_cache[key] = ok
        return ok

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if not self._allowed(request):
            resp = web.json_response({"error": {"code": 403, "message": "forbidden: Host or Origin not allowed "
                                                "(see --allowed-host)"}}, status=403)
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                e.headers.setdefault(ROUTE_HEADER, "proxy")
                raise
            except (asyncio.CancelledError, ConnectionError):
                raise
            except Exception as e:  # noqa: BLE001 - a bug of the proxy still answers with the route header
                request.app.logger.exception("1bit proxy: %s %s failed", request.method, request.path)
                resp = _error(500, f"proxy error: {type(e).__name__}")
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
        # Tokenize is idempotent: a stale pooled connection is retried on fresh ones.
        u = self.by_role["default"]
        err: Exception | None = None
        for session in (self.session, self.fresh, self.fresh):
            try:
                async with session.post(u.url + "/tokenize", json={"content": text}) as r:
                    if r.status != 200:
                        raise aiohttp.ClientResponseError(r.request_info, r.history, status=r.status,
                                                          message=f"{u.role} backend answered {r.status}")
                    data = await r.json(content_type=None)
                return len(data.get("tokens", []))
            except RETRYABLE as e:
                err = e
        raise err

    async def _pick(self, path: str, body: dict | None, oversized: bool = False) -> tuple[Upstream, bool]:
        """Choose the child for a request; returns (upstream, reserved)."""
        if self.policy == "long" and path in GENERATION and oversized:
            return self.by_role["long"], False  # a body over inspect_limit is long by any count
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

    def _too_large(self, what: str) -> web.Response:
        mib = self.max_body / 1024**2
        return _error(413, f"request body {what} is over the proxy's limit of {mib:g} MiB (1bit serve --max-body)")

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        rel = request.rel_url
        raw_path = rel.raw_path
        path = canonical_path(raw_path)
        if path is None:
            return _error(400, "bad request path: it does not decode to UTF-8 text without control characters")
        if not self._relayable(path):
            return _error(404, f"not found: {path}")
        if not self.ready:
            return _error(503, "Loading model")
        declared = request.content_length
        if declared is not None and declared > self.max_body:
            return self._too_large(f"of {declared} bytes")
        qs = rel.raw_query_string
        # a path canonical_path left as it was has nothing to decode: it is already its own encoding
        target = (path if path is raw_path else encoded_path(path)) + ("?" + qs if qs else "")
        decoded = request.body_exists and _decoded(request)
        # a body in an encoding aiohttp left alone is opaque: it goes out as it came, unread and unrewritten
        opaque = not decoded and request.headers.get("Content-Encoding", "identity").strip().lower() != "identity"

        # A body with a small declared length is read whole (sent on a pooled connection, JSON checked); a chunked one
        # only when the proxy needs it (alias rewrite, routing by prompt); never more than inspect_limit.
        needs_body = bool(self.alias or self.drop_model or (self.policy in ("long", "laya") and path in GENERATION)
                          or (self.laya is not None and path in GENERATION))
        prefix, complete = b"", not request.body_exists
        if request.body_exists and (declared <= self.inspect_limit if declared is not None else needs_body):
            try:
                prefix, complete = await self._read_upto(request.content, self.inspect_limit)
            except BodyTimeout:
                return self._timed_out()
        if complete and len(prefix) > self.max_body:
            return self._too_large(f"of {len(prefix)} bytes")

        raw, body = None, None
        if complete:
            raw = prefix
            if raw and not opaque and not request.content_type.startswith("multipart/"):
                try:
                    body, raw = self._json_body(raw)
                except _BadJson as e:
                    return _error(400, f"request body is not a valid JSON object: {e}")

        try:
            decision = (await self.laya.pick(body)
                        if self.laya is not None and path in GENERATION and isinstance(body, dict) else None)
            if decision is not None:  # Laya: the conversation's child, and `<class> <confidence> <device>` for the header
                request["onebit_route"] = decision.header()
                up, reserved = self.by_role[decision.device], False
            else:
                up, reserved = await self._pick(path, body, oversized=not complete and needs_body)
        except (TimeoutError, aiohttp.ClientError) as e:
            return _error(502, f"upstream tokenize failed: {e}")
        if up.drop_model and isinstance(body, dict) and "model" in body:
            raw = json.dumps({k: v for k, v in body.items() if k != "model"}).encode()
        try:
            if complete:
                return await self._forward(request, up, target, raw, decoded)
            return await self._forward_stream(request, up, target, prefix, decoded)
        finally:
            if reserved:
                async with self.lock:
                    up.inflight -= 1

    def _json_body(self, raw: bytes) -> tuple[dict, bytes]:
        """(the body as a dict, the bytes to send, "model" rewritten to the alias). Raises _BadJson."""
        try:
            body = json.loads(raw)
        except RecursionError:
            raise _BadJson("nested too deeply") from None
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise _BadJson(str(e).splitlines()[0][:200]) from None
        if not isinstance(body, dict):
            raise _BadJson(f"a JSON {type(body).__name__}, not an object")
        if self.alias and "model" in body:
            body["model"] = self.alias
            raw = json.dumps(body).encode()
        return body, raw

    def _headers(self, request: web.Request, decoded: bool) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if decoded:  # the body goes out decoded: its encoding header would now be a lie
            headers = {k: v for k, v in headers.items() if k.lower() != "content-encoding"}
        return headers

    async def _forward(self, request: web.Request, up: Upstream, target: str, raw: bytes,
                       decoded: bool) -> web.StreamResponse:
        """A body the proxy holds: a pooled connection first; if that one was stale, once more on a fresh one."""
        headers = self._headers(request, decoded)
        url = URL(up.url + target, encoded=True)  # sent as checked: no second decoding or normalising
        for session in (self.session, self.fresh):
            try:
                return await self._forward_once(request, up, url, headers, raw or None, session)
            except RETRYABLE as e:
                if session is self.fresh or request.get("onebit_prepared", False):
                    return _bad_gateway(up, e)
            except (TimeoutError, aiohttp.ClientError) as e:
                return _bad_gateway(up, e)

    async def _forward_stream(self, request: web.Request, up: Upstream, target: str, prefix: bytes,
                              decoded: bool) -> web.StreamResponse:
        """A body streamed from the client to the child as it arrives, on a fresh connection (it cannot be re-sent)."""
        headers = self._headers(request, decoded)
        if request.content_length is not None and not decoded:
            headers["Content-Length"] = str(request.content_length)
        url = URL(up.url + target, encoded=True)
        state = {"over": False, "timeout": False}
        body = self._body_stream(prefix, request.content, state) if request.body_exists else None
        try:
            return await self._forward_once(request, up, url, headers, body, self.fresh)
        except (TimeoutError, aiohttp.ClientError, BodyTooLarge, BodyTimeout) as e:
            if state["over"]:
                return self._too_large("(chunked)")
            if state["timeout"]:
                return self._timed_out()
            return _bad_gateway(up, e)

    def _body_deadline(self, start: float, received: int) -> float:
        return start + self.body_timeout + received / MIN_BODY_RATE

    async def _read_upto(self, content: aiohttp.StreamReader, limit: int) -> tuple[bytes, bool]:
        """Read until EOF or until more than `limit` bytes are in hand: (bytes read, reached EOF)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        buf = bytearray()
        try:
            async with asyncio.timeout_at(self._body_deadline(start, 0)) as cm:
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        return bytes(buf), True
                    buf += chunk
                    if len(buf) > limit:
                        return bytes(buf), False
                    cm.reschedule(self._body_deadline(start, len(buf)))
        except TimeoutError:
            raise BodyTimeout() from None

    async def _body_stream(self, prefix: bytes, content: aiohttp.StreamReader, state: dict) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = len(prefix)
        if prefix:
            yield prefix
        while True:
            try:
                async with asyncio.timeout_at(self._body_deadline(start, sent)):
                    chunk = await content.readany()
            except TimeoutError:
                state["timeout"] = True
                raise BodyTimeout() from None
            if not chunk:
                return
            sent += len(chunk)
            if sent > self.max_body:
                state["over"] = True
                raise BodyTooLarge(sent)
            yield chunk

    def _timed_out(self) -> web.Response:
        resp = _error(408, f"request body too slow: it must arrive within {self.body_timeout:g} s plus 1 s per "
                      f"{MIN_BODY_RATE} bytes")
        resp.force_close()  # the connection ends after this reply (and aiohttp's bounded lingering read)
        return resp

    async def _forward_once(self, request, up, url, headers, data, session) -> web.StreamResponse:
        async with session.request(request.method, url, data=data, headers=headers) as r:
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
            except (TimeoutError, aiohttp.ClientError):
                pass  # headers are out: all we can do is end the stream; the client sees it cut short
            await resp.write_eof()
            return resp


def _error(status: int, message: str) -> web.Response:
    """The proxy's own error reply (X-1bit-Route: proxy, added by the guard)."""
    return web.json_response({"error": {"code": status, "message": message}}, status=status)


def _machine_names() -> tuple[str, ...]:
    name = socket.gethostname()
    return (name, f"{name}.local") if name else ()


def _bad_gateway(up: Upstream, e: Exception) -> web.Response:
    # the proxy's own reply (X-1bit-Route: proxy); the message names the child it could not reach
    reason = str(e) or type(e).__name__
    return web.json_response({"error": {"code": 502, "message": f"{up.role} backend: {reason}"}}, status=502)


async def serve_forever(proxy: Proxy, host: str, port: int, stop: asyncio.Event) -> None:
    # aiohttp closes a connection still waiting for a complete request head when its keep-alive timer fires (armed
    # at connect and after each reply): that timer is the header timeout. After a reply that left part of a body
    # unread (413, 408), aiohttp reads and drops the rest for lingering_time, so the client sees the reply: bounded
    # by the body timeout too.
    runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False, keepalive_timeout=proxy.header_timeout,
                           lingering_time=min(proxy.body_timeout, 10.0))
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
    ap.add_argument("--max-body", type=int, default=MAX_BODY, metavar="BYTES")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME")
    a = ap.parse_args(argv)
    ups = [Upstream(role=s.split("=", 1)[0], url=s.split("=", 1)[1]) for s in a.upstream]
    proxy = Proxy(ups, policy=a.policy, alias=a.alias, long_from=a.long_from, public_host=a.host,
                  max_body=a.max_body, allowed_hosts=a.allowed_host)

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
