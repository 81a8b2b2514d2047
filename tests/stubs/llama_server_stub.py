#!/usr/bin/env python3
"""Stub llama-server: records its argv and environment, and (if asked) serves a few endpoints.

It stands in for backends that cannot run here (AMD GPU, NPU); tests assert the exact command serve ran.

Environment:
  ONEBIT_STUB_RECORD  directory; the stub writes <dir>/<port>.json = {"argv": [...], "env": {...}, "pid": N}
  ONEBIT_STUB_SERVE   "1": listen on --host/--port and answer /health, /tokenize, /completion,
                      /v1/chat/completions (streamed: ONEBIT_STUB_CHUNKS chunks, ONEBIT_STUB_DELAY s apart),
                      /props, /slots, /metrics, /v1/models. Otherwise exit 0 after recording.
  ONEBIT_STUB_HEALTH_DELAY  seconds /health answers 503 before it answers 200
  ONEBIT_STUB_DEVICES  comma-separated device names: `--list-devices` prints them as llama-server does
                       ("Available devices:" then "  <name>: <description>"); `--check` prints them as zinc's Vulkan
                       enumeration does ("GPU <i>: <name> | VRAM ..." on stderr, for names ending in <i>)
It also reads zinc's port spelling (-p). `--help` prints a usage naming --port, as ds4-server's does. Every probe
(--list-devices, --check, --help) is appended to ONEBIT_STUB_RECORD/probes.jsonl.
  ONEBIT_STUB_KEEPALIVE_MAX N: a keep-alive connection serves N requests; the next request that arrives on it is
                      not answered, the connection is closed (a server closing an idle connection just as the
                      client reuses it: what a pooled client must survive)
  ONEBIT_STUB_FAIL    a text: a generation request whose body contains it is answered 500 with the stub's own
                      error (to check the proxy relays children's errors unchanged)
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def opt(argv, *names, default=None):
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            return argv[i + 1]
    return default


def record_probe(argv):
    """A probe (--list-devices, --check, --help) is recorded too: ONEBIT_STUB_RECORD/probes.jsonl, one argv a line."""
    rec = os.environ.get("ONEBIT_STUB_RECORD")
    if rec:
        with open(os.path.join(rec, "probes.jsonl"), "a") as f:
            f.write(json.dumps(argv) + "\n")


def main():
    argv = sys.argv
    devices = [d for d in os.environ.get("ONEBIT_STUB_DEVICES", "").split(",") if d]
    if {"--list-devices", "--check", "--help"} & set(argv):
        record_probe(argv)
    if "--help" in argv:  # as ds4-server's usage(): names its options, exits 0
        print("Usage: ds4-server [options]\n  --host HOST\n  --port N")
        return 0
    if "--list-devices" in argv:
        print("Available devices:")
        for d in devices:
            print(f"  {d}: stub device {d} (1024 MiB, 1000 MiB free)")
        if not devices:
            print("  (none)")
        return 0
    if "--check" in argv:
        for d in devices:
            print(f"info: GPU {d[-1]}: stub {d} | VRAM: 1024 MB | vendor: 0x1002", file=sys.stderr)
        return 0
    host = opt(argv, "--host", default="127.0.0.1")
    port = int(opt(argv, "--port", "-p", default="8080"))
    alias = opt(argv, "--alias", "-a", default="stub")
    rec = os.environ.get("ONEBIT_STUB_RECORD")
    if rec:
        path = os.path.join(rec, f"{port}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"argv": argv, "env": dict(os.environ), "pid": os.getpid(), "ppid": os.getppid()}, f)
        os.replace(tmp, path)
    if os.environ.get("ONEBIT_STUB_SERVE") != "1":
        return 0

    started = time.monotonic()
    health_delay = float(os.environ.get("ONEBIT_STUB_HEALTH_DELAY", "0"))
    chunks = int(os.environ.get("ONEBIT_STUB_CHUNKS", "3"))
    delay = float(os.environ.get("ONEBIT_STUB_DELAY", "0"))
    keepalive_max = int(os.environ.get("ONEBIT_STUB_KEEPALIVE_MAX", "0"))
    fail = os.environ.get("ONEBIT_STUB_FAIL", "").encode()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        served = 0

        def log_message(self, *a):
            pass

        def _drop(self) -> bool:
            """Past ONEBIT_STUB_KEEPALIVE_MAX on this connection: close it without an answer."""
            self.served += 1
            if keepalive_max and self.served > keepalive_max:
                self.close_connection = True
                return True
            return False

        def _json(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self._drop():
                return
            if self.path == "/health":
                if time.monotonic() - started < health_delay:
                    return self._json(503, {"error": {"code": 503, "message": "Loading model"}})
                return self._json(200, {"status": "ok"})
            if self.path == "/v1/models":
                return self._json(200, {"data": [{"id": alias}], "port": port})
            if self.path in ("/props", "/slots", "/metrics"):
                return self._json(200, {"path": self.path, "port": port})
            return self._json(404, {"error": "not found"})

        def do_POST(self):
            if self._drop():
                return
            n = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(n)
            body = json.loads(raw or b"{}")
            if self.path == "/tokenize":
                return self._json(200, {"tokens": list(body.get("content", "").encode())})
            if fail and fail in raw:
                return self._json(500, {"error": {"code": 500, "message": f"stub failure on port {port}",
                                                  "type": "server_error"}})
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(chunks):
                    ev = f"data: {json.dumps({'i': i, 'port': port, 'model': body.get('model'), 't': time.time()})}\n\n"
                    data = ev.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                    if delay:
                        time.sleep(delay)
                done = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                self.wfile.flush()
                return
            return self._json(200, {"port": port, "path": self.path, "model": body.get("model"), "received": body})

    ThreadingHTTPServer.daemon_threads = True
    srv = ThreadingHTTPServer((host, port), H)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
