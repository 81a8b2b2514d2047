"""Companion sources, for real: git submodules at their gitlinks, `cargo vendor`, Hugging Face files over HTTP.

Each is fetched once from a local stand-in for its upstream (git repos under tmp_path reached through a real
url.<base>.insteadOf rule, a cargo git dependency, an HTTP server on 127.0.0.1 with the Hub's resolve/<rev>/<file>
URL shape), then fetched again with the upstream gone and --offline: it must come from the cache.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import subprocess
import socket
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
from http_fixtures import QuietHandler

from builders.inputs import companions
from builders.errors import FetchError

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env={**GIT_ENV, "PATH": "/usr/bin:/bin", "HOME": str(cwd)}).stdout.strip()


def repo(path: Path, files: dict[str, str], links: dict[str, tuple[str, str]] | None = None) -> str:
    """A git repo with files and gitlinks {path: (url, sha)}; returns its HEAD commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    if links:
        (path / ".gitmodules").write_text("".join(f'[submodule "{p}"]\n\tpath = {p}\n\turl = {u}\n' for p, (u, _) in links.items()))
    git(path, "add", "-A")
    for p, (_, sha) in (links or {}).items():  # gitlinks only, as a superproject records them
        git(path, "update-index", "--add", "--cacheinfo", f"160000,{sha},{p}")
    git(path, "commit", "-q", "-m", "c")
    return git(path, "rev-parse", "HEAD")


@pytest.fixture
def upstreams(tmp_path, monkeypatch):
    """parent -> xrt (https URL, mirrored by insteadOf) -> nested (relative URL ../nested.git)."""
    up = tmp_path / "up"
    nested = repo(up / "nested.git", {"n.txt": "nested\n"})
    xrt = repo(up / "xrt.git", {"x.txt": "xrt\n"}, {"src/nested": ("../nested.git", nested)})
    parent = repo(up / "parent", {"p.txt": "parent\n"}, {"xrt": ("https://example.invalid/Xilinx/xrt.git", xrt),
                                                         "unused": ("https://example.invalid/unused.git", "1" * 40)})
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text(f'[url "{up}/"]\n\tinsteadOf = https://example.invalid/Xilinx/\n'
                         "[protocol \"file\"]\n\tallow = always\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    cache = tmp_path / "cache"
    parent_git = cache / "git" / f"{parent}.git"
    from builders.inputs.fetch import _fetch_into_new_repo
    _fetch_into_new_repo(parent_git, str(up / "parent"), parent)
    return {"up": up, "cache": cache, "parent": parent, "xrt": xrt, "nested": nested, "parent_git": parent_git}


def test_submodules_at_their_gitlinks_recursively_then_offline(upstreams, tmp_path):
    u = upstreams
    git_cache = lambda sha: u["cache"] / "git" / f"{sha}.git"
    lock = u["cache"] / "submodules" / "lock.json"
    subs = companions.fetch_submodules(git_cache, u["parent_git"], u["parent"], "https://example.invalid/parent.git",
                                       ["xrt"], lock)
    assert [(s.path, s.commit) for s in subs] == [("xrt", u["xrt"]), ("xrt/src/nested", u["nested"])]
    assert subs[1].url == "https://example.invalid/Xilinx/nested.git"  # ../nested.git against xrt's URL, as git does
    written = json.loads(lock.read_text())  # the lock names its key: the pinned commit and the submodules asked for
    assert (written["commit"], written["want"]) == (u["parent"], ["xrt"])
    assert written["submodules"][0] == {"path": "xrt", "url": "https://example.invalid/Xilinx/xrt.git", "commit": u["xrt"]}

    shutil.rmtree(u["up"])  # the upstreams are gone: everything must come from the cache now
    again = companions.fetch_submodules(git_cache, u["parent_git"], u["parent"], "https://example.invalid/parent.git",
                                        ["xrt"], lock, offline=True)
    assert again == subs
    src = tmp_path / "src"
    subprocess.run(["git", "--git-dir", str(u["parent_git"]), "worktree", "add", "-q", "--detach", str(src), u["parent"]], check=True)
    companions.checkout_submodules(src, lock, git_cache)
    assert (src / "xrt" / "x.txt").read_text() == "xrt\n"
    assert (src / "xrt" / "src" / "nested" / "n.txt").read_text() == "nested\n"


def test_submodule_offline_first_time_and_unknown_path_are_one_line(upstreams, tmp_path, monkeypatch):
    u = upstreams
    (tmp_path / "empty-gitconfig").write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "empty-gitconfig"))  # no mirror rule: the real https URL
    git_cache = lambda sha: u["cache"] / "git" / f"{sha}.git"
    with pytest.raises(FetchError, match=r"submodule xrt @ \w{12} is not in the cache .* --offline forbids fetching"):
        companions.fetch_submodules(git_cache, u["parent_git"], u["parent"], "u", ["xrt"], u["cache"] / "l.json", offline=True)
    with pytest.raises(FetchError, match=r"'nope' is not a submodule \(gitlinks: unused, xrt\)"):
        companions.fetch_submodules(git_cache, u["parent_git"], u["parent"], "u", ["nope"], u["cache"] / "l.json")
    assert not (u["cache"] / "l.json").exists()


