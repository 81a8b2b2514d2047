"""isolate: the pin bot split the way Dependabot splits its updater from its credentials (docs/security.md).

`pins bump` (which may hold the token) never fetches, checks out, patches, parses or runs upstream content. It starts
two parts, each as `python -m builders.pins ...` in builders/roots/sandbox.py (own user, PID, mount namespaces and /proc,
so the token holder's /proc/<pid>/environ is out of reach; a cleared environment; private HOME and /tmp):

1. `evaluate` (network on): resolves every pin, checks ancestry, rebases or merges forks (into a git bundle, never
   pushed), checks the patches, and checks out the trees the build-flag check needs. It sees the project read-only
   (its .git hidden), the local mirrors read-only, and writes only its work directory: report.json, the bundles, the
   trees.
2. `drift` (no network; the work directory read-only; no writable path at all): plans each recipe variant, reads
   upstream's build files, runs `make -n` (bounded in time and memory), and prints the flag reports framed by a
   nonce it read from stdin; it makes itself non-dumpable first, so a Makefile's process cannot read its memory,
   fds or environment through /proc, nor forge the frame.

The token holder reads both back as plain data (builders/pins/report.py) and then pushes and opens PRs. Where this
host cannot make the sandbox, `evaluate` runs as a child with a cleared environment (it runs git, hardened, and
nothing of upstream's), and `drift` runs without `make -n`: every make comparison HOLDs the bump, saying why.
"""
from __future__ import annotations

import ctypes
import os
import re
import secrets as pysecrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..io import runner
from ..roots import sandbox
from ..errors import OnebitError
from . import flagdrift, flags, report
from .flags import Row, VariantReport

