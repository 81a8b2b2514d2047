"""Companion sources that come with a pin: git submodules at their gitlinks, vendored crates, Hugging Face files.

Each is fetched once into the content-addressed cache, verified, and works offline afterwards:
- submodules: the gitlink SHAs recorded in the pinned commit's tree (recursively), each fetched like a pin into
  cache/git/<sha>.git and verified to hold that commit; a lock file lists what was found. URLs come from the
  commit's .gitmodules and go through git's own `url.<base>.insteadOf` rewriting, so a mirror is a git config line.
- crates: `cargo vendor --locked` of a manifest in the checked-out source, keyed by the source commit; the config
  that cargo prints is kept beside the crates, and a digest of the vendored tree is checked on every reuse. cargo
  reads upstream's manifests, so it runs in the sandbox (builders/roots/sandbox.py): the variant's build root and its
  cargo (the host's /usr without one), the source read-only, a private HOME and CARGO_HOME, no inherited
  environment but the proxy variables (so no registry token or credential file of the host is in reach); the network
  is on, with the host's resolver configuration and CA bundle.
- Hugging Face: `<endpoint>/<repo>/resolve/<revision>/<file>` for each file pinned in pins.yaml, checked against its
  sha256. The endpoint is $ONEBIT_HF_ENDPOINT (default https://huggingface.co); $HF_TOKEN is sent when set. Downloads
  go through the project's one HTTP session (builders/io/http.py: 5xx, rate limits and broken connections retried).
"""
from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..io import gitcmd, http
from ..roots import sandbox
from ..project.config import file_sha256, tree_digest
from ..errors import FetchError
from .fetch import _fetch_into_new_repo, cached, is_local
from ..io.swap import replace_dir, write_text_atomic

Log = Callable[[str], None]
HF_ENDPOINT_ENV = "ONEBIT_HF_ENDPOINT"
HF_DEFAULT_ENDPOINT = "https://huggingface.co"


def _noop(_: str) -> None:
    pass


def _git(git_dir: Path, *args: str) -> str:
    proc = gitcmd.run(["--git-dir", str(git_dir), *args])
    if proc.returncode != 0:
        raise FetchError(f"git {' '.join(args)} in {git_dir} failed: {proc.stderr.strip()}")
    return proc.stdout


# ---- submodules ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submodule:
    path: str  # relative to the top source tree
    url: str  # as .gitmodules says (after resolving a relative URL against the parent's)
    commit: str  # the gitlink

    def to_json(self) -> dict:
        return {"path": self.path, "url": self.url, "commit": self.commit}


def gitlinks(git_dir: Path, commit: str) -> dict[str, str]:
    """Pure read of a commit's tree: submodule path -> gitlink SHA."""
    out = _git(git_dir, "ls-tree", "-r", "-z", commit)
    links = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        _mode, kind, sha = meta.split()
        if kind == "commit":
            links[path] = sha
    return links


def gitmodules(git_dir: Path, commit: str) -> dict[str, str]:
    """submodule path -> url, from the commit's .gitmodules ({} when it has none)."""
    proc = gitcmd.run(["--git-dir", str(git_dir), "config", "--blob", f"{commit}:.gitmodules", "-z",
                       "--get-regexp", r"^submodule\..*\.(path|url)$"])
    if proc.returncode != 0:
        return {}
    by_name: dict[str, dict[str, str]] = {}
    for item in proc.stdout.split("\0"):
        if not item:
            continue
        key, _, value = item.partition("\n")
        name, _, field = key[len("submodule."):].rpartition(".")
        by_name.setdefault(name, {})[field] = value
    return {v["path"]: v["url"] for v in by_name.values() if "path" in v and "url" in v}


def absolute_url(url: str, parent_url: str) -> str:
    """A .gitmodules URL made absolute: `../x.git` is relative to the superproject's URL, as git resolves it."""
    if not url.startswith(("./", "../")):
        return url
    base = parent_url.rstrip("/")
    scheme, sep, rest = base.partition("://")
    if not sep:
        scheme, rest = "", base
    joined = posixpath.normpath(posixpath.join(rest, url))  # the superproject URL as the base directory, like git
    return f"{scheme}://{joined}" if sep else joined


