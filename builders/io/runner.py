"""runner: the one way this project runs a process it must be able to stop (the executor's build commands, git, the
sandbox, the drift check's `make -n`, the release checklist, a root's probes).

Every process starts in its own session, so its whole process group can be killed: a build's compilers, a Makefile's
$(shell ...), a server's workers go with it. What each call decides:
- stdin is /dev/null unless the caller gives `input` (or its own stdin): nothing ever waits on the terminal;
- `memory`: bytes of address space (RLIMIT_AS) for the process and everything it starts, and no core file;
- `timeout`: at the deadline the group is killed (SIGKILL; with `grace`, SIGTERM first and SIGKILL `grace` seconds
  later), its pipes drained for at most DRAIN seconds (a process that left the group and holds them is not waited
  on), and `TimedOut` is raised: a subprocess.TimeoutExpired carrying what the process wrote until then. Callers turn
  it into their own one-line error;
- Ctrl-C (any exception while it runs): the group is killed before the exception goes on, since a process in its
  own session never sees the terminal's signal.

  run(argv, ...)            capture the output (or send it where `stdout`/`stderr` say), wait, return a
                            CompletedProcess;
  tee(argv, log, on_line)   stdout and stderr merged, read line by line: each line written to `log` and handed to
                            `on_line` as it comes (the executor's ninja progress), the whole output returned;
  start(argv) / stop(proc)  a process that runs beside the caller (the checklist's server, the sandbox's id-mapped
                            start), stopped with its group.
"""
from __future__ import annotations

import codecs
import io
import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT
DRAIN = 10.0  # seconds the pipes of a killed group are still read
CHUNK = 1 << 16


class TimedOut(subprocess.TimeoutExpired):
    """A process ran past its deadline; its group was killed. `output` and `stderr`: what it wrote until then."""


def _bounds(memory: int | None) -> Callable[[], None] | None:
    if not memory:
        return None

    def apply() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def start(argv: Sequence[str], *, cwd=None, env: Mapping[str, str] | None = None, stdin=DEVNULL, stdout=PIPE,
          stderr=PIPE, text: bool = True, errors: str | None = "replace", memory: int | None = None,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start `argv` in its own session (see the module's docstring). `errors`: how undecodable output is read in text
    mode (None: strictly)."""
    return subprocess.Popen(list(argv), cwd=cwd, env=None if env is None else dict(env), stdin=stdin, stdout=stdout,
                            stderr=stderr, text=text, errors=errors if text else None, start_new_session=True,
                            preexec_fn=_bounds(memory), pass_fds=tuple(pass_fds))


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace: float = 0.0) -> None:
    """End `proc`'s whole process group: SIGTERM and `grace` seconds to go (when grace > 0), then SIGKILL."""
    if grace > 0:
        _signal(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal(proc, signal.SIGKILL)


def _drain(proc: subprocess.Popen):
    """(stdout, stderr) still in the pipes of a killed group; (None, None) when something outside it holds them."""
    try:
        return proc.communicate(timeout=DRAIN)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return None, None


def wait(proc: subprocess.Popen, *, input: str | bytes | None = None, timeout: float | None = None,
         grace: float = 0.0) -> subprocess.CompletedProcess:
    """Wait for a started process, feeding it `input` and capturing what it writes to its pipes."""
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc, grace)
        out, err = _drain(proc)
        raise TimedOut(proc.args, timeout, out, err) from None
    except BaseException:  # Ctrl-C: the group is in its own session, the terminal's signal never reached it
        stop(proc)
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run(argv: Sequence[str], *, timeout: float | None = None, input: str | bytes | None = None, cwd=None,
        env: Mapping[str, str] | None = None, stdin=None, stdout=PIPE, stderr=PIPE, text: bool = True,
        errors: str | None = "replace", memory: int | None = None, grace: float = 0.0, check: bool = False,
        pass_fds: Sequence[int] = ()) -> subprocess.CompletedProcess:
    """Run `argv` to its end (or its deadline), capturing its output (see the module's docstring); `check`: a
    non-zero exit raises subprocess.CalledProcessError."""
    proc = start(argv, cwd=cwd, env=env, stdin=PIPE if input is not None else (DEVNULL if stdin is None else stdin),
                 stdout=stdout, stderr=stderr, text=text, errors=errors, memory=memory, pass_fds=pass_fds)
    done = wait(proc, input=input, timeout=timeout, grace=grace)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done


def tee(argv: Sequence[str], *, log: IO[str] | None = None, on_line: Callable[[str], None] | None = None,
        timeout: float | None = None, cwd=None, env: Mapping[str, str] | None = None, memory: int | None = None,
        grace: float = 0.0) -> subprocess.CompletedProcess:
    """Run `argv` with stdout and stderr merged, read as text line by line (universal newlines, undecodable bytes
    replaced): each line written to `log`, then handed to `on_line`. Returns the whole output as `.stdout`; at the
    deadline raises TimedOut with the output so far."""
    proc = start(argv, cwd=cwd, env=env, stdout=PIPE, stderr=STDOUT, text=False, memory=memory)
    assert proc.stdout is not None
    lines: list[str] = []
    decode = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True)
    pending = ""

    def emit(text: str, final: bool = False) -> str:
        *whole, rest = text.split("\n")
        for line in [w + "\n" for w in whole] + ([rest] if final and rest else []):
            if log is not None:
                log.write(line)
            lines.append(line)
            if on_line is not None:
                on_line(line)
        return "" if final else rest

    deadline = None if timeout is None else time.monotonic() + timeout
    killed = False
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not sel.select(left):
                    if killed:  # something that left the group holds the pipe: stop reading
                        break
                    stop(proc, grace)
                    killed, deadline = True, time.monotonic() + DRAIN
                    continue
                chunk = os.read(proc.stdout.fileno(), CHUNK)
                if not chunk:
                    break
                pending = emit(pending + decode.decode(chunk))
        emit(pending + decode.decode(b"", final=True), final=True)
        proc.stdout.close()
        rc = proc.wait()
    except BaseException:
        stop(proc)
        proc.stdout.close()
        proc.wait()
        raise
    if killed:
        raise TimedOut(proc.args, timeout, "".join(lines))
    return subprocess.CompletedProcess(proc.args, rc, "".join(lines), None)
