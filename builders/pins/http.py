"""The pin bot's calls on the shared clients: GitHub (builders/io/github.py) and the Hugging Face Hub (builders/io/http.py).

Retries, rate limits, pagination and error messages are the shared client's; this module adds the bot's own calls,
the bot token (ONEBIT_BOT_TOKEN, else GITHUB_TOKEN), and keeps the token out of what it sends and reports (secrets.py).
Base URLs are configurable (ONEBIT_GITHUB_API, ONEBIT_HF_ENDPOINT) so tests point them at a local server.
A reply of the wrong shape is reported as malformed.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
from typing import Any
from urllib.parse import quote

from ..io import github, http
from ..errors import OnebitError
from . import secrets

HF_ENDPOINT = "https://huggingface.co"


def bot_token(env: dict | None = None) -> str | None:
    env = os.environ if env is None else env
    return env.get("ONEBIT_BOT_TOKEN") or env.get("GITHUB_TOKEN") or None


def field(reply: Any, key: str, kind: type | tuple, where: str) -> Any:
    """reply[key] checked for type; a wrong shape is a clear error instead of a KeyError deep inside."""
    if not isinstance(reply, dict) or not isinstance(reply.get(key), kind):
        raise OnebitError(f"malformed API reply: expected {key!r} ({getattr(kind, '__name__', kind)}) in {str(reply)[:120]!r}", where=where)
    return reply[key]


class _Redacting:
    """Registers the token as a secret; blanks every registered secret out of errors and of JSON bodies sent."""

    def _setup(self) -> None:
        secrets.register(self.token)

    def redact(self, text: str) -> str:
        return secrets.redact(text)

    def json(self, method: str, path: str, **kw: Any) -> Any:
        if kw.get("json") is not None:
            kw["json"] = secrets.redact_data(kw["json"])
        return super().json(method, path, **kw)


class GitHub(_Redacting, github.GitHub):
    """GitHub REST at ONEBIT_GITHUB_API (default the public API), with the bot token when there is one."""

    def __init__(self, base: str | None = None, token: str | None = None, **kw: Any):
        super().__init__(base, token, **kw)
        self._setup()

    @classmethod
    def from_env(cls, env: dict | None = None) -> GitHub:
        return super().from_env(env, token_vars=("ONEBIT_BOT_TOKEN", "GITHUB_TOKEN"))

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "User-Agent": "onebit-pins"}

    def need_token(self) -> None:
        if not self.token:
            raise OnebitError("opening a pull request needs a token, and none is set",
                              hint="set ONEBIT_BOT_TOKEN (a token whose PRs trigger CI) or GITHUB_TOKEN")

    def latest_release(self, slug: str) -> dict:
        where = f"{self.base}/repos/{slug}/releases/latest"
        rel = self.json("GET", f"/repos/{slug}/releases/latest")
        field(rel, "tag_name", str, where)
        return {"tag": rel["tag_name"], "body": rel.get("body") or "", "url": rel.get("html_url") or "", "name": rel.get("name") or ""}

    def contents(self, slug: str, path: str, ref: str | None) -> dict:
        """{'type': 'file', 'text': ...} or {'type': 'submodule', 'sha': ...} for a path of a repository."""
        where = f"{self.base}/repos/{slug}/contents/{path}"
        reply = self.json("GET", f"/repos/{slug}/contents/{quote(path)}", params={"ref": ref} if ref else None)
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

    def create_pull(self, slug: str, *, title: str, head: str, base: str, body: str) -> dict:
        reply = self.json("POST", f"/repos/{slug}/pulls", json={"title": title, "head": head, "base": base, "body": body,
                                                               "maintainer_can_modify": True})
        field(reply, "number", int, f"{self.base}/repos/{slug}/pulls")
        return reply

    def add_labels(self, slug: str, number: int, labels: list[str]) -> None:
        self.json("POST", f"/repos/{slug}/issues/{number}/labels", json={"labels": labels})

    def comment(self, slug: str, number: int, body: str) -> None:
        self.json("POST", f"/repos/{slug}/issues/{number}/comments", json={"body": body})

    def close_pull(self, slug: str, number: int) -> None:
        self.json("PATCH", f"/repos/{slug}/pulls/{number}", json={"state": "closed"})


class HuggingFace(_Redacting, http.Client):
    """The Hugging Face Hub API at ONEBIT_HF_ENDPOINT: a model repo's current revision and its files' sha256."""

    service = "Hugging Face"

    def __init__(self, base: str, token: str | None = None, **kw: Any):
        super().__init__(base, token, **kw)
        self._setup()

    @classmethod
    def from_env(cls, env: dict | None = None) -> HuggingFace:
        env = os.environ if env is None else env
        return cls(env.get("ONEBIT_HF_ENDPOINT") or HF_ENDPOINT, env.get("HF_TOKEN") or None)

    def revision(self, repo: str, branch: str = "main") -> str:
        where = f"{self.base}/api/models/{repo}/revision/{branch}"
        sha = field(self.json("GET", f"/api/models/{repo}/revision/{quote(branch, safe='')}"), "sha", str, where)
        if len(sha) != 40:
            raise OnebitError(f"malformed API reply: revision {sha!r} is not a 40-hex commit", where=where)
        return sha

    def file_hashes(self, repo: str, revision: str, files: list[str]) -> dict[str, str]:
        """sha256 of each file at `revision`: the LFS oid where the file is in LFS, else hashed from a download."""
        where = f"{self.base}/api/models/{repo}/tree/{revision}"
        tree = list(self.pages(f"/api/models/{repo}/tree/{revision}", params={"recursive": "true"}))
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
                buf = io.BytesIO()
                self.download(f"/{repo}/resolve/{revision}/{quote(name)}", buf)
                out[name] = hashlib.sha256(buf.getvalue()).hexdigest()
        return out
