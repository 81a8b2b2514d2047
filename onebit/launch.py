"""Launch a LaunchPlan: exec one llama-server, or run children behind the proxy."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
from typing import Mapping

from .errors import ServeError
from .proxy import Proxy, Upstream, serve_forever
from .launch_plan import Child, LaunchPlan

PR_SET_PDEATHSIG = 1


def free_ports(n: int) -> tuple[int, ...]:
    """n distinct free loopback ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


def child_env(child: Child, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for k, v in child.env.items():
        env.setdefault(k, v)  # the user's environment always wins
    return env


def exec_child(child: Child) -> None:
    """Replace this process with the backend's server: no proxy, zero overhead."""
    _check_binary(child.binary)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if child.cwd:
            os.chdir(child.cwd)
        os.execve(child.binary, list(child.argv), child_env(child))
    except OSError as e:
        raise ServeError(f"cannot run {child.binary}: {e.strerror or e}") from None


def _check_binary(path: str) -> None:
    if not os.path.isfile(path):
        raise ServeError(f"{os.path.basename(path)} not found at {path}; is the bundle installed completely?")
    if not os.access(path, os.X_OK):
        raise ServeError(f"{path} is not executable")


def _die_with_parent(parent: int) -> None:
    """preexec_fn: ask the kernel to SIGKILL this child when serve dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def spawn(child: Child) -> subprocess.Popen:
    _check_binary(child.binary)
    parent = os.getpid()
    return subprocess.Popen(
        list(child.argv),
        executable=child.binary,
        env=child_env(child),
        cwd=child.cwd,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: _die_with_parent(parent),
        close_fds=True,
    )


def run_proxied(plan: LaunchPlan, laya=None, *, max_body: int | None = None, allowed_hosts: tuple[str, ...] = ()) -> int:
    """Start every child, serve the proxy until a signal or until a child exits; stop the children."""
    assert plan.proxy is not None
    procs: list[subprocess.Popen] = []
    try:
        for c in plan.children:
            procs.append(spawn(c))
        ups = [Upstream(role=c.role, url=f"http://{c.host}:{c.port}", slots=c.slots, drop_model=c.drop_model)
               for c in plan.children]
        proxy = Proxy(ups, policy=plan.proxy.policy, alias=plan.proxy.alias, long_from=plan.proxy.long_from,
                      public_host=plan.proxy.host, laya=laya, allowed_hosts=allowed_hosts,
                      **({"max_body": max_body} if max_body else {}))
        return asyncio.run(_main(proxy, plan, procs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def _main(proxy: Proxy, plan: LaunchPlan, procs: list[subprocess.Popen]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(s, stop.set)
    result = {"rc": 0}

    async def watch_children() -> None:
        while not stop.is_set():
            for c, p in zip(plan.children, procs):
                rc = p.poll()
                if rc is not None:
                    print(f"1bit serve: {c.role} backend ({c.backend}) exited with status {rc}; stopping",
                          file=sys.stderr)
                    result["rc"] = rc or 1
                    stop.set()
                    return
            await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch_children())
    try:
        await serve_forever(proxy, plan.proxy.host, plan.proxy.port, stop)
    except OSError as e:
        raise ServeError(f"cannot listen on {plan.proxy.host}:{plan.proxy.port}: {e.strerror or e}") from None
    finally:
        watcher.cancel()
    return result["rc"]
