"""fetch: verified by commit SHA, mirrors in order, offline, the sdist mirror with its sha256."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from builders.project import config
from builders.inputs import fetch
from builders.project.config import Mirror, Pin
from builders.errors import FetchError
from mini_project import git, make_mini

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mini(tmp_path):
    return make_mini(tmp_path / "mini")


def pin_for(mini, *mirrors: Mirror, **kw) -> Pin:
    base = dict(name="hello", url=f"file://{mini.upstream}", policy="release", cadence="daily", license="MIT",
                commit=mini.commit, unresolved=None, mirrors=tuple(mirrors), where="pins.yaml:3: pins.hello")
    base.update(kw)
    return Pin(**base)


def test_fetch_verifies_and_caches_by_commit(mini, tmp_path):
    pin = pin_for(mini, Mirror("git", f"file://{mini.upstream}"))
    dest = tmp_path / "cache" / f"{mini.commit}.git"
    assert fetch.fetch_pin(pin, dest, tmp_path / "dl") == f"git file://{mini.upstream}"
    assert fetch.verify_commit(dest, mini.commit) is None
    assert fetch.fetch_pin(pin, dest, tmp_path / "dl") == "cache"


def test_a_commit_no_mirror_has_is_a_clear_error(mini, tmp_path):
    bogus = "1" * 40
    pin = pin_for(mini, Mirror("git", f"file://{mini.upstream}"), commit=bogus)
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(pin, tmp_path / f"{bogus}.git", tmp_path / "dl")
    text = str(err.value)
    assert f"commit {bogus} of hello could not be fetched from any mirror" in text
    assert f"1) git file://{mini.upstream}" in text and text.startswith("pins.yaml:3: pins.hello")
    assert not (tmp_path / f"{bogus}.git").exists()  # nothing half-written


def test_mirrors_are_tried_in_order(mini, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    pin = pin_for(mini, Mirror("git", f"file://{tmp_path / 'missing'}"), Mirror("git", f"file://{empty}"),
                  Mirror("git", f"file://{mini.upstream}"))
    assert fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl") == f"git file://{mini.upstream}"
    # the canonical url comes last unless listed: here it is listed, so it is not tried twice
    assert [m.spec for m in pin.fetch_order()] == [f"file://{tmp_path / 'missing'}", f"file://{empty}", f"file://{mini.upstream}"]


def test_canonical_url_is_tried_last():
    pin = Pin(name="x", url="https://example.invalid/x.git", policy="branch", cadence="daily", license="MIT",
              commit="a" * 40, unresolved=None, mirrors=(Mirror("git", "file:///m"),))
    assert [m.spec for m in pin.fetch_order()] == ["file:///m", "https://example.invalid/x.git"]


def test_offline_skips_network_mirrors_and_says_so(mini, tmp_path):
    pin = pin_for(mini, Mirror("git", "https://example.invalid/hello.git"), url="https://example.invalid/hello.git")
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl", offline=True)
    assert "1) git https://example.invalid/hello.git: skipped (offline)" in str(err.value)
    assert "run without --offline" in str(err.value)


def test_offline_uses_local_mirrors(mini, tmp_path):
    pin = pin_for(mini, Mirror("git", "https://example.invalid/hello.git"), Mirror("git", str(mini.upstream)))
    assert fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl", offline=True) == f"git {mini.upstream}"


def test_moved_tag_is_refused(mini, tmp_path):
    moved = mini.commit_upstream("main.c", "int main(void){return 0;}\n", "other")
    git(mini.upstream, "tag", "-f", "v1.0", moved)
    pin = pin_for(mini, Mirror("git", f"file://{mini.upstream}"), tag="v1.0")
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl")
    assert f"tag 'v1.0' moved: pins.yaml says {mini.commit}, file://{mini.upstream} now says {moved}" in str(err.value)
    assert "pins bump hello" in str(err.value)


def test_deleted_tag_is_refused(mini, tmp_path):
    git(mini.upstream, "tag", "-d", "v1.0")
    pin = pin_for(mini, Mirror("git", f"file://{mini.upstream}"), tag="v1.0")
    with pytest.raises(FetchError, match="tag 'v1.0' no longer exists"):
        fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl")


def make_sdist(mini, tmp_path) -> tuple[Path, str]:
    """An sdist that vendors the upstream as a submodule, with its git dir (like llama-cpp-python's)."""
    top = tmp_path / "sd" / "hello_py-1.0"
    gitdir = top / ".git" / "modules" / "vendor" / "hello"
    gitdir.parent.mkdir(parents=True)
    shutil.copytree(mini.upstream / ".git", gitdir)
    (gitdir / "config").write_text("[core]\n\tbare = false\n\tworktree = ../../../../vendor/hello\n")
    out = tmp_path / "hello_py-1.0.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(top, arcname="hello_py-1.0")
    return out, hashlib.sha256(out.read_bytes()).hexdigest()


def sdist_mirror(sha: str) -> Mirror:
    return Mirror("pypi_sdist", {"package": "hello-py", "version": "1.0", "sha256": sha,
                                 "git_dir": "hello_py-1.0/.git/modules/vendor/hello"})


def test_sdist_mirror_from_the_download_cache_offline(mini, tmp_path):
    sdist, sha = make_sdist(mini, tmp_path)
    dl = tmp_path / "dl"
    (dl / sha).mkdir(parents=True)
    shutil.copy(sdist, dl / sha / sdist.name)
    pin = pin_for(mini, sdist_mirror(sha), url="https://example.invalid/hello.git")
    assert fetch.fetch_pin(pin, tmp_path / "c.git", dl, offline=True) == f"sdist {sdist.name}"
    assert fetch.verify_commit(tmp_path / "c.git", mini.commit) is None


def test_sdist_with_wrong_sha256_is_refused(mini, tmp_path):
    sdist, sha = make_sdist(mini, tmp_path)
    dl = tmp_path / "dl"
    wrong = "f" * 64
    (dl / wrong).mkdir(parents=True)
    shutil.copy(sdist, dl / wrong / sdist.name)
    pin = pin_for(mini, sdist_mirror(wrong))
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(pin, tmp_path / "c.git", dl, offline=True)
    assert f"sha256 mismatch for cached {sdist.name}: expected {wrong}, found {sha}" in str(err.value)


def test_sdist_missing_offline(mini, tmp_path):
    pin = pin_for(mini, sdist_mirror("e" * 64), url="https://example.invalid/hello.git")
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl", offline=True)
    assert "not in the download cache" in str(err.value) and "--offline forbids downloading" in str(err.value)


def test_unresolved_pin_cannot_be_fetched(mini, tmp_path):
    pin = pin_for(mini, commit=None, unresolved="nobody knows")
    with pytest.raises(FetchError, match="unresolved: nobody knows"):
        fetch.fetch_pin(pin, tmp_path / "c.git", tmp_path / "dl")


def test_corrupt_cache_is_refetched(mini, tmp_path):
    pin = pin_for(mini, Mirror("git", f"file://{mini.upstream}"))
    dest = tmp_path / "c.git"
    dest.mkdir()
    (dest / "junk").write_text("x")
    assert fetch.fetch_pin(pin, dest, tmp_path / "dl").startswith("git ")
    assert not (dest / "junk").exists()


# ---- local mirror directories --------------------------------------------------------------------------------------
@pytest.mark.parametrize("given, env, want", [
    ((), {}, ()),
    ((), {"ONEBIT_GIT_MIRRORS": "/m"}, ("/m",)),
    ((), {"ONEBIT_GIT_MIRRORS": f"/a{os.pathsep}{os.pathsep}/b{os.pathsep}/a"}, ("/a", "/b")),  # empty and repeats dropped
    (("/opt",), {"ONEBIT_GIT_MIRRORS": "/a"}, ("/opt", "/a")),  # --mirror-dir first, then the variable
    (("/a", "/a"), {}, ("/a",)),
])
def test_mirror_dirs_options_first_then_the_variable(given, env, want):
    assert fetch.mirror_dirs(given, env) == tuple(Path(p) for p in want)


@pytest.mark.parametrize("name, url, want", [
    ("ds4", "https://github.com/antirez/ds4.git", ("ds4.git",)),
    ("ds4-rocm", "https://github.com/antirez/ds4.git", ("ds4-rocm.git", "ds4.git")),
    ("xdna-driver", "https://github.com/amd/xdna-driver.git", ("xdna-driver.git",)),
    ("zinc", "https://github.com/zolotukhin/zinc", ("zinc.git",)),  # .git added
    ("rocmfpx", "https://github.com/1bit-MONSTER/ROCmFPX.git", ("rocmfpx.git", "ROCmFPX.git")),
    ("rocmfpx-upstream", "https://github.com/charlie12345/ROCmFPX.git", ("rocmfpx-upstream.git", "ROCmFPX.git")),
    ("x", "git@example.invalid:o/y.git", ("x.git", "y.git")),
    ("x", "file:///srv/repos/y/", ("x.git", "y.git")),
])
def test_a_pin_is_looked_up_by_its_name_then_its_url(name, url, want):
    assert config.repo_names(name, url) == want


def test_mirror_dirs_come_before_the_pins_own_mirrors_and_the_url():
    pin = Pin(name="ds4-rocm", url="https://example.invalid/antirez/ds4.git", policy="branch", cadence="daily",
              license="MIT", commit="a" * 40, unresolved=None,
              mirrors=(Mirror("pypi_sdist", {"package": "p", "version": "1", "sha256": "0" * 64, "git_dir": "g"}),))
    order = [(m.kind, m.spec if m.kind != "pypi_sdist" else "sdist") for m in pin.fetch_order([Path("/a"), Path("/b")])]
    assert order == [("mirror_dir", "/a/ds4-rocm.git"), ("mirror_dir", "/a/ds4.git"), ("mirror_dir", "/b/ds4-rocm.git"),
                     ("mirror_dir", "/b/ds4.git"), ("pypi_sdist", "sdist"), ("git", pin.url)]
    assert pin.fetch_order() == pin.fetch_order([])[-2:]  # without mirror dirs: as before


def test_the_upstream_of_a_fork_pin_is_a_pin_named_upstream():
    project = config.load_project(ROOT)
    up = fetch.upstream_pin(project.pins["rocmfpx"])
    raw = project.pins["rocmfpx"].raw["upstream"]
    assert (up.name, up.url, up.commit) == ("rocmfpx-upstream", raw["url"], raw["commit"])
    assert config.repo_names(up.name, up.url)[0] == "rocmfpx-upstream.git"  # the team mirror's name for it
    assert fetch.upstream_pin(project.pins["zinc"]) is None


@pytest.mark.parametrize("paths, users, want", [
    (["data/a.bin"], [("r.yaml", ("data/*.bin",))], []),
    (["data/a.bin", "src/x.c"], [("r.yaml", ("data/*.bin",))], [("src/x.c", "r.yaml")]),
    (["data/sub/a.bin"], [("r.yaml", ("data/*.bin",))], [("data/sub/a.bin", "r.yaml")]),  # * stays in one folder
    (["data/sub/a.bin"], [("r.yaml", ("data/**/*.bin",))], []),
    (["data/a.bin"], [("r.yaml", ("data/**/*.bin",))], []),  # **/ may be no folder at all
    (["models/v.gguf"], [("r.yaml", ("models/",))], []),  # a folder covers what is under it
    (["a.bin"], [("one.yaml", ("*.bin",)), ("two.yaml", ())], [("a.bin", "two.yaml")]),  # every recipe must tolerate it
    (["a.bin"], [], [("a.bin", "")]),  # nobody said: nothing is tolerated
    (["x[1].bin"], [("r.yaml", ("x?1?.bin",))], []),  # ? is one character; brackets are literal
    (["data/a.bin"], [("r.yaml", ("data/a?bin",))], []),
    (["data/a/bin"], [("r.yaml", ("data/a?bin",))], [("data/a/bin", "r.yaml")]),  # ? never matches /
])
def test_which_absent_files_a_recipe_tolerates(paths, users, want):
    assert fetch.untolerated(paths, users) == want


BIG = "data/corpus.bin"
TOLERATES = [("recipes/hello.yaml", ("data/*.bin",))]


@pytest.fixture
def partial(mini, tmp_path):
    """The mini upstream with a large data file in the pinned commit, and a mirror dir holding a real git partial
    clone of it (--filter=blob:limit) that lacks that one blob."""
    (mini.upstream / "data").mkdir()
    (mini.upstream / BIG).write_bytes(os.urandom(64 * 1024))
    (mini.upstream / "data" / "README").write_text("the corpus\n")
    git(mini.upstream, "add", ".")
    git(mini.upstream, "commit", "-qm", "add a corpus")
    commit = git(mini.upstream, "rev-parse", "HEAD")
    mirrors = tmp_path / "mirrors"
    mirrors.mkdir()
    git(mini.upstream, "config", "uploadpack.allowFilter", "true")  # the serving side's (local transports drop -c)
    git(mirrors, "-c", "protocol.file.allow=always", "clone", "-q", "--bare", "--no-local", "--filter=blob:limit=16k",
        f"file://{mini.upstream}", "hello.git")
    big_oid = git(mini.upstream, "rev-parse", f"HEAD:{BIG}")
    missing = git(mirrors / "hello.git", "-c", "core.hooksPath=/dev/null", "rev-list", "--objects", "--missing=print",
                  "-n", "1", commit)
    assert [line for line in missing.splitlines() if line.startswith("?")] == [f"?{big_oid}"]  # really partial
    return mirrors, commit, big_oid


def offline_pin(mini, commit, **kw) -> Pin:
    """The pin as CI sees it: its canonical URL unreachable (skipped offline), no mirrors of its own."""
    return pin_for(mini, url="https://example.invalid/hello.git", commit=commit, tag=None, **kw)


def test_a_partial_clone_is_accepted_when_the_absent_files_are_tolerated(mini, partial, tmp_path):
    mirrors, commit, big_oid = partial
    dest = tmp_path / "cache" / f"{commit}.git"
    how = fetch.fetch_pin(offline_pin(mini, commit), dest, tmp_path / "dl", offline=True, mirror_dirs=[mirrors],
                          may_lack=TOLERATES)
    assert how == (f"mirror dir {mirrors / 'hello.git'} (a partial clone: 1 file(s) absent, tolerated by "
                   f"source.may_lack: {BIG})")
    record = json.loads((dest / fetch.RECORD).read_text())
    assert record == {"pin": "hello", "commit": commit, "served_by": f"mirror dir {mirrors / 'hello.git'}",
                      "absent": [[BIG, big_oid]]}
    assert fetch.absent_files(dest) == [(BIG, big_oid)]
    # the pinned commit is there with every object but the absent blob, and nothing else is missing
    assert fetch.verify_commit(dest, commit, absent_ok=[big_oid]) is None
    assert "1 object(s) of commit" in fetch.verify_commit(dest, commit)
    assert fetch.cached(dest, commit, TOLERATES)
    assert not fetch.cached(dest, commit, [("recipes/other.yaml", ())])  # a recipe that may read it refetches
    # the checkout: every present file exactly the pinned tree's, the absent one left out, a clean worktree
    src = tmp_path / "src"
    for argv in fetch.worktree_commands(str(dest), str(src), commit, [BIG]):
        subprocess.run(argv, check=True, capture_output=True)
    for name in ("CMakeLists.txt", "greet.c", "main.c", "data/README"):
        assert (src / name).read_bytes() == (mini.upstream / name).read_bytes()
    assert not (src / BIG).exists()
    assert git(src, "status", "--porcelain") == ""
    (src / "greet.c").write_text("changed\n")
    git(src, "reset", "-q", "--hard", commit)  # how a checkout is reset for new patches: the absent file stays out
    assert (src / "greet.c").read_bytes() == (mini.upstream / "greet.c").read_bytes() and not (src / BIG).exists()


def test_a_partial_clone_lacking_a_file_the_recipe_may_use_is_refused_in_one_line(mini, partial, tmp_path):
    mirrors, commit, _ = partial
    dest = tmp_path / "cache" / f"{commit}.git"
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(offline_pin(mini, commit), dest, tmp_path / "dl", offline=True, mirror_dirs=[mirrors],
                        may_lack=[("recipes/hello.yaml", ("docs/*",))])
    lines = str(err.value).splitlines()
    assert lines[1] == (f"    1) mirror dir {mirrors / 'hello.git'}: {mirrors / 'hello.git'} lacks 1 file(s) of "
                        f"{commit[:7]} that recipes/hello.yaml may use: {BIG} (not matched by its source.may_lack)")
    assert lines[2] == "    2) git https://example.invalid/hello.git: skipped (offline)"
    assert not dest.exists() and not list(dest.parent.glob(".*"))  # nothing half-written


def test_a_refused_partial_clone_falls_through_to_a_complete_mirror(mini, partial, tmp_path):
    mirrors, commit, _ = partial
    dest = tmp_path / "c.git"
    pin = offline_pin(mini, commit, mirrors=(Mirror("git", f"file://{mini.upstream}"),))
    assert fetch.fetch_pin(pin, dest, tmp_path / "dl", offline=True, mirror_dirs=[mirrors]) == f"git file://{mini.upstream}"
    assert fetch.absent_files(dest) == [] and fetch.verify_commit(dest, commit) is None
    assert fetch.read_record(dest)["served_by"] == f"git file://{mini.upstream}"


def test_a_mirror_dir_with_the_wrong_commit_is_skipped_for_the_next(mini, tmp_path):
    other = tmp_path / "other"  # the same name, another history: not the pinned commit
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    (other / "main.c").write_text("int main(void){return 1;}\n")
    git(other, "add", ".")
    git(other, "commit", "-qm", "another project")
    first, second = tmp_path / "m1", tmp_path / "m2"
    for d, up in ((first, other), (second, mini.upstream)):
        d.mkdir()
        git(d, "clone", "-q", "--bare", "--no-local", str(up), "hello.git")
    dest = tmp_path / "c.git"
    how = fetch.fetch_pin(offline_pin(mini, mini.commit), dest, tmp_path / "dl", offline=True,
                          mirror_dirs=[tmp_path / "nothing-here", first, second])
    assert how == f"mirror dir {second / 'hello.git'}"
    assert fetch.verify_commit(dest, mini.commit) is None and fetch.absent_files(dest) == []
    assert git(dest, "rev-parse", "refs/onebit/pinned") == mini.commit
    with pytest.raises(FetchError) as err:  # and when no mirror has it, each says why, in order
        fetch.fetch_pin(offline_pin(mini, "1" * 40), tmp_path / "d.git", tmp_path / "dl", offline=True,
                        mirror_dirs=[tmp_path / "nothing-here", first])
    text = str(err.value)
    assert f"1) mirror dir {first / 'hello.git'}: does not hold commit {'1' * 40}" in text
    assert f"(not in the mirror dirs: {tmp_path / 'nothing-here' / 'hello.git'})" in text


def test_a_mirror_dir_lacking_a_tree_is_refused(mini, tmp_path):
    (mini.upstream / "sub").mkdir()
    (mini.upstream / "sub" / "f.c").write_text("int f;\n")
    git(mini.upstream, "add", ".")
    git(mini.upstream, "commit", "-qm", "sub")
    commit = git(mini.upstream, "rev-parse", "HEAD")
    repo = tmp_path / "m" / "hello.git"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "--bare")
    git(repo, "fetch", "-q", str(mini.upstream), "main")  # a few objects arrive loose
    tree = git(repo, "rev-parse", f"{commit}:sub")
    (repo / "objects" / tree[:2] / tree[2:]).unlink()
    with pytest.raises(FetchError) as err:
        fetch.fetch_pin(offline_pin(mini, commit), tmp_path / "c.git", tmp_path / "dl", offline=True,
                        mirror_dirs=[tmp_path / "m"], may_lack=[("r.yaml", ("**",))])
    assert f"1) mirror dir {repo}: cannot read the objects of commit {commit}: " in str(err.value)
    assert not (tmp_path / "c.git").exists()