@pytest.mark.parametrize("url, parent, out", [
    ("https://h/o/x.git", "https://h/o/p.git", "https://h/o/x.git"),
    ("../x.git", "https://h/o/p.git", "https://h/o/x.git"),
    ("../../q/x.git", "https://h/o/p.git", "https://h/q/x.git"),
    ("./x.git", "/srv/p", "/srv/p/x.git"),
])
def test_relative_submodule_urls(url, parent, out):
    assert companions.absolute_url(url, parent) == out


@pytest.fixture
def git_daemon(tmp_path):
    """A git daemon on 127.0.0.1 serving tmp_path/served: the crates step's sandbox shares the host's network but
    none of its files, so a git dependency reaches it as it would from a forge, not through file://."""
    served = tmp_path / "served"
    served.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["git", "daemon", "--export-all", "--reuseaddr", "--listen=127.0.0.1", f"--port={port}",
                             f"--base-path={served}", str(served)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield served, f"git://127.0.0.1:{port}"
    proc.terminate()
    proc.wait()


def test_cargo_vendor_once_then_offline_build(tmp_path, monkeypatch, cargo, git_daemon):
    """The crates step without a build root: the host's cargo in the sandbox (host_cargo), a git dependency from a
    server, then offline from the cache."""
    served, base = git_daemon
    monkeypatch.setenv("CARGO_HOME", str(tmp_path / "cargo-home"))
    dep = served / "dep"
    repo(dep, {"Cargo.toml": '[package]\nname = "dep"\nversion = "0.1.0"\nedition = "2021"\n',
               "src/lib.rs": "pub fn answer() -> u32 { 42 }\n"})
    src = tmp_path / "src"
    (src / "app" / "src").mkdir(parents=True)
    (src / "app" / "Cargo.toml").write_text(f'[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                            f'[dependencies]\ndep = {{ git = "{base}/dep", branch = "main" }}\n')
    (src / "app" / "src" / "lib.rs").write_text("pub fn a() -> u32 { dep::answer() }\n")
    subprocess.run([cargo, "generate-lockfile", "--manifest-path", str(src / "app" / "Cargo.toml")], check=True, capture_output=True)
    dest = tmp_path / "cache" / "crates" / "k"

    assert companions.vendor_crates(src, "app/Cargo.toml", dest) == "vendored"
    assert (dest / "vendor").is_dir() and 'directory = "' + str(dest / "vendor") + '"' in (dest / "config.toml").read_text()
    shutil.rmtree(dep)  # the upstream is gone
    shutil.rmtree(tmp_path / "cargo-home")
    assert companions.vendor_crates(src, "app/Cargo.toml", dest, offline=True) == "cache"
    proc = subprocess.run([cargo, "build", "--release", "--locked", "--offline", "--config", str(dest / "config.toml"),
                           "--manifest-path", str(src / "app" / "Cargo.toml"), "--target-dir", str(tmp_path / "t")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    (dest / "vendor" / "extra").write_text("x")  # a vendored tree that changed is never reused
    assert not companions.crates_ready(dest)
    with pytest.raises(FetchError, match="not trusted in the cache .the vendored tree does not match the digest its .complete records"):
        companions.vendor_crates(src, "app/Cargo.toml", dest, offline=True)


@pytest.mark.parametrize("where,environ,want", [
    ("/usr/bin/cargo", {}, ((), {})),  # Debian's cargo: nothing to add
    ("~/.cargo/bin/cargo", {}, (("~/.cargo/bin", "~/.rustup"), {"RUSTUP_HOME": "~/.rustup"})),  # rustup's proxy
    ("~/.cargo/bin/cargo", {"RUSTUP_TOOLCHAIN": "1.98.1"},
     (("~/.cargo/bin", "~/.rustup"), {"RUSTUP_HOME": "~/.rustup", "RUSTUP_TOOLCHAIN": "1.98.1"})),
])
def test_host_cargo(tmp_path, where, environ, want):
    """What the sandbox needs to run the host's cargo: never CARGO_HOME itself (credentials.toml lives there)."""
    home = tmp_path / "home"
    exe = Path(where.replace("~", str(home))) if where.startswith("~") else None
    if exe is not None:
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        (home / ".rustup").mkdir()
        path = str(exe.parent)
    else:  # Debian's: a cargo whose real file is under /usr (a link to one, so the row needs no cargo installed)
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "cargo").symlink_to("/usr/bin/env")
        path = str(tmp_path / "bin")
    got = companions.host_cargo({"PATH": path, "HOME": str(home), **environ})
    subst = str(home)
    assert got[1:] == (tuple(p.replace("~", subst) for p in want[0]), {k: v.replace("~", subst) for k, v in want[1].items()})
    assert not any(p.endswith(".cargo") for p in got[1])


class _Hub(QuietHandler):
    files: ClassVar[dict[str, bytes]] = {}
    hits: ClassVar[list[str]] = []

    def do_GET(self):
        self.hits.append(self.path)
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.answer(200, body)


@pytest.fixture
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hub.files, _Hub.hits = {}, []
    yield f"http://127.0.0.1:{server.server_address[1]}", _Hub
    server.shutdown()


def test_hf_files_by_revision_verified_then_offline(hub, tmp_path, monkeypatch):
    endpoint, h = hub
    rev = "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851"
    blobs = {"model.safetensors": b"weights" * 1000, "tokenizer/tokenizer.json": b'{"v": 1}'}
    h.files = {f"/conv/laya/resolve/{rev}/{n}": b for n, b in blobs.items()}
    pins = {n: hashlib.sha256(b).hexdigest() for n, b in blobs.items()}
    monkeypatch.setenv("ONEBIT_HF_ENDPOINT", endpoint + "/")
    dest = tmp_path / "hf" / "k"
    assert companions.fetch_hf("conv/laya", rev, pins, dest).startswith(endpoint)
    assert (dest / "tokenizer" / "tokenizer.json").read_bytes() == b'{"v": 1}'
    assert sorted(h.hits) == sorted(f"/conv/laya/resolve/{rev}/{n}" for n in blobs)
    h.files = {}  # the hub is gone
    assert companions.fetch_hf("conv/laya", rev, pins, dest, offline=True) == "cache"


def test_hf_sha256_mismatch_leaves_nothing(hub, tmp_path):
    endpoint, h = hub
    h.files = {"/o/r/resolve/abc/f.bin": b"tampered"}
    dest = tmp_path / "hf" / "k"
    with pytest.raises(FetchError, match=r"sha256 mismatch for o/r/f.bin @ abc: pins.yaml expects 00+, the server sent [0-9a-f]{64}"):
        companions.fetch_hf("o/r", "abc", {"f.bin": "0" * 64}, dest, endpoint=endpoint)
    assert not dest.exists() and not list((tmp_path / "hf").iterdir())
    with pytest.raises(FetchError, match="could not download .*/o/r/resolve/abc/g.bin"):
        companions.fetch_hf("o/r", "abc", {"g.bin": "0" * 64}, dest, endpoint=endpoint)
    with pytest.raises(FetchError, match="not in the cache .* --offline forbids downloading"):
        companions.fetch_hf("o/r", "abc", {"f.bin": "0" * 64}, dest, offline=True)
    with pytest.raises(FetchError, match="no sha256 pinned for f.bin"):
        companions.fetch_hf("o/r", "abc", {"f.bin": None}, dest, endpoint=endpoint)


def test_hf_endpoint_and_url_shape():
    assert companions.hf_endpoint({}) == "https://huggingface.co"
    assert companions.hf_endpoint({"ONEBIT_HF_ENDPOINT": "http://127.0.0.1:9/"}) == "http://127.0.0.1:9"
    assert companions.hf_url("http://h", "o/r", "abc", "a/b.json") == "http://h/o/r/resolve/abc/a/b.json"