def rewritten(url: str) -> str:
    """The URL git would really fetch, after the user's url.<base>.insteadOf rules (a mirror is one config line)."""
    proc = gitcmd.run(["ls-remote", "--get-url", url], user_config=True)
    return proc.stdout.strip() or url if proc.returncode == 0 else url


MAX_LOCK = 16 << 20  # bytes of a submodules lock file
_SHA = re.compile(r"[0-9a-f]{40}")


def lock_key(commit: str, want: list[str]) -> dict:
    """Pure: what a submodules lock file names as its key: the pinned commit and the submodules asked for."""
    return {"commit": commit, "want": sorted(want)}


def read_lock(lock: Path, key: dict | None = None) -> tuple[list[Submodule] | None, str | None]:
    """(The submodules a lock file lists, None) when it is a regular file (bounded, never through a link) of the shape
    fetch_submodules writes, naming `key` when one is given, every path inside the source tree and every commit a full
    id; else (None, why not)."""
    from ..io.readfile import UnreadableFile, read_json

    try:
        data = read_json(lock, MAX_LOCK)
    except UnreadableFile as exc:
        return None, exc.why
    if not isinstance(data, dict) or set(data) != {"commit", "want", "submodules"} or not isinstance(data["submodules"], list):
        return None, "is not a submodules lock of this version"
    if key is not None and {"commit": data["commit"], "want": data["want"]} != key:
        return None, "names another commit or other submodules"
    subs = []
    for s in data["submodules"]:
        if not (isinstance(s, dict) and set(s) == {"path", "url", "commit"} and all(isinstance(v, str) for v in s.values())):
            return None, "lists a submodule of another shape"
        parts = s["path"].split("/")
        if not _SHA.fullmatch(s["commit"]) or s["path"].startswith("/") or "" in parts or ".." in parts or "." in parts:
            return None, f"lists a submodule outside the source tree or at no commit ({s['path'][:80]!r})"
        subs.append(Submodule(**s))
    return subs, None


def fetch_submodules(git_cache: Callable[[str], Path], git_dir: Path, commit: str, url: str, want: list[str],
                     lock: Path, *, offline: bool = False, log: Log = _noop) -> list[Submodule]:
    """Fetch the wanted submodules of `commit` (and theirs, recursively) at their gitlinks; write the lock file. A lock
    file there is trusted only when it names this commit and these submodules (read_lock) and each is in the cache;
    otherwise the submodules are found again and the lock written anew (log: why)."""
    key = lock_key(commit, want)
    if os.path.lexists(lock):
        subs, why = read_lock(lock, key)
        if subs is not None and all(cached(git_cache(s.commit), s.commit) for s in subs):
            return subs
        log(f"the submodules lock {lock} is not trusted ({why or 'a submodule it lists is not in the cache'}): "
            "finding them again")
    found: list[Submodule] = []

    def walk(gdir: Path, at: str, parent_url: str, prefix: str, only: list[str] | None) -> None:
        links = gitlinks(gdir, at)
        urls = gitmodules(gdir, at)
        for path in only if only is not None else sorted(links):
            if path not in links:
                raise FetchError(f"{url} @ {commit[:12]}: {prefix + path!r} is not a submodule (gitlinks: "
                                 f"{', '.join(sorted(prefix + p for p in links)) or 'none'})",
                                 hint="fix source.submodules in the recipe")
            if path not in urls:
                raise FetchError(f"{prefix + path}: gitlink {links[path][:12]} has no URL in .gitmodules at {at[:12]}")
            sub = Submodule(prefix + path, absolute_url(urls[path], parent_url), links[path])
            dest = git_cache(sub.commit)
            if not cached(dest, sub.commit):
                real = rewritten(sub.url)
                if offline and not is_local(real):
                    raise FetchError(f"submodule {sub.path} @ {sub.commit[:12]} is not in the cache ({dest}) and --offline "
                                     f"forbids fetching {real}", hint="run `1bit-build fetch BUNDLE` once with network")
                log(f"git fetch submodule {sub.path} @ {sub.commit[:7]} from {real}")
                try:
                    _fetch_into_new_repo(dest, real, sub.commit)
                except FetchError as exc:  # git's own message (or the deadline's, or the refusal's), one line
                    raise FetchError(f"submodule {sub.path} @ {sub.commit} could not be fetched from {real}: {exc.what}",
                                     hint=exc.hint or "add a url.<mirror>.insteadOf rule to git config for this URL") from None
            found.append(sub)
            walk(dest, sub.commit, sub.url, sub.path + "/", None)

    walk(git_dir, commit, url, "", list(want) if want != ["*"] else None)
    write_text_atomic(lock, json.dumps({**key, "submodules": [s.to_json() for s in found]}, indent=1))
    return found


