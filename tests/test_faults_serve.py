"""Issue #10, serve side: every fault gets a clear refusal, and serve is safe to expose.

- a non-loopback bind needs --allow-remote (exec and proxy mode);
- the proxy answers its bound host and the address a LAN client used, and still refuses foreign Host/Origin;
- request bodies are streamed with a cap (413 above it), the proxy reads only what it must;
- an unreadable Hadamard stamp is refused, not read as absent;
- `1bit serve --dry-run | head` ends quietly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web
from load_client import healthy
from serve_fixtures import free_port, start_app, write_stub_bundle
from tiny_gguf import write_tiny_gguf

from onebit.errors import ModelError
from onebit.hosts import (
    bind_refusal,
    host_allowed,
    origin_allowed,
    static_allowed_names,
)
from onebit.inspect import inspect_model
from onebit.proxy import Proxy, Upstream, serve_forever

# --- binding ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host,allow,ok",
    [
        ("127.0.0.1", False, True), ("127.0.0.2", False, True), ("::1", False, True), ("[::1]", False, True),
        ("localhost", False, True), ("LOCALHOST", False, True),
        ("0.0.0.0", False, False), ("::", False, False), ("192.168.1.5", False, False), ("box.lan", False, False),
        ("", False, False), ("::ffff:127.0.0.1", False, True),
        ("0.0.0.0", True, True), ("192.168.1.5", True, True), ("::", True, True),
    ],
)
def test_bind_refusal(host, allow, ok):
    why = bind_refusal(host, allow)
    assert (why is None) is ok
    if why:
        assert "--allow-remote" in why and "\n" not in why


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"dense": write_tiny_gguf(d / "dense.gguf"), "moe": write_tiny_gguf(d / "moe.gguf", experts=4)}


@pytest.fixture()
def bundle(tmp_path):
    prefix = tmp_path / "prefix"
    write_stub_bundle(prefix)
    rec = tmp_path / "rec"
    rec.mkdir()
    return prefix, rec


def _serve(prefix, rec, *args, stdout=subprocess.PIPE, **extra_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env.update(ONEBIT_STUB_RECORD=str(rec), ONEBIT_MANIFEST=str(prefix / "share/onebit/manifest.json"), **extra_env)
    return subprocess.run([sys.executable, "-m", "onebit.cli", "serve", *map(str, args)], env=env, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=60, check=False)


@pytest.mark.parametrize("args", [
    ["--host", "0.0.0.0"],
    ["--host", "192.0.2.7"],
    ["--host", "::"],
    ["--", "--host", "0.0.0.0"],  # a --host passed through to llama-server would override ours
    ["--", "--host=0.0.0.0"],
    ["--host", "0.0.0.0", "--long-model", "MOE"],  # proxy mode too
])
def test_remote_bind_refused_without_opt_in(bundle, tiny, args):
    prefix, rec = bundle
    args = [str(tiny["moe"]) if a == "MOE" else a for a in args]
    r = _serve(prefix, rec, "-m", tiny["dense"], "--port", free_port(), *args)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--allow-remote" in lines[0] and "Traceback" not in r.stderr
    assert list(rec.iterdir()) == []  # nothing was started


def test_remote_bind_with_opt_in_execs(bundle, tiny):
    prefix, rec = bundle
    port = free_port()
    r = _serve(prefix, rec, "-m", tiny["dense"], "--port", port, "--host", "0.0.0.0", "--allow-remote")
    assert r.returncode == 0, r.stderr
    argv = json.loads((rec / f"{port}.json").read_text())["argv"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"


def test_dry_run_shows_the_refusal(bundle, tiny):
    prefix, rec = bundle
    r = _serve(prefix, rec, "-m", tiny["dense"], "--host", "0.0.0.0", "--dry-run")
    assert r.returncode == 3
    assert json.loads(r.stdout)["refused"] == "remote-bind"


# --- pipes -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--dry-run"], ["--help"]])
def test_closed_stdout_pipe_is_quiet(bundle, tiny, args):
    """`1bit serve --dry-run | head`: the reader is gone before serve writes; no BrokenPipe traceback."""
    prefix, rec = bundle
    rfd, wfd = os.pipe()
    os.close(rfd)  # the reader has already left
    try:
        r = _serve(prefix, rec, "-m", tiny["dense"], *args, stdout=wfd)
    finally:
        os.close(wfd)
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert r.stderr == ""


def test_dry_run_into_head(bundle, tiny):
    prefix, _ = bundle
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_")}
    env["ONEBIT_MANIFEST"] = str(prefix / "share/onebit/manifest.json")
    r = subprocess.run(f"{sys.executable} -m onebit.cli serve -m {tiny['dense']} --dry-run | head -c 1",
                       shell=True, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.stdout == "{" and r.stderr == ""


# --- Hadamard stamp ----------------------------------------------------------------------------------------------------


def _retype_stamp(path, type_id: int, value: bytes):
    """Rewrite the uint32 onebit.hadamard_q4_0 field in place as another 4-byte GGUF type."""
    data = bytearray(path.read_bytes())
    key = b"onebit.hadamard_q4_0"
    i = data.index(key) + len(key)
    assert data[i:i + 4] == (4).to_bytes(4, "little")  # GGUFValueType.UINT32
    data[i:i + 4] = type_id.to_bytes(4, "little")
    data[i + 4:i + 8] = value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "type_id,value,want",
    [
        (4, (32).to_bytes(4, "little"), 32),  # uint32
        (5, (32).to_bytes(4, "little"), 32),  # int32
        (6, bytes.fromhex("00000042"), "float"),  # float32 32.0: not a stamp
    ],
)
def test_stamp_types(tmp_path, type_id, value, want):
    p = write_tiny_gguf(tmp_path / "m.gguf", hadamard=32)
    _retype_stamp(p, type_id, value)
    if isinstance(want, int):
        assert inspect_model(p).hadamard == want
    else:
        with pytest.raises(ModelError) as e:
            inspect_model(p)
        assert "onebit.hadamard_q4_0" in str(e.value) and want in str(e.value) and "\n" not in str(e.value)


def test_stamp_as_string_is_refused(tmp_path):
    p = write_tiny_gguf(tmp_path / "m.gguf", extra_kv={"onebit.hadamard_q4_0": "32"})
    with pytest.raises(ModelError, match=r"onebit\.hadamard_q4_0 field is present but not an integer \(str '32'\)"):
        inspect_model(p)


def test_stamp_absent_is_none(tmp_path):
    assert inspect_model(write_tiny_gguf(tmp_path / "m.gguf")).hadamard is None


# --- allowed names -----------------------------------------------------------------------------------------------------


MACHINE = ("vm", "vm.local")


@pytest.mark.parametrize(
    "bind,host,ok",
    [
        # loopback bind: loopback names only
        ("127.0.0.1", "127.0.0.1:8080", True), ("127.0.0.1", "localhost:8080", True), ("127.0.0.1", "[::1]:1", True),
        ("127.0.0.1", "vm:8080", False), ("127.0.0.1", "evil.example", False), ("127.0.0.1", "192.0.2.2:8080", False),
        # a LAN address: that address and the machine's names
        ("192.0.2.2", "192.0.2.2:8080", True), ("192.0.2.2", "192.0.2.2", True), ("192.0.2.2", "vm:8080", True),
        ("192.0.2.2", "VM.local:8080", True), ("192.0.2.2", "192.0.2.3:8080", False),
        ("192.0.2.2", "evil.example:8080", False), ("192.0.2.2", "vm.evil.example", False),
        # a wildcard: the machine's names (the connection's own address is added per request)
        ("0.0.0.0", "vm:8080", True), ("0.0.0.0", "0.0.0.0:8080", False), ("0.0.0.0", "evil.example", False),
        ("::", "[fd00::2]:8080", False), ("fd00::2", "[fd00::2]:8080", True), ("fd00::2", "[FD00:0::2]:8080", True),
        # a name
        ("box.lan", "box.lan:8080", True), ("box.lan", "BOX.LAN.:8080", True), ("box.lan", "box.lan.evil.example", False),
        # malformed
        ("0.0.0.0", "fd00::2", False), ("0.0.0.0", "[fd00::2", False), ("0.0.0.0", "", False), ("0.0.0.0", None, False),
    ],
)
def test_host_names(bind, host, ok):
    assert host_allowed(host, static_allowed_names(bind, MACHINE if bind not in ("127.0.0.1",) else ())) is ok


@pytest.mark.parametrize(
    "origin,ok",
    [
        (None, True),
        # every http/https loopback Origin, any port
        ("http://localhost:3000", True), ("https://localhost", True), ("http://app.localhost:5173", True),
        ("http://127.0.0.1:8080", True), ("https://127.9.9.9", True), ("http://[::1]:8080", True),
        ("http://[::ffff:127.0.0.1]", True),
        # the bound host and the machine's names
        ("http://192.0.2.2:8080", True), ("https://vm.local", True),
        # refused
        ("null", False), ("file://", False), ("file:///etc/passwd", False), ("chrome-extension://abc", False),
        ("ws://localhost", False), ("http://evil.example", False), ("http://localhost.evil.example", False),
        ("http://192.0.2.3", False), ("http://[fd00::2", False), ("", False),
    ],
)
def test_origin_names(origin, ok):
    assert origin_allowed(origin, static_allowed_names("192.0.2.2", MACHINE)) is ok


def test_extra_allowed_host():
    names = static_allowed_names("127.0.0.1", (), ("api.example.com",))
    assert host_allowed("api.example.com", names) and origin_allowed("https://api.example.com", names)
    assert not host_allowed("vm", names)


# --- the proxy, over real sockets --------------------------------------------------------------------------------------


def _lan_ipv4() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("198.51.100.1", 9))  # no packet is sent; this only picks the outgoing interface
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


async def _echo_upstream():
    """A child that answers /health and hashes every body it receives (never holding more than a chunk)."""

    async def health(request):
        return web.json_response({"status": "ok"})

    async def echo(request):
        h, n = hashlib.sha256(), 0
        async for chunk in request.content.iter_any():
            h.update(chunk)
            n += len(chunk)
        return web.json_response({"sha256": h.hexdigest(), "bytes": n, "path": request.path})

    app = web.Application(client_max_size=1024**3)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", echo)
    return await start_app(app)


async def _with_proxy(body, **kw):
    up_runner, up_url = await _echo_upstream()
    bind = kw.pop("bind", "127.0.0.1")
    proxy = Proxy([Upstream("default", up_url)], health_interval=0.02, public_host=bind, **kw)
    stop = asyncio.Event()
    port = free_port()
    task = asyncio.create_task(serve_forever(proxy, bind, port, stop))
    try:
        async with aiohttp.ClientSession() as s:
            await healthy(s, f"http://127.0.0.1:{port}")
            return await body(s, port)
    finally:
        stop.set()
        await task
        await up_runner.cleanup()


def test_wildcard_bind_serves_lan_clients_and_refuses_rebinding():
    ip = _lan_ipv4()
    if ip is None:
        pytest.skip("no non-loopback IPv4 address on this host")

    async def body(s, port):
        out = {}
        for name, headers in {
            "ip": {}, "ip-origin": {"Origin": f"http://{ip}:{port}"},
            "rebind-host": {"Host": f"evil.example:{port}"}, "rebind-origin": {"Origin": "http://evil.example"},
            "other-ip-origin": {"Origin": "http://203.0.113.9"},
        }.items():
            async with s.get(f"http://{ip}:{port}/props", headers=headers) as r:
                out[name] = (r.status, r.headers.get("X-1bit-Route"))
        return out

    got = asyncio.run(_with_proxy(body, bind="0.0.0.0"))
    assert got == {"ip": (200, "default"), "ip-origin": (200, "default"), "rebind-host": (403, "proxy"),
                   "rebind-origin": (403, "proxy"), "other-ip-origin": (403, "proxy")}


def test_body_over_the_cap_is_413_and_under_it_streams_through():
    cap = 4 * 1024 * 1024
    big = os.urandom(cap)

    async def chunked(data):
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    async def body(s, port):
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        out = {}
        async with s.post(url, data=big) as r:  # exactly at the cap, with Content-Length
            out["at-cap"] = (r.status, await r.json())
        async with s.post(url, data=big + b"x") as r:  # over the cap, with Content-Length: refused before reading
            out["over-cl"] = (r.status, await r.json())
        async with s.post(url, data=chunked(big + b"x")) as r:  # over the cap, chunked: cut while streaming
            out["over-chunked"] = (r.status, await r.json())
        async with s.post(url, data=chunked(big)) as r:
            out["chunked"] = (r.status, await r.json())
        return out

    got = asyncio.run(_with_proxy(body, max_body=cap, alias="pub", inspect_limit=1024 * 1024))
    want = {"sha256": hashlib.sha256(big).hexdigest(), "bytes": cap, "path": "/v1/chat/completions"}
    assert got["at-cap"] == (200, want)
    assert got["chunked"] == (200, want)
    for k in ("over-cl", "over-chunked"):
        status, err = got[k]
        assert status == 413 and "--max-body" in err["error"]["message"], got[k]


def test_small_json_body_is_still_rewritten():
    async def body(s, port):
        async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "x", "messages": []}) as r:
            return await r.json()

    got = asyncio.run(_with_proxy(body, alias="pub", inspect_limit=1024))
    want = json.dumps({"model": "pub", "messages": []}).encode()
    assert got["sha256"] == hashlib.sha256(want).hexdigest()
