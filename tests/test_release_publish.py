"""Publishing to GitHub Releases against the fake REST API on 127.0.0.1 (tests/github_fake.py): draft at the built
commit, upload, verify, publish; re-runs resume; injected failures (5xx, connection resets, rate limits, a kill
mid-upload) end with every asset exactly once, with the right bytes."""
from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path

import pytest
import local_http
from github_fake import REPO, TOKEN, Fake, Fault

from builders.io import http
from builders.io.github import GitHub
from builders.release.publish import GitHubReleases, PublishError, publish

__all__ = ["REPO", "TOKEN", "Fake"]  # test_release_build and the workflow replay publish to this fake too
ROOT = Path(__file__).resolve().parent.parent
BUILT = "a" * 40


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


def client(fake, **retry):
    """The client as the release builds it (from the environment); `retry` makes a quicker policy for the tests."""
    if retry:
        return GitHubReleases(REPO, client=GitHub(fake.url, TOKEN, retry=http.Retry(**retry)))
    return GitHubReleases.from_env(REPO, {"GITHUB_TOKEN": TOKEN, "ONEBIT_GITHUB_API": fake.url})


def uploaded(fake) -> dict[str, list[str]]:
    """name -> sha256 of each asset GitHub holds (a name twice shows as two entries)."""
    out: dict[str, list[str]] = {}
    for a in fake.assets.values():
        out.setdefault(a["name"], []).append(hashlib.sha256(a["_data"]).hexdigest() if a["state"] == "uploaded" else a["state"])
    return out


def local(files) -> dict[str, list[str]]:
    return {p.name: [hashlib.sha256(p.read_bytes()).hexdigest()] for p in files}


def test_draft_at_the_built_commit_upload_publish_then_rerun_skips(fake, files):
    rep = publish(client(fake), "v2026.48", files, title="1bit v2026.48", notes="# notes", target=BUILT)
    assert rep.created and rep.published and rep.uploaded == ["a.tar.gz", "b.conda", "SHA256SUMS"]
    [rel] = fake.releases.values()
    assert rel["draft"] is False and rel["tag_name"] == "v2026.48" and rel["body"] == "# notes"
    assert rel["target_commitish"] == BUILT  # tagged at the commit that was built, not the branch head at publish time
    assert next(c for c in fake.calls if c[0] != "GET") == ("POST", f"/repos/{REPO}/releases")  # created as a draft first
    assert fake.calls[-1] == ("PATCH", f"/repos/{REPO}/releases/{rel['id']}")  # published last
    again = publish(client(fake), "v2026.48", files, title="1bit v2026.48", notes="# notes", target=BUILT)
    assert (again.created, again.uploaded, again.published) == (False, [], False)
    assert again.skipped == ["a.tar.gz", "b.conda", "SHA256SUMS"]
    assert uploaded(fake) == local(files) and client(fake).tags() == ["v2026.48"]


def test_different_bytes_is_an_error_and_uploads_nothing(fake, files):
    publish(client(fake), "v2026.48", files[:1], title="t", notes="n")
    files[0].write_bytes(b"changed")
    with pytest.raises(PublishError, match="other bytes"):
        publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert [a["name"] for a in fake.assets.values()] == ["a.tar.gz"]


def test_an_upload_cut_off_is_resumed_in_the_same_run(fake, files):
    fake.fail_upload = {"b.conda"}  # GitHub keeps a `starter` asset and answers 502
    rep = publish(client(fake), "v2026.48", files, title="t", notes="n", pause=0)
    assert rep.published and rep.uploaded == ["a.tar.gz", "b.conda", "SHA256SUMS"] and rep.skipped == []
    starter = next(c for c in fake.calls if c[0] == "DELETE")
    assert starter[1].startswith(f"/repos/{REPO}/releases/assets/")
    assert uploaded(fake) == local(files) and len(fake.releases) == 1


