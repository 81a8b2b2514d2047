"""Fixtures for the pin bot tests: real git repositories on disk and a fake GitHub / Hugging Face API served over
real HTTP on 127.0.0.1 that records what the bot asks for (and the PRs it opens)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlparse

from http_fixtures import QuietHandler

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise AssertionError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr}")
    return proc.stdout.strip()


class Upstream:
    """A real repository with a working tree that plays an upstream (served through file://)."""

    def __init__(self, path: Path, branch: str = "main"):
        self.path = path
        self.branch = branch
        path.mkdir(parents=True)
        git(path, "init", "--quiet", "-b", branch)
        git(path, "config", "uploadpack.allowFilter", "true")
        git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
        git(path, "config", "receive.denyCurrentBranch", "ignore")

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def commit(self, message: str, files: dict[str, str] | None = None) -> str:
        for name, text in (files or {message.replace(" ", "_") + ".txt": message}).items():
            f = self.path / name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
            git(self.path, "add", name)
        git(self.path, "commit", "--quiet", "-m", message)
        return self.head()

    def head(self, ref: str = "HEAD") -> str:
        return git(self.path, "rev-parse", ref)

    def tag(self, name: str, ref: str = "HEAD", annotated: bool = False) -> str:
        git(self.path, "tag", *(["-a", "-m", name] if annotated else []), name, ref)
        return self.head(f"{name}^{{commit}}")

    def reset_hard(self, ref: str) -> None:
        git(self.path, "reset", "--quiet", "--hard", ref)


class Bare:
    """A bare repository (our fork, or this project's origin), which the bot pushes to."""

    def __init__(self, path: Path):
        self.path = path
        git(path.parent, "init", "--quiet", "--bare", str(path))
        git(path, "config", "uploadpack.allowFilter", "true")
        git(path, "config", "uploadpack.allowAnySHA1InWant", "true")

    @property
    def url(self) -> str:
        return self.path.as_uri()

    def ref(self, ref: str) -> str | None:
        proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", ref], cwd=self.path, capture_output=True, text=True)
        return proc.stdout.strip() or None

    def show(self, ref: str, path: str) -> str:
        return git(self.path, "show", f"{ref}:{path}") + "\n"


def make_fork(tmp: Path, upstream: Upstream, name: str, branch: str, our_files: dict[str, str]) -> tuple[Bare, str]:
    """A fork of `upstream` carrying one commit of ours on `branch`; returns (fork, our tip)."""
    fork = Bare(tmp / f"{name}.git")
    work = tmp / f"{name}-work"
    git(tmp, "clone", "--quiet", upstream.url, str(work))
    git(work, "checkout", "--quiet", "-b", branch)
    for fname, text in our_files.items():
        (work / fname).write_text(text)
        git(work, "add", fname)
    git(work, "commit", "--quiet", "-m", "our change")
    tip = git(work, "rev-parse", "HEAD")
    git(work, "push", "--quiet", fork.url, f"{branch}:refs/heads/{branch}")
    return fork, tip


# --------------------------------------------------------------------------------------------------- fake API


@dataclass
class FakeState:
    releases: dict = field(default_factory=dict)  # slug -> reply
    contents: dict = field(default_factory=dict)  # (slug, path) -> reply
    pulls: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # number -> [names]
    comments: list = field(default_factory=list)
    hf_revisions: dict = field(default_factory=dict)  # repo -> sha
    hf_trees: dict = field(default_factory=dict)  # (repo, rev) -> list
    hf_files: dict = field(default_factory=dict)  # (repo, rev, path) -> bytes
    raw: dict = field(default_factory=dict)  # path -> (status, body text) overrides
    requests: list = field(default_factory=list)  # (method, path, body)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def opened(self) -> list[dict]:
        return [p for p in self.pulls if p.get("_created")]


class _Handler(QuietHandler):
    state: FakeState

    @property
    def server_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _send(self, status: int, payload=None, raw: bytes | None = None, headers: dict | None = None):
        data = raw if raw is not None else json.dumps(payload).encode()
        self.answer(status, data, {"Content-Type": "application/json" if raw is None else "application/octet-stream",
                                   **(headers or {})})

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"null") if n else None

    def _route(self, method: str):
        st = self.state
        url = urlparse(self.path)
        path, q = unquote(url.path), {k: v[0] for k, v in parse_qs(url.query).items()}
        body = self._body() if method in ("POST", "PATCH") else None
        with st.lock:
            st.requests.append((method, self.path, body, self.headers.get("Authorization")))
            if path in st.raw:
                status, text = st.raw[path]
                return self._send(status, raw=text.encode())
            m = re.fullmatch(r"/repos/([^/]+/[^/]+)/releases/latest", path)
            if m:
                rel = st.releases.get(m.group(1))
                return self._send(200, rel) if rel else self._send(404, {"message": "Not Found"})
            m = re.fullmatch(r"/repos/([^/]+/[^/]+)/contents/(.+)", path)
            if m:
                reply = st.contents.get((m.group(1), m.group(2)))
                return self._send(200, reply) if reply else self._send(404, {"message": "Not Found"})
            m = re.fullmatch(r"/repos/([^/]+/[^/]+)/pulls", path)
            if m and method == "GET":
                out = [p for p in st.pulls if q.get("state", "open") in ("all", p["state"])]
                if "head" in q:
                    out = [p for p in out if f"{p['_owner']}:{p['head']['ref']}" == q["head"]]
                page, per = int(q.get("page", 1)), int(q.get("per_page", 30))
                more = len(out) > page * per  # GitHub paginates with a Link header
                link = {"Link": f'<{self.server_url}{url.path}?{urlencode({**q, "page": page + 1})}>; rel="next"'} if more else {}
                return self._send(200, [{k: v for k, v in p.items()} for p in out[(page - 1) * per: page * per]], headers=link)
            if m and method == "POST":
                if not (self.headers.get("Authorization") or "").startswith("Bearer "):
                    return self._send(401, {"message": "Requires authentication"})
                n = len(st.pulls) + 1
                pr = {"number": n, "state": "open", "title": body["title"], "body": body["body"], "base": {"ref": body["base"]},
                      "head": {"ref": body["head"]}, "html_url": f"http://fake/pull/{n}", "_owner": m.group(1).split("/")[0],
                      "_created": True}
                st.pulls.append(pr)
                return self._send(201, pr)
            m = re.fullmatch(r"/repos/([^/]+/[^/]+)/pulls/(\d+)", path)
            if m and method == "PATCH":
                pr = st.pulls[int(m.group(2)) - 1]
                pr.update({k: v for k, v in body.items() if k == "state"})
                return self._send(200, pr)
            m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/(\d+)/labels", path)
            if m:
                st.labels.setdefault(int(m.group(2)), []).extend(body["labels"])
                return self._send(200, [{"name": x} for x in body["labels"]])
            m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/(\d+)/comments", path)
            if m:
                st.comments.append((int(m.group(2)), body["body"]))
                return self._send(201, {"id": len(st.comments)})
            m = re.fullmatch(r"/api/models/(.+)/revision/([^/]+)", path)
            if m:
                sha = st.hf_revisions.get(m.group(1))
                return self._send(200, {"id": m.group(1), "sha": sha}) if sha else self._send(404, {"error": "not found"})
            m = re.fullmatch(r"/api/models/(.+)/tree/([0-9a-f]{40})", path)
            if m:
                tree = st.hf_trees.get((m.group(1), m.group(2)))
                return self._send(200, tree) if tree is not None else self._send(404, {"error": "not found"})
            m = re.fullmatch(r"/(.+)/resolve/([0-9a-f]{40})/(.+)", path)
            if m:
                data = st.hf_files.get((m.group(1), m.group(2), m.group(3)))
                return self._send(200, raw=data) if data is not None else self._send(404, {"error": "not found"})
            return self._send(404, {"message": f"fake API has no route {method} {path}"})

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_PATCH(self):
        self._route("PATCH")


