"""The one HTTP mechanism (builders/io/http.py): what is retried and how long it waits (tables over the policy), and the
Hugging Face downloads of companions.py going through it against a real server on 127.0.0.1."""
from __future__ import annotations

import hashlib
from http.server import ThreadingHTTPServer
import logging
import socket
import threading
from typing import ClassVar

import pytest
import urllib3
from http_fixtures import QuietHandler

from builders.inputs import companions
from builders.io import http
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


class _Flaky(QuietHandler):
    """Answers 503 to the first request for each path, then the file."""
    files: ClassVar[dict[str, bytes]] = {}
    seen: ClassVar[list[str]] = []

    def do_GET(self):
        first = self.path not in self.seen
        self.seen.append(self.path)
        body = self.files.get(self.path)
        status = 503 if first else (200 if body is not None else 404)
        data = b"busy" if first else (body or b"")
        self.answer(status, data)


@pytest.fixture
def flaky():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.files, _Flaky.seen = {}, []
    yield f"http://127.0.0.1:{server.server_address[1]}", _Flaky
    server.shutdown()
    server.server_close()


def test_hf_companion_downloads_retry_a_busy_server(flaky, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="builders.io.http")
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect_error(url: str) -> BaseException:
    """The error urllib3 itself raises for `url`, asked once without retries."""
    try:
        urllib3.PoolManager().request("GET", url, retries=False, timeout=5)
    except Exception as exc:  # what the Retry sees
        return exc
    raise AssertionError(f"{url} answered")


@pytest.mark.parametrize("url, why", [
    ("http://nothing.invalid/x", "the host name does not resolve"),   # offline: no name resolves
    ("http://127.0.0.1:{port}/x", "the connection was refused"),      # nothing listens
])
def test_unreachable_names_what_no_wait_would_change(url, why):
    error = _connect_error(url.format(port=_free_port()))
    assert http.unreachable(error) == why
    assert http.unreachable(urllib3.exceptions.ReadTimeoutError(None, url, "read timed out")) is None  # retried
    assert http.unreachable(None) is None


@pytest.mark.parametrize("base, why", [
    ("http://api.github.invalid", "the host name does not resolve"),
    ("http://127.0.0.1:{port}", "the connection was refused"),
])
def test_pins_status_offline_fails_at_once_without_backoff(tmp_path, monkeypatch, caplog, capsys, base, why):
    """`1bit-build pins status` with the API unreachable: the pin's row says why in one line, and no request is
    retried (offline, every endpoint cost half a minute of backoff before)."""
    from builders.pins.__main__ import main
    from pins_fixtures import Project, Upstream, release_pin

    up = Upstream(tmp_path / "huggingface" / "tokenizers")
    commit = up.commit("one")
    up.tag("v0.20.3")
    proj = Project(tmp_path, release_pin("tokenizers", up.url, "v0.20.3", commit, "Apache-2.0"))
    monkeypatch.setenv("ONEBIT_GITHUB_API", base.format(port=_free_port()))
    monkeypatch.setenv("COLUMNS", "200")
    caplog.set_level(logging.WARNING, logger="builders.io.http")
    main(["--root", str(proj.root), "status"])
    out = capsys.readouterr().out
    assert f"error: cannot reach the GitHub API: ConnectionError ({why})" in out
    assert [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()] == []
