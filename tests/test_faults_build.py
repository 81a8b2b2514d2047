"""The build side's fault table (issue 10): every fault ends in one clear line, a non-zero exit and nothing changed on
disk; no secret in any process's argv; archives cannot write outside their target; output swaps are atomic;
concurrent builds take turns. Real git, real HTTP, real builds of the mini project, real filesystems."""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from mini_project import git, make_mini
from test_pins_bot import TOKEN, api, release_project  # noqa: F401 - api is a fixture

from builders.io import archives, lock, swap
from builders.inputs import patch
from builders.io.archives import ArchiveError
from builders.cli import main
from builders.project.config import Mirror, Pin, file_sha256
from builders.errors import PatchError
from builders.inputs.fetch import NotThePinnedSource, fetch_pin
from builders.project.schemas import path_problem

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = str(Path(sys.executable).parent)


def cli_env() -> dict:
    return {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}


def snapshot(*dirs: Path) -> dict:
    """Every path under dirs with its size (what 'nothing changed on disk' compares)."""
    out = {}
    for d in dirs:
        if d.exists():
            for p in sorted(d.rglob("*")):
                out[str(p)] = p.stat().st_size if p.is_file() and not p.is_symlink() else -1
    return out


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err
    return " ".join(err.split())


# ================================================================================================ 1. secrets


class GitHTTP(BaseHTTPRequestHandler):
    """`git http-backend` over HTTP on 127.0.0.1: reads are public, a push needs the bot's basic auth (like GitHub)."""

    root: Path
    expected: str
    seen_auth: list

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._cgi()

    def do_POST(self):
        self._cgi()

    def _cgi(self):
        path, _, query = self.path.partition("?")
        push = "git-receive-pack" in path or "service=git-receive-pack" in query
        scheme, _, cred = (self.headers.get("Authorization") or "").partition(" ")
        auth = f"{scheme.capitalize()} {cred}" if cred else None
        if push:
            self.seen_auth.append(auth)
            if auth != self.expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="git"')
                self.end_headers()
                return
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {"GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path, "QUERY_STRING": query,
               "REQUEST_METHOD": self.command, "CONTENT_TYPE": self.headers.get("Content-Type", ""),
               "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""), "REMOTE_USER": "bot",
               "REMOTE_ADDR": "127.0.0.1", "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
               "PATH": os.environ["PATH"], "CONTENT_LENGTH": str(len(body))}
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, rest = out.partition(sep)
        status = 200
        headers = []
        for line in head.decode().splitlines():
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)


@pytest.fixture
def spawned(monkeypatch):
    """Every process started through subprocess (and GitPython) while the test runs: its argv."""
    seen: list[list[str]] = []
    real = subprocess.Popen

    class Recording(real):
        def __init__(self, args, *a, **kw):
            seen.append([str(x) for x in (args if isinstance(args, (list, tuple)) else [args])])
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Recording)
    import git.cmd
    monkeypatch.setattr(git.cmd, "Popen", Recording, raising=False)
    return seen