def test_interrupted_publish_resumes_on_the_next_run(fake, files):
    fake.fail_upload = {"b.conda"}
    with pytest.raises(PublishError, match="HTTP 502") as exc:
        publish(client(fake), "v2026.48", files, title="t", notes="n", target=BUILT, attempts=1)
    assert "run the same command again" in str(exc.value)
    [rel] = fake.releases.values()
    assert rel["draft"] is True  # never published half-done
    rep = publish(client(fake), "v2026.48", files, title="t", notes="n", target=BUILT)
    assert rep.resumed and not rep.created and rep.published
    assert rep.skipped == ["a.tar.gz"] and rep.uploaded == ["b.conda", "SHA256SUMS"]
    assert list(fake.releases) == [rel["id"]] and uploaded(fake) == local(files)


def test_a_draft_built_from_another_commit_is_not_resumed(fake, files):
    fake.fail_upload = {"b.conda"}
    with pytest.raises(PublishError):
        publish(client(fake), "v2026.48", files, title="t", notes="n", target=BUILT, attempts=1)
    with pytest.raises(PublishError, match=f"draft v2026.48 .* points at '{BUILT}', but this run built {'b' * 40}") as exc:
        publish(client(fake), "v2026.48", files, title="t", notes="n", target="b" * 40)
    assert "never moves to another commit" in str(exc.value)
    assert sorted(uploaded(fake)) == ["a.tar.gz", "b.conda"]  # nothing more was uploaded


def test_without_digest_the_asset_is_downloaded_and_hashed(files):
    fake = Fake(digests=False)
    try:
        publish(client(fake), "v2026.48", files, title="t", notes="n")
        rep = publish(client(fake), "v2026.48", files, title="t", notes="n")
        assert rep.skipped == ["a.tar.gz", "b.conda", "SHA256SUMS"]
        assert any(c[0] == "GET" and c[1].startswith(f"/repos/{REPO}/releases/assets/") for c in fake.calls)
    finally:
        fake.close()


def test_bad_token_is_one_clear_error_and_not_retried(fake, files):
    c = GitHubReleases.from_env(REPO, {"GITHUB_TOKEN": "wrong", "ONEBIT_GITHUB_API": fake.url})
    with pytest.raises(PublishError, match="HTTP 401: Bad credentials") as exc:
        publish(c, "v2026.48", files, title="t", notes="n")
    assert "wrong" not in str(exc.value) and len(fake.calls) == 1


def test_assets_and_releases_are_listed_across_pages(tmp_path):
    fake = Fake(page_size=2)  # GitHub pages at most 100; the fake pages at 2 to show the Link header is followed
    try:
        files = []
        for i in range(5):
            (tmp_path / f"f{i}.bin").write_bytes(b"%d" % i)
            files.append(tmp_path / f"f{i}.bin")
        for week in (45, 46, 47):  # three newer releases push the draft onto the second page
            fake.add_release(f"v2026.{week}", draft=False)
        publish(client(fake), "v2026.44", files, title="t", notes="n", target=BUILT, attempts=1)
        for week in (48, 49):
            fake.add_release(f"v2026.{week}", draft=False)
        assert sorted(client(fake).tags()) == ["v2026.44", "v2026.45", "v2026.46", "v2026.47", "v2026.48", "v2026.49"]
        rep = publish(client(fake), "v2026.44", files, title="t", notes="n", target=BUILT)
        assert rep.skipped == [p.name for p in files] and rep.uploaded == []
        assert uploaded(fake) == local(files)
        pages = [p for m, p in fake.calls if m == "GET" and p.endswith("/assets")]
        assert len(pages) >= 3  # 5 assets, 2 a page
    finally:
        fake.close()


# --------------------------------------------------------------------------------------------- the client's retries