EVAL_TIMEOUT = 3 * 3600.0  # seconds for the whole evaluation (fetches of large upstreams included)
EVAL_MEMORY = 32 << 30  # bytes of address space for the evaluation (git maps packs)
DRIFT_TIMEOUT = 3600.0
DRIFT_MEMORY = 8 << 30
PASSED_ENV = ("ONEBIT_GITHUB_API", "ONEBIT_HF_ENDPOINT", "GITHUB_API_URL", "SSL_CERT_FILE", "SSL_CERT_DIR",
              "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "ONEBIT_PINS_MAKE_TIMEOUT")  # never a secret
REPORT = "report.json"
REQUESTS = "drift.json"


def code_paths() -> tuple[str, ...]:
    """What the interpreter needs to run `builders` (the package's parent, the environment, the interpreter)."""
    here = Path(__file__).resolve().parents[2]
    exe = Path(os.path.realpath(sys.executable))
    paths = {str(here), sys.prefix, sys.base_prefix, sys.exec_prefix, str(exe.parent.parent)}
    return tuple(sorted(p for p in paths if p and not p.startswith("/usr/") and p != "/usr" and os.path.isdir(p)))


def local_mirrors(pins: Mapping) -> tuple[str, ...]:
    """The local directories pins.yaml names as git URLs (file:// or paths): bound read-only for the evaluation."""
    out = set()
    for pin in pins.values():
        raw = getattr(pin, "raw", {}) or {}
        urls = [getattr(pin, "url", None), (raw.get("upstream") or {}).get("url")]
        urls += [m.get("url") if isinstance(m, dict) else m for m in raw.get("mirrors") or []]
        for url in urls:
            if not isinstance(url, str):
                continue
            path = url[len("file://"):] if url.startswith("file://") else url if url.startswith("/") else None
            if path and os.path.isdir(path):
                out.add(os.path.realpath(path))
    return tuple(sorted(out))


def child_env() -> dict[str, str]:
    """The whole environment of an isolated part: a PATH, the code, the API endpoints; no secret."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONNOUSERSITE": "1"}
    env.update({k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)})
    return env


def _python(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "builders.pins", "--root", str(root), *args]


def _hide(root: Path) -> tuple[str, ...]:
    git = root / ".git"
    return (str(git),) if git.is_dir() and not git.is_symlink() else ()


def _run(sb: sandbox.Sandbox | None, cmd: list[str], *, cwd: Path, timeout: float, input: str | None = None):
    """Run an isolated part: in the sandbox, or (no sandbox here) as a child with the cleared environment."""
    if sb is not None:
        return sandbox.run(sb, cmd, input=input)
    return runner.run(cmd, cwd=cwd, env=child_env(), timeout=timeout, input=input)


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1].strip()[:500] if lines else "no message"


# ------------------------------------------------------------------------------------------------ 1. evaluate


def run_evaluation(root: Path, pins: Mapping, names: Sequence[str], work: Path, *, allow_rollback: bool = False,
                   reason: str | None = None, log=lambda m: None) -> dict:
    """The evaluating part over `names`, in its sandbox; returns report.json's data (checked by the caller)."""
    root = Path(root).resolve()
    args = ["evaluate", "--out", str(work), *(["--allow-rollback"] if allow_rollback else []),
            *(["--reason", reason] if reason else []), "--", *names]
    why = sandbox.why_unavailable()
    sb = None
    if why is None:
        sb = sandbox.Sandbox(env=child_env(), cwd=str(work), ro=code_paths() + (str(root),) + local_mirrors(pins),
                             rw=(str(work),), hide=_hide(root), network=True, memory=EVAL_MEMORY, timeout=EVAL_TIMEOUT)
    else:
        log(f"no sandbox on this host ({why}): the evaluation runs as a child without any secret; make -n will not run")
    try:
        proc = _run(sb, _python(root, *args), cwd=work, timeout=EVAL_TIMEOUT)
    except runner.TimedOut:
        raise OnebitError(f"the evaluation of the pins did not finish within {EVAL_TIMEOUT:.0f} s; nothing was pushed") from None
    for line in (proc.stderr or "").splitlines():
        if line.startswith("log: "):
            log(line[5:])
    path = work / REPORT
    if proc.returncode != 0 or not path.is_file():
        raise OnebitError(f"the evaluation of the pins failed (exit {proc.returncode}): {_last_line(proc.stderr)}",
                          hint="nothing was pushed or opened")
    return report.load_file(work, REPORT, report.MAX_FILE)  # bounded, never through a link the evaluator made


# ------------------------------------------------------------------------------------------------ 2. drift


def drift_request(root: Path, pin: str, url: str, old: str | None, new: str, recipes: Sequence[str], work: Path, sub: str,
                  *, where: str | None = None) -> dict:
    """(The evaluating part) check out what the drift check of one pin needs into work/<sub>; the request for it."""
    req = {"pin": pin, "old": old, "new": new, "recipes": list(recipes), "dir": sub, "info": None, "error": None}
    try:
        req["info"] = flagdrift.checkout_trees(root, pin, url, old, new, recipes, work / sub, where=where)
    except OnebitError as exc:  # the project itself cannot be read: said in the PR, the bump is not held for it
        req["error"] = exc.what
    return req


def _held(requests: Sequence[dict], why: str) -> list[list[VariantReport]]:
    return [[VariantReport(r, f"**{r}**", (Row(flags.HOLD, "build flags", "", why),)) for r in req["recipes"]] for req in requests]


FRAME = re.compile(r"^BEGIN-(?P<n>[0-9a-f]{32})\n(?P<data>.*)\nEND-(?P=n)$", re.M | re.S)


def run_drift(root: Path, work: Path, requests: Sequence[dict]) -> list[list[VariantReport]]:
    """The drift check of every request in its sandbox (no network, `work` read-only); one list of reports per
    request. A check that cannot finish holds its bumps."""
    if not requests:
        return []
    root = Path(root).resolve()
    report.write_file(work, REQUESTS, list(requests))  # aside and renamed: never through a link the evaluator left
    nonce = pysecrets.token_hex(16)
    why = sandbox.why_unavailable()
    cmd = _python(root, "drift", "--in", str(work))
    sb = None
    if why is None:
        sb = sandbox.Sandbox(env=child_env(), cwd=str(work), ro=code_paths() + (str(root), str(work)), hide=_hide(root),
                             network=False, memory=DRIFT_MEMORY, timeout=DRIFT_TIMEOUT)
    else:
        cmd += ["--no-make", f"this host cannot make the sandbox ({why})"]
    try:
        proc = _run(sb, cmd, cwd=work, timeout=DRIFT_TIMEOUT, input=nonce + "\n")
    except runner.TimedOut:
        return _held(requests, f"the build-flag check did not finish within {DRIFT_TIMEOUT:.0f} s")
    frames = [m for m in FRAME.finditer(proc.stdout or "") if m.group("n") == nonce]
    if proc.returncode != 0 or len(frames) != 1:
        return _held(requests, f"the build-flag check failed (exit {proc.returncode}): {_last_line(proc.stderr)}")
    try:
        data = report.loads(frames[0].group("data"), "the build-flag check's output")
        got = [[report.load_variant(v, f"drift[{i}][{j}]") for j, v in enumerate(report._list(reps, f"drift[{i}]"))]
               for i, reps in enumerate(report._list(data, "drift"))]
    except OnebitError as exc:
        return _held(requests, exc.what)
    if len(got) != len(requests):
        return _held(requests, "the build-flag check answered for other requests than it was given")
    return got


def flag_reports(root: Path, pin: str, url: str, old: str | None, new: str, recipes: Sequence[str], *,
                 where: str | None = None) -> list[VariantReport]:
    """Both halves of the build-flag check for one pin: check out here (no secret may be in this process), then the
    drift check in its sandbox."""
    import tempfile

    if not recipes:
        return []
    with tempfile.TemporaryDirectory(prefix="onebit-flags-") as tmp_name:
        tmp = Path(tmp_name)
        request = drift_request(root, pin, url, old, new, recipes, tmp, "t0", where=where)
        return run_drift(root, tmp, [request])[0]


# ------------------------------------------------------------------------------------------------ inside the parts


def not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same user (a Makefile's $(shell ...)) cannot open this one's /proc entries
    (environ, mem, fd, cwd, root)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def drift_main(root: Path, work: Path, no_make: str | None) -> int:
    """`python -m builders.pins drift --in WORK`: the drift check (runs inside its sandbox)."""
    not_dumpable()
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    if not re.fullmatch(r"[0-9a-f]{32}", nonce):
        print("error: the drift check needs its nonce on stdin", file=sys.stderr)
        return 2
    requests = report.load_file(work, REQUESTS, report.MAX_FILE)
    try:
        timeout = float(os.environ.get("ONEBIT_PINS_MAKE_TIMEOUT", flagdrift.MAKE_TIMEOUT))
    except ValueError:
        timeout = flagdrift.MAKE_TIMEOUT
    limits = flagdrift.MakeLimits(blocked=no_make, timeout=timeout)
    out = []
    for req in requests:
        if req.get("error"):
            out.append([report.dump_variant(VariantReport(r, f"**{r}**", (Row("not compared", r, "", req["error"]),)))
                        for r in req["recipes"]])
            continue
        reps = flagdrift.reports_from_trees(root, req["pin"], req["old"], req["new"], req["recipes"], work / req["dir"],
                                            req["info"] or {}, limits)
        out.append([report.dump_variant(r) for r in reps])
    sys.stdout.write(f"BEGIN-{nonce}\n{report.dumps(out)}\nEND-{nonce}\n")
    sys.stdout.flush()
    return 0
