"""Publishing to GitHub Releases against a fake REST API on 127.0.0.1: draft, upload, publish, re-runs."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from builders.release.publish import GitHubReleases, PublishError, publish

REPO = "1bit-MONSTER/1bit-engine"
TOKEN = "t0ken"


class Fake:
    """Just enough of the Releases API: list, create, patch, assets (with digest), upload, delete, download."""

    def __init__(self, *, digests: bool = True):
        self.releases: dict[int, dict] = {}
        self.assets: dict[int, dict] = {}  # id -> asset (+ _data, _release)
        self.calls: list[tuple[str, str]] = []
        self.fail_upload: set[str] = set()
        self.digests = digests
        self.lock = threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, status, payload=None, raw=None):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_any(self, method):
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with fake.lock:
                    fake.calls.append((method, url.path))
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        return self.reply(401, {"message": "Bad credentials"})
                    return fake.route(self, method, url.path, q, body)

            def do_GET(self):
                self.handle_any("GET")

            def do_POST(self):
                self.handle_any("POST")

            def do_PATCH(self):
                self.handle_any("PATCH")

            def do_DELETE(self):
                self.handle_any("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def public(self, a: dict) -> dict:
        out = {k: v for k, v in a.items() if not k.startswith("_")}
        if not self.digests:
            out.pop("digest", None)
        return out

    def route(self, h, method, path, q, body):
        base = f"/repos/{REPO}"
        if method == "GET" and path == f"{base}/releases":
            page = int(q.get("page", 1))
            items = sorted(self.releases.values(), key=lambda r: -r["id"])
            return h.reply(200, items[(page - 1) * 100: page * 100])
        if method == "POST" and path == f"{base}/releases":
            data = json.loads(body)
            rid = len(self.releases) + 1
            self.releases[rid] = {"id": rid, "tag_name": data["tag_name"], "name": data["name"], "body": data["body"],
                                  "draft": data["draft"], "html_url": f"{self.url}/r/{rid}",
                                  "upload_url": f"{self.url}/uploads{base}/releases/{rid}/assets{{?name,label}}"}
            return h.reply(201, self.releases[rid])
        if m := re.fullmatch(rf"{base}/releases/(\d+)", path):
            rel = self.releases[int(m[1])]
            rel.update(json.loads(body))
            return h.reply(200, rel)
        if m := re.fullmatch(rf"{base}/releases/(\d+)/assets", path):
            return h.reply(200, [self.public(a) for a in self.assets.values() if a["_release"] == int(m[1])])
        if m := re.fullmatch(rf"/uploads{base}/releases/(\d+)/assets", path):
            aid = max(self.assets, default=0) + 1
            name = q["name"]
            state = "uploaded"
            if name in self.fail_upload:  # the connection drops mid-upload: GitHub keeps a `starter` asset
                self.fail_upload.discard(name)
                state = "starter"
            self.assets[aid] = {"id": aid, "name": name, "state": state, "size": len(body), "_release": int(m[1]),
                                "digest": "sha256:" + hashlib.sha256(body).hexdigest(), "_data": body}
            if state == "starter":
                return h.reply(502, {"message": "upstream closed"})
            return h.reply(201, self.public(self.assets[aid]))
        if m := re.fullmatch(rf"{base}/releases/assets/(\d+)", path):
            if method == "DELETE":
                del self.assets[int(m[1])]
                return h.reply(204, raw=b"")
            return h.reply(200, raw=self.assets[int(m[1])]["_data"])
        return h.reply(404, {"message": "Not Found"})

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.close()


@pytest.fixture
def files(tmp_path):
    out = []
    for name, data in [("a.tar.gz", b"aaa"), ("b.conda", b"bbb"), ("SHA256SUMS", b"sums")]:
        (tmp_path / name).write_bytes(data)
        out.append(tmp_path / name)
    return out


def client(fake):
    return GitHubReleases.from_env(REPO, {"GITHUB_TOKEN": TOKEN, "ONEBIT_GITHUB_API": fake.url})


def test_draft_upload_publish_then_rerun_skips(fake, files):
    rep = publish(client(fake), "v2026.48", files, title="1bit v2026.48", notes="# notes")
    assert rep.created and rep.published and rep.uploaded == ["a.tar.gz", "b.conda", "SHA256SUMS"]
    rel = fake.releases[1]
    assert rel["draft"] is False and rel["tag_name"] == "v2026.48" and rel["body"] == "# notes"
    assert next(c for c in fake.calls if c[0] != "GET") == ("POST", f"/repos/{REPO}/releases")  # created as a draft first
    assert fake.calls[-1] == ("PATCH", f"/repos/{REPO}/releases/1")  # published last
    again = publish(client(fake), "v2026.48", files, title="1bit v2026.48", notes="# notes")
    assert (again.created, again.uploaded, again.published) == (False, [], False)
    assert again.skipped == ["a.tar.gz", "b.conda", "SHA256SUMS"]
    assert len(fake.assets) == 3 and client(fake).tags() == ["v2026.48"]


def test_different_bytes_is_an_error_and_uploads_nothing(fake, files):
    publish(client(fake), "v2026.48", files[:1], title="t", notes="n")
    files[0].write_bytes(b"changed")
    with pytest.raises(PublishError, match="other bytes"):
        publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert [a["name"] for a in fake.assets.values()] == ["a.tar.gz"]


def test_interrupted_publish_resumes(fake, files):
    fake.fail_upload = {"b.conda"}
    with pytest.raises(PublishError, match="HTTP 502"):
        publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert fake.releases[1]["draft"] is True  # never published half-done
    rep = publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert rep.skipped == ["a.tar.gz"] and rep.uploaded == ["b.conda", "SHA256SUMS"] and rep.published
    assert ("DELETE", f"/repos/{REPO}/releases/assets/2") in fake.calls
    assert sorted(a["name"] for a in fake.assets.values()) == ["SHA256SUMS", "a.tar.gz", "b.conda"]
    assert all(a["state"] == "uploaded" for a in fake.assets.values())


def test_without_digest_the_asset_is_downloaded_and_hashed(files):
    fake = Fake(digests=False)
    try:
        publish(client(fake), "v2026.48", files, title="t", notes="n")
        rep = publish(client(fake), "v2026.48", files, title="t", notes="n")
        assert rep.skipped == ["a.tar.gz", "b.conda", "SHA256SUMS"]
        assert ("GET", f"/repos/{REPO}/releases/assets/1") in fake.calls
    finally:
        fake.close()


def test_bad_token_is_one_clear_error(fake, files):
    c = GitHubReleases.from_env(REPO, {"GITHUB_TOKEN": "wrong", "ONEBIT_GITHUB_API": fake.url})
    with pytest.raises(PublishError, match="HTTP 401"):
        publish(c, "v2026.48", files, title="t", notes="n")