def test_server_errors_and_resets_are_retried(fake, files, caplog):
    caplog.set_level(logging.WARNING, logger="builders.io.http")
    fake.faults = [Fault("GET", r"/releases$", "502", times=2), Fault("GET", r"/assets$", "reset"),
                   Fault("PATCH", r"/releases/\d+$", "503")]
    rep = publish(client(fake, backoff_factor=0.01), "v2026.48", files, title="t", notes="n")
    assert rep.published and uploaded(fake) == local(files)
    assert [c for c in fake.calls if c == ("GET", f"/repos/{REPO}/releases")] == [("GET", f"/repos/{REPO}/releases")] * 3
    retried = [r.getMessage() for r in caplog.records]
    assert sum("HTTP 502; retrying" in m for m in retried) == 2
    assert any("ProtocolError; retrying" in m or "ConnectionResetError" in m for m in retried), retried
    assert any("HTTP 503; retrying" in m for m in retried)


def test_a_secondary_rate_limit_waits_as_asked(fake, files, caplog):
    caplog.set_level(logging.WARNING, logger="builders.io.http")
    fake.faults = [Fault("POST", r"/releases$", "secondary", wait=1)]  # refused: safe to repeat even a POST
    rep = publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert rep.created and rep.published and len(fake.releases) == 1
    posts = [t for m, p, t in fake.stamps if (m, p) == ("POST", f"/repos/{REPO}/releases")]
    assert len(posts) == 2 and posts[1] - posts[0] >= 1.0  # the second try came after the asked wait
    assert any("HTTP 403; retrying in 1.0 s (as the server asked)" in r.getMessage() for r in caplog.records)


def test_a_rate_limited_upload_is_sent_again_whole(fake, tmp_path):
    big = tmp_path / "big.tar.zst"
    big.write_bytes(os.urandom(3 << 20))
    fake.faults = [Fault("POST", r"/uploads/", "secondary", wait=1, query="name=big")]  # refused after the body was sent
    rep = publish(client(fake), "v2026.48", [big], title="t", notes="n")
    assert rep.uploaded == ["big.tar.zst"] and uploaded(fake) == local([big])  # the retry re-read the file from its start
    assert sum(1 for m, p in fake.calls if m == "POST" and p.startswith("/uploads/")) == 2


def test_a_used_up_rate_limit_waits_until_the_reset(fake, files, caplog):
    caplog.set_level(logging.WARNING, logger="builders.io.http")
    fake.faults = [Fault("GET", r"/releases$", "primary", wait=1)]
    rep = publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert rep.published
    assert any("HTTP 403; retrying in" in r.getMessage() and "as the server asked" in r.getMessage() for r in caplog.records)


def test_a_wait_too_long_is_not_waited_but_named(fake, files):
    fake.faults = [Fault("GET", r"/releases$", "secondary", wait=7200, times=9)]
    with pytest.raises(PublishError, match="HTTP 403: rate limit: You have exceeded a secondary rate limit") as exc:
        publish(client(fake, max_wait=60), "v2026.48", files, title="t", notes="n", attempts=1)
    assert "asks to wait until" in str(exc.value)
    assert fake.calls == [("GET", f"/repos/{REPO}/releases")]


def test_a_plain_403_is_not_retried(fake, files):
    fake.faults = [Fault("POST", r"/releases$", "403")]
    with pytest.raises(PublishError, match="HTTP 403") as exc:
        publish(client(fake), "v2026.48", files, title="t", notes="n")
    assert "lacks permission" in str(exc.value)
    assert [c for c in fake.calls if c[0] == "POST"] == [("POST", f"/repos/{REPO}/releases")]


def test_retries_are_bounded(fake, files):
    fake.faults = [Fault("GET", r"/releases$", "502", times=99)]
    with pytest.raises(PublishError, match="HTTP 502"):
        publish(client(fake, total=3, backoff_factor=0.01), "v2026.48", files, title="t", notes="n", attempts=2, pause=0)
    assert len(fake.calls) == 2 * (1 + 3)  # two passes, each one try and three retries
    assert fake.releases == {}


