"""Publish a release directory to GitHub Releases over REST: draft, upload, publish. Re-runs are idempotent.

- the release is found by tag among all releases (drafts included) or created as a draft;
- an asset already uploaded with the same sha256 is skipped; one with other bytes is an error (nothing is replaced);
- an upload left half-done (state `starter`) is deleted and uploaded again;
- only when every asset is there is the draft published, so an interrupted run is resumed by running it again.
The API base is $ONEBIT_GITHUB_API (tests point it at 127.0.0.1), the token $GITHUB_TOKEN.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import requests

from ..config import file_sha256 as _sha256
from ..errors import OnebitError

GITHUB_API = "https://api.github.com"


class PublishError(OnebitError):
    pass



@dataclass
class Report:
    release_url: str = ""
    created: bool = False
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    published: bool = False


class GitHubReleases:
    def __init__(self, repo: str, *, token: str | None, api: str | None = None, session: requests.Session | None = None):
        self.repo = repo
        self.api = (api or GITHUB_API).rstrip("/")
        self.http = session or requests.Session()
        self.http.headers.update({"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"})
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    def from_env(cls, repo: str, env: Mapping[str, str] | None = None) -> GitHubReleases:
        env = os.environ if env is None else env
        return cls(repo, token=env.get("GITHUB_TOKEN"), api=env.get("ONEBIT_GITHUB_API"))

    def _call(self, method: str, url: str, *, ok=(200, 201, 204), **kw) -> requests.Response:
        url = url if url.startswith("http") else f"{self.api}{url}"
        try:
            resp = self.http.request(method, url, timeout=600, **kw)
        except requests.RequestException as exc:
            raise PublishError(f"{method} {url}: {exc}", hint="run the same command again to resume") from None
        if resp.status_code not in ok:
            raise PublishError(f"{method} {url}: HTTP {resp.status_code} {resp.text[:300]}",
                               hint="check GITHUB_TOKEN (contents: write) and the repository; then run again to resume")
        return resp

    def releases(self) -> list[dict]:
        out, page = [], 1
        while True:
            batch = self._call("GET", f"/repos/{self.repo}/releases", params={"per_page": 100, "page": page}).json()
            out += batch
            if len(batch) < 100:
                return out
            page += 1

    def tags(self) -> list[str]:
        return [r["tag_name"] for r in self.releases()]

    def find(self, tag: str) -> dict | None:
        return next((r for r in self.releases() if r["tag_name"] == tag), None)

    def assets(self, release: dict) -> list[dict]:
        return self._call("GET", f"/repos/{self.repo}/releases/{release['id']}/assets", params={"per_page": 100}).json()

    def asset_sha256(self, asset: dict) -> str:
        digest = asset.get("digest") or ""
        if digest.startswith("sha256:"):
            return digest.removeprefix("sha256:")
        resp = self._call("GET", f"/repos/{self.repo}/releases/assets/{asset['id']}",
                          headers={"Accept": "application/octet-stream"}, stream=True)
        h = hashlib.sha256()
        for chunk in resp.iter_content(1 << 20):
            h.update(chunk)
        return h.hexdigest()

    def upload(self, release: dict, path: Path) -> dict:
        url = release["upload_url"].split("{", 1)[0]
        with open(path, "rb") as f:
            return self._call("POST", url, params={"name": path.name}, data=f,
                              headers={"Content-Type": "application/octet-stream",
                                       "Content-Length": str(path.stat().st_size)}).json()


def publish(client: GitHubReleases, tag: str, files: Sequence[Path], *, title: str, notes: str,
            target: str | None = None) -> Report:
    """Create (or find) the draft for `tag`, upload what is missing, then publish it. Safe to run again."""
    report = Report()
    names = [p.name for p in files]
    if len(set(names)) != len(names):
        raise PublishError(f"two release assets share a name: {sorted(n for n in names if names.count(n) > 1)}")
    release = client.find(tag)
    if release is None:
        body = {"tag_name": tag, "name": title, "body": notes, "draft": True, "prerelease": False}
        if target:
            body["target_commitish"] = target
        release = client._call("POST", f"/repos/{client.repo}/releases", json=body).json()
        report.created = True
    present = {a["name"]: a for a in client.assets(release)}
    local = {p.name: _sha256(p) for p in files}
    # refuse before uploading anything when an uploaded asset has other bytes
    for name, digest in local.items():
        asset = present.get(name)
        if asset and asset.get("state", "uploaded") == "uploaded" and client.asset_sha256(asset) != digest:
            raise PublishError(f"release {tag} already has {name} with other bytes (local sha256 {digest})",
                               hint="a published asset is never replaced: respin with the next tag instead")
    for path in files:
        asset = present.get(path.name)
        if asset and asset.get("state", "uploaded") == "uploaded":
            report.skipped.append(path.name)
            continue
        if asset:  # a half-done upload from an interrupted run
            client._call("DELETE", f"/repos/{client.repo}/releases/assets/{asset['id']}")
        client.upload(release, path)
        report.uploaded.append(path.name)
    if release.get("draft", True):
        release = client._call("PATCH", f"/repos/{client.repo}/releases/{release['id']}",
                               json={"draft": False, "make_latest": "true"}).json()
        report.published = True
    report.release_url = release.get("html_url", "")
    return report
