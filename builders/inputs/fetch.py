"""fetch: sources into a content-addressed cache keyed by commit SHA, verified, trying mirrors in order.

A mirror is a git URL or an sdist on the Python package index that vendors the upstream with its git objects
(llama-cpp-python carries llama.cpp's), or a repository of a local mirror directory (`--mirror-dir`,
$ONEBIT_GIT_MIRRORS), consulted first. Offline, only the caches and local mirrors are used. Every cache entry records
which mirror served it (onebit-fetch.json); one copied from a partial clone also lists the files it lacks
(docs/mirrors.md).
"""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import git

from ..io import gitcmd
from ..io.archives import ArchiveError, check_archive_file, extract_tar
from ..project.config import MIRRORS_ENV, Mirror, Pin, file_sha256
from ..errors import FetchError
from ..io.swap import ABSENT, mark, offline_refusal, replace_dir, why_untrusted, write_text_atomic

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


def verify_commit(repo_dir: Path, commit: str, absent_ok: Iterable[str] = ()) -> str | None:
    """None when repo_dir holds `commit` with every object it needs (but the blobs in `absent_ok`, which a cache entry
    copied from a partial clone records as absent); otherwise what is wrong."""
    if not Path(repo_dir).is_dir():
        return f"{repo_dir} is not a git repository"
    kind = _git(Path(repo_dir), "cat-file", "-t", commit, check=False)
    if kind.returncode != 0:
        if b"not a git repository" in kind.stderr:
            return f"{repo_dir} is not a git repository"
        return f"commit {commit} is not in the repository"
    if kind.stdout.decode().strip() != "commit":
        return f"{commit} is a {kind.stdout.decode().strip()}, not a commit"
    allowed = set(absent_ok)
    walk = _git(Path(repo_dir), "rev-list", "--objects", "--missing=print", "-n", "1", commit, check=False)
    if walk.returncode != 0:
        return f"objects of {commit} are unreadable: {walk.stderr.decode(errors='replace').strip()}"
    missing = [line for line in walk.stdout.decode(errors="replace").splitlines()
               if line.startswith("?") and line[1:] not in allowed]
    if missing:
        return f"{len(missing)} object(s) of commit {commit} are missing (first: {missing[0][1:]})"
    return None


# ---- what a cache entry records: the mirror that served it, and the files it lacks --------------------------------
RECORD = "onebit-fetch.json"  # inside the cache's bare repo: {"pin", "commit", "served_by", "absent": [[path, oid]]}

# (where, globs): one recipe that uses a pin, with its `source.may_lack` globs (relative to the pin's tree)
MayLack = tuple[str, tuple[str, ...]]


def read_record(repo_dir: Path) -> dict:
    """The entry's record ({} when it has none, or one that is not a bounded regular JSON file: builders/io/readfile.py)."""
    from ..io.readfile import UnreadableFile, read_json
    from ..io.swap import MAX_RECORD

    try:
        data = read_json(Path(repo_dir) / RECORD, MAX_RECORD)
    except UnreadableFile:
        return {}
    return data if isinstance(data, dict) else {}


def absent_files(repo_dir: Path) -> list[tuple[str, str]]:
    """(path, blob id) of every file of the pinned tree that this cache entry lacks (copied from a partial clone)."""
    return [(str(p), str(o)) for p, o in read_record(repo_dir).get("absent", [])]


def _write_record(repo_dir: Path, pin: str, commit: str, served_by: str, absent: Sequence[tuple[str, str]] = ()) -> None:
    write_text_atomic(Path(repo_dir) / RECORD, json.dumps(
        {"pin": pin, "commit": commit, "served_by": served_by, "absent": [list(a) for a in absent]}, indent=1) + "\n")