def test_a_reset_during_an_upload_is_resumed_from_the_listing(fake, files):
    fake.faults = [Fault("POST", r"/uploads/.*/assets$", "reset")]  # a POST is not repeated blindly
    rep = publish(client(fake), "v2026.48", files, title="t", notes="n", pause=0)
    assert rep.published and uploaded(fake) == local(files)
    assert sum(1 for c in fake.calls if c[0] == "POST" and c[1].startswith("/uploads/")) == 4  # three + the one cut off


# --------------------------------------------------------------------------------------------- a kill mid-upload

UPLOADER = """
import sys
from pathlib import Path
from builders.release.publish import GitHubReleases, publish
publish(GitHubReleases.from_env(sys.argv[1]), "v2026.48", [Path(p) for p in sys.argv[3:]], title="t", notes="n",
        target=sys.argv[2])
"""


def test_a_kill_mid_upload_is_finished_by_the_next_run(fake, tmp_path):
    big = tmp_path / "1bit-v2026.48-linux-x86_64.tar.zst"
    big.write_bytes(os.urandom(24 << 20))  # more than loopback buffers hold: the uploader is stuck mid-body
    files = [tmp_path / "a.conda", big, tmp_path / "SHA256SUMS"]
    files[0].write_bytes(b"conda")
    files[2].write_bytes(b"sums")
    env = {**os.environ, "GITHUB_TOKEN": TOKEN, "ONEBIT_GITHUB_API": fake.url, "PYTHONPATH": str(ROOT)}
    fake.kill_mid_upload(big.name, [sys.executable, "-c", UPLOADER, REPO, BUILT, *map(str, files)], env=env, cwd=ROOT)
    [rel] = fake.releases.values()
    assert rel["draft"] is True
    assert {a["name"]: a["state"] for a in fake.assets.values()} == {"a.conda": "uploaded", big.name: "starter"}

    rep = publish(client(fake), "v2026.48", files, title="t", notes="n", target=BUILT)
    assert rep.resumed and rep.published and rep.skipped == ["a.conda"] and rep.uploaded == [big.name, "SHA256SUMS"]
    assert list(fake.releases) == [rel["id"]] and fake.releases[rel["id"]]["draft"] is False
    assert uploaded(fake) == local(files)  # every asset exactly once, with the right bytes


def test_two_releases_with_one_tag_are_named(fake, files):
    fake.add_release("v2026.48", draft=True)
    fake.add_release("v2026.48", draft=True)
    with pytest.raises(PublishError, match="2 releases of .* carry the tag v2026.48"):
        publish(client(fake), "v2026.48", files, title="t", notes="n")


# --------------------------------------------------------------------------------------------- where the token goes


class _Server:
    """A bare HTTP server on 127.0.0.1 that records (path, Authorization) and answers `answer(path)` ->
    (status, json body, headers)."""

    def __init__(self, answer):
        import json
        from http.server import BaseHTTPRequestHandler

        seen = self.seen = []

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                seen.append((self.path, self.headers.get("Authorization")))
                status, body, headers = answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = handle_any

        self.server, self.url = local_http.serve(H)

    def close(self):
        local_http.stop(self.server)


def test_the_token_never_goes_to_an_upload_url_on_another_host(fake, files):
    evil = _Server(lambda path: (201, {"id": 1, "name": "x", "state": "uploaded"}, {}))
    try:
        rel = fake.add_release("v2026.48", draft=True, target=BUILT)
        rel["upload_url"] = f"{evil.url}/repos/{REPO}/releases/{rel['id']}/assets{{?name,label}}"
        with pytest.raises(PublishError, match="upload_url is on 127.0.0.1:[0-9]+, neither the API's host nor GitHub's upload host"):
            publish(client(fake), "v2026.48", files, title="t", notes="n", target=BUILT, attempts=1)
        assert evil.seen == []
    finally:
        evil.close()


