"""The one HTTP mechanism (builders/http.py): what is retried and how long it waits (tables over the policy), and the
Hugging Face downloads of companions.py going through it against a real server on 127.0.0.1."""
from __future__ import annotations

import hashlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import logging
import threading
from typing import ClassVar

import pytest

from builders import companions, http
from builders.errors import FetchError


@pytest.mark.parametrize("status, headers, expected", [
    (429, {}, True),                                              # always a rate limit
    (403, {"Retry-After": "30"}, True),                           # GitHub's secondary limit
    (403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1700000000"}, True),  # the primary limit, used up
    (403, {"X-RateLimit-Remaining": "12"}, False),                # limit not reached: a real "forbidden"
    (403, {}, False),                                             # no permission: never retried
    (502, {"Retry-After": "5"}, False),
])
def test_rate_limited(status, headers, expected):
    assert http.rate_limited(status, headers) is expected


@pytest.mark.parametrize("headers, expected", [
    ({"Retry-After": "7"}, 7.0),
    ({"retry-after": "0"}, 0.0),
    ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1000"}, 11.0),   # until the reset (+1 s), from now = 990
    ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "900"}, 0.0),     # already reset
    ({"x-ratelimit-remaining": "3", "x-ratelimit-reset": "1000"}, None),   # not used up: no hint
    ({"Retry-After": "soon"}, None),                                       # unparseable: backoff instead
    ({}, None),
])
def test_wait_hint(headers, expected):
    assert http.wait_hint(headers, now=990.0) == expected


@pytest.mark.parametrize("method, status, expected", [
    ("GET", 502, True), ("PUT", 500, True), ("DELETE", 504, True), ("PATCH", 503, True),
    ("POST", 502, False),   # may have been done: the caller reconciles (the publisher lists and resumes)
    ("POST", 429, True), ("POST", 403, True),   # a rate limit refuses the request; a 403 is decided on its headers
    ("GET", 404, False), ("GET", 401, False), ("GET", 422, False),
])
def test_what_is_retried(method, status, expected):
    assert http.Retry().is_retry(method, status) is expected


class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 to the first request for each path, then the file."""
    files: ClassVar[dict[str, bytes]] = {}
    seen: ClassVar[list[str]] = []

    def do_GET(self):
        first = self.path not in self.seen
        self.seen.append(self.path)
        body = self.files.get(self.path)
        status = 503 if first else (200 if body is not None else 404)
        data = b"busy" if first else (body or b"")
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def flaky():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.files, _Flaky.seen = {}, []
    yield f"http://127.0.0.1:{server.server_address[1]}", _Flaky
    server.shutdown()
    server.server_close()


def test_hf_companion_downloads_retry_a_busy_server(flaky, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="builders.http")
    endpoint, h = flaky
    rev = "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851"
    h.files = {f"/o/r/resolve/{rev}/model.bin": b"w" * 3000}
    dest = tmp_path / "hf"
    companions.fetch_hf("o/r", rev, {"model.bin": hashlib.sha256(b"w" * 3000).hexdigest()}, dest, endpoint=endpoint)
    assert (dest / "model.bin").read_bytes() == b"w" * 3000
    assert h.seen == [f"/o/r/resolve/{rev}/model.bin"] * 2
    assert any("HTTP 503; retrying" in r.getMessage() for r in caplog.records)


def test_hf_companion_download_that_stays_missing_is_one_clear_error(flaky, tmp_path):
    endpoint, h = flaky
    with pytest.raises(FetchError, match=r"could not download .*/o/r/resolve/abc/gone.bin: Hugging Face API answered HTTP 404"):
        companions.fetch_hf("o/r", "abc", {"gone.bin": "0" * 64}, tmp_path / "hf", endpoint=endpoint)
    assert not (tmp_path / "hf").exists()