class FakeAPI:
    def __init__(self):
        self.state = FakeState()
        handler = type("H", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # helpers to set up replies
    def release(self, slug: str, tag: str, body: str = "notes") -> None:
        self.state.releases[slug] = {"tag_name": tag, "body": body, "html_url": f"http://fake/{slug}/releases/{tag}", "name": tag}

    def file(self, slug: str, path: str, text: str) -> None:
        self.state.contents[(slug, path)] = {"type": "file", "encoding": "base64", "content": base64.b64encode(text.encode()).decode()}

    def submodule(self, slug: str, path: str, sha: str) -> None:
        self.state.contents[(slug, path)] = {"type": "submodule", "sha": sha, "submodule_git_url": "x"}

    def hf_model(self, repo: str, rev: str, files: dict[str, bytes], lfs: set[str] = frozenset()) -> dict[str, str]:
        self.state.hf_revisions[repo] = rev
        tree = []
        for name, data in files.items():
            entry = {"type": "file", "path": name, "oid": hashlib.sha1(data).hexdigest(), "size": len(data)}
            if name in lfs:
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data)}
            tree.append(entry)
            self.state.hf_files[(repo, rev, name)] = data
        self.state.hf_trees[(repo, rev)] = tree
        return {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}


# --------------------------------------------------------------------------------------------------- project