def test_a_next_page_on_another_host_is_not_followed(tmp_path):
    evil = _Server(lambda path: (200, [], {}))
    api = _Server(lambda path: (200, [{"tag_name": "v2026.1", "id": 1}], {"Link": f'<{evil.url}/page2>; rel="next"'}))
    try:
        with pytest.raises(http.HTTPError, match="next page is on another host"):
            GitHubReleases(REPO, client=GitHub(api.url, TOKEN)).tags()
        assert evil.seen == [] and api.seen[0][1] == f"Bearer {TOKEN}"
    finally:
        evil.close()
        api.close()


def test_endless_pagination_stops_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(http, "MAX_PAGES", 5)
    api = _Server(lambda path: (200, [{"tag_name": "v", "id": 1}],
                                {"Link": f'<{api.url}/repos/{REPO}/releases?page={int(path.rsplit("=", 1)[-1] or 0) + 1 if "page=" in path else 2}>; rel="next"'}))
    try:
        with pytest.raises(http.HTTPError, match="more than 5 pages; stopped"):
            GitHubReleases(REPO, client=GitHub(api.url, TOKEN)).tags()
        assert len(api.seen) == 5
    finally:
        api.close()
    loop = _Server(lambda path: (200, [{"tag_name": "v", "id": 1}], {"Link": f'<{loop.url}/repos/{REPO}/releases>; rel="next"'}))
    try:
        with pytest.raises(http.HTTPError, match="link back to a page already read"):
            GitHubReleases(REPO, client=GitHub(loop.url, TOKEN)).tags()
    finally:
        loop.close()
    monkeypatch.setattr(http, "MAX_ITEMS", 3)
    many = _Server(lambda path: (200, [{"tag_name": "v", "id": i} for i in range(4)], {}))
    try:
        with pytest.raises(http.HTTPError, match="more than 3 items; stopped"):
            GitHubReleases(REPO, client=GitHub(many.url, TOKEN)).tags()
    finally:
        many.close()


@pytest.mark.parametrize("base, url, sent", [
    ("https://api.github.com", "https://api.github.com/repos/o/r/releases", True),
    ("https://api.github.com", "https://uploads.github.com/repos/o/r/releases/1/assets", True),
    ("https://api.github.com", "https://evil.example/upload", False),
    ("https://api.github.com", "https://api.github.com.evil.example/x", False),
    ("https://ghe.example/api/v3", "https://ghe.example/api/uploads/repos/o/r/releases/1/assets", True),
    ("https://ghe.example/api/v3", "https://uploads.github.com/repos/o/r", False),
])
def test_token_hosts(base, url, sent):
    assert GitHub(base, TOKEN).may_send_token(url) is sent


def test_the_api_host_comes_from_github_api_url():
    assert GitHub.from_env({"GITHUB_API_URL": "https://ghe.example/api/v3", "GITHUB_TOKEN": "x"}).base == "https://ghe.example/api/v3"


def test_held_a_redirect_to_another_host_drops_the_token():
    other = _Server(lambda path: (200, {"ok": True}, {}))
    api = _Server(lambda path: (302, {}, {"Location": f"{other.url}/elsewhere"}))
    try:
        assert GitHub(api.url, TOKEN).json("GET", "/repos/o/r/releases/assets/1") == {"ok": True}
        assert api.seen[0][1] == f"Bearer {TOKEN}" and other.seen == [("/elsewhere", None)]
    finally:
        other.close()
        api.close()


def test_held_a_201_with_a_wrong_digest_is_deleted(fake, files, monkeypatch):
    real = GitHubReleases.upload

    def damaged(self, release, path):
        got = real(self, release, path)
        return {**got, "digest": "sha256:" + "0" * 64} if path.name == "b.conda" else got

    monkeypatch.setattr(GitHubReleases, "upload", damaged)
    with pytest.raises(PublishError, match="GitHub holds other bytes for b.conda"):
        publish(client(fake), "v2026.48", files, title="t", notes="n", target=BUILT, attempts=1)
    assert "b.conda" not in uploaded(fake)
