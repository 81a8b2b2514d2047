"""Publish a release directory to GitHub Releases: draft, upload, verify, publish. A re-run resumes; nothing is replaced.

- the release is found by tag among all releases, drafts included (every page), or created as a draft at the commit
  that was built (`target_commitish`); a draft or release found for the tag must point at that same commit;
- an asset already uploaded with the same sha256 is skipped; one with other bytes is an error (nothing is replaced);
- an upload left half-done (state `starter`) is deleted and uploaded again;
- only when every asset is there exactly once, uploaded, with the local bytes, is the draft published, so an
  interrupted run (a kill, a lost connection) is finished by running the same command again.

The HTTP is the shared GitHub client (builders/io/github.py): 5xx answers to idempotent calls, rate limits and broken
connections are retried there. A POST (create, upload) is never repeated blindly; when one fails for a passing reason,
publish() starts over from the listing, which is exactly what a re-run does, at most `attempts` times.
The API base is $ONEBIT_GITHUB_API (tests point it at 127.0.0.1), the token $GITHUB_TOKEN.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..io import http
from ..project.config import file_sha256 as _sha256
from ..errors import OnebitError
from ..io.github import GitHub

log = logging.getLogger("builders.release.publish")


class PublishError(OnebitError):
    pass


@dataclass
class Report:
    release_url: str = ""
    tag: str = ""
    created: bool = False
    resumed: bool = False  # an unpublished draft was found and finished
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    published: bool = False


class _Hasher:
    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def write(self, block: bytes) -> None:
        self.h.update(block)


class GitHubReleases:
    """The Releases API of one repository, on the shared client."""

    def __init__(self, repo: str, *, token: str | None = None, api: str | None = None, client: GitHub | None = None):
        self.repo = repo
        self.gh = client or GitHub(api, token)

    @classmethod
    def from_env(cls, repo: str, env: Mapping[str, str] | None = None) -> GitHubReleases:
        return cls(repo, client=GitHub.from_env(env))

    def releases(self) -> list[dict]:
        return list(self.gh.pages(f"/repos/{self.repo}/releases"))

    def tags(self) -> list[str]:
        return [r["tag_name"] for r in self.releases()]

    def find(self, tag: str) -> dict | None:
        found = [r for r in self.releases() if r["tag_name"] == tag]
        if len(found) > 1:
            raise PublishError(f"{len(found)} releases of {self.repo} carry the tag {tag} (ids "
                               f"{', '.join(str(r['id']) for r in found)})",
                               hint="delete the extra drafts on GitHub, then run the same command again")
        return found[0] if found else None

    def create(self, tag: str, *, title: str, notes: str, target: str | None) -> dict:
        body = {"tag_name": tag, "name": title, "body": notes, "draft": True, "prerelease": False}
        if target:
            body["target_commitish"] = target
        return self.gh.json("POST", f"/repos/{self.repo}/releases", json=body)

    def assets(self, release: dict) -> list[dict]:
        return list(self.gh.pages(f"/repos/{self.repo}/releases/{release['id']}/assets"))

    def asset_sha256(self, asset: dict) -> str:
        digest = asset.get("digest") or ""
        if digest.startswith("sha256:"):
            return digest.removeprefix("sha256:")
        sink = _Hasher()
        self.gh.download(f"/repos/{self.repo}/releases/assets/{asset['id']}", sink,
                         headers={"Accept": "application/octet-stream"})
        return sink.h.hexdigest()

    def upload(self, release: dict, path: Path) -> dict:
        url = str(release.get("upload_url") or "").split("{", 1)[0]
        if not self.gh.may_send_token(url):
            raise PublishError(f"the release's upload_url is on {urlsplit(url).netloc or 'no host'}, neither the API's "
                               f"host nor GitHub's upload host; the token is not sent there",
                               where=f"release {release.get('id')}", hint="check ONEBIT_GITHUB_API / GITHUB_API_URL")
        with open(path, "rb") as f:
            return self.gh.json("POST", url, params={"name": path.name}, data=f, timeout=(15, 600),
                                headers={"Content-Type": "application/octet-stream",
                                         "Content-Length": str(path.stat().st_size)})

    def delete_asset(self, asset: dict) -> None:
        self.gh.request("DELETE", f"/repos/{self.repo}/releases/assets/{asset['id']}")

    def publish(self, release: dict, *, title: str, notes: str) -> dict:
        return self.gh.json("PATCH", f"/repos/{self.repo}/releases/{release['id']}",
                            json={"draft": False, "make_latest": "true", "name": title, "body": notes})


def release_tags(client: GitHubReleases) -> tuple[list[str], list[str]]:
    """(published tags, draft tags) of the release store, for tag.release_tag."""
    releases = client.releases()
    return [r["tag_name"] for r in releases if not r.get("draft")], [r["tag_name"] for r in releases if r.get("draft")]


def _target_problem(release: dict, tag: str, target: str | None) -> str | None:
    """Pure: why a release found for the tag cannot be this run's (it points elsewhere), or None."""
    have = release.get("target_commitish")
    if not target or have == target:
        return None
    what = "draft" if release.get("draft") else "published release"
    return f"the {what} {tag} (id {release.get('id')}) points at {have!r}, but this run built {target}"


