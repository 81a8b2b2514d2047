"""The one GitHub REST client (on builders/io/http.py's session: retries, rate limits, Link pagination), shared by the pin bot
(builders/pins/http.py), the release publisher (builders/release/publish.py) and the bump merge (builders/release/bumps.py).

The API base is $ONEBIT_GITHUB_API (default the public API; tests point it at a server on 127.0.0.1). Only the calls
more than one user needs, or that read like the API itself, live here; each user keeps its own flow.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from . import http

GITHUB_API = "https://api.github.com"
UPLOADS = "uploads.github.com"
JOB_URL = re.compile(r"/actions/runs/\d+/job(?:s)?/(\d+)")


class GitHub(http.Client):
    service = "GitHub"

    def __init__(self, base: str | None = None, token: str | None = None, **kw: Any):
        super().__init__(base or GITHUB_API, token, **kw)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, token_vars: Sequence[str] = ("GITHUB_TOKEN",),
                 **kw: Any) -> GitHub:
        env = os.environ if env is None else env
        token = next((env[v] for v in token_vars if env.get(v)), None)
        return cls(env.get("ONEBIT_GITHUB_API") or env.get("GITHUB_API_URL") or GITHUB_API, token, **kw)

    def token_hosts(self) -> set[str]:
        """The API's host and GitHub's upload host: uploads.github.com for the public API; a GitHub Enterprise
        Server serves uploads (/api/uploads) on its API's own host."""
        host = urlsplit(self.base).netloc.lower()
        return {host, UPLOADS} if host == urlsplit(GITHUB_API).netloc else {host}

    def headers(self) -> dict[str, str]:
        return {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28", **super().headers()}

    # ---- pull requests (the bot proposes bumps; the release merges them)
    def pulls(self, slug: str, *, state: str = "open", head: str | None = None, base: str | None = None) -> list[dict]:
        params = {"state": state, **({"head": head} if head else {}), **({"base": base} if base else {})}
        out = list(self.pages(f"/repos/{slug}/pulls", params=params))
        if not all(isinstance(p, dict) and isinstance(p.get("number"), int) for p in out):
            raise http.HTTPError("malformed API reply: expected a list of pull requests", where=f"{self.base}/repos/{slug}/pulls")
        return out

    # ---- what CI said about a commit
    def check_runs(self, slug: str, sha: str) -> list[dict]:
        """Every check run on a commit (GitHub Actions jobs among them), across pages."""
        return list(self.pages(f"/repos/{slug}/commits/{sha}/check-runs", key="check_runs"))

    def statuses(self, slug: str, sha: str) -> list[dict]:
        """The latest commit status of each context on a commit (the combined status), across pages."""
        return list(self.pages(f"/repos/{slug}/commits/{sha}/status", key="statuses"))

    def set_status(self, slug: str, sha: str, *, state: str, context: str, description: str = "",
                   target_url: str | None = None) -> dict:
        body = {"state": state, "context": context, "description": description[:140]}
        if target_url:
            body["target_url"] = target_url
        return self.json("POST", f"/repos/{slug}/statuses/{sha}", json=body)

    def actions_job(self, slug: str, check_run: Mapping[str, Any]) -> int | None:
        """The Actions job id behind a check run (from its details URL), None for checks of other apps."""
        m = JOB_URL.search(str(check_run.get("details_url") or check_run.get("html_url") or ""))
        return int(m[1]) if m else None

    def job(self, slug: str, job_id: int) -> dict:
        return self.json("GET", f"/repos/{slug}/actions/jobs/{job_id}")

    def job_log(self, slug: str, job_id: int) -> str:
        """A job's plain-text log (the API answers with a redirect to it, which requests follows)."""
        resp = self.request("GET", f"/repos/{slug}/actions/jobs/{job_id}/logs")
        return resp.content.decode("utf-8", errors="replace")
