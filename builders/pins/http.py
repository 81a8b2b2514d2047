"""The only HTTP the pin bot does: one small GitHub REST client and one Hugging Face client (requests).

Base URLs are configurable (ONEBIT_GITHUB_API, ONEBIT_HF_ENDPOINT) so tests point them at a local server.
Every failure becomes an OnebitError naming the URL; a reply of the wrong shape is reported as malformed.
"""
from __future__ import annotations

import base64
import hashlib
import os
from typing import Any
from urllib.parse import quote

import requests

from ..errors import OnebitError
from . import secrets

GITHUB_API = "https://api.github.com"
HF_ENDPOINT = "https://huggingface.co"
TIMEOUT = 30


def bot_token(env: dict | None = None) -> str | None:
    env = os.environ if env is None else env
    return env.get("ONEBIT_BOT_TOKEN") or env.get("GITHUB_TOKEN") or None


class _Client:
    service = "HTTP"

    def __init__(self, base: str, token: str | None = None, session: requests.Session | None = None):
        self.base = base.rstrip("/")
        self.token = token
        secrets.register(token)
        self.session = session or requests.Session()

    def _headers(self) -> dict[str, str]:
        return {}

    def request(self, method: str, path: str, *, params: dict | None = None, json: Any = None, ok404: bool = False,
                raw: bool = False) -> Any:
        url = path if path.startswith(("http://", "https://")) else f"{self.base}{path}"
        try:
            resp = self.session.request(method, url, params=params, json=secrets.redact_data(json), headers=self._headers(),
                                        timeout=TIMEOUT)
        except requests.RequestException as exc:
            raise OnebitError(f"cannot reach the {self.service} API: {type(exc).__name__}", where=url,
                              hint="check the network (and the base URL setting); nothing was changed") from None
        if ok404 and resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message") or resp.json().get("error") or resp.text[:200]
            except ValueError:
                message = resp.text[:200]
            hint = None
            if resp.status_code in (401, 403):
                hint = "the token is missing, expired or lacks permission (contents: write, pull-requests: write)"
            raise OnebitError(f"{self.service} API said {resp.status_code}: {secrets.redact(str(message))}", where=f"{method} {url}",
                              hint=hint)
        if raw:
            return resp.content
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise OnebitError(f"malformed reply from the {self.service} API (not JSON)", where=f"{method} {url}") from None


def field(reply: Any, key: str, kind: type | tuple, where: str) -> Any:
    """reply[key] checked for type; a wrong shape is a clear error instead of a KeyError deep inside."""
    if not isinstance(reply, dict) or not isinstance(reply.get(key), kind):
        raise OnebitError(f"malformed API reply: expected {key!r} ({getattr(kind, '__name__', kind)}) in {str(reply)[:120]!r}", where=where)
    return reply[key]