def test_a_moved_tag_in_a_mirror_dir_is_refused(mini, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    git(d, "clone", "-q", "--bare", "--no-local", str(mini.upstream), "hello.git")
    moved = git(d / "hello.git", "rev-parse", "HEAD^{tree}")
    git(d / "hello.git", "tag", "-f", "v1.0", git(d / "hello.git", "commit-tree", "-m", "x", moved))
    with pytest.raises(FetchError, match="tag 'v1.0' moved"):
        fetch.fetch_pin(pin_for(mini, tag="v1.0", url="https://example.invalid/hello.git"), tmp_path / "c.git",
                        tmp_path / "dl", offline=True, mirror_dirs=[d])


def test_git_runs_nothing_from_the_mirror(mini, partial, tmp_path):
    """A mirror's own config cannot make git run a program: hooks, fsmonitor and a lazy fetch are all off."""
    mirrors, commit, _ = partial
    ran = tmp_path / "ran"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {ran}\n")
    script.chmod(0o755)
    repo = mirrors / "hello.git"
    for key, value in (("core.hooksPath", str(tmp_path)), ("core.fsmonitor", str(script)),
                       ("remote.origin.url", f"ext::{script}"), ("protocol.allow", "always")):
        git(repo, "config", key, value)
    (tmp_path / "reference-transaction").write_text(script.read_text())
    (tmp_path / "reference-transaction").chmod(0o755)
    dest = tmp_path / "c.git"
    fetch.fetch_pin(offline_pin(mini, commit), dest, tmp_path / "dl", offline=True, mirror_dirs=[mirrors],
                    may_lack=TOLERATES)
    assert fetch.absent_files(dest) and not ran.exists()
    # the control: a plain git reading the absent blob from that mirror does run the mirror's program
    subprocess.run(["git", "--git-dir", str(repo), "cat-file", "-p", partial[2]], capture_output=True, timeout=60)
    assert ran.exists()


def test_a_build_from_a_partial_mirror_lists_the_absent_files_beside_its_checkout(mini, partial, tmp_path):
    """The whole flow: the fetch step consults the mirror dir first, the source step checks the pin out sparsely and
    lists what it lacks beside the checkout; a recipe that does not tolerate the absent file is refused."""
    from builders.inputs import host
    from builders.execute import Executor
    from builders.plan import all_tools, make_plan
    from builders.plan_types import Layout

    mirrors, commit, _ = partial
    mini.without_sysroot()  # built offline from a fresh cache
    data = mini.pins()
    data["pins"]["hello"].pop("tag")
    data["pins"]["hello"].update(commit=commit, url="https://example.invalid/hello.git", mirrors=[])
    mini.write_pins(data)
    recipe = mini.recipe()
    recipe["source"]["may_lack"] = ["data/*.bin"]
    mini.write_recipe(recipe)
    project = config.load_project(mini.root)
    layout = Layout(root=mini.root, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out",
                    mirror_dirs=(mirrors,))
    plan = make_plan(project, "mini", host.gather(all_tools(project, "mini")), layout)
    assert plan.step("fetch:hello").data.may_lack == (("recipes/hello.yaml", ("data/*.bin",)),)
    assert plan.step("fetch:hello").describe[0].startswith(f"from the mirror directory {mirrors / 'hello.git'}:")
    report = Executor(plan, project, offline=True).run()
    assert "build:hello" in report.ran
    src = Path(plan.step(next(s for s in report.ran if s.startswith("source:"))).data.dir)
    assert src.with_name(src.name + ".onebit-absent").read_text() == f"{BIG}\n"
    assert (src / "data" / "README").is_file() and not (src / BIG).exists()

    recipe["source"]["may_lack"] = ["docs/**"]
    mini.write_recipe(recipe)
    project = config.load_project(mini.root)
    plan = make_plan(project, "mini", host.gather(all_tools(project, "mini")), layout)
    with pytest.raises(FetchError) as err:
        Executor(plan, project, offline=True).run()
    assert f"lacks 1 file(s) of {commit[:7]} that recipes/hello.yaml may use: {BIG}" in str(err.value)


def test_the_checkout_refuses_a_cache_entry_lacking_a_file_its_recipe_may_use(mini, partial, tmp_path):
    """Defence in depth: a source step whose recipe does not tolerate what the cache entry lacks stops in one line
    before checking anything out; one that does gets the sparse commands and the list beside its checkout."""
    from builders.errors import BuildError
    from builders.execute import Executor
    from builders.plan_types import Command, Layout, Plan, Step
    from builders.steps.source import SourceData, checkout_commands

    mirrors, commit, _ = partial
    dest = tmp_path / "cache" / f"{commit}.git"
    fetch.fetch_pin(offline_pin(mini, commit), dest, tmp_path / "dl", offline=True, mirror_dirs=[mirrors],
                    may_lack=TOLERATES)
    src = tmp_path / "work" / "src" / "hello"
    layout = Layout(root=mini.root, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")

    def step(may_lack):
        add = Command(("git", "--git-dir", str(dest), "worktree", "add", "--quiet", "--force", "--detach", str(src), commit))
        return Step(id="source:hello", action="source", title="check out", key="k", commands=(add,),
                    data=SourceData(dir=str(src), pin="hello", commit=commit, patches=(), extra=(),
                                    where="recipes/hello.yaml", may_lack=may_lack))

    executor = Executor(Plan(bundle="mini", version="1", build_number=0, platform="linux-64", layout=layout, steps=[]),
                        config.load_project(mini.root))
    with pytest.raises(BuildError) as err:
        checkout_commands(executor.context(), step(("docs/**",)))
    assert str(err.value).splitlines()[0] == (f"recipes/hello.yaml: the cache entry of {commit[:7]} ({dest}) lacks {BIG}, "
                                              "which this recipe may use (no glob of its source.may_lack matches it)")
    cmds = checkout_commands(executor.context(), step(("data/*.bin",)))
    assert [c.argv for c in cmds] == fetch.worktree_commands(str(dest), str(src), commit, [BIG])
    assert src.with_name("hello.onebit-absent").read_text() == f"{BIG}\n"


@pytest.mark.parametrize("argv, env, want", [
    ([], {}, ()),
    (["--mirror-dir", "/m1", "--mirror-dir", "/m2"], {"ONEBIT_GIT_MIRRORS": "/e"}, ("/m1", "/m2", "/e")),
    ([], {"ONEBIT_GIT_MIRRORS": "/e"}, ("/e",)),
])
def test_the_mirror_dir_option_reaches_the_layout(argv, env, want, monkeypatch):
    from builders.cli import build_parser
    from builders.session import layout_for

    monkeypatch.delenv("ONEBIT_GIT_MIRRORS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = build_parser().parse_args([*argv, "plan", "cpu"])
    assert layout_for(args, "cpu").mirror_dirs == tuple(Path(p) for p in want)


# ---- a hostile mirror: special files git would block on, a git that never ends -----------------------------------
def team_mirror(name: str, tmp_path: Path) -> tuple[Path, str]:
    """(a writable copy of the team's mirror `<name>.git` in tmp_path/mirrors, the pinned commit it holds); skipped
    where no mirror directory ($ONEBIT_GIT_MIRRORS) holds it. The team's mirrors are only read."""
    pin = config.load_project(ROOT).pins[name]
    found = next((d / f"{name}.git" for d in fetch.mirror_dirs((), os.environ) if (d / f"{name}.git").is_dir()), None)
    if found is None:
        pytest.skip(f"no mirror directory holds {name}.git (set {config.MIRRORS_ENV}; `nox -s tests` uses ../shared/mirrors)")
    copy = tmp_path / "mirrors" / f"{name}.git"
    shutil.copytree(found, copy, symlinks=True)
    return copy, pin.commit


def fetch_cli(mini, tmp_path: Path, commit: str, mirrors: Path, timeout: float = 90, **env) -> subprocess.CompletedProcess:
    """`1bit-build --mirror-dir MIRRORS fetch mini --offline` (the real CLI, in its own process group) for the mini
    project pinned at `commit` of zinc's URL, which only the mirror dir can serve offline. A run past `timeout` (the
    old code blocked on the FIFO forever) is killed with its whole group and fails the test."""
    data = mini.pins()
    data["pins"]["hello"].pop("tag")
    data["pins"]["hello"].update(commit=commit, url="https://example.invalid/zinc.git", mirrors=[])
    mini.write_pins(data)
    argv = [sys.executable, "-m", "builders.cli", "--root", str(mini.root), "--cache", str(tmp_path / "cache"),
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--mirror-dir", str(mirrors),
            "fetch", "mini", "--offline"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**{k: v for k, v in os.environ.items() if k != config.MIRRORS_ENV},
                                                         "PYTHONPATH": str(ROOT), "COLUMNS": "400", **env})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"`1bit-build fetch` still running after {timeout:g} s (git blocked on the mirror)")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def processes_reading(path: Path) -> list[str]:
    """The command lines of the processes still running that name `path`."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmd:
            out.append(cmd)
    return out


@pytest.mark.parametrize("special", ["objects/info/alternates", "config"])
def test_a_mirror_holding_a_fifo_is_refused_in_one_line_before_git_runs(mini, tmp_path, special):
    """A copy of a team mirror whose objects/info/alternates (or config) is a FIFO: git would block opening it
    forever (the old fetch step did); the fetch step refuses that mirror in one line naming the file, at once."""
    repo, commit = team_mirror("zinc", tmp_path)
    (repo / special).unlink(missing_ok=True)
    (repo / special).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(repo / special)
    started = time.monotonic()
    proc = fetch_cli(mini, tmp_path, commit, repo.parent)
    took = time.monotonic() - started
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr
    line = next(ln for ln in err.splitlines() if "1) mirror dir" in ln)
    assert line.strip() == (f"1) mirror dir {repo}: refused before git cat-file ran: {repo / special} is a FIFO, "
                            "not a regular file"), err
    assert f"commit {commit} of hello could not be fetched from any mirror" in " ".join(err.split())
    assert not (tmp_path / "cache" / "git" / f"{commit}.git").exists() and processes_reading(repo) == []
    print(f"refused in {took:.1f} s")


def test_a_mirror_git_blocks_on_is_killed_at_the_deadline_in_one_line(mini, tmp_path):
    """Where the check before git runs does not look (a loose object: a repository holds too many to walk), a FIFO
    still blocks real git: the call is killed at its deadline ($ONEBIT_GIT_TIMEOUT, here 3 s) with every process it
    started, and that mirror is refused in one line naming the command and the repository."""
    team, commit = team_mirror("zinc", tmp_path / "team")
    repo = tmp_path / "mirrors" / "zinc.git"  # the team mirror's objects, loose (no pack to find the commit in)
    git(tmp_path, "init", "-q", "--bare", str(repo))
    for pack in sorted((team / "objects" / "pack").glob("*.pack")):
        with open(pack, "rb") as ins:
            subprocess.run(["git", "--git-dir", str(repo), "unpack-objects", "-q"], stdin=ins, check=True)
    if (team / "shallow").is_file():
        shutil.copy2(team / "shallow", repo / "shallow")
    loose = repo / "objects" / commit[:2] / commit[2:]
    assert loose.is_file()
    loose.unlink()
    os.mkfifo(loose)
    started = time.monotonic()
    proc = fetch_cli(mini, tmp_path, commit, repo.parent, ONEBIT_GIT_TIMEOUT="3")
    took = time.monotonic() - started
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "1) mirror dir" in ln)
    assert line.strip() == (f"1) mirror dir {repo}: git cat-file on {repo} did not finish within 3 s: killed with "
                            "every process it started"), proc.stderr
    assert processes_reading(repo) == []  # no git left blocked on the FIFO
    print(f"killed and refused in {took:.1f} s")
