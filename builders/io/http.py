"""The one HTTP mechanism of the project: a requests session whose retries are urllib3's `Retry`, and a small client on it.

Every HTTP request the build side, the pin bot and the release make goes through `make_session()` (the GitHub REST API,
the Hugging Face Hub, release asset uploads, companion downloads). What is retried, and how long it may take:

- a 5xx answer (500, 502, 503, 504) to an idempotent request (GET, HEAD, OPTIONS, PUT, DELETE, and PATCH: every PATCH
  this project sends sets fields to values). A POST is not repeated blindly: it may have been done; the caller
  reconciles instead (the release publisher lists what is there and resumes);
- a rate-limit answer to any request, the request having been refused, not done: 429, or 403 with `Retry-After` or
  with `x-ratelimit-remaining: 0` (GitHub's secondary and primary limits). A plain 403 (no permission) is not retried;
- a connection that could not be opened (any request), and one that broke after the request was sent (idempotent only);
  but not a host that cannot be reached at all (`unreachable`: its name does not resolve, it refuses the connection,
  no route leads to it): offline, or a wrong URL, the same answer comes back however long we wait, so the command
  fails at once instead of backing off for half a minute per endpoint;
- waits: `Retry-After` when the server sends it, else until `x-ratelimit-reset`, else exponential backoff (0, 2, 4, 8,
  16 s); one wait longer than `max_wait`, or waits adding up past `budget`, are not waited: the answer is given back
  as it is and the caller's error says when to run again. At most `total` retries.

Each wait is logged (logger `builders.io.http`), so a slow run says why it paused.
"""
from __future__ import annotations

import datetime as dt
import errno
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.exceptions import MaxRetryError, NameResolutionError, NewConnectionError, ResponseError

from ..errors import OnebitError

log = logging.getLogger("builders.io.http")

TIMEOUT = (15, 120)  # connect, read (seconds)
TRANSIENT = frozenset({500, 502, 503, 504})
RATE_LIMIT = frozenset({403, 429})
USER_AGENT = "onebit-build"


def rate_limited(status: int, headers: Mapping[str, str]) -> bool:
    """Pure: whether an answer is a rate limit (the request was refused, so repeating it is safe)."""
    if status == 429:
        return True
    return status == 403 and ("retry-after" in {k.lower() for k in headers} or _header(headers, "x-ratelimit-remaining") == "0")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    get = getattr(headers, "get", None)
    value = get(name) if get else None  # requests' and urllib3's headers are case-insensitive
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def wait_hint(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Pure given `now`: the seconds a server asks a client to wait (Retry-After, or until x-ratelimit-reset when the
    limit is used up); None when it does not say."""
    retry_after = _header(headers, "retry-after")
    if retry_after is not None:
        try:
            return max(0.0, float(urllib3.util.Retry().parse_retry_after(retry_after)))
        except Exception:  # an unparseable header: fall back to backoff
            return None
    reset = _header(headers, "x-ratelimit-reset")
    if _header(headers, "x-ratelimit-remaining") == "0" and reset and reset.isdigit():
        return max(0.0, int(reset) - (time.time() if now is None else now) + 1)
    return None


_NO_ROUTE = (errno.ENETUNREACH, errno.EHOSTUNREACH)


def unreachable(error: BaseException | None) -> str | None:
    """Pure: why a connection could not be opened at all, where waiting would not change it (the name does not
    resolve, the host refuses, no route leads to it); None for any other error (a timeout, a broken connection)."""
    if isinstance(error, NameResolutionError):
        return "the host name does not resolve"
    if isinstance(error, NewConnectionError):
        cause = error.__cause__ or error.__context__
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused"
        if isinstance(cause, OSError) and cause.errno in _NO_ROUTE:
            return "no route to the host"
    return None


def _reason(exc: BaseException) -> str:
    """What a requests failure came from: `unreachable`'s words when they apply, else the exception's type."""
    seen: BaseException | None = exc
    for _ in range(5):  # requests' ConnectionError -> urllib3's MaxRetryError -> its reason
        if seen is None:
            break
        why = unreachable(seen)
        if why:
            return f"{type(exc).__name__} ({why})"
        seen = getattr(seen, "reason", None) or (seen.args[0] if seen.args and isinstance(seen.args[0], BaseException)
                                                 else None)
    return type(exc).__name__


class Retry(urllib3.util.Retry):
    """urllib3's Retry with the policy above (see the module docstring)."""

    IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"})

    def __init__(self, total: int = 5, *, max_wait: float = 300, budget: float = 900, started: float | None = None,
                 **kw: Any):
        kw.setdefault("allowed_methods", self.IDEMPOTENT)
        kw.setdefault("status_forcelist", TRANSIENT)
        kw.setdefault("backoff_factor", 1.0)
        kw.setdefault("backoff_max", 30)
        kw.setdefault("raise_on_status", False)  # the last answer goes back to the caller, who names it
        super().__init__(total=total, **kw)
        self.max_wait, self.budget, self.started = max_wait, budget, started

    def new(self, **kw: Any) -> Retry:
        kw.setdefault("max_wait", self.max_wait)
        kw.setdefault("budget", self.budget)
        kw.setdefault("started", self.started if self.started is not None else time.monotonic())
        return super().new(**kw)

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if status_code in RATE_LIMIT:
            return bool(self.total)  # decided on the answer's headers in increment()
        return super().is_retry(method, status_code, has_retry_after)

    def _wait(self, response) -> tuple[float, str]:
        hint = wait_hint(response.headers) if response is not None else None
        if hint is not None:
            return hint, "as the server asked"
        return self.get_backoff_time(), "backoff"

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None) -> Retry:
        if response is not None and response.status in RATE_LIMIT and not rate_limited(response.status, response.headers):
            raise MaxRetryError(_pool, url, ResponseError(f"HTTP {response.status}"))  # not a rate limit: hand it back
        if unreachable(error):  # offline or a wrong URL: no wait changes it
            raise MaxRetryError(_pool, url, error)
        new = super().increment(method, url, response, error, _pool, _stacktrace)
        wait, why = new._wait(response)
        spent = time.monotonic() - new.started
        if wait > self.max_wait or spent + wait > self.budget:
            log.warning("%s %s: not waiting %.0f s more (%s); giving up after %.0f s", method, url, wait, why, spent)
            raise MaxRetryError(_pool, url, error or ResponseError(f"HTTP {getattr(response, 'status', '?')}"))
        what = f"HTTP {response.status}" if response is not None else type(error).__name__
        log.warning("%s %s: %s; retrying in %.1f s (%s)", method, url, what, wait, why)
        return new

    def sleep(self, response=None) -> None:
        wait, _ = self._wait(response)
        if wait > 0:
            time.sleep(wait)


