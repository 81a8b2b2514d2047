"""fetch: verified by commit SHA, mirrors in order, offline, the sdist mirror with its sha256."""
from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

import pytest

from builders import fetch
from builders.config import Mirror, Pin
from builders.errors import FetchError
from mini_project import git, make_mini


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