def glob_regex(glob: str) -> re.Pattern:
    """A `source.may_lack` glob as a regex over a path of the tree: `**` any number of folders, `*` and `?` within one
    name; a glob ending in `/` or `/**` covers everything under that folder."""
    if glob.endswith("/"):
        glob += "**"
    out = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def untolerated(paths: Iterable[str], users: Sequence[MayLack]) -> list[tuple[str, str]]:
    """Pure: (path, where) for each absent path that some recipe using the pin does not tolerate (no glob of its
    `source.may_lack` matches it), in path order. With no recipe named, nothing is tolerated."""
    bad = []
    for path in sorted(set(paths)):
        if not users:
            bad.append((path, ""))
            continue
        for where, globs in users:
            if not any(glob_regex(g).match(path) for g in globs):
                bad.append((path, where))
                break
    return bad


def cached(dest: Path, commit: str, may_lack: Sequence[MayLack] = ()) -> bool:
    """dest holds commit with all its objects, or lacks only files that every recipe in `may_lack` tolerates."""
    if not dest.is_dir():
        return False
    absent = absent_files(dest)
    if absent and untolerated([p for p, _ in absent], may_lack):
        return False
    return verify_commit(dest, commit, absent_ok=[o for _, o in absent]) is None


def _fetch_into_new_repo(dest: Path, url: str, commit: str, *, timeout: float | None = None, pin: str = "",
                         served_by: str = "") -> None:
    """git fetch exactly `commit` from url into a fresh bare repo at dest (atomic: written aside, renamed). Through
    builders/io/gitcmd.py: hardened, with a deadline (`timeout`, else gitcmd's for a fetch), a local url refused before
    git runs when it holds a special file."""
    tmp = _unique_tmp(dest)
    try:
        gitcmd.run(["init", "--quiet", "--bare", str(tmp)], check=True)
        proc = gitcmd.run(["--git-dir", str(tmp), "fetch", "--quiet", "--depth=1", "--no-tags", url, commit],
                          timeout=timeout)
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines()
            raise FetchError(err[-1] if err else f"git fetch exit {proc.returncode}")
        problem = verify_commit(tmp, commit)
        if problem:
            raise FetchError(problem)
        gitcmd.run(["--git-dir", str(tmp), "update-ref", "refs/onebit/pinned", commit], check=True)
        _write_record(tmp, pin, commit, served_by or f"git {url}")
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remote_tag_commit(url: str, tag: str, timeout: float = 60) -> str | None:
    """The commit a tag points at on a remote (peeled), or None if the tag is absent."""
    proc = gitcmd.run(["ls-remote", "--tags", url, f"refs/tags/{tag}", f"refs/tags/{tag}^{{}}"], timeout=timeout)
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        raise FetchError(f"cannot list the tags of {url}: {err[-1] if err else proc.returncode}")
    refs = dict(reversed(line.split("\t")) for line in proc.stdout.splitlines() if "\t" in line)
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


# ---- local mirror directories: `<name>.git` bare repositories, consulted before a pin's own mirrors -------------
def mirror_dirs(given: Sequence[str | Path] | None, env: Mapping[str, str]) -> tuple[Path, ...]:
    """Pure: the mirror directories in the order they are consulted: `--mirror-dir` options first (`given`), then
    $ONEBIT_GIT_MIRRORS (os.pathsep-separated); empty entries and repeats dropped."""
    out: list[Path] = []
    for d in [*(given or ()), *env.get(MIRRORS_ENV, "").split(os.pathsep)]:
        if str(d).strip() and Path(d) not in out:
            out.append(Path(d))
    return tuple(out)


def upstream_pin(pin: Pin) -> Pin | None:
    """The base a fork pin is rebased on (`upstream: {url, commit}` in pins.yaml) as a pin of its own, named
    `<pin>-upstream`, or None where the pin records no upstream commit."""
    up = pin.raw.get("upstream") or {}
    if not up.get("commit") or not up.get("url"):
        return None
    return Pin(name=f"{pin.name}-upstream", url=up["url"], policy=pin.policy, cadence=pin.cadence, license=pin.license,
               commit=up["commit"], unresolved=None, mirrors=(), branch=up.get("branch"), raw={}, where=pin.where)


# git reads nothing but the mirror's objects: hardened the one way (builders/io/gitcmd.py: no system or global config, no
# hooks, no fsmonitor, no filter driver), no gc, and never a lazy fetch from a partial clone's promisor remote (which
# would go to the network).
_NO_GC = ("-c", "gc.auto=0", "-c", "maintenance.auto=false")
_MIRROR_ENV = {"HOME": os.devnull, "LC_ALL": "C", "GIT_NO_LAZY_FETCH": "1"}


