"""fetch: sources into a content-addressed cache keyed by commit SHA, verified, trying mirrors in order.

A mirror is a git URL or an sdist on the Python package index that vendors the upstream with its git objects
(llama-cpp-python carries llama.cpp's). Offline, only the caches and local mirrors are used.
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import git

from .archives import ArchiveError, check_archive_file, extract_tar
from .config import Mirror, Pin, file_sha256
from .errors import FetchError
from .swap import replace_dir

Log = Callable[[str], None]


def _noop(_: str) -> None:
    pass


class NotThePinnedSource(FetchError):
    """What a mirror served is not what was pinned (a moved or deleted tag, a sha256 mismatch, an unsafe archive).
    Fatal: the next mirror is not tried, because the pin itself needs a human."""


def is_local(url: str) -> bool:
    return url.startswith("file://") or url.startswith("/")


def _unique_tmp(dest: Path) -> Path:
    """A fresh directory beside dest, named for this process and a random part, so two runs never share one."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-{os.getpid()}-", dir=dest.parent))


def verify_commit(repo_dir: Path, commit: str) -> str | None:
    """None when repo_dir holds `commit` with every object it needs; otherwise what is wrong."""
    try:
        repo = git.Repo(repo_dir)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return f"{repo_dir} is not a git repository"
    try:
        kind = repo.git.cat_file("-t", commit)
    except git.GitCommandError:
        return f"commit {commit} is not in the repository"
    if kind != "commit":
        return f"{commit} is a {kind}, not a commit"
    try:
        missing = [line for line in repo.git.rev_list("--objects", "--missing=print", "-n", "1", commit).splitlines()
                   if line.startswith("?")]
    except git.GitCommandError as exc:
        return f"objects of {commit} are unreadable: {exc.stderr.strip()}"
    if missing:
        return f"{len(missing)} object(s) of commit {commit} are missing (first: {missing[0][1:]})"
    return None


def cached(dest: Path, commit: str) -> bool:
    return dest.is_dir() and verify_commit(dest, commit) is None


def _fetch_into_new_repo(dest: Path, url: str, commit: str, *, timeout: int = 600) -> None:
    """git fetch exactly `commit` from url into a fresh bare repo at dest (atomic: written aside, renamed)."""
    tmp = _unique_tmp(dest)
    repo = git.Repo.init(tmp, bare=True)
    try:
        repo.git.fetch("--quiet", "--depth=1", "--no-tags", url, commit, kill_after_timeout=timeout,
                       env={"GIT_TERMINAL_PROMPT": "0"})
        problem = verify_commit(tmp, commit)
        if problem:
            raise FetchError(problem)
        repo.git.update_ref("refs/onebit/pinned", commit)
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remote_tag_commit(url: str, tag: str, timeout: int = 60) -> str | None:
    """The commit a tag points at on a remote (peeled), or None if the tag is absent."""
    out = git.Git().ls_remote("--tags", url, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}", kill_after_timeout=timeout,
                              env={"GIT_TERMINAL_PROMPT": "0"})
    refs = dict(reversed(line.split("\t")) for line in out.splitlines() if "\t" in line)
    return refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}")


def check_tag(pin: Pin, url: str) -> None:
    """The pin's tag must still point at its commit. A mirror may lack tags; the canonical URL may not."""
    if not pin.tag:
        return
    at = remote_tag_commit(url, pin.tag)
    if at is None and url != pin.url:
        return
    if at is None:
        raise NotThePinnedSource(f"tag {pin.tag!r} no longer exists at {url}", where=pin.where,
                         hint="the tag was deleted upstream; re-pin with `1bit-build pins bump " + pin.name + "`")
    if at != pin.commit:
        raise NotThePinnedSource(
            f"tag {pin.tag!r} moved: pins.yaml says {pin.commit}, {url} now says {at}",
            where=pin.where,
            hint="someone re-tagged upstream. Review the new commit, then re-pin it "
                 f"(`1bit-build pins bump {pin.name}`), or drop `tag:` to keep the verified old commit",
        )