def make_session(retry: Retry | None = None, *, user_agent: str = USER_AGENT) -> requests.Session:
    """A requests session that retries by `retry` (default `Retry()`) on http and https."""
    s = requests.Session()
    adapter = HTTPAdapter(max_retries=retry or Retry())
    s.mount("https://", adapter)
    s.mount("http://", adapter)
    s.headers["User-Agent"] = user_agent
    return s


class HTTPError(OnebitError):
    """A request that failed for good (after the retries): `status` is the answer's code, None when there was none."""

    def __init__(self, what: str, *, status: int | None = None, where: str | None = None, hint: str | None = None):
        super().__init__(what, where=where, hint=hint)
        self.status = status

    @property
    def transient(self) -> bool:
        """Worth running again later: no answer at all, a server error or a rate limit."""
        return (self.status is None or self.status in TRANSIENT or self.status == 429
                or (self.status == 403 and "rate limit" in self.what))


def next_link(resp: requests.Response) -> str | None:
    """The URL of the next page (RFC 8288 `Link: <...>; rel="next"`), as GitHub and the Hugging Face Hub paginate."""
    return (resp.links.get("next") or {}).get("url")


MAX_PAGES = 200  # pages of one listing followed at most (20,000 items at GitHub's 100 a page)
MAX_ITEMS = 20_000  # items of one listing