def _git(repo: Path, *args: str, stdin=None, stdout=subprocess.PIPE, check: bool = True) -> subprocess.CompletedProcess:
    """git on `repo` (builders/io/gitcmd.py: hardened, with a deadline, refused when the repository holds a special
    file), output as bytes; FetchError when it fails and `check`."""
    proc = gitcmd.run([*_NO_GC, "-c", f"safe.directory={repo}", "--git-dir", str(repo), *args], text=False,
                      extra_env=_MIRROR_ENV, allow_file=False, stdin=stdin, stdout=stdout)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise FetchError(f"git {args[0]} failed: {err[-1] if err else proc.returncode}")
    return proc


def tree_absent(repo: Path, commit: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(every object id of the pinned commit that `repo` holds, (path, blob id) of each file of its tree it lacks).
    Read without any fetch; raises FetchError when the commit, or one of its trees, is not there."""
    kind = _git(repo, "cat-file", "-t", commit, check=False)
    if kind.returncode != 0 or kind.stdout.decode().strip() != "commit":
        raise FetchError(f"does not hold commit {commit}")
    walk = _git(repo, "rev-list", "--objects", "--missing=print", "-n", "1", commit, check=False)
    if walk.returncode != 0:  # a tree (or the commit's own data) cannot be read: no file list can be trusted
        err = walk.stderr.decode(errors="replace").strip().splitlines()
        raise FetchError(f"cannot read the objects of commit {commit}: {err[0] if err else walk.returncode}")
    listing = walk.stdout.decode().splitlines()
    present = [line.split(" ", 1)[0] for line in listing if line and not line.startswith("?")]
    missing = {line[1:] for line in listing if line.startswith("?")}
    absent: list[tuple[str, str]] = []
    if missing:
        ls = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit, check=False)
        if ls.returncode != 0:  # a tree is absent: which files there are cannot be known
            err = ls.stderr.decode(errors="replace").strip().splitlines()
            raise FetchError(f"cannot read the objects of commit {commit}: {err[0] if err else ls.returncode} "
                             "(a tree is absent: not a usable partial clone)")
        tree = ls.stdout.decode(errors="surrogateescape")
        for entry in filter(None, tree.split("\0")):
            meta, path = entry.split("\t", 1)
            _mode, kind_, oid = meta.split(" ")
            if kind_ == "blob" and oid in missing:
                absent.append((path, oid))
        unexplained = missing - {oid for _, oid in absent}
        if unexplained:  # a tree (or the commit's own objects) is absent: no file list can be trusted
            raise FetchError(f"lacks {len(unexplained)} object(s) of commit {commit} that are not files "
                             f"(first: {sorted(unexplained)[0]}): not a usable partial clone")
    return present, sorted(absent)


def copy_from_mirror_dir(pin: Pin, repo: Path, dest: Path, may_lack: Sequence[MayLack], log: Log = _noop) -> str:
    """Copy the pinned commit's objects from a mirror-dir repository into a fresh cache entry at dest (aside, then
    swapped in). A partial clone is accepted when every file it lacks is one that each recipe using the pin tolerates
    (`source.may_lack`); the cache entry then records those files. The objects are re-hashed by index-pack, and the
    copy is checked to lack exactly the files recorded."""
    assert pin.commit is not None
    present, absent = tree_absent(repo, pin.commit)
    if pin.tag:  # a mirror may lack the tag; where it has it, it must point at the pinned commit
        at = _git(repo, "rev-parse", "--verify", "--quiet", f"refs/tags/{pin.tag}^{{commit}}", check=False)
        if at.returncode == 0 and at.stdout.decode().strip() != pin.commit:
            raise NotThePinnedSource(f"tag {pin.tag!r} moved: pins.yaml says {pin.commit}, {repo} says "
                                     f"{at.stdout.decode().strip()}", where=pin.where,
                                     hint=f"check the mirror, or re-pin with `1bit-build pins bump {pin.name}`")
    bad = untolerated([p for p, _ in absent], may_lack)
    if bad:
        who = f"{bad[0][1]} may use" if bad[0][1] else "the recipe may use"
        raise FetchError(f"{repo} lacks {len(bad)} file(s) of {pin.short} that {who}: "
                         + ", ".join(p for p, _ in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
                         + " (not matched by its source.may_lack)")
    tmp = _unique_tmp(dest)
    try:
        gitcmd.run([*_NO_GC, "init", "--quiet", "--bare", str(tmp)], check=True, allow_file=False, extra_env=_MIRROR_ENV)
        ids = tmp / "onebit-objects"
        ids.write_text("".join(f"{oid}\n" for oid in present))
        log(f"copy {len(present)} object(s) of {pin.short} from {repo}" + (f" ({len(absent)} file(s) absent)" if absent else ""))
        pack_file = tmp / "onebit-objects.pack"  # one call at a time, each with its deadline: no pipe between two gits
        with open(ids, "rb") as ins, open(pack_file, "wb") as outs:
            pack = _git(repo, "pack-objects", "--stdout", "-q", stdin=ins, stdout=outs, check=False)
        if pack.returncode == 0:
            with open(pack_file, "rb") as ins:
                index = _git(tmp, "index-pack", "--stdin", stdin=ins, check=False)
        if pack.returncode != 0 or index.returncode != 0:
            why = (pack.stderr if pack.returncode != 0 else index.stderr).decode(errors="replace").strip()
            raise FetchError(f"could not copy the objects of {pin.short}: {why.splitlines()[-1] if why else 'git failed'}")
        ids.unlink()
        pack_file.unlink()
        header = _git(repo, "cat-file", "commit", pin.commit).stdout.decode(errors="replace").split("\n\n", 1)[0]
        if any(line.startswith("parent ") for line in header.splitlines()):  # only the pinned commit is copied: its parents are the shallow boundary, as after --depth=1
            (tmp / "shallow").write_text(pin.commit + "\n")
        _git(tmp, "update-ref", "refs/onebit/pinned", pin.commit)
        problem = verify_commit(tmp, pin.commit, absent_ok=[o for _, o in absent])
        if problem:
            raise FetchError(problem)
        _write_record(tmp, pin.name, pin.commit, f"mirror dir {repo}", absent)
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    how = f"mirror dir {repo}"
    if absent:
        shown = ", ".join(p for p, _ in absent[:10]) + (f" and {len(absent) - 10} more" if len(absent) > 10 else "")
        how += f" (a partial clone: {len(absent)} file(s) absent, tolerated by source.may_lack: {shown})"
    return how


def fetch_pin(pin: Pin, dest: Path, downloads: Path, *, offline: bool = False, log: Log = _noop,
              mirror_dirs: Sequence[Path] = (), may_lack: Sequence[MayLack] = ()) -> str:
    """Make dest a bare repo holding pin.commit. Returns how it was obtained (which mirror served it; also recorded in
    dest/onebit-fetch.json). Raises FetchError naming every mirror tried.

    mirror_dirs: local mirror directories, consulted first (repo_names says under which names); may_lack: the
    recipes using the pin and the absent files each tolerates in a partial clone."""
    if pin.commit is None:
        raise FetchError(f"pin {pin.name!r} is unresolved: {pin.unresolved}", where=pin.where,
                         hint=f"resolve it with `1bit-build pins bump {pin.name}`")
    if cached(dest, pin.commit, may_lack):
        return "cache"
    failures: list[str] = []
    not_there: list[str] = []
    i = 0
    for mirror in pin.fetch_order(mirror_dirs):
        if mirror.kind == "mirror_dir" and not Path(mirror.spec).is_dir():
            not_there.append(mirror.spec)
            continue
        i += 1
        label = f"{i}) {mirror.describe()}"
        try:
            how = _try_mirror(pin, mirror, dest, downloads, offline=offline, log=log, may_lack=may_lack)
        except NotThePinnedSource:
            raise
        except FetchError as exc:  # this mirror cannot serve it: try the next
            failures.append(f"{label}: {exc.what}")
            continue
        if how is None:
            failures.append(f"{label}: skipped (offline)")
            continue
        return how
    if not_there:
        failures.append(f"(not in the mirror dirs: {', '.join(not_there)})")
    raise FetchError(
        f"commit {pin.commit} of {pin.name} could not be fetched from any mirror:\n    " + "\n    ".join(failures),
        where=pin.where,
        hint="run without --offline to download, add a mirror that has this commit, or check the commit in pins.yaml"
        if offline else "add a mirror that has this commit, or check the commit in pins.yaml",
    )


def _try_mirror(pin: Pin, mirror: Mirror, dest: Path, downloads: Path, *, offline: bool, log: Log,
                may_lack: Sequence[MayLack] = ()) -> str | None:
    if mirror.kind == "mirror_dir":
        return copy_from_mirror_dir(pin, Path(mirror.spec), dest, may_lack, log)
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
            _fetch_into_new_repo(dest, str(gdir), pin.commit, pin=pin.name, served_by=f"sdist {sdist.name}")
        return f"sdist {sdist.name}"
    url = mirror.spec
    if offline and not is_local(url):
        return None
    check_tag(pin, url)  # before fetching: a commit under a moved tag never enters the cache
    log(f"git fetch {pin.short} from {url}")
    _fetch_into_new_repo(dest, url, pin.commit, pin=pin.name)
    return f"git {url}"


# ---- a checkout of a cache entry that lacks files: sparse, so git never reads what is absent ----------------------
ABSENT_FILE = ".onebit-absent"  # beside a checkout (<src>.onebit-absent): the files its cache entry lacks


def _sparse_pattern(path: str) -> str:
    """A gitignore-style pattern that excludes exactly this path (its special characters escaped)."""
    escaped = re.sub(r"([\\*?\[\]!#])", r"\\\1", path)
    if escaped.endswith(" "):
        escaped = escaped[:-1] + "\\ "
    return "!/" + escaped


def worktree_commands(git_dir: str, dest: str, commit: str, absent: Sequence[str]) -> list[tuple[str, ...]]:
    """Pure: the commands that make `dest` a worktree of `commit` from the cache entry at git_dir. With files absent, a
    sparse checkout leaves them out (skip-worktree), so git never reads them and a later reset keeps them out."""
    add = ("git", "--git-dir", git_dir, "worktree", "add", "--quiet", "--force", "--detach")
    if not absent:
        return [add + (dest, commit)]
    # run as plan commands: the executor hardens every git call (builders/io/gitcmd.py)
    return [add + ("--no-checkout", dest, commit),
            ("git", "-C", dest, "sparse-checkout", "set", "--no-cone", "/*", *(_sparse_pattern(p) for p in absent)),
            ("git", "-C", dest, "reset", "--quiet", "--hard", commit)]


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


def wheels_key(requirements: Sequence[str], pythons: Sequence[str]) -> str:
    """Pure: what a wheels entry's .complete names: every requirement and CPython it was fetched for, sorted."""
    return "\n".join(sorted(requirements) + [f"python {p}" for p in sorted(pythons)])


def wheels_untrusted(dest: Path, requirements: Sequence[str], pythons: Sequence[str]) -> str | None:
    """None when `dest` holds the wheels of exactly these requirements and CPythons (its .complete names them:
    swap.why_untrusted); otherwise why not (swap.ABSENT when nothing is there)."""
    return why_untrusted(dest, wheels_key(requirements, pythons))


def fetch_wheels(requirements: list[str], dest: Path, pythons: list[str], *, offline: bool = False,
                 log: Log = _noop) -> str:
    """The wheels of `requirements` (the whole closure, each by exact version: nothing is resolved here) for each
    CPython minor in `pythons`, one folder each (dest/cp312/...), written aside and swapped into place."""
    why = wheels_untrusted(dest, requirements, pythons)
    if why is None:
        return "cache"
    if offline:
        raise offline_refusal(f"wheels for {', '.join(requirements)} are", why, dest)
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
        mark(tmp, wheels_key(requirements, pythons))
        replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return "downloaded" if why == ABSENT else f"downloaded again: the wheels there were not trusted ({why})"
