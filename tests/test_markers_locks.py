"""Cache entries whose marker cannot be forged, and locks that cannot be redirected (issue 27).

A tiny build root (one .deb built here, served from a Debian archive on disk, resolved and assembled by the real
`1bit-build roots` commands): a `.complete` that is empty, names another key, or stands beside a missing, unparsable or
foreign onebit-root.json is not trusted; the root is assembled again aside and swapped into place, and the run says why
in one line. A `<dest>.lock` planted as a link (or a hard link) to a victim file leaves the victim untouched; a FIFO or
a directory there is refused in one line without a hang. The same lock helper guards Lemonade's cache and config."""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from builders.inputs import companions, fetch, toolchain
from builders.roots import debs, assemble as roots
from builders.io import swap
from builders.cli import main
from builders.project.config import DebInput, file_sha256
from builders.project.root_pins import load_roots
from test_debs import _info, make_deb

TOP = Path(__file__).resolve().parent.parent
ROOT_YAML = "schema_version: 1\nname: t\nsummary: a one-package root\nessential: false\nsuites: [{suite: sid}]\npackages: [tool]\n"
TOOL = [_info("./", kind=tarfile.DIRTYPE, mode=0o755), _info("./usr/", kind=tarfile.DIRTYPE, mode=0o755),
        _info("./usr/bin/", kind=tarfile.DIRTYPE, mode=0o755),
        _info("./usr/bin/tool", data=b"#!/bin/sh\necho tool\n", mode=0o755)]


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A project whose roots/t.yaml is resolved (`1bit-build roots resolve t`) against a Debian archive on disk
    holding one package built here; returns (project, cache, the root's pin)."""
    archive = tmp_path / "debian"
    pool = "pool/main/t/tool/tool_1.0-1_amd64.deb"
    (archive / pool).parent.mkdir(parents=True)
    make_deb(archive / pool, TOOL)
    size = (archive / pool).stat().st_size
    index = archive / "dists" / "sid" / "main" / "binary-amd64" / "Packages.xz"
    index.parent.mkdir(parents=True)
    index.write_bytes(lzma.compress(f"Package: tool\nVersion: 1.0-1\nArchitecture: amd64\nFilename: {pool}\n"
                                    f"Size: {size}\nSHA256: {file_sha256(archive / pool)}\n".encode()))
    monkeypatch.setenv(debs.MIRROR_ENV, archive.as_uri())
    monkeypatch.delenv(roots.SNAPSHOT_ENV, raising=False)
    project = tmp_path / "project"
    (project / "roots").mkdir(parents=True)
    (project / "roots" / "t.yaml").write_text(ROOT_YAML)
    assert main(["--root", str(project), "roots", "resolve", "t"]) == 0
    found, problems = load_roots(project / "roots")
    assert not problems and [d.package for d in found["t"].resolved] == ["tool"]
    return project, tmp_path / "cache", found["t"]


def assemble(project: Path, cache: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["--root", str(project), "--cache", str(cache), "roots", "assemble", "t"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def _empty_marker_only(dest: Path, key: str) -> None:  # the attack as found: a directory holding only an empty .complete
    for p in sorted(dest.rglob("*"), reverse=True):
        p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
    (dest / ".complete").write_text("")


def _other_key(dest: Path, key: str) -> None:
    (dest / ".complete").write_text("0" * 64 + "\n")


def _record_missing(dest: Path, key: str) -> None:
    (dest / roots.METADATA).unlink()


def _record_unparsable(dest: Path, key: str) -> None:
    (dest / roots.METADATA).write_text('{"key": "' + key)


def _record_of_another_key(dest: Path, key: str) -> None:
    meta = json.loads((dest / roots.METADATA).read_text())
    (dest / roots.METADATA).write_text(json.dumps({**meta, "key": "f" * 64}))


def _marker_a_link_to_dev_zero(dest: Path, key: str) -> None:
    (dest / ".complete").unlink()
    (dest / ".complete").symlink_to("/dev/zero")


@pytest.mark.parametrize("forge, why", [
    (_empty_marker_only, "its .complete is empty"),
    (_other_key, "its .complete names another key (0000"),
    (_record_missing, f"its record {roots.METADATA} is missing"),
    (_record_unparsable, f"its record {roots.METADATA} is not JSON"),
    (_record_of_another_key, f"its record {roots.METADATA} names another key (ffff"),
    (_marker_a_link_to_dev_zero, "its .complete is a link (to /dev/zero), not a regular file"),
])
def test_a_forged_root_marker_is_not_trusted_the_root_is_assembled_again(tiny, capsys, forge, why):
    project, cache, pin = tiny
    dest = pin.dest(cache)
    rc, out = assemble(project, cache, capsys)
    assert rc == 0 and "1 Debian package(s) assembled at" in out and "not trusted" not in out
    assert (dest / ".complete").read_text() == pin.key + "\n"
    rc, again = assemble(project, cache, capsys)
    assert rc == 0 and "t: cache at" in again  # assembled once

    forge(dest, pin.key)
    rc, out = assemble(project, cache, capsys)
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if "not trusted" in ln]
    assert len(lines) == 1 and f"assembled again: the root there was not trusted ({why}" in lines[0], out
    assert "Traceback" not in out
    # the root is whole again: marker, record and content, swapped into place
    assert (dest / ".complete").read_text() == pin.key + "\n" and not (dest / ".complete").is_symlink()
    meta = json.loads((dest / roots.METADATA).read_text())
    assert (meta["key"], meta["assembly"]) == (pin.key, roots.ASSEMBLY)
    assert (dest / "usr" / "bin" / "tool").read_text() == "#!/bin/sh\necho tool\n"
    assert roots.untrusted(dest, pin.key) is None
    rc, again = assemble(project, cache, capsys)
    assert rc == 0 and "t: cache at" in again


def test_the_fetch_step_reuses_a_root_only_while_it_is_trusted(tiny, tmp_path, capsys):
    """Through the executor (`1bit-build fetch BUNDLE`: the root step is the fetch steps' sibling): with the step's
    stamp in the work directory, a root whose marker was forged afterwards in the shared cache is not reused."""
    from mini_project import add_rooted, make_mini

    project, cache, pin = tiny
    mini = make_mini(tmp_path / "mini")
    add_rooted(mini, "t", (project / "roots" / "t.yaml").read_text(), summary="built inside the one-package root",
               toolchain=[], build={"kind": "script", "root": "t", "network": "none", "commands": [["/usr/bin/tool"]]},
               stage={"keep": ["bin/tool"], "binaries": {"tool": "bin/tool"}}, tests=[])
    args = ["--root", str(mini.root), "--cache", str(cache), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "fetch", "mini"]
    def said() -> str:
        got = capsys.readouterr()
        return got.out + got.err

    said()
    assert main(args) == 0
    first = said()
    assert "build root t" in first and "1 Debian package(s) assembled" in first
    assert main(args) == 0
    assert "assembled" not in said()  # the step is cached: its stamp, and a trusted root
    (pin.dest(cache) / ".complete").write_text("")
    assert main(args) == 0
    out = said()
    assert "1 Debian package(s) assembled again: the root there was not trusted (its .complete is empty)" in out, out
    assert roots.untrusted(pin.dest(cache), pin.key) is None


# ---- planted locks ------------------------------------------------------------------------------------------------------
def _symlink(lock: Path, victim: Path) -> None:
    lock.symlink_to(victim)


def _dangling_symlink(lock: Path, victim: Path) -> None:
    lock.symlink_to(victim.with_name("created-by-the-lock"))


def _hard_link(lock: Path, victim: Path) -> None:
    os.link(victim, lock)


@pytest.mark.parametrize("plant, says", [
    (_symlink, "is a link (to "),
    (_dangling_symlink, "is a link (to "),
    (_hard_link, "has 2 hard links"),
])
def test_a_planted_lock_link_leaves_its_victim_untouched(tiny, tmp_path, capsys, plant, says):
    project, cache, pin = tiny
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    before = victim.stat()
    lock = pin.dest(cache).with_name(pin.dest(cache).name + ".lock")
    lock.parent.mkdir(parents=True)
    plant(lock, victim)
    rc, out = assemble(project, cache, capsys)
    assert rc == 2 and "Traceback" not in out
    errors = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and says in errors[0] and "the lock file of the build root " in errors[0], out
    assert victim.read_text() == "precious\n" and victim.stat().st_mtime_ns == before.st_mtime_ns
    assert not victim.with_name("created-by-the-lock").exists()
    assert not pin.dest(cache).exists()  # nothing was assembled


def _fifo(lock: Path) -> None:
    os.mkfifo(lock)


def _directory(lock: Path) -> None:
    lock.mkdir()
    (lock / "inside").write_text("x")


@pytest.mark.parametrize("plant, says", [(_fifo, "is a FIFO, not a regular file"),
                                         (_directory, "is a directory, not a regular file")])
def test_a_fifo_or_directory_as_a_lock_is_refused_in_one_line_without_a_hang(tiny, plant, says):
    """The real command as its own process, with a generous timeout that only detects a hang."""
    project, cache, pin = tiny
    lock = pin.dest(cache).with_name(pin.dest(cache).name + ".lock")
    lock.parent.mkdir(parents=True)
    plant(lock)
    proc = subprocess.run([sys.executable, "-m", "builders.cli", "--root", str(project), "--cache", str(cache),
                           "roots", "assemble", "t"], capture_output=True, text=True, timeout=120, cwd=TOP,
                          env={**os.environ, "PYTHONPATH": str(TOP), "COLUMNS": "300"})
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert proc.returncode == 2 and "Traceback" not in out
    assert len(errors) == 1 and says in errors[0], out
    assert not pin.dest(cache).exists()


def test_the_pid_is_written_without_truncating_through_anything(tmp_path):
    """A lock file that already holds a longer text (an older format, another writer) is left holding only this pid."""
    from builders.io import lock

    target = tmp_path / "dir"
    lock.lock_path(target).write_text("1234567890123456789012345678901234567890\n")
    with lock.hold(target, "test"):
        assert lock.lock_path(target).read_text().strip() == str(os.getpid())
        assert lock._holder(os.open(lock.lock_path(target), os.O_RDONLY)) == f"1bit-build pid {os.getpid()}"


# ---- the other marked cache entries -------------------------------------------------------------------------------------
def test_toolchain_wheels_and_companion_entries_trust_only_a_marker_naming_their_key(tmp_path, monkeypatch):
    """Each cache entry with a marker: the marker must name exactly its key, and a record where the entry has one;
    a FIFO or a link to /dev/zero as a marker is read without blocking and without reading past the bound."""
    # a toolchain root of Debian packages, assembled for real from a .deb built here
    deb = tmp_path / "archive" / "pool/main/t/tool/tool_1.0-1_amd64.deb"
    deb.parent.mkdir(parents=True)
    make_deb(deb, TOOL)
    spec = DebInput("pool/main/t/tool/tool_1.0-1_amd64.deb", file_sha256(deb))
    monkeypatch.setenv(debs.MIRROR_ENV, (tmp_path / "archive").as_uri())
    dest = tmp_path / "toolchains" / "sdk"
    how = toolchain.fetch_and_assemble((), tmp_path / "dl", dest, debs=(spec,), log=lambda m: None)
    assert how == "1 Debian package(s) assembled"
    assert toolchain.fetch_and_assemble((), tmp_path / "dl", dest, debs=(spec,), offline=True) == "cache"
    meta = json.loads((dest / toolchain.METADATA).read_text())
    (dest / toolchain.METADATA).write_text(json.dumps({**meta, "debs": [{"path": spec.path, "sha256": "0" * 64}]}))
    assert toolchain.untrusted(dest, debs=(spec,)) == f"its record {toolchain.METADATA} names other inputs"
    again = toolchain.fetch_and_assemble((), tmp_path / "dl", dest, debs=(spec,), offline=True)
    assert again == f"1 Debian package(s) assembled again: the root there was not trusted (its record " \
                    f"{toolchain.METADATA} names other inputs)"
    assert toolchain.untrusted(dest, debs=(spec,)) is None
    (dest / ".complete").unlink()
    os.mkfifo(dest / ".complete")
    assert toolchain.untrusted(dest, debs=(spec,)) == "its .complete is a FIFO, not a regular file"

    # wheels: the marker names the requirements and the CPythons
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / ".complete").write_text(fetch.wheels_key(["a==1"], ["3.12"]) + "\n")
    assert fetch.wheels_untrusted(wheels, ["a==1"], ["3.12"]) is None
    assert fetch.wheels_untrusted(wheels, ["a==2"], ["3.12"]).startswith("its .complete names another key")
    (wheels / ".complete").unlink()
    (wheels / ".complete").symlink_to("/dev/zero")
    assert fetch.wheels_untrusted(wheels, ["a==1"], ["3.12"]) == "its .complete is a link (to /dev/zero), not a regular file"

    # Hugging Face files: the marker names every file and sha256, and each file is there
    hf = tmp_path / "hf"
    hf.mkdir()
    files = {"m.gguf": "a" * 64}
    (hf / "m.gguf").write_text("weights")
    (hf / ".complete").write_text("{not json")
    assert companions.hf_untrusted(hf, files).startswith("its .complete names another key")  # was a traceback
    (hf / ".complete").write_text(companions.hf_key(files))
    assert companions.hf_untrusted(hf, files) is None
    (hf / "m.gguf").unlink()
    assert companions.hf_untrusted(hf, files) == "its file m.gguf is missing"

    # a submodules lock: it names its commit and the submodules asked for, every path inside the source tree
    lock = tmp_path / "submodules.json"
    sha = "1" * 40
    key = companions.lock_key(sha, ["xrt"])
    entry = {"path": "xrt", "url": "https://example.invalid/xrt.git", "commit": "2" * 40}
    lock.write_text(json.dumps({**key, "submodules": [entry]}))
    assert companions.read_lock(lock, key)[0] == [companions.Submodule(**entry)]
    assert companions.read_lock(lock, companions.lock_key("3" * 40, ["xrt"])) == (None, "names another commit or other submodules")
    lock.write_text(json.dumps({**key, "submodules": [{**entry, "path": "../../outside"}]}))
    assert "outside the source tree" in companions.read_lock(lock, key)[1]
    lock.write_text(json.dumps([entry]))  # the lock of an older version: found again, never trusted
    assert companions.read_lock(lock, key) == (None, "is not a submodules lock of this version")
    with pytest.raises(companions.FetchError, match="not a submodules lock of this version; nothing was checked out"):
        companions.checkout_submodules(tmp_path / "src", lock, lambda c: tmp_path / c)


def test_an_old_marker_of_the_same_key_stays_trusted(tmp_path):
    """Entries assembled before this change wrote the same key (roots: key + newline; wheels: no final newline): they
    are reused, never assembled again for nothing (the strix root is 1.3 GiB)."""
    dest = tmp_path / "root"
    dest.mkdir()
    key = hashlib.sha256(b"k").hexdigest()
    (dest / ".complete").write_text(key + "\n")
    (dest / roots.METADATA).write_text(json.dumps({"assembly": roots.ASSEMBLY, "key": key, "packages": []}))
    assert roots.untrusted(dest, key) is None
    assert swap.why_untrusted(tmp_path / "none", key) == swap.ABSENT
