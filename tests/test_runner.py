"""The one process runner (builders/io/runner.py): real processes, real process groups, read back from /proc.

A build interrupted by Ctrl-C stops what its command started (the command runs in its own session, so the runner
kills its group); a process past its deadline goes with its whole group and its output so far is kept; one that
left the group while holding the pipes does not hang the caller; a memory bound holds; the executor's line reader
(`tee`) sees every line as the old reader did."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builders.roots import root as rootmod
from builders.io import runner
from mini_project import make_mini

ROOT = Path(__file__).resolve().parents[1]


def _pids_with(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a unique sleep length: only this test starts them)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{p}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and int(p) != os.getpid():
            out.append(int(p))
    return out


def _marker() -> str:
    """A sleep length no other process has: 120 s and a fraction of this moment."""
    return f"120.{os.getpid() % 1000:03d}{time.monotonic_ns() % 10**6:06d}"


def _wait_for(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def reap():
    """Markers whose leftover processes the test ends (by pid) whether it passes or not."""
    markers: list[str] = []
    yield markers
    for m in markers:
        for pid in _pids_with(f"sleep {m}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_build_interrupted_by_ctrl_c_leaves_nothing_of_its_command_running(tmp_path, reap):
    """`1bit-build build` gets SIGINT while cmake's configure runs a long command: the CLI stops, and so do cmake and
    what it started (they run in their own session: the runner kills the group before the interrupt goes on)."""
    marker = _marker()
    reap.append(marker)
    mini = make_mini(tmp_path / "mini")
    slow = tmp_path / "slow.cmake"
    slow.write_text(f'execute_process(COMMAND /bin/sh -c "sleep {marker}")\n')
    recipe = mini.recipe()
    recipe["build"]["options"]["CMAKE_PROJECT_INCLUDE"] = str(slow)
    mini.write_recipe(recipe)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                                           os.environ.get("PATH", "")])}
    cli = subprocess.Popen([sys.executable, "-m", "builders.cli", "--root", str(mini.root), "--cache",
                            str(tmp_path / "cache"), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
                            "build", "mini"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _wait_for(lambda: _pids_with(f"sleep {marker}"), 300), "the configure step never started its command"
        os.kill(cli.pid, signal.SIGINT)  # the CLI alone: what it started is the runner's to stop
        _, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode != 0, err[-2000:]
    assert _wait_for(lambda: not _pids_with(f"sleep {marker}"), 10), "cmake's command outlived the interrupted build"


def test_a_command_past_its_deadline_goes_with_its_group_and_keeps_its_output(reap):
    marker = _marker()
    reap.append(marker)
    script = f"echo started; sleep {marker} & sleep {marker}"
    with pytest.raises(runner.TimedOut) as caught:
        runner.run(["/bin/sh", "-c", script], timeout=1)
    assert caught.value.output == "started\n" and caught.value.timeout == 1
    assert _wait_for(lambda: not _pids_with(f"sleep {marker}"), 10)
    seen = []
    with pytest.raises(runner.TimedOut) as caught:
        runner.tee(["/bin/sh", "-c", script], on_line=seen.append, timeout=1)
    assert caught.value.output == "started\n" and seen == ["started\n"]
    assert _wait_for(lambda: not _pids_with(f"sleep {marker}"), 10)


def test_a_process_that_left_the_group_holding_the_pipes_does_not_hang_the_caller(monkeypatch, reap):
    """A root's probe (Root.run) whose command starts a daemon of its own session, holding stdout: at the deadline the
    group is killed and the pipes are read for DRAIN seconds only, not until the daemon ends."""
    marker = _marker()
    reap.append(marker)
    monkeypatch.setattr(runner, "DRAIN", 1.0)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        rootmod.host().run(["/bin/sh", "-c", f"setsid sleep {marker} & sleep {marker}"], timeout=1, net=True)
    assert time.monotonic() - started < 45  # a hang would wait the daemon's whole sleep


def test_a_memory_bound_holds_for_the_process():
    code = "bytearray(768 << 20); print('allocated')"
    bounded = runner.run([sys.executable, "-c", code], memory=512 << 20, timeout=60)
    assert bounded.returncode != 0 and "MemoryError" in bounded.stderr
    free = runner.run([sys.executable, "-c", code], timeout=60)
    assert free.returncode == 0 and free.stdout == "allocated\n"


@pytest.mark.parametrize("written, lines", [
    (b"[1/2] cc a.c\n[2/2] ld\n", ["[1/2] cc a.c\n", "[2/2] ld\n"]),
    (b"one\r\ntwo\rthree", ["one\n", "two\n", "three"]),       # universal newlines, the last line without one
    (b"bad \xff byte\n", ["bad \ufffd byte\n"]),                  # undecodable bytes replaced, never a crash
    (b"", []),
])
def test_tee_hands_on_every_line_and_writes_the_log(tmp_path, written, lines):
    data = tmp_path / "out.bin"
    data.write_bytes(written)
    seen = []
    with open(tmp_path / "log", "w") as log:
        done = runner.tee(["/bin/cat", str(data)], log=log, on_line=seen.append)
    assert seen == lines and done.stdout == "".join(lines) and done.returncode == 0
    assert (tmp_path / "log").read_text() == "".join(lines)


def test_tee_merges_stderr_and_reads_no_terminal(tmp_path):
    done = runner.tee(["/bin/sh", "-c", "echo out; echo err >&2; cat; exit 3"], timeout=30)
    assert done.stdout == "out\nerr\n" and done.returncode == 3  # stdin is /dev/null: cat ends at once