class GitHub(_Client):
    """GitHub REST, at ONEBIT_GITHUB_API (default the public API), with the bot token when there is one."""

    service = "GitHub"

    @classmethod
    def from_env(cls, env: dict | None = None) -> "GitHub":
        env = os.environ if env is None else env
        return cls(env.get("ONEBIT_GITHUB_API") or GITHUB_API, bot_token(env))

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "onebit-pins"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def need_token(self) -> None:
        if not self.token:
            raise OnebitError("opening a pull request needs a token, and none is set",
                              hint="set ONEBIT_BOT_TOKEN (a token whose PRs trigger CI) or GITHUB_TOKEN")

    def latest_release(self, slug: str) -> dict:
        where = f"{self.base}/repos/{slug}/releases/latest"
        rel = self.request("GET", f"/repos/{slug}/releases/latest")
        field(rel, "tag_name", str, where)
        return {"tag": rel["tag_name"], "body": rel.get("body") or "", "url": rel.get("html_url") or "", "name": rel.get("name") or ""}

    def contents(self, slug: str, path: str, ref: str | None) -> dict:
        """{'type': 'file', 'text': ...} or {'type': 'submodule', 'sha': ...} for a path of a repository."""
        where = f"{self.base}/repos/{slug}/contents/{path}"
        reply = self.request("GET", f"/repos/{slug}/contents/{quote(path)}", params={"ref": ref} if ref else None)
        kind = field(reply, "type", str, where)
        if kind == "submodule":
            return {"type": "submodule", "sha": field(reply, "sha", str, where)}
        if kind == "file":
            content = field(reply, "content", str, where)
            try:
                text = base64.b64decode(content).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                raise OnebitError("malformed API reply: file content is not base64 UTF-8", where=where) from None
            return {"type": "file", "text": text}
        raise OnebitError(f"malformed API reply: {path} is a {kind}, expected a file or a submodule", where=where)

    def pulls(self, slug: str, *, state: str = "open", head: str | None = None) -> list[dict]:
        out: list[dict] = []
        for page in range(1, 11):
            params = {"state": state, "per_page": 100, "page": page}
            if head:
                params["head"] = head
            reply = self.request("GET", f"/repos/{slug}/pulls", params=params)
            if not isinstance(reply, list) or not all(isinstance(p, dict) and isinstance(p.get("number"), int) for p in reply):
                raise OnebitError("malformed API reply: expected a list of pull requests", where=f"{self.base}/repos/{slug}/pulls")
            out += reply
            if len(reply) < 100:
                break
        return out

    def create_pull(self, slug: str, *, title: str, head: str, base: str, body: str) -> dict:
        reply = self.request("POST", f"/repos/{slug}/pulls", json={"title": title, "head": head, "base": base, "body": body,
                                                                  "maintainer_can_modify": True})
        field(reply, "number", int, f"{self.base}/repos/{slug}/pulls")
        return reply

    def add_labels(self, slug: str, number: int, labels: list[str]) -> None:
        self.request("POST", f"/repos/{slug}/issues/{number}/labels", json={"labels": labels})

    def comment(self, slug: str, number: int, body: str) -> None:
        self.request("POST", f"/repos/{slug}/issues/{number}/comments", json={"body": body})

    def close_pull(self, slug: str, number: int) -> None:
        self.request("PATCH", f"/repos/{slug}/pulls/{number}", json={"state": "closed"})


class HuggingFace(_Client):
    """The Hugging Face Hub API at ONEBIT_HF_ENDPOINT: a model repo's current revision and its files' sha256."""

    service = "Hugging Face"

    @classmethod
    def from_env(cls, env: dict | None = None) -> "HuggingFace":
        env = os.environ if env is None else env
        return cls(env.get("ONEBIT_HF_ENDPOINT") or HF_ENDPOINT, env.get("HF_TOKEN") or None)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def revision(self, repo: str, branch: str = "main") -> str:
        where = f"{self.base}/api/models/{repo}/revision/{branch}"
        sha = field(self.request("GET", f"/api/models/{repo}/revision/{quote(branch, safe='')}"), "sha", str, where)
        if len(sha) != 40:
            raise OnebitError(f"malformed API reply: revision {sha!r} is not a 40-hex commit", where=where)
        return sha

    def file_hashes(self, repo: str, revision: str, files: list[str]) -> dict[str, str]:
        """sha256 of each file at `revision`: the LFS oid where the file is in LFS, else hashed from a download."""
        where = f"{self.base}/api/models/{repo}/tree/{revision}"
        tree = self.request("GET", f"/api/models/{repo}/tree/{revision}", params={"recursive": "true"})
        if not isinstance(tree, list):
            raise OnebitError("malformed API reply: expected a list of files", where=where)
        entries = {e.get("path"): e for e in tree if isinstance(e, dict)}
        out: dict[str, str] = {}
        for name in files:
            entry = entries.get(name)
            if entry is None:
                raise OnebitError(f"{repo} at {revision[:12]} has no file {name!r}", where=where,
                                  hint="the checkpoint layout changed; update companions.huggingface.files by hand")
            lfs = entry.get("lfs")
            if isinstance(lfs, dict) and isinstance(lfs.get("oid"), str) and len(lfs["oid"]) == 64:
                out[name] = lfs["oid"]
            else:
                data = self.request("GET", f"/{repo}/resolve/{revision}/{quote(name)}", raw=True)
                out[name] = hashlib.sha256(data).hexdigest()
        return out