HEADER = """\
# test pins: comments must survive a bump
schema_version: 1
pins:
"""


class Project:
    """A project root (pins.yaml, recipes/) that is a git repository with a bare origin."""

    def __init__(self, tmp: Path, pins_body: str, recipes: dict[str, str] | None = None, patches: dict[str, str] | None = None):
        self.root = tmp / "project"
        self.root.mkdir()
        self.origin = Bare(tmp / "origin.git")
        (self.root / "pins.yaml").write_text(HEADER + textwrap.indent(textwrap.dedent(pins_body).strip("\n") + "\n", "  "))
        (self.root / "recipes").mkdir()
        for name, text in (recipes or {}).items():
            (self.root / "recipes" / f"{name}.yaml").write_text(textwrap.dedent(text))
        for rel, text in (patches or {}).items():
            p = self.root / "recipes" / "patches" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        git(self.root, "init", "--quiet", "-b", "main")
        git(self.root, "add", ".")
        git(self.root, "commit", "--quiet", "-m", "init")
        git(self.root, "remote", "add", "origin", self.origin.url)
        git(self.root, "push", "--quiet", "origin", "main")

    @property
    def pins_path(self) -> Path:
        return self.root / "pins.yaml"

    def text(self) -> str:
        return self.pins_path.read_text()

    def commit_all(self, message: str) -> str:
        git(self.root, "add", ".")
        git(self.root, "commit", "--quiet", "-m", message)
        return git(self.root, "rev-parse", "HEAD")


# ---- the bot's command line against a Project (roots and toolchain inputs) -----------------------------------------
def bump(proj: Project, *argv: str) -> int:
    """`1bit-build pins bump ARGV` in the project, in this process."""
    from builders.pins.__main__ import main

    return main(["--root", str(proj.root), "bump", *argv])


def branches(proj: Project) -> list[str]:
    """The branches of the project's origin."""
    out = git(proj.origin.path, "for-each-ref", "--format=%(refname)", "refs/heads/")
    return [r.removeprefix("refs/heads/") for r in out.split()]


def evaluate_report(proj: Project, out: Path, monkeypatch, token: str, report: str, *names: str) -> dict:
    """The evaluating job: `pins bump NAMES --report OUT` with no token in the environment; the report file `report`
    it wrote, as JSON."""
    monkeypatch.delenv("ONEBIT_BOT_TOKEN")
    try:
        assert bump(proj, *names, "--report", str(out)) == 0
    finally:
        monkeypatch.setenv("ONEBIT_BOT_TOKEN", token)
    return json.loads((out / report).read_text())