def publish(client: GitHubReleases, tag: str, files: Sequence[Path], *, title: str, notes: str,
            target: str | None = None, attempts: int = 3, pause: float = 5.0) -> Report:
    """Create (or find) the draft for `tag` at `target`, upload what is missing, verify, then publish. Safe to run
    again; a passing failure (a server error, a lost connection, a rate limit) starts over from the listing."""
    names = [p.name for p in files]
    if len(set(names)) != len(names):
        raise PublishError(f"two release assets share a name: {sorted({n for n in names if names.count(n) > 1})}")
    local = {p.name: _sha256(p) for p in files}
    report = Report(tag=tag)
    for attempt in range(1, attempts + 1):
        try:
            return _publish_once(client, tag, files, local, title=title, notes=notes, target=target, report=report)
        except http.HTTPError as exc:
            if not exc.transient or attempt == attempts:
                raise PublishError(exc.what, where=exc.where,
                                   hint=exc.hint or "fix the cause, then run the same command again to resume") from None
            log.warning("publish %s: %s; starting over from the listing (attempt %d of %d)", tag, exc.what, attempt + 1,
                        attempts)
            time.sleep(pause * attempt)
    raise AssertionError("unreachable")


def _publish_once(client: GitHubReleases, tag: str, files: Sequence[Path], local: Mapping[str, str], *, title: str,
                  notes: str, target: str | None, report: Report) -> Report:
    release = client.find(tag)
    if release is None:
        release = client.create(tag, title=title, notes=notes, target=target)
        report.created = True
    else:
        problem = _target_problem(release, tag, target)
        if problem:
            raise PublishError(problem, hint="delete that draft on GitHub, or release this commit under the next tag "
                                             "(--tag); a release never moves to another commit")
        report.resumed = report.resumed or (bool(release.get("draft")) and not report.created)
    present = {a["name"]: a for a in client.assets(release)}
    # refuse before uploading anything when an uploaded asset has other bytes
    for name, digest in local.items():
        asset = present.get(name)
        if asset and asset.get("state", "uploaded") == "uploaded" and client.asset_sha256(asset) != digest:
            raise PublishError(f"release {tag} already has {name} with other bytes (local sha256 {digest})",
                               hint="a published asset is never replaced: respin with the next tag instead")
    for path in files:
        asset = present.get(path.name)
        if asset and asset.get("state", "uploaded") == "uploaded":
            if path.name not in report.uploaded and path.name not in report.skipped:
                report.skipped.append(path.name)
            continue
        if asset:  # a half-done upload from an interrupted run
            client.delete_asset(asset)
        log.info("upload %s", path.name)
        got = client.upload(release, path)
        digest = (got or {}).get("digest") or ""
        if digest.startswith("sha256:") and digest.removeprefix("sha256:") != local[path.name]:
            client.delete_asset(got)
            raise PublishError(f"GitHub holds other bytes for {path.name} than were uploaded ({digest})",
                               hint="the upload was damaged on the way; run the same command again")
        report.uploaded.append(path.name)
    if release.get("draft", True):
        _verify(client, release, tag, local, {p.name: p.stat().st_size for p in files})
        release = client.publish(release, title=title, notes=notes)
        report.published = True
    report.release_url = release.get("html_url", "")
    return report


def _verify(client: GitHubReleases, release: dict, tag: str, local: Mapping[str, str], sizes: Mapping[str, int]) -> None:
    """Every file once, uploaded, with the local size and (where GitHub gives a digest) sha256, before the draft goes
    public. Nothing is downloaded here: an asset without a digest is checked by size."""
    assets = client.assets(release)
    names = [a["name"] for a in assets]
    problems = [f"{n} is missing" for n in local if n not in names]
    problems += [f"{n} is there {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    for a in assets:
        name, digest = a["name"], a.get("digest") or ""
        if a.get("state", "uploaded") != "uploaded":
            problems.append(f"{name} is {a.get('state')}")
        elif name in local and (a.get("size", sizes[name]) != sizes[name]
                                or (digest.startswith("sha256:") and digest.removeprefix("sha256:") != local[name])):
            problems.append(f"{name} has other bytes")
    if problems:
        raise PublishError(f"draft {tag} is not complete: {'; '.join(problems)}", hint="run the same command again")