class Client:
    """JSON over the shared session at one base URL, with a bearer token. Failures are `HTTPError`s naming the URL.

    The token goes only to `token_hosts()` (the base URL's host; GitHub adds its upload host): a URL an answer hands
    us (an upload URL, a next page) on another host gets no token, or is refused. A listing stops with a clear error
    past MAX_PAGES pages or MAX_ITEMS items, or when a page links back to one already read."""

    service = "HTTP"

    def __init__(self, base: str, token: str | None = None, *, session: requests.Session | None = None,
                 retry: Retry | None = None):
        self.base = base.rstrip("/")
        self.token = token
        self.session = session or make_session(retry)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.base}{path}"

    def token_hosts(self) -> set[str]:
        """Where the token may go: host[:port] of the base URL."""
        return {urlsplit(self.base).netloc.lower()}

    def may_send_token(self, url: str) -> bool:
        return urlsplit(url).netloc.lower() in self.token_hosts()

    def redact(self, text: str) -> str:
        return text.replace(self.token, "***") if self.token and len(self.token) >= 4 else text

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
                data: Any = None, headers: Mapping[str, str] | None = None, ok404: bool = False, stream: bool = False,
                timeout: Any = TIMEOUT) -> requests.Response | None:
        """One request; an answer >= 400 raises `HTTPError` (a 404 gives None with `ok404`)."""
        url = self.url(path)
        try:
            sent = {**self.headers(), **(headers or {})}
            if not self.may_send_token(url):  # an URL on a host the token is not for: sent without it
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
            resp = self.session.request(method, url, params=params, json=json, data=data, stream=stream, timeout=timeout,
                                        headers=sent)
        except requests.RequestException as exc:
            raise HTTPError(f"cannot reach the {self.service} API: {_reason(exc)}", where=f"{method} {url}",
                            hint="check the network (and the base URL setting), then run the same command again") from None
        if ok404 and resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise self.error(method, url, resp)
        return resp

    def error(self, method: str, url: str, resp: requests.Response) -> HTTPError:
        try:
            body = resp.json()
            message = (body.get("message") or body.get("error") or resp.text[:200]) if isinstance(body, dict) else resp.text[:200]
        except ValueError:
            message = resp.text[:200]
        status = resp.status_code
        hint = None
        wait = wait_hint(resp.headers)
        if rate_limited(status, resp.headers):
            when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=wait or 60)
            message = f"rate limit: {message}"
            hint = f"the {self.service} API asks to wait until {when:%H:%M} UTC; run the same command again then"
        elif status in (401, 403):
            hint = "the token is missing, expired or lacks permission"
        elif status in TRANSIENT:
            hint = "the server failed after the retries; run the same command again to resume"
        return HTTPError(f"{self.service} API answered HTTP {status}: {self.redact(str(message))}", status=status,
                         where=f"{method} {url}", hint=hint)

    def json(self, method: str, path: str, **kw: Any) -> Any:
        """The decoded JSON answer (None for 204 / an empty body, or a 404 with ok404)."""
        resp = self.request(method, path, **kw)
        if resp is None or resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise HTTPError(f"malformed reply from the {self.service} API (not JSON)", status=resp.status_code,
                            where=f"{method} {resp.url}") from None

    def pages(self, path: str, *, params: Mapping[str, Any] | None = None, key: str | None = None) -> Iterator[Any]:
        """Every item of a paginated listing, following `Link: rel="next"` (the next URL carries its own query).
        `key`: the list inside an object answer (GitHub's check-runs and statuses)."""
        url: str | None = self.url(path)
        query = dict(params or {})
        query.setdefault("per_page", 100)
        seen: set[str] = set()
        count = 0
        while url:
            if len(seen) >= MAX_PAGES:
                raise HTTPError(f"the {self.service} API kept paginating: more than {MAX_PAGES} pages; stopped",
                                where=f"GET {self.url(path)}", hint="nothing after the stop was read; report it if it is real")
            if urlsplit(url).netloc.lower() != urlsplit(self.base).netloc.lower():
                raise HTTPError(f"the {self.service} API's next page is on another host ({urlsplit(url).netloc}); not followed",
                                where=f"GET {self.url(path)}")
            if url in seen:
                raise HTTPError(f"the {self.service} API's pages link back to a page already read; stopped", where=f"GET {url}")
            seen.add(url)
            resp = self.request("GET", url, params=query)
            try:
                page = resp.json()
            except ValueError:
                raise HTTPError(f"malformed reply from the {self.service} API (not JSON)", where=f"GET {resp.url}") from None
            items = page.get(key) if key and isinstance(page, dict) else page
            if not isinstance(items, list):
                raise HTTPError(f"malformed reply from the {self.service} API: expected a list"
                                + (f" under {key!r}" if key else ""), where=f"GET {resp.url}")
            count += len(items)
            if count > MAX_ITEMS:
                raise HTTPError(f"the {self.service} API listed more than {MAX_ITEMS} items; stopped",
                                where=f"GET {self.url(path)}")
            yield from items
            url, query = next_link(resp), None

    def download(self, path: str, dest, *, headers: Mapping[str, str] | None = None, chunk: int = 1 << 20) -> int:
        """Stream an answer's body into `dest` (anything with write(bytes)); the bytes written."""
        resp = self.request("GET", path, stream=True, headers=headers)
        n = 0
        try:
            for block in resp.iter_content(chunk):
                dest.write(block)
                n += len(block)
        except requests.RequestException as exc:
            raise HTTPError(f"download from the {self.service} API broke off: {type(exc).__name__}",
                            where=f"GET {resp.url}", hint="run the same command again") from None
        return n