def bot_env(monkeypatch, api: FakeAPI, token: str, *, archive: Path) -> None:
    """The bot's environment in a test: the fake GitHub (and Hugging Face) at `api`, the token, the Debian archive
    at `archive` as the only mirror; none of a CI runner's variables, no snapshot archive."""
    from builders.roots import debs
    from builders.roots.assemble import SNAPSHOT_ENV

    monkeypatch.setenv("ONEBIT_GITHUB_API", api.url)
    monkeypatch.setenv("ONEBIT_HF_ENDPOINT", api.url)
    monkeypatch.setenv("ONEBIT_BOT_TOKEN", token)
    for var in ("GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_REF_NAME", "GITHUB_EVENT_PATH", "GITHUB_STEP_SUMMARY",
                "ONEBIT_PINS_REMOTE", "ONEBIT_PINS_BASE", "HF_TOKEN", SNAPSHOT_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(debs.MIRROR_ENV, archive.as_uri())


def nothing_pushed(proj: Project, api: FakeAPI) -> None:
    """No PR opened, no branch pushed, no request but a GET sent to GitHub."""
    assert not api.state.opened() and branches(proj) == ["main"]
    assert not [r for r in api.state.requests if r[0] != "GET"]


def refused_tampered(proj: Project, api: FakeAPI, capsys, report: Path, says: str, *names: str) -> None:
    """The token holder, in this process: `pins bump NAMES --from-report DIR --open-pr` refuses the tampered `report`
    (in DIR) in one line that starts by naming it and says `says`, and pushes nothing."""
    capsys.readouterr()
    assert bump(proj, *names, "--from-report", str(report.parent), "--open-pr") == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith(f"error: {report.name}") and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    nothing_pushed(proj, api)


# ---- a report file that is not a plain file: read back by the token holder as its own, limited process ------------------
TOP = Path(__file__).resolve().parent.parent
CHILD_MEMORY = 2 << 30  # RLIMIT_AS of the child: a reader that held a whole /dev/zero would die with MemoryError


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def bump_child(proj: Project, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m builders.pins --root PROJ bump ARGV` as its own process under an address-space limit (so a reader
    that holds more than it should fails there with MemoryError), with a generous timeout that only detects a hang (a
    FIFO read with no writer); the environment is this test's (the fake GitHub, the token)."""
    return subprocess.run([sys.executable, "-m", "builders.pins", "--root", str(proj.root), "bump", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=TOP, preexec_fn=_limit_memory,
                          env={**os.environ, "PYTHONPATH": str(TOP), "COLUMNS": "300"})


def hostile_files(path: Path, oversize: int) -> dict:
    """Ways to put something other than the report's own regular file at `path` (each a function of it)."""
    def dev_zero() -> None:
        path.symlink_to("/dev/zero")

    def fifo() -> None:
        os.mkfifo(path)

    def directory() -> None:
        path.mkdir()

    def too_large() -> None:  # sparse: a regular file past the bound costs no disk
        with open(path, "wb") as fh:
            fh.truncate(oversize + 1)

    def link_to_a_report() -> None:  # even a link to a good report is not followed
        good = path.with_name("elsewhere.json")
        good.write_text("{}")
        path.symlink_to(good)

    return {"dev_zero": (dev_zero, "is a link (to /dev/zero), not a regular file"),
            "fifo": (fifo, "is a FIFO, not a regular file"),
            "directory": (directory, "is a directory, not a regular file"),
            "too_large": (too_large, f"is larger than {oversize} bytes"),
            "link": (link_to_a_report, "is a link (to "), }


def branch_pin(name: str, url: str, commit: str) -> str:
    """A pins.yaml entry (Project's pins_body) following branch main of url, pinned at commit."""
    return f"""
{name}:
  url: {url}
  policy: branch
  branch: main
  commit: {commit}
  cadence: daily
  license: MIT
  mirrors: []
"""


def release_pin(name: str, url: str, tag: str, commit: str, license: str = "MIT") -> str:
    """A pins.yaml entry (Project's pins_body) following url's releases, pinned at tag (its commit)."""
    return f"""
{name}:
  url: {url}
  policy: release
  tag: {tag}
  commit: {commit}
  cadence: daily
  license: {license}
  mirrors: []
"""


def make_recipe(name: str, env: dict | None = None, options: dict | None = None) -> str:
    """A recipe building `prog` of pin `name` with make (target cpu), its options (default: ARCH_FLAG and programs)
    and build env."""
    options = {"ARCH_FLAG": "-march=x86-64-v3", "programs": "prog"} if options is None else options
    text = "".join(f"\n    {k}: {v}" for k, v in options.items())
    env_text = "".join(f"\n    {k}: \"{v}\"" for k, v in (env or {}).items())
    return textwrap.dedent(f"""\
        schema_version: 1
        name: {name}
        summary: a make-built upstream
        license: MIT
        source:
          pin: {name}
        toolchain:
          - {{tool: make}}
        build:
          kind: make
          network: none
          options:OPTIONS
          targets: [cpu]
        stage:
          root: libexec/onebit/{{variant}}
          keep: [bin/prog]
          binaries:
            prog: bin/prog
        provides:
          backend: null
          adapter: ds4
          devices: [CPU]
          features: []
        """).replace("options:OPTIONS", "options:" + text).replace(
        "  options:", ("  env:" + env_text + "\n  options:") if env else "  options:")


def refused_unread(proj: Project, api: FakeAPI, report: Path, limit: int, form: str, *names: str) -> None:
    """`report` replaced by the hostile `form` (hostile_files, `limit` its bound): the token holder as its own process
    (`bump_child`: pins bump NAMES --from-report DIR --open-pr) refuses it in one line without reading it (no
    MemoryError, no hang) and pushes nothing."""
    report.unlink()
    plant, says = hostile_files(report, limit)[form]
    plant()
    proc = bump_child(proj, *names, "--from-report", str(report.parent), "--open-pr")
    err = proc.stderr
    assert proc.returncode == 2 and "MemoryError" not in err + proc.stdout and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: cannot read {report.name}") and says in err, err
    nothing_pushed(proj, api)