def checkout_submodules(src: Path, lock: Path, git_cache: Callable[[str], Path]) -> list[Submodule]:
    """Check out each locked submodule as a worktree of its cache entry, parents before children."""
    subs, why = read_lock(lock)
    if subs is None:
        raise FetchError(f"the submodules lock {why}; nothing was checked out", where=str(lock),
                         hint="run the build again: the submodules step writes it anew")
    for sub in sorted(subs, key=lambda s: s.path.count("/")):
        target = src / sub.path
        if target.exists() and not any(target.iterdir()):
            target.rmdir()  # git leaves an empty directory for an uninitialised submodule
        gdir = git_cache(sub.commit)
        gitcmd.run(["--git-dir", str(gdir), "worktree", "prune"])
        _git(gdir, "worktree", "add", "--quiet", "--force", "--detach", str(target), sub.commit)
    return subs


# ---- crates ----------------------------------------------------------------------------------------------------
def crates_untrusted(dest: Path) -> str | None:
    """None when `dest` holds vendored crates whose .complete names the digest of the vendored tree as it is now (the
    tree is its own key: a crate changed after vendoring is never reused) and cargo's config.toml beside them;
    otherwise why not (swap.why_untrusted; swap.ABSENT when nothing is there)."""
    from ..io.swap import ABSENT, why_untrusted

    if not os.path.lexists(dest):
        return ABSENT
    vendor = dest / "vendor"
    if not vendor.is_dir() or vendor.is_symlink():
        return "it has no vendor directory"
    if not (dest / "config.toml").is_file() or (dest / "config.toml").is_symlink():
        return "its cargo config.toml is missing"
    why = why_untrusted(dest, tree_digest(vendor))
    return "the vendored tree does not match the digest its .complete records" if why and "another key" in why else why


def crates_ready(dest: Path) -> bool:
    return crates_untrusted(dest) is None


_REGISTRY = re.compile(r"unable to update registry `([^`]+)`")
_UNREACHABLE = re.compile(r"Could not resolve host: ([^\s)]+)|Failed to connect to ([^\s]+)|"
                          r"failed to connect to ([^\s:]+)|Connection timed out|timed out|Network is unreachable",
                          re.IGNORECASE)


def cargo_vendor_failure(manifest: str, stderr: str) -> str:
    """Pure: one line saying why `cargo vendor` failed. A registry cargo could not reach is named as cargo names it (its
    source name, and the host it reported), so the line says exactly what blocks the crates step; anything else is
    cargo's last line."""
    reg, net = _REGISTRY.search(stderr), _UNREACHABLE.search(stderr)
    if reg and net:
        host = next((g for g in net.groups() if g), None)
        name = "the crates registry" if reg.group(1) == "crates-io" else "the registry"
        return (f"{name} (cargo's `{reg.group(1)}` source{', ' + host if host else ''}) is unreachable from this "
                f"host: cargo vendor --locked for {manifest} needs it")
    last = stderr.strip().splitlines()
    return f"cargo vendor failed for {manifest}: {last[-1].strip() if last else 'no message'}"