def test_bot_token_never_in_argv_logs_or_pr_body(tmp_path, api, spawned, capsys):  # noqa: F811 - api fixture
    _up, proj, _old, new = release_project(tmp_path, api)
    api.release("ggml-org/llama.cpp", "b101", f"notes that leak {TOKEN} by mistake")
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    handler = type("H", (GitHTTP,), {"root": tmp_path, "expected": f"Basic {basic}", "seen_auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/origin.git"
        git(proj.root, "remote", "set-url", "origin", url)
        from builders.pins.__main__ import main as pins_main
        rc = pins_main(["--root", str(proj.root), "bump", "--open-pr", "--repo", "ggml-org/onebit", "--show-body"])
    finally:
        server.shutdown()
    out = capsys.readouterr()
    assert rc == 0, out.err
    branch = f"bump/llama.cpp-{new[:12]}"
    assert proj.origin.ref(f"refs/heads/{branch}")  # the push went through, with the token
    assert handler.seen_auth and handler.seen_auth[-1] == f"Basic {basic}"
    assert spawned and any("push" in argv for argv in spawned)
    leaks = [argv for argv in spawned if any(TOKEN in a or basic in a for a in argv)]
    assert leaks == []
    [pr] = api.state.opened()
    assert TOKEN not in pr["body"] and "notes that leak *** by mistake" in pr["body"]
    assert TOKEN not in out.out + out.err and basic not in out.out + out.err


def test_auth_env_only_for_https_or_loopback():
    from builders.pins.gitops import auth_env

    assert auth_env("file:///x/origin.git", TOKEN) == {}
    assert auth_env("http://example.invalid/o.git", TOKEN) == {}
    assert auth_env("https://example.invalid/o.git", None) == {}
    env = auth_env("https://example.invalid/o.git", TOKEN)
    n = int(env["GIT_CONFIG_COUNT"]) - 1
    assert env[f"GIT_CONFIG_KEY_{n}"] == "http.https://example.invalid/o.git.extraheader"
    assert env[f"GIT_CONFIG_VALUE_{n}"].startswith("AUTHORIZATION: basic ")


# ================================================================================================ 4. archives


@pytest.mark.parametrize("name, link, special, expected", [
    ("pkg/file.txt", False, False, None),
    ("pkg/./file", False, False, None),
    ("../evil", False, False, "climbs out with '..'"),
    ("pkg/../../evil", False, False, "climbs out with '..'"),
    ("/etc/passwd", False, False, "has an absolute path"),
    ("C:evil", False, False, "has an absolute path"),
    ("pkg\\..\\evil", False, False, "has a backslash in its name"),
    ("pkg/link", True, False, "is a link"),
    ("pkg/dev", False, True, "is a device, FIFO or other special file"),
    ("", False, False, "has an empty or NUL name"),
])
def test_member_problem_table(name, link, special, expected):
    assert archives.member_problem(name, is_link=link, is_special=special) == expected


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return path


def _link(name: str, target: str, hard: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info


@pytest.mark.parametrize("bad", [
    ("pkg/../../evil.txt", b"x"),
    ("/tmp/onebit-evil-abs.txt", b"x"),
    _link("pkg/escape", "/etc"),
    _link("pkg/hard", "/etc/passwd", hard=True),
])
def test_unsafe_tar_is_refused_and_nothing_is_written(tmp_path, bad):
    archive = _tar(tmp_path / "a.tar.gz", [("pkg/ok.txt", b"fine"), bad, ("pkg/after.txt", b"late")])
    into = tmp_path / "into"
    with pytest.raises(ArchiveError) as err:
        archives.extract_tar(archive, into)
    assert "refusing to unpack it" in str(err.value)
    assert not into.exists() and not (tmp_path / "evil.txt").exists()


def test_unsafe_zip_and_wheel_are_refused(tmp_path):
    for name in ("../evil.py", "/abs.py"):
        whl = tmp_path / "bad-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            zf.writestr("bad/__init__.py", "")
            zf.writestr(name, "boom")
        with pytest.raises(ArchiveError):
            archives.check_archive_file(whl)
        with pytest.raises(ArchiveError):
            archives.extract(whl, tmp_path / "into")
        assert not (tmp_path / "into").exists() and not (tmp_path / "evil.py").exists()
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as zf:
        info = zipfile.ZipInfo("pkg/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(ArchiveError, match="is a link"):
        archives.extract(link, tmp_path / "into")
    good = tmp_path / "good.whl"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("good/__init__.py", "x = 1\n")
    assert archives.extract(good, tmp_path / "ok") == 1 and (tmp_path / "ok" / "good" / "__init__.py").read_text() == "x = 1\n"


def test_malicious_sdist_mirror_is_fatal_and_writes_nothing(tmp_path):
    """An sdist whose sha256 matches the pin but which carries a `..` member: refused, and the next mirror is not
    tried (the pin itself names a bad file)."""
    sdist = _tar(tmp_path / "evil-1.0.tar.gz", [("evil-1.0/vendor/.git/HEAD", b"ref: refs/heads/main\n"),
                                                ("evil-1.0/vendor/.git/../../../../../escaped", b"x")])
    sha = file_sha256(sdist)
    downloads = tmp_path / "downloads"
    (downloads / sha).mkdir(parents=True)
    shutil.copy(sdist, downloads / sha / sdist.name)
    spec = {"package": "evil", "version": "1.0", "sha256": sha, "git_dir": "evil-1.0/vendor/.git"}
    pin = Pin(name="evil", url="file:///nonexistent/upstream", policy="branch", cadence="daily", license="MIT",
              commit="a" * 40, unresolved=None, mirrors=(Mirror("pypi_sdist", spec),), where="pins.yaml:3")
    with pytest.raises(NotThePinnedSource, match="climbs out"):
        fetch_pin(pin, tmp_path / "cache" / "git" / "x.git", downloads, offline=True)
    assert not (tmp_path / "cache").exists()
    assert not list(Path(tempfile.gettempdir()).glob("escaped"))


@pytest.mark.parametrize("value, bad", [
    ("lib/libgreet.so*", False), ("bin/hello", False), ("share/../lib", True), ("../outside", True),
    ("/etc/passwd", True), ("~/x", True), ("a\\b", True),
])
def test_prefix_path_table(value, bad):
    assert (path_problem(value) is not None) == bad


@pytest.mark.parametrize("field, value", [("keep", ["bin/hello", "../../etc/*"]), ("keep", ["/usr/lib/*"]),
                                          ("binaries", {"hello": "../bin/hello"})])
def test_recipe_path_escaping_the_prefix_is_a_validation_error(tmp_path, capsys, field, value):
    mini = make_mini(tmp_path)
    recipe = mini.recipe()
    recipe["stage"][field] = value
    mini.write_recipe(recipe)
    assert main(["--root", str(mini.root), "validate"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "recipes/hello.yaml:" in err and f"stage.{field}" in err and "prefix" in err


# ================================================================================================ 9. one clear line


def test_unknown_placeholder_is_one_line_with_file(tmp_path, capsys):
    mini = make_mini(tmp_path)
    recipe = mini.recipe()
    recipe["build"]["options"]["HELLO_COMMIT"] = "{nope}"
    mini.write_recipe(recipe)
    before = snapshot(tmp_path)
    assert main(["--root", str(mini.root), "--cache", str(tmp_path / "c"), "plan", "mini"]) == 2
    err = one_error_line(capsys.readouterr().err)
    line = next(i for i, ln in enumerate((mini.root / "recipes" / "hello.yaml").read_text().splitlines(), 1) if "{nope}" in ln)
    assert f"hello.yaml:{line}: build.options.HELLO_COMMIT: unknown placeholder {{nope}}" in err  # file AND line
    assert "known: {build}, {build_number}, {commit}" in err and "{tool:T} " not in err
    assert snapshot(tmp_path) == before


def test_patch_failing_after_its_check_leaves_the_tree_as_it_was(tmp_path, monkeypatch):
    """Two patches; the second passes --check, then the tree changes under it (a race) and git apply fails for real.
    The error says so, and the first patch is reversed: the tree is back at the pinned commit."""
    repo = tmp_path / "src"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.c").write_text("one\ntwo\nthree\n")
    (repo / "b.c").write_text("alpha\nbeta\ngamma\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    p1 = tmp_path / "0001-a.patch"
    p1.write_text("diff --git a/a.c b/a.c\n--- a/a.c\n+++ b/a.c\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n")
    p2 = tmp_path / "0002-b.patch"
    p2.write_text("diff --git a/b.c b/b.c\n--- a/b.c\n+++ b/b.c\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n")
    real = patch._git_apply

    def racing(worktree, p, *extra):
        if p == p2 and not extra:  # between the check and the apply, someone rewrites b.c
            (worktree / "b.c").write_text("something else entirely\n")
        return real(worktree, p, *extra)

    monkeypatch.setattr(patch, "_git_apply", racing)
    with pytest.raises(PatchError) as err:
        patch.apply_all(repo, [p1, p2], where="recipes/x.yaml")
    assert "0002-b.patch passed its check but failed to apply" in str(err.value)
    assert (repo / "a.c").read_text() == "one\ntwo\nthree\n"  # the first patch was reversed


NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _as_nobody() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


# third-party top-level modules that importing every build-side module loads (the CLI's imports and more), as paths
_THIRD_PARTY = """
import importlib, json, os, pkgutil, site, sys, sysconfig
import builders
for m in pkgutil.walk_packages(builders.__path__, "builders."):
    if not m.name.startswith("builders.release"):
        importlib.import_module(m.name)
from builders.project import config
config.load_project(os.getcwd())  # and what loading a project imports when it runs (floor.yaml's policy: auditwheel)
sites = sorted({os.path.realpath(p) for p in site.getsitepackages() + [sysconfig.get_path("purelib"),
                sysconfig.get_path("platlib")]}, key=len, reverse=True)
tops = set()
for name, mod in list(sys.modules.items()):
    f = getattr(mod, "__file__", None)
    if not f or name.split(".")[0] in ("builders", "onebit"):  # the project's own: copied apart
        continue
    f = os.path.realpath(f)
    for d in sites:
        if f.startswith(d + os.sep):
            top = os.path.join(d, os.path.relpath(f, d).split(os.sep)[0])
            if not os.path.basename(top).startswith(("__editable__", "_distutils_hack")):
                tops.add(top)
            break
print(json.dumps(sorted(tops)))
"""


def _link_or_copy(src: str, dst: str) -> None:
    """A world-readable file shares its inode (no bytes copied); any other is copied and made readable."""
    if os.stat(src).st_mode & 0o004:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)
    os.chmod(dst, os.stat(dst).st_mode | 0o444)


def _open_folders(top: Path) -> None:
    for d in (top, *(p for p in top.rglob("*") if p.is_dir() and not p.is_symlink())):
        os.chmod(d, 0o755)


def _nobody_imports(python: str, pythonpath: str, cwd: Path) -> str | None:
    """None when nobody can run `python` and import the CLI from `pythonpath`; else the last line it printed."""
    proc = subprocess.run([*AS_NOBODY, python, "-c", "import builders.cli, builders.build, builders.project.floor as f; "
                                                   "f.policy_data('manylinux_2_34')"], capture_output=True,
                          text=True, cwd=cwd, timeout=120, check=False,
                          env={"PATH": os.defpath, "PYTHONPATH": pythonpath, "PYTHONDONTWRITEBYTECODE": "1"})
    return None if proc.returncode == 0 else ((proc.stderr or proc.stdout).strip().splitlines() or ["no message"])[-1]


@pytest.fixture(scope="module")
def nobody_cli():
    """(python, PYTHONPATH, a folder nobody can enter) to run `python -m builders.cli` as nobody from a readable copy.

    The checkout may lie under a folder nobody cannot enter (root's home is 0700 on a stock Debian, and README command
    2 makes its venv inside the checkout): the project's packages are copied into a world-readable folder first on
    PYTHONPATH. Where nobody cannot import the libraries of this interpreter's environment either, the environment's
    own interpreter runs with a copy of the third-party modules the build side imports (hard links where they can
    be). Where even that cannot run as nobody, the tests that need it are skipped with the reason in one line."""
    if not _as_nobody():
        pytest.skip("needs root and setpriv to run the build as an unprivileged user")
    base = Path(tempfile.mkdtemp(prefix="onebit-nobody-"))
    try:
        py = base / "py"
        for pkg in ("builders", "onebit"):
            shutil.copytree(ROOT / pkg, py / pkg, ignore=shutil.ignore_patterns("__pycache__"))
        _open_folders(base)
        python, paths = sys.executable, [str(py)]
        why = _nobody_imports(python, str(py), base)
        if why:
            tops = json.loads(subprocess.run([sys.executable, "-c", _THIRD_PARTY], capture_output=True,
                                             text=True, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                             timeout=300).stdout)
            site = base / "site"
            site.mkdir()
            for top in map(Path, tops):
                if top.is_dir():
                    shutil.copytree(top, site / top.name, copy_function=_link_or_copy,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    _link_or_copy(str(top), str(site / top.name))
            _open_folders(site)
            python, paths = os.path.realpath(sys.executable), [str(py), str(site)]
            why = _nobody_imports(python, os.pathsep.join(paths), base)
        if why:
            pytest.skip(f"nobody cannot run the build side even from a readable copy in {base}: {why}")
        yield python, os.pathsep.join(paths), base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("which", ["cache", "work", "out"])
def test_permission_denied_directory_is_one_line_and_nothing_changes(which, nobody_cli):
    python, pythonpath, readable = nobody_cli
    base = Path(tempfile.mkdtemp(prefix="onebit-perm-"))
    try:
        os.chmod(base, 0o755)
        mini = make_mini(base / "m")
        for d in (base, *base.rglob("*")):
            if d.is_dir():
                os.chmod(d, 0o755)
        dirs = {w: base / "runs" / w for w in ("cache", "work", "out")}
        (base / "runs").mkdir()
        os.chown(base / "runs", NOBODY, NOBODY)
        locked = base / "locked"
        locked.mkdir(mode=0o755)  # owned by root: nobody cannot write here
        dirs[which] = locked / which
        home = base / "home"
        home.mkdir()
        os.chown(home, NOBODY, NOBODY)
        before = snapshot(base / "runs", locked)
        proc = subprocess.run(
            [*AS_NOBODY, python, "-m", "builders.cli",
             "--root", str(mini.root), "--cache", str(dirs["cache"]), "--work", str(dirs["work"]), "--out", str(dirs["out"]),
             "build", "mini", "--offline"],
            capture_output=True, text=True, env={**cli_env(), "HOME": str(home), "PYTHONPATH": pythonpath,
                                                 "PYTHONDONTWRITEBYTECODE": "1"},
            cwd=readable, check=False, timeout=300)
        assert proc.returncode == 2, proc.stderr
        err = one_error_line(proc.stderr)
        assert f"cannot write the {which} directory" in err and "permission denied" in err and "nothing was changed" in err
        assert snapshot(base / "runs", locked) == before
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_oserror_reaching_the_cli_is_one_line(tmp_path, capsys, monkeypatch):
    def boom(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x"))

    from builders import cli
    monkeypatch.setattr(cli, "cmd_validate", boom)
    assert cli.main(["--root", str(ROOT), "validate"]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert f"Permission denied: {tmp_path / 'x'}" in err and "hint:" in err


# ================================================================================================ 8. EXDEV


SHM = Path("/dev/shm")


def _other_fs(a: Path, b: Path) -> bool:
    return a.is_dir() and os.stat(a).st_dev != os.stat(b).st_dev


@pytest.mark.skipif(not _other_fs(SHM, Path(tempfile.gettempdir())), reason="no second filesystem (tmpfs) here")
def test_work_and_out_on_different_filesystems(tmp_path, capsys):
    mini = make_mini(tmp_path / "m")
    work = Path(tempfile.mkdtemp(prefix="onebit-work-", dir=SHM))
    try:
        out = tmp_path / "out"
        rc = main(["--root", str(mini.root), "--cache", str(tmp_path / "cache"), "--work", str(work), "--out", str(out),
                   "build", "mini"])
        assert rc == 0, capsys.readouterr().err
        assert (out / "SHA256SUMS").is_file() and (out / "manifest.json").is_file()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no staging dir left behind
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lock.lock_path(work).unlink(missing_ok=True)


# ================================================================================================ 6. atomic swap


def _version(d: Path, n: int) -> Path:
    (d / "payload").mkdir(parents=True)
    for i in range(20):
        (d / "payload" / f"f{i}").write_text(str(n))
    (d / "VERSION").write_text(str(n))
    return d


def test_reader_never_sees_a_missing_or_partial_output(tmp_path):
    target = tmp_path / "out"
    swap.replace_dir(_version(tmp_path / "v0", 0), target)
    stop = threading.Event()
    seen: list[str] = []
    reads = [0]

    def reader():
        while not stop.is_set():
            try:
                os.stat(target / "VERSION")
                os.stat(target / "payload" / "f19")
            except FileNotFoundError as exc:
                seen.append(f"missing: {exc.filename}")
            reads[0] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        for n in range(1, 301):
            swap.replace_dir(_version(tmp_path / f"v{n}", n), target)
    finally:
        stop.set()
        t.join()
    assert seen == [], f"{len(seen)} of {reads[0]} reads saw no output: {seen[:3]}"
    assert (target / "VERSION").read_text() == "300" and reads[0] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # every old tree was removed


def test_replace_dir_swaps_a_symlinked_output_atomically(tmp_path):
    first = _version(tmp_path / "first", 1)
    target = tmp_path / "out"
    os.symlink("first", target)
    swap.replace_dir(_version(tmp_path / "second", 2), target)
    assert target.is_symlink() and (target / "VERSION").read_text() == "2"
    swap.replace_dir(_version(tmp_path / "third", 3), target)
    assert (target / "VERSION").read_text() == "3"
    assert first.is_dir()  # a tree the link pointed at but we did not create is left alone
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(".out.v-")]) == 1  # the second was removed


# ================================================================================================ 7. concurrency


def test_lock_says_who_holds_it(tmp_path):
    d = tmp_path / "out"
    with lock.hold(d, "out"):
        code = "import sys; from pathlib import Path; from builders.io import lock\nwith lock.hold(Path(sys.argv[1]), 'out', wait=False): pass"
        proc = subprocess.run([sys.executable, "-c", code, str(d)],
                              capture_output=True, text=True, env=cli_env(), check=False)
        assert proc.returncode != 0
        assert f"the out directory {d} is in use by 1bit-build pid {os.getpid()}" in proc.stderr
    with lock.hold(d, "out", wait=False):  # released: free again
        pass


def test_two_concurrent_builds_take_turns_and_the_cache_stays_consistent(tmp_path):
    mini = make_mini(tmp_path / "m")
    args = ["--root", str(mini.root), "--cache", str(tmp_path / "cache"), "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out"), "build", "mini"]
    procs = [subprocess.Popen([sys.executable, "-m", "builders.cli", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**cli_env(), "COLUMNS": "200"}, cwd=ROOT)
             for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    for rc, _out, err in results:
        assert rc == 0, err
    assert sum("waiting for 1bit-build pid" in " ".join(err.split()) for _, _, err in results) >= 1
    out = tmp_path / "out"
    for line in (out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        assert file_sha256(out / name) == digest
    cached = tmp_path / "cache" / "git" / f"{mini.commit}.git"
    fsck = subprocess.run(["git", "--git-dir", str(cached), "fsck", "--strict"], capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stderr
    leftovers = [p.name for p in (tmp_path / "cache" / "git").iterdir() if ".tmp-" in p.name]
    assert leftovers == []
    stamps = list((tmp_path / "cache" / "steps").glob("*.json"))
    assert stamps and all(yaml.safe_load(s.read_text())["key"] == s.stem for s in stamps)


# ================================================================================================ 5. excepts keep the cause


def test_a_fetch_error_mentioning_moved_is_not_mistaken_for_a_moved_tag(tmp_path):
    """Fatal fetch errors are chosen by type, not by words: a download cache under a directory named 'moved' used to
    make "not in the download cache" fatal, so the next (working) mirror was never tried."""
    mini = make_mini(tmp_path / "m")
    spec = {"package": "hello", "version": "1.0", "sha256": "0" * 64, "git_dir": "hello-1.0/.git"}
    pin = Pin(name="hello", url=f"file://{mini.upstream}", policy="branch", cadence="daily", license="MIT",
              commit=mini.commit, unresolved=None, where="pins.yaml:3",
              mirrors=(Mirror("pypi_sdist", spec), Mirror("git", f"file://{mini.upstream}")))
    how = fetch_pin(pin, tmp_path / "cache" / "git" / "x.git", tmp_path / "moved" / "downloads", offline=True)
    assert how == f"git file://{mini.upstream}"


def test_install_solver_failure_names_the_cause_and_the_channel_contents(tmp_path):
    from builders.errors import OnebitError
    from builders.ship.install import install_bundle

    channel = tmp_path / "channel"
    for sub in ("linux-64", "noarch"):
        (channel / sub).mkdir(parents=True)
        (channel / sub / "repodata.json").write_text(json.dumps({"info": {"subdir": sub}, "packages": {}, "packages.conda": {}}))
    with pytest.raises(OnebitError) as err:
        install_bundle(channel, tmp_path / "prefix", "nosuch", cache_dir=tmp_path / "pkgs")
    text = str(err.value)
    assert "cannot install onebit-bundle-nosuch" in text and "nosuch" in text.split(":", 2)[-1]
    assert "bundles in this channel: none" in text


def test_install_does_not_hide_a_bug_as_a_wrong_bundle_name(tmp_path, monkeypatch):
    import rattler

    from builders.ship.install import install_bundle

    async def broken(**kw):
        raise ZeroDivisionError("a bug, not a user mistake")

    monkeypatch.setattr(rattler, "solve", broken)
    channel = tmp_path / "channel"
    (channel / "linux-64").mkdir(parents=True)
    (channel / "linux-64" / "repodata.json").write_text("{}")
    with pytest.raises(ZeroDivisionError):
        install_bundle(channel, tmp_path / "prefix", "x")


def test_resolve_reports_a_bad_regex_and_lets_bugs_through(monkeypatch):
    from builders.errors import OnebitError
    from builders.pins import resolve as res

    pin = Pin(name="linux", url="file:///nowhere/linux", policy="tag-pattern", cadence="weekly", license="GPL-2.0-only",
              commit="a" * 40, unresolved=None, mirrors=(), raw={"tag_pattern": "^v(\\d+"}, where="pins.yaml:7")
    monkeypatch.setattr(res.gitops, "tag_commits", lambda url, where=None: {"v1": "b" * 40})
    with pytest.raises(OnebitError, match="is not a valid regular expression: missing \\)"):
        res.resolve({"linux": pin}, "linux", github=None)

    def bug(tags, pattern):
        raise KeyError("internal")

    monkeypatch.setattr(res, "newest_tag", bug)
    with pytest.raises(KeyError):
        res.resolve({"linux": pin}, "linux", github=None)
