"""A fake of the GitHub REST API on 127.0.0.1 for the release tests: releases and their assets (drafts, uploads that can be
cut off, digests), pull requests, check runs, commit statuses, Actions jobs and their logs. Listings are paginated with a
`Link` header, as GitHub does. Failures are injected per request: a 5xx, a connection reset, a secondary rate limit
(403 + Retry-After) or a used-up primary limit (403 + x-ratelimit-remaining: 0 + x-ratelimit-reset).

What it models of GitHub (from its REST docs): a draft release has no git tag and several drafts may share a tag name,
a published release's tag is unique; an asset name is unique within a release (422 already_exists); an upload that
breaks off leaves an asset in state `starter`; `digest` is `sha256:<hex>` of the uploaded bytes.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse

from http_fixtures import QuietHandler

REPO = "1bit-MONSTER/1bit-engine"
TOKEN = "t0ken"


@dataclass
class Fault:
    """Answer `times` requests matching method and path (a regex, searched) with `kind` instead of the real answer:
    an HTTP status ("502"), "reset" (the connection is cut, no answer), "secondary" (403, Retry-After: `wait`) or
    "primary" (403, x-ratelimit-remaining: 0, x-ratelimit-reset: now + `wait`)."""
    method: str
    path: str
    kind: str
    times: int = 1
    wait: int = 1
    query: str = ""  # a regex searched in the query string too, e.g. "name=SHA256SUMS" for one upload


class Fake:
    def __init__(self, *, digests: bool = True, page_size: int = 100):
        self.releases: dict[int, dict] = {}
        self.assets: dict[int, dict] = {}  # id -> asset (+ _data, _release)
        self.pulls: list[dict] = []
        self.check_runs: dict[str, list[dict]] = {}  # sha -> check runs
        self.statuses: dict[str, list[dict]] = {}  # sha -> statuses, newest last
        self.jobs: dict[int, dict] = {}
        self.logs: dict[int, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.stamps: list[tuple[str, str, float]] = []  # (method, path, monotonic time) of every request
        self.faults: list[Fault] = []
        self.fail_upload: set[str] = set()  # names whose next upload breaks off (a 502 after a `starter` asset)
        self.paused: dict[str, tuple[threading.Event, threading.Event]] = {}  # see pause_upload
        self.digests = digests
        self.page_size = page_size
        self.lock = threading.Lock()
        self.ids: dict[str, int] = {}
        fake = self

        class H(QuietHandler):
            def reply(self, status, payload=None, raw=None, headers=None):
                self.answer(status, raw if raw is not None else json.dumps(payload).encode(), headers)

            def reset(self):
                """Cut the connection with a TCP RST: the client sees 'connection reset by peer'."""
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def handle_any(self, method):
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                with fake.lock:
                    fake.calls.append((method, url.path))
                    fake.stamps.append((method, url.path, time.monotonic()))
                    fault = fake.take_fault(method, url.path, url.query)
                upload = method == "POST" and url.path.startswith("/uploads/")
                if fault is not None:
                    n = int(self.headers.get("Content-Length") or 0)
                    if n:
                        self.rfile.read(n)
                    return fake.answer_fault(self, fault)
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.reply(401, {"message": "Bad credentials"})
                if upload:
                    return fake.upload(self, url.path, q)
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with fake.lock:
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
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    # ---- faults
    def take_fault(self, method: str, path: str, query: str = "") -> Fault | None:
        for f in self.faults:
            if f.times > 0 and f.method == method and re.search(f.path, path) and re.search(f.query, query):
                f.times -= 1
                return f
        return None

    def answer_fault(self, h, f: Fault):
        if f.kind == "reset":
            return h.reset()
        if f.kind == "secondary":
            return h.reply(403, {"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you "
                                            "try again."}, headers={"Retry-After": str(f.wait)})
        if f.kind == "primary":
            return h.reply(403, {"message": "API rate limit exceeded"},
                           headers={"x-ratelimit-remaining": "0", "x-ratelimit-limit": "5000",
                                    "x-ratelimit-reset": str(int(time.time()) + f.wait)})
        return h.reply(int(f.kind), {"message": "Server Error"})

    # ---- helpers
    def public(self, a: dict) -> dict:
        out = {k: v for k, v in a.items() if not k.startswith("_")}
        if not self.digests:
            out.pop("digest", None)
        return out

    def page(self, h, path: str, q: dict, items: list, wrap=None):
        page = int(q.get("page", 1))
        per = min(int(q.get("per_page", 30)), self.page_size)
        chunk = items[(page - 1) * per: page * per]
        headers = {}
        if len(items) > page * per:
            headers["Link"] = f'<{self.url}{path}?{urlencode({**q, "page": page + 1})}>; rel="next"'
        return h.reply(200, wrap(chunk, len(items)) if wrap else chunk, headers=headers)

    def new_id(self, kind: str) -> int:
        """Ids count from 1 per kind (releases 1, 2, ...), as tests name them."""
        self.ids[kind] = self.ids.get(kind, 0) + 1
        return self.ids[kind]

    def add_release(self, tag: str, *, draft: bool, target: str = "main") -> dict:
        with self.lock:
            rid = self.new_id("release")
            self.releases[rid] = self._release(rid, tag, tag, "", draft, target)
            return self.releases[rid]

    def _release(self, rid, tag, name, body, draft, target):
        return {"id": rid, "tag_name": tag, "name": name, "body": body, "draft": draft, "target_commitish": target,
                "html_url": f"{self.url}/r/{rid}",
                "upload_url": f"{self.url}/uploads/repos/{REPO}/releases/{rid}/assets{{?name,label}}"}

    # ---- uploads (read as a stream, so a client killed mid-upload leaves a `starter` asset)
    def upload(self, h, path, q):
        m = re.fullmatch(rf"/uploads/repos/{REPO}/releases/(\d+)/assets", path)
        name = q.get("name", "")
        n = int(h.headers.get("Content-Length") or 0)
        with self.lock:
            rid = int(m[1]) if m else 0
            if rid not in self.releases:
                h.rfile.read(n)
                return h.reply(404, {"message": "Not Found"})
            if any(a["_release"] == rid and a["name"] == name for a in self.assets.values()):
                h.rfile.read(n)
                return h.reply(422, {"message": "Validation Failed",
                                     "errors": [{"resource": "ReleaseAsset", "code": "already_exists", "field": "name"}]})
            aid = self.new_id("asset")
            asset = {"id": aid, "name": name, "state": "starter", "size": 0, "_release": rid, "_data": b"",
                     "digest": None, "content_type": h.headers.get("Content-Type")}
            self.assets[aid] = asset
            pause = self.paused.pop(name, None)
        data = bytearray()
        while len(data) < n:
            block = h.rfile.read(min(1 << 16, n - len(data)))
            if not block:
                return  # the client went away: the asset stays a `starter`
            data += block
            if pause is not None:
                started, proceed = pause
                started.set()
                proceed.wait(60)
                pause = None
        with self.lock:
            asset.update(size=len(data), _data=bytes(data), digest="sha256:" + hashlib.sha256(data).hexdigest())
            if name in self.fail_upload:  # the connection drops at the end: GitHub keeps a `starter` asset
                self.fail_upload.discard(name)
                return h.reply(502, {"message": "upstream closed"})
            asset["state"] = "uploaded"
            answer = self.public(asset)
        try:
            h.reply(201, answer)
        except OSError:  # the uploader is gone (killed): GitHub keeps what it received
            h.close_connection = True

    # ---- everything else
    def route(self, h, method, path, q, body):
        base = f"/repos/{REPO}"
        if method == "GET" and path == f"{base}/releases":
            return self.page(h, path, q, sorted(self.releases.values(), key=lambda r: -r["id"]))
        if method == "POST" and path == f"{base}/releases":
            data = json.loads(body)
            if not data["draft"] and any(r["tag_name"] == data["tag_name"] and not r["draft"] for r in self.releases.values()):
                return h.reply(422, {"message": "Validation Failed", "errors": [{"code": "already_exists", "field": "tag_name"}]})
            rid = self.new_id("release")
            self.releases[rid] = self._release(rid, data["tag_name"], data["name"], data["body"], data["draft"],
                                               data.get("target_commitish", "main"))
            return h.reply(201, self.releases[rid])
        if m := re.fullmatch(rf"{base}/releases/(\d+)", path):
            rel = self.releases.get(int(m[1]))
            if rel is None:
                return h.reply(404, {"message": "Not Found"})
            if method == "PATCH":
                data = json.loads(body)
                if data.get("draft") is False and any(r["tag_name"] == rel["tag_name"] and not r["draft"] and r is not rel
                                                      for r in self.releases.values()):
                    return h.reply(422, {"message": "Validation Failed", "errors": [{"code": "already_exists"}]})
                rel.update({k: v for k, v in data.items() if k != "make_latest"})
            return h.reply(200, rel)
        if m := re.fullmatch(rf"{base}/releases/(\d+)/assets", path):
            return self.page(h, path, q, [self.public(a) for a in self.assets.values() if a["_release"] == int(m[1])])
        if m := re.fullmatch(rf"{base}/releases/assets/(\d+)", path):
            asset = self.assets.get(int(m[1]))
            if asset is None:
                return h.reply(404, {"message": "Not Found"})
            if method == "DELETE":
                del self.assets[int(m[1])]
                return h.reply(204, raw=b"")
            return h.reply(200, raw=asset["_data"])
        if method == "GET" and path == f"{base}/pulls":
            out = [p for p in self.pulls if q.get("state", "open") in ("all", p["state"])
                   and ("base" not in q or p["base"]["ref"] == q["base"])]
            return self.page(h, path, q, out)
        if m := re.fullmatch(rf"{base}/commits/([0-9a-f]{{40}})/check-runs", path):
            runs = self.check_runs.get(m[1], [])
            return self.page(h, path, q, runs, wrap=lambda chunk, total: {"total_count": total, "check_runs": chunk})
        if m := re.fullmatch(rf"{base}/commits/([0-9a-f]{{40}})/status", path):
            latest = {}
            for s in self.statuses.get(m[1], []):
                latest[s["context"]] = s
            items = list(reversed(list(latest.values())))
            return self.page(h, path, q, items, wrap=lambda chunk, total: {"state": combined(items), "sha": m[1],
                                                                           "total_count": total, "statuses": chunk})
        if method == "POST" and (m := re.fullmatch(rf"{base}/statuses/([0-9a-f]{{40}})", path)):
            data = json.loads(body)
            status = {"id": self.new_id("status"), "state": data["state"], "context": data.get("context", "default"),
                      "description": data.get("description"), "target_url": data.get("target_url")}
            self.statuses.setdefault(m[1], []).append(status)
            return h.reply(201, status)
        if m := re.fullmatch(rf"{base}/actions/jobs/(\d+)", path):
            job = self.jobs.get(int(m[1]))
            return h.reply(200, job) if job else h.reply(404, {"message": "Not Found"})
        if m := re.fullmatch(rf"{base}/actions/jobs/(\d+)/logs", path):  # a redirect to the plain-text log, as GitHub does
            return h.reply(302, raw=b"", headers={"Location": f"{self.url}/_logs/{m[1]}.txt"})
        if m := re.fullmatch(r"/_logs/(\d+)\.txt", path):
            return h.reply(200, raw=self.logs.get(int(m[1]), "").encode())
        return h.reply(404, {"message": "Not Found"})

    def kill_mid_upload(self, name: str, argv: list[str], *, env: dict, cwd, wait: float = 60) -> None:
        """Run `argv` (an uploader), SIGKILL it while it sends `name`, then let the server go on reading."""
        import signal
        import subprocess

        started, proceed = self.pause_upload(name)
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert started.wait(wait), proc.communicate(timeout=5)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            proceed.set()
        assert proc.returncode == -signal.SIGKILL

    def pause_upload(self, name: str) -> tuple[threading.Event, threading.Event]:
        """The next upload of `name` stops reading after its first 64 KiB: `started` is set then, and reading goes on
        once the test sets `proceed` (after it killed the uploader, say)."""
        pause = (threading.Event(), threading.Event())
        self.paused[name] = pause
        return pause

    # ---- CI facts for bump branches
    def pull(self, branch: str, sha: str, base: str = "main") -> dict:
        pr = {"number": len(self.pulls) + 1, "state": "open", "head": {"ref": branch, "sha": sha, "repo": {"full_name": REPO}},
              "base": {"ref": base}, "html_url": f"{self.url}/pull/{len(self.pulls) + 1}"}
        self.pulls.append(pr)
        return pr

    def check(self, sha: str, name: str, conclusion: str | None, *, job: dict | None = None, log: str = "") -> None:
        """A check run on `sha` (conclusion None: still running); with `job`, an Actions job with steps and a log."""
        rid = self.new_id("check")
        run = {"id": rid, "name": name, "head_sha": sha, "status": "completed" if conclusion else "in_progress",
               "conclusion": conclusion, "app": {"slug": "github-actions"}, "output": {"title": None, "summary": None},
               "details_url": f"https://github.com/{REPO}/actions/runs/77/job/{rid}"}
        if job is not None:
            self.jobs[rid] = {"id": rid, "run_id": 77, "name": name, "head_sha": sha, "conclusion": conclusion, **job}
            self.logs[rid] = log
        self.check_runs.setdefault(sha, []).append(run)

    def status(self, sha: str, context: str, state: str, description: str = "") -> None:
        self.statuses.setdefault(sha, []).append({"id": self.new_id("status"), "state": state, "context": context,
                                                  "description": description, "target_url": None})

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def combined(statuses: list[dict]) -> str:
    states = {s["state"] for s in statuses}
    if states & {"failure", "error"}:
        return "failure"
    if "pending" in states or not states:
        return "pending"
    return "success"