# what the crates step sees of the host: the proxy settings cargo and curl honour, the resolver and the CA bundle
CRATES_PASS_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")
CRATES_HOST_ETC = ("resolv.conf", "hosts", "ssl/certs/ca-certificates.crt")
CRATES_TIMEOUT = 1800


def host_cargo(environ: Mapping[str, str]) -> tuple[str, tuple[str, ...], dict[str, str]]:
    """Without a build root: the host's cargo as the sandbox can run it (the program, what to bind read-only, the
    variables it needs). Debian's /usr/bin/cargo needs nothing more; rustup's proxy (~/.cargo/bin) needs its
    directory and RUSTUP_HOME, which hold no credentials (those are in CARGO_HOME, which stays out)."""
    exe = shutil.which("cargo", path=environ.get("PATH"))
    if exe is None or os.path.realpath(exe).startswith("/usr/"):
        return exe or "cargo", (), {}
    ro, env = [os.path.dirname(exe)], {}
    rustup = environ.get("RUSTUP_HOME") or os.path.join(environ.get("HOME") or "/nonexistent", ".rustup")
    if os.path.isdir(rustup):
        ro.append(rustup)
        env["RUSTUP_HOME"] = rustup
        if environ.get("RUSTUP_TOOLCHAIN"):
            env["RUSTUP_TOOLCHAIN"] = environ["RUSTUP_TOOLCHAIN"]
    return exe, tuple(ro), env


def crates_sandbox(source: Path, work: Path, root: str | None, environ: Mapping[str, str],
                   cargo: tuple[tuple[str, ...], Mapping[str, str]] = ((), {})) -> sandbox.Sandbox:
    """Pure: where `cargo vendor` runs: in `root` (the variant's build root; None: the host's /usr, with `cargo`'s
    read-only paths and variables from host_cargo), the source read-only, `work` writable and the working directory
    (so no cargo config of the project or the host is read), HOME and CARGO_HOME private, the environment only PATH,
    the locale, the CA bundle and the proxy variables."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CARGO_HOME": "/tmp/cargo-home",
           **({"CARGO_HTTP_CAINFO": "/etc/ssl/certs/ca-certificates.crt"} if root else {}), **cargo[1],
           **{k: environ[k] for k in CRATES_PASS_ENV if environ.get(k)}}
    return sandbox.Sandbox(env=env, cwd=str(work), root=root, ro=(str(source), *cargo[0]), rw=(str(work),),
                           network=True, timeout=CRATES_TIMEOUT, host_etc=CRATES_HOST_ETC if root else ())


def vendor_crates(source: Path, manifest: str, dest: Path, *, offline: bool = False, log: Log = _noop,
                  root: str | None = None) -> str:
    """`cargo vendor --locked` into dest/vendor, in the sandbox (crates_sandbox); dest/config.toml is the config cargo
    printed, pointing there."""
    from ..io.swap import ABSENT, mark, offline_refusal

    distrust = crates_untrusted(dest)
    if distrust is None:
        return "cache"
    if offline:
        raise offline_refusal(f"crates for {manifest} are", distrust, dest, absent="not vendored yet")
    why = sandbox.why_unavailable()
    if why:
        raise FetchError(f"the crates step of {manifest} runs cargo in a sandbox, and this host cannot make one: {why}")
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(f"cargo vendor --locked ({manifest})" + (f" in build root {root}" if root else ""))
    exe, ro, env = ("cargo", (), {}) if root else host_cargo(os.environ)
    argv = [exe, "vendor", "--locked", "--versioned-dirs", "--manifest-path", str(source / manifest),
            str(tmp / "vendor")]
    try:
        proc = sandbox.run(crates_sandbox(source, tmp, root, os.environ, (ro, env)), argv)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(f"cargo vendor --locked for {manifest} did not finish in {CRATES_TIMEOUT} s") from None
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(cargo_vendor_failure(manifest, proc.stderr),
                         hint="check the network, or that Cargo.lock matches Cargo.toml (--locked)")
    (tmp / "vendor").mkdir(exist_ok=True)  # a crate without dependencies: cargo makes no vendor directory
    config = proc.stdout.replace(str(tmp / "vendor"), str(dest / "vendor"))
    (tmp / "config.toml").write_text(config)
    mark(tmp, tree_digest(tmp / "vendor"))
    replace_dir(tmp, dest)
    return "vendored" if distrust == ABSENT else f"vendored again: the crates there were not trusted ({distrust})"


# ---- Hugging Face ----------------------------------------------------------------------------------------------
def hf_endpoint(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return (env.get(HF_ENDPOINT_ENV) or HF_DEFAULT_ENDPOINT).rstrip("/")


def hf_url(endpoint: str, repo: str, revision: str, name: str) -> str:
    return f"{endpoint}/{repo}/resolve/{revision}/{name}"


def hf_key(files: Mapping[str, str]) -> str:
    """Pure: what a Hugging Face entry's .complete names: every pinned file and its sha256."""
    return json.dumps(dict(files), sort_keys=True)