@dataclass
class SdistMirror:
    spec: dict
    downloads: Path

    @property
    def dir(self) -> Path:
        return self.downloads / self.spec["sha256"]

    def find(self) -> Path | None:
        if not self.dir.is_dir():
            return None
        for f in sorted(self.dir.iterdir()):
            if f.name.endswith((".tar.gz", ".zip", ".tar.bz2")) and not f.name.startswith("."):
                return f
        return None

    def download(self, log: Log) -> Path:
        """pip download the sdist by name, check its sha256, keep it in downloads/<sha256>/."""
        req = f"{self.spec['package']}=={self.spec['version']}"
        with tempfile.TemporaryDirectory(prefix="onebit-dl-", dir=self.downloads.parent if self.downloads.parent.exists() else None) as tmp:
            log(f"pip download {req} (sdist)")
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", self.spec["package"], "--dest", tmp,
                 "--disable-pip-version-check", "--quiet", req],
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                raise FetchError(f"pip could not download {req}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
            files = [p for p in Path(tmp).iterdir() if p.is_file()]
            if len(files) != 1:
                raise FetchError(f"pip download {req} gave {len(files)} files, expected one sdist")
            got = file_sha256(files[0])
            if got != self.spec["sha256"]:
                raise NotThePinnedSource(
                    f"sha256 mismatch for {files[0].name}: pins.yaml expects {self.spec['sha256']}, the index served {got}",
                    hint="the file on the index is not the one pinned: do not build from it. If the pin is wrong, "
                         "fix pins.yaml's sha256 after checking the file by hand",
                )
            self.dir.mkdir(parents=True, exist_ok=True)
            final = self.dir / files[0].name
            shutil.move(str(files[0]), str(final.with_name("." + final.name + ".part")))
            os.replace(final.with_name("." + final.name + ".part"), final)
            return final

    def git_dir(self, sdist: Path, into: Path) -> Path:
        """Unpack only the vendored git dir of the sdist."""
        got = file_sha256(sdist)
        if got != self.spec["sha256"]:
            raise NotThePinnedSource(
                f"sha256 mismatch for cached {sdist.name}: expected {self.spec['sha256']}, found {got}",
                hint=f"the download cache is corrupt; delete {sdist.parent} and fetch again",
            )
        prefix = self.spec["git_dir"].rstrip("/") + "/"
        try:  # every member is checked (no '..', absolute path or link) before any is written
            found = extract_tar(sdist, into, select=lambda name: name.startswith(prefix))
        except ArchiveError as exc:
            raise NotThePinnedSource(exc.what, where=exc.where, hint=exc.hint) from None
        if not found:
            raise FetchError(f"{sdist.name} has no {self.spec['git_dir']}",
                             hint="this sdist does not carry the upstream's git objects; fix git_dir in pins.yaml")
        gdir = into / self.spec["git_dir"]
        # A vendored submodule git dir points at a work tree that is not unpacked: serve it as a bare repo.
        cfg = git.GitConfigParser(str(gdir / "config"), read_only=False)
        cfg.set_value("core", "bare", "true")
        if cfg.has_option("core", "worktree"):
            cfg.remove_option("core", "worktree")
        cfg.write()
        cfg.release()
        return gdir


def fetch_pin(pin: Pin, dest: Path, downloads: Path, *, offline: bool = False, log: Log = _noop) -> str:
    """Make dest a bare repo holding pin.commit. Returns how it was obtained. Raises FetchError naming every mirror tried."""
    if pin.commit is None:
        raise FetchError(f"pin {pin.name!r} is unresolved: {pin.unresolved}", where=pin.where,
                         hint=f"resolve it with `1bit-build pins bump {pin.name}`")
    if cached(dest, pin.commit):
        return "cache"
    failures: list[str] = []
    for i, mirror in enumerate(pin.fetch_order(), 1):
        label = f"{i}) {mirror.describe()}"
        try:
            how = _try_mirror(pin, mirror, dest, downloads, offline=offline, log=log)
        except NotThePinnedSource:
            raise
        except FetchError as exc:  # this mirror cannot serve it: try the next
            failures.append(f"{label}: {exc.what}")
            continue
        except git.GitCommandError as exc:
            failures.append(f"{label}: {(exc.stderr or str(exc)).strip().splitlines()[-1] if (exc.stderr or str(exc)).strip() else exc}")
            continue
        if how is None:
            failures.append(f"{label}: skipped (offline)")
            continue
        return how
    raise FetchError(
        f"commit {pin.commit} of {pin.name} could not be fetched from any mirror:\n    " + "\n    ".join(failures),
        where=pin.where,
        hint="run without --offline to download, add a mirror that has this commit, or check the commit in pins.yaml"
        if offline else "add a mirror that has this commit, or check the commit in pins.yaml",
    )


def _try_mirror(pin: Pin, mirror: Mirror, dest: Path, downloads: Path, *, offline: bool, log: Log) -> str | None:
    if mirror.kind == "pypi_sdist":
        sd = SdistMirror(mirror.spec, downloads)
        sdist = sd.find()
        if sdist is None:
            if offline:
                raise FetchError(f"not in the download cache ({sd.dir}) and --offline forbids downloading")
            sdist = sd.download(log)
        with tempfile.TemporaryDirectory(prefix="onebit-sdist-") as tmp:
            gdir = sd.git_dir(sdist, Path(tmp))
            log(f"git fetch {pin.short} from {sdist.name}:{mirror.spec['git_dir']}")
            _fetch_into_new_repo(dest, str(gdir), pin.commit)
        return f"sdist {sdist.name}"
    url = mirror.spec
    if offline and not is_local(url):
        return None
    check_tag(pin, url)  # before fetching: a commit under a moved tag never enters the cache
    log(f"git fetch {pin.short} from {url}")
    _fetch_into_new_repo(dest, url, pin.commit)
    return f"git {url}"


# pip's platform tags for the interpreters `bin/1bit` runs on (x86_64 Linux, glibc >= 2.17)
MANYLINUX = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def python_tag(python: str) -> str:
    """'3.12' -> 'cp312': the folder of a CPython minor's wheel set."""
    major, _, minor = python.partition(".")
    return f"cp{major}{minor}"


def target_args(python: str) -> list[str]:
    """pip arguments that pick wheels for a CPython minor ('3.12') on x86_64 Linux, whichever Python runs pip."""
    args = ["--python-version", python, "--implementation", "cp"]
    for platform in MANYLINUX:
        args += ["--platform", platform]
    return args


MAX_DOWNLOAD = 4 << 30  # bytes: the stated bound of one downloaded wheel (pip cannot be told a pinned size)


def _capped_files() -> None:
    """In pip's process: no file it writes may grow past MAX_DOWNLOAD (the kernel stops it: SIGXFSZ), so a server
    cannot fill the disk before the sha256 is checked."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_DOWNLOAD, MAX_DOWNLOAD))


def fetch_wheel_file(package: str, version: str, sha256: str, downloads: Path, *, offline: bool = False,
                     log: Log = _noop) -> Path:
    """One wheel of a toolchain input (NVIDIA's CUDA wheels), downloaded by name and version into downloads/<sha256>/
    and checked against its pinned sha256; the cached file is checked again on every use."""
    where = downloads / sha256
    wheel = next((f for f in sorted(where.glob("*.whl"))), None) if where.is_dir() else None
    if wheel is not None and file_sha256(wheel) == sha256:
        return wheel
    if offline:
        raise FetchError(f"{package}=={version} is not in the download cache ({where}) and --offline forbids downloading",
                         hint="run `1bit-build fetch BUNDLE` once with network, or carry the cache's downloads/ over")
    log(f"pip download {package}=={version}")
    tmp = _unique_tmp(where)
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--disable-pip-version-check", "--quiet", "--no-cache-dir", "--dest", str(tmp),
                               f"{package}=={version}"], capture_output=True, text=True, preexec_fn=_capped_files)
        if proc.returncode != 0:
            raise FetchError(f"pip could not download {package}=={version}: {proc.stderr.strip()[-400:]}")
        wheel = next(tmp.glob("*.whl"))
        got = file_sha256(wheel)
        if got != sha256:
            raise NotThePinnedSource(f"{wheel.name}: sha256 {got} does not match the recipe's {sha256}",
                                     hint="the package index served other bytes than were pinned; check the version, "
                                          "then update the recipe's toolchain wheel sha256 only after review")
        replace_dir(tmp, where)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return where / wheel.name


def fetch_wheels(requirements: list[str], dest: Path, pythons: list[str], *, offline: bool = False,
                 log: Log = _noop) -> str:
    """The wheels of `requirements` (the whole closure, each by exact version: nothing is resolved here) for each
    CPython minor in `pythons`, one folder each (dest/cp312/...), written aside and swapped into place."""
    stamp = dest / ".complete"
    want = sorted(requirements) + [f"python {p}" for p in sorted(pythons)]
    if stamp.is_file() and stamp.read_text().split("\n") == want:
        return "cache"
    if offline:
        raise FetchError(f"wheels for {', '.join(requirements)} are not in the cache ({dest}) and --offline forbids downloading",
                         hint="run `1bit-build fetch BUNDLE` once with network")
    tmp = _unique_tmp(dest)
    try:
        for python in sorted(pythons):
            log(f"pip download {len(requirements)} wheel(s) for CPython {python}")
            into = tmp / python_tag(python)
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                   "--dest", str(into), "--disable-pip-version-check", "--quiet", *target_args(python),
                                   *requirements], capture_output=True, text=True, preexec_fn=_capped_files)
            if proc.returncode != 0:
                raise FetchError(f"pip could not download the wheels for CPython {python}: {proc.stderr.strip()[-400:]}")
            for wheel in sorted(into.glob("*.whl")):  # refuse a wheel that would write outside its install dir
                try:
                    check_archive_file(wheel)
                except ArchiveError as exc:
                    raise NotThePinnedSource(exc.what, where=exc.where, hint=exc.hint) from None
        (tmp / ".complete").write_text("\n".join(want))
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return "downloaded"
