"""Bounded reads of the files another party wrote (issue 27): builders/io/readfile.py reads only a regular file, never
through a link, never more than its cap of bytes actually read (a /proc file says 0 bytes and holds more). Lemonade's
config.json as a FIFO, a link to /dev/zero or a directory, and its planted locks, through the real `1bit-build lemonade
install`; the release's --bumps file. (roots.json, toolchains.json, report.json and drift-results.json are driven
through `pins bump --from-report` in tests/test_pins_roots.py and tests/test_pins_toolchains.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders.errors import OnebitError
from builders.release import bumps
from test_lemonade_install import NEW, archive, files_of, sums

TOP = Path(__file__).resolve().parent.parent
MEMORY = 2 << 30


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def child(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m builders.cli ARGV` as its own process under an address-space limit, with a timeout that only
    detects a hang."""
    return subprocess.run([sys.executable, "-m", "builders.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=TOP, preexec_fn=_limit_memory,
                          env={**os.environ, "PYTHONPATH": str(TOP), "COLUMNS": "300"})


# ---- the reader --------------------------------------------------------------------------------------------------------
def _regular(p: Path) -> None:
    p.write_bytes(b'{"a": 1}')


def _link(p: Path) -> None:
    _regular(p.with_name("target"))
    p.symlink_to("target")


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _directory(p: Path) -> None:
    p.mkdir()


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _large(p: Path) -> None:
    p.write_bytes(b" " * 101)


@pytest.mark.parametrize("make, why", [
    (_regular, None),
    (_link, "is a link (to target), not a regular file"),
    (_dev_zero, "is a link (to /dev/zero), not a regular file"),
    (_fifo, "is a FIFO, not a regular file"),
    (_directory, "is a directory, not a regular file"),
    (_large, "is larger than 100 bytes"),
    (lambda p: None, "cannot be opened: No such file or directory"),
])
def test_what_the_reader_reads(tmp_path, make, why):
    from builders.io import readfile

    path = tmp_path / "f"
    make(path)
    if why is None:
        assert readfile.read_json(path, 100) == {"a": 1}
        return
    with pytest.raises(readfile.UnreadableFile) as exc:
        readfile.read_bytes(path, 100)
    assert exc.value.why == why and exc.value.where == str(path)


def test_the_cap_is_on_the_bytes_read_not_on_a_stat():
    """/proc/self/maps is a regular file whose stat says 0 bytes: a size check before reading would let it through."""
    from builders.io import readfile

    maps = Path("/proc/self/maps")
    assert maps.stat().st_size == 0
    with pytest.raises(readfile.UnreadableFile, match="is larger than 100 bytes"):
        readfile.read_bytes(maps, 100)
    assert readfile.read_bytes(maps, 1 << 24).count(b"\n") > 1


# ---- Lemonade's config.json and locks, through `1bit-build lemonade install` --------------------------------------------
@pytest.fixture
def release(tmp_path):
    out = tmp_path / "rel"
    cpu = archive(out, NEW, files_of("cpu"))
    return cpu, sums(out, cpu)


@pytest.mark.parametrize("make, says", [
    (_fifo, "is a FIFO, not a regular file; nothing was changed"),
    (_dev_zero, "is a link to /dev/zero, which is not a file; nothing was changed"),
    (_directory, "is a directory, not a regular file; nothing was changed"),
])
def test_lemonades_config_that_is_not_a_file_is_refused_in_one_line(tmp_path, release, make, says):
    cpu, sha_sums = release
    cache = tmp_path / "cache"
    cache.mkdir()
    make(cache / "config.json")
    proc = child("lemonade", "install", str(cpu), "--cache", str(cache), "--sums", str(sha_sums))
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error")]
    assert proc.returncode == 2 and "Traceback" not in out and "MemoryError" not in out, out
    assert len(errors) == 1 and says in errors[0] and "config.json" in errors[0], out
    assert not (cache / "bin" / "llamacpp").exists()  # nothing was installed


@pytest.mark.parametrize("lock, what", [("bin.lock", "Lemonade cache"), ("config.json.lock", "Lemonade config")])
def test_a_planted_lemonade_lock_link_leaves_its_victim_untouched(tmp_path, release, capsys, lock, what):
    from builders.cli import main

    cpu, sha_sums = release
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "config.json").write_text('{"port": 8000}\n')
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (cache / lock).symlink_to(victim)
    assert main(["lemonade", "install", str(cpu), "--cache", str(cache), "--sums", str(sha_sums)]) == 2
    err = capsys.readouterr()
    errors = [ln for ln in (err.out + err.err).splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and f"the lock file of the {what} is a link (to {victim})" in errors[0], errors
    assert victim.read_text() == "precious\n"
    assert json.loads((cache / "config.json").read_text()) == {"port": 8000} and not (cache / "bin" / "llamacpp").exists()


# ---- the release's --bumps file ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, says", [(_fifo, "is a FIFO, not a regular file"),
                                        (_dev_zero, "is a link (to /dev/zero), not a regular file")])
def test_a_bumps_file_that_is_not_a_file_is_one_line_without_a_hang(tmp_path, make, says):
    """bumps.load, as `1bit-build release --bumps FILE` calls it, in its own limited process (a FIFO blocked it)."""
    path = tmp_path / "bumps.json"
    make(path)
    proc = subprocess.run([sys.executable, "-c", "import sys\nfrom builders.release import bumps\n"
                           "from builders.errors import OnebitError\ntry:\n    bumps.load(sys.argv[1])\n"
                           "except OnebitError as exc:\n    print(exc.what)\n", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=TOP, preexec_fn=_limit_memory, env={**os.environ, "PYTHONPATH": str(TOP)})
    assert proc.returncode == 0 and proc.stdout.strip() == f"not a bump results file: it {says}", proc.stdout + proc.stderr
    with pytest.raises(OnebitError):
        bumps.load(path)


# ---- the token holder's writes into the evaluation's folder ----------------------------------------------------------------
def test_a_report_written_where_the_evaluator_left_links_never_writes_through_them(tmp_path):
    """The evaluating part had the work folder read-write: links it left at a report's name, or at the name the
    writer puts its file aside under, are replaced, never written through (report.write_file: drift.json, report.json)."""
    from builders.pins import report

    work = tmp_path / "work"
    work.mkdir()
    victims = [tmp_path / "authorized_keys", tmp_path / "bashrc"]
    for v in victims:
        v.write_text("precious\n")
    (work / "drift.json").symlink_to(victims[0])
    (work / ".drift.json.part").symlink_to(victims[1])
    report.write_file(work, "drift.json", [{"pin": "x"}])
    assert [v.read_text() for v in victims] == ["precious\n", "precious\n"]
    assert not (work / "drift.json").is_symlink() and report.load_file(work, "drift.json", 1000) == [{"pin": "x"}]
    assert not os.path.lexists(work / ".drift.json.part")