def hf_untrusted(dest: Path, files: Mapping[str, str]) -> str | None:
    """None when `dest` holds these pinned files: its .complete names them (hf_key) and each is a regular file there;
    otherwise why not (swap.why_untrusted; swap.ABSENT when nothing is there)."""
    from ..io.swap import why_untrusted

    why = why_untrusted(dest, hf_key(files))
    if why:
        return why
    gone = next((n for n in sorted(files) if not (dest / n).is_file() or (dest / n).is_symlink()), None)
    return f"its file {gone} is missing" if gone else None


def hf_ready(dest: Path, files: Mapping[str, str]) -> bool:
    return hf_untrusted(dest, files) is None


def fetch_hf(repo: str, revision: str, files: Mapping[str, str | None], dest: Path, *, where: str = "",
             offline: bool = False, endpoint: str | None = None, log: Log = _noop) -> str:
    """Each pinned file at the pinned revision into dest/<name>, sha256-checked; atomic as a whole."""
    unpinned = sorted(n for n, h in files.items() if not h)
    if unpinned:
        raise FetchError(f"{repo}: no sha256 pinned for {', '.join(unpinned)}", where=where,
                         hint="pin every file's sha256 in pins.yaml (`1bit-build pins bump` fills them in)")
    from ..io.swap import ABSENT, mark, offline_refusal

    why = hf_untrusted(dest, files)
    if why is None:
        return "cache"
    if offline:
        raise offline_refusal(f"{repo} @ {revision[:12]} is", why, dest)
    endpoint = endpoint or hf_endpoint()
    hub = http.Client(endpoint, os.environ.get("HF_TOKEN") or None)
    hub.service = "Hugging Face"
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, sha in sorted(files.items()):
            url = hf_url(endpoint, repo, revision, name)
            out = tmp / name
            out.parent.mkdir(parents=True, exist_ok=True)
            log(f"download {name}")
            try:
                with open(out, "wb") as f:
                    hub.download(url, f)
            except http.HTTPError as exc:
                raise FetchError(f"could not download {url}: {exc.what}", where=where,
                                 hint=f"check the network, or point {HF_ENDPOINT_ENV} at a mirror") from None
            got = file_sha256(out)
            if got != sha:
                raise FetchError(f"sha256 mismatch for {repo}/{name} @ {revision[:12]}: pins.yaml expects {sha}, "
                                 f"the server sent {got}", where=where,
                                 hint="do not build from it; if the pin is wrong, re-pin with `1bit-build pins bump`")
        mark(tmp, hf_key(files))
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    again = "" if why == ABSENT else f", again: the files there were not trusted ({why})"
    return f"{endpoint} ({len(files)} file(s){again})"
