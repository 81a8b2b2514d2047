"""Replay a GitHub Actions workflow's job graph locally, read from the workflow file itself: its jobs, `needs`, matrix
(`include` and value lists), `if:` conditions, job outputs, steps' `run:` and `env:`, and the artifact hand-off of
actions/upload-artifact and actions/download-artifact. It is a test of our commands in the workflow's order, not a
workflow runner: it knows only what release.yml uses, and anything else in the file is an error, so the two cannot
drift apart quietly.

How each part is replayed:
  - every job (each matrix entry a job) runs in its own clean `git clone` of the project, with its own HOME (so its
    own ~/.cache/onebit), its own RUNNER_TEMP and its own $GITHUB_OUTPUT / $GITHUB_PATH files;
  - a `run:` step that is a job body (one `1bit-build`, `nox` or `python -m builders...` command) runs for real,
    through bash as GitHub runs it, with the GITHUB_* variables a runner sets (repository, ref, sha, event);
    a `run:` step of runner setup (pip install of the project, a venv, apt) is modelled: the test's own environment
    is the installed project, and the runner model provides what apt would (recording shims);
  - upload-artifact stores exactly the files its `path` patterns select, rooted as the action roots them (a single
    directory: its contents; several paths: their least common ancestor), hidden files left out as in v4.4+; a name
    uploaded twice is an error, as on GitHub; download-artifact by `name`, or by `pattern` with `merge-multiple`;
  - actions/checkout is the clone: of the default branch, or of its `ref:` (a branch as it is now, or a commit, fetched
    as the action fetches it, `fetch-depth` deep, and checked out detached); setup-python and cache are recorded (a
    cache miss: the job starts cold);
    attest-build-provenance checks its subjects exist and records their sha256;
  - jobs whose `needs` are done run at the same time, in threads that each drive their job's processes, as GitHub
    runs a matrix on separate runners.
"""
from __future__ import annotations

import fnmatch
import glob
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from builders.project.config import file_sha256


class ReplayError(Exception):
    pass


# ---- expressions: ${{ ... }} with the operators and functions the workflow uses -----------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||!|\(|\)|,)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_*][A-Za-z0-9_-]*)*))")


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            if expr[pos:].strip() == "":
                break
            raise ReplayError(f"expression {expr!r}: cannot read {expr[pos:]!r}")
        pos = m.end()
        kind = m.lastgroup
        out.append((kind, m[kind]))
    return out


def evaluate(expr: str, ctx: Mapping, functions: Mapping[str, Callable] | None = None):
    """GitHub's expression language, the part the workflow uses: context paths, 'strings', numbers, ==, !=, !, &&,
    ||, parentheses and function calls (hashFiles, always, success)."""
    toks = _tokens(expr)
    functions = functions or {}
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else (None, None)

    def take():
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def lookup(path: str):
        cur = ctx
        for part in path.split("."):
            if isinstance(cur, Mapping):
                cur = cur.get(part)
            else:
                return None
        return cur

    def primary():
        kind, val = take()
        if kind == "str":
            return val[1:-1].replace("''", "'")
        if kind == "num":
            return float(val)
        if (kind, val) == ("op", "("):
            v = orexpr()
            take()
            return v
        if (kind, val) == ("op", "!"):
            return not primary()
        if kind == "name":
            if val in ("true", "false"):
                return val == "true"
            if val == "null":
                return None
            if peek() == ("op", "("):
                take()
                args = []
                while peek() != ("op", ")"):
                    args.append(orexpr())
                    if peek() == ("op", ","):
                        take()
                take()
                if val not in functions:
                    raise ReplayError(f"expression {expr!r}: the replay knows no function {val}()")
                return functions[val](*args)
            return lookup(val)
        raise ReplayError(f"expression {expr!r}: unexpected {val!r}")

    def cmp():
        left = primary()
        while peek() in (("op", "=="), ("op", "!=")):
            op = take()[1]
            right = primary()
            eq = str(left).lower() == str(right).lower() if isinstance(left, str) or isinstance(right, str) else left == right
            left = eq if op == "==" else not eq
        return left

    def chain(op, operand, pick):
        """operand (op operand)*, folded from the left by pick(left, right)."""
        left = operand()
        while peek() == ("op", op):
            take()
            left = pick(left, operand())
        return left

    def andexpr():
        return chain("&&", cmp, lambda left, right: right if left else left)

    def orexpr():
        return chain("||", andexpr, lambda left, right: left if left else right)

    value = orexpr()
    if pos != len(toks):
        raise ReplayError(f"expression {expr!r}: trailing {toks[pos:]}")
    return value


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def substitute(text, ctx: Mapping, functions: Mapping[str, Callable] | None = None):
    if not isinstance(text, str):
        return text
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _text(evaluate(m[1], ctx, functions)), text)


def truthy(cond, ctx: Mapping, functions: Mapping[str, Callable]) -> bool:
    if cond is None:
        return bool(functions["success"]())
    if isinstance(cond, bool):
        return cond
    text = cond.strip()
    m = re.fullmatch(r"\$\{\{(.*)\}\}", text, re.S)
    return bool(evaluate(m[1] if m else text, ctx, functions))


# ---- the graph ----------------------------------------------------------------------------------------------------


@dataclass
class Job:
    key: str  # the job id, plus the matrix values that make this one
    job: str
    matrix: dict
    spec: dict
    needs: list[str]

    @property
    def runs_on(self):
        return self.spec.get("runs-on")


def expand_matrix(strategy: dict | None) -> list[dict]:
    """GitHub's matrix: the product of the value lists, each `include` entry extending the combinations it matches
    (or added as its own), `exclude` entries removed."""
    matrix = dict((strategy or {}).get("matrix") or {})
    if not matrix:
        return [{}]
    include = matrix.pop("include", []) or []
    exclude = matrix.pop("exclude", []) or []
    keys = list(matrix)
    combos = [dict(zip(keys, vals)) for vals in itertools.product(*(matrix[k] for k in keys))] if keys else []
    combos = [c for c in combos if not any(all(c.get(k) == v for k, v in e.items()) for e in exclude)]
    for inc in include:
        matched = [c for c in combos if all(c[k] == inc[k] for k in keys if k in inc)] if keys else []
        if matched:
            for c in matched:
                c.update({k: v for k, v in inc.items() if k not in keys})
        else:
            combos.append(dict(inc))
    return combos or [{}]


def load_jobs(workflow: Path) -> tuple[dict, list[Job]]:
    wf = yaml.safe_load(Path(workflow).read_text())
    jobs = []
    for name, spec in wf["jobs"].items():
        needs = spec.get("needs") or []
        needs = [needs] if isinstance(needs, str) else list(needs)
        for combo in expand_matrix(spec.get("strategy")):
            # the name GitHub shows: the job's `name:` with its matrix filled in, else the id and the matrix values
            shown = substitute(spec["name"], {"matrix": combo}) if spec.get("name") else (
                f"{name} ({', '.join(str(v) for v in combo.values())})" if combo else name)
            jobs.append(Job(key=shown, job=name, matrix=combo, spec=spec, needs=needs))
    if len({j.key for j in jobs}) != len(jobs):
        raise ReplayError("two jobs of the workflow show the same name: " + ", ".join(sorted(j.key for j in jobs)))
    known = {j.job for j in jobs}
    for j in jobs:
        for n in j.needs:
            if n not in known:
                raise ReplayError(f"job {j.job} needs {n}, which the workflow does not have")
    return wf, jobs


# ---- runners and results ------------------------------------------------------------------------------------------


@dataclass
class RunnerModel:
    """What the runner a job lands on has: its environment (PATH, toolchain roots) and what apt would install."""
    env: dict
    apt: Callable[[list[str], Path], list[str]] | None = None  # (packages, job dir) -> folders for PATH
    venv: Path | None = None  # what `python3 -m venv .venv && pip install -e .` leaves: the test's environment


@dataclass
class StepResult:
    name: str
    kind: str  # body, setup, uses, skipped
    command: str = ""
    seconds: float = 0.0
    rc: int = 0
    log: Path | None = None


@dataclass
class JobResult:
    job: Job
    status: str = "pending"  # success, failure, skipped
    started: float = 0.0
    ended: float = 0.0
    steps: list[StepResult] = field(default_factory=list)
    outputs: dict = field(default_factory=dict)
    uploaded: dict[str, list[str]] = field(default_factory=dict)  # artifact -> its files
    downloaded: dict[str, list[str]] = field(default_factory=dict)
    attested: dict[str, str] = field(default_factory=dict)
    workspace: Path | None = None
    home: Path | None = None
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.started


# ---- run steps: what a job body is, what runner setup is -----------------------------------------------------------

# one command of ours, nothing around it
BODY = re.compile(r"^(1bit-build|nox|python3? -m nox|python3? -m builders(\.[a-z_]+)+) [^\n;&|]*$")
SETUP = {
    "pip-install": re.compile(r"^python3? -m pip install -e '?\.(\[[a-z,]+\])?'?$"),
    "venv": re.compile(r"^python3 -m venv \.venv && \.venv/bin/python -m pip install -e '?\.(\[[a-z,]+\])?'?$"),
    "github-path": re.compile(r'^echo "\$PWD/\.venv/bin" >> "\$GITHUB_PATH"$'),
    "apt": re.compile(r"^sudo apt-get update -q\n(# shellcheck disable=SC2086\n)?"
                      r"sudo apt-get install -y -q --no-install-recommends \$APT_PACKAGES$"),
}


def classify(run: str) -> str:
    text = run.strip()
    if BODY.match(text):
        return "body"
    for name, rx in SETUP.items():
        if rx.match(text):
            return name
    raise ReplayError(f"run step {text!r} is neither a job body (one `1bit-build`, nox or `python -m builders...` "
                      "command) nor runner setup "
                      "the replay knows (pip install of the project, a venv, $GITHUB_PATH, apt)")


# ---- artifacts -------------------------------------------------------------------------------------------------------


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _search_path(pattern: str) -> str:
    parts = Path(pattern).parts
    lead = []
    for p in parts:
        if any(c in p for c in "*?["):
            break
        lead.append(p)
    return str(Path(*lead)) if lead else "."


def upload_files(workspace: Path, path_input: str, include_hidden: bool = False) -> tuple[Path, list[Path]]:
    """(root, files) as actions/upload-artifact v4 selects them for `path` (lines of paths or globs, `!` to exclude)."""
    lines = [ln.strip() for ln in path_input.splitlines() if ln.strip()]
    includes = [ln for ln in lines if not ln.startswith("!")]
    excludes = [ln[1:] for ln in lines if ln.startswith("!")]
    files: set[Path] = set()
    searches = []
    for pattern in includes:
        full = str(workspace / os.path.expanduser(pattern))
        searches.append(Path(workspace / _search_path(os.path.expanduser(pattern))).resolve())
        for hit in glob.glob(full, recursive=True):
            p = Path(hit)
            if p.is_dir():
                files.update(f for f in p.rglob("*") if f.is_file())
            elif p.is_file():
                files.add(p)
    files = {f.resolve() for f in files if not any(fnmatch.fnmatch(str(f), str(workspace / e)) for e in excludes)}
    if len(searches) == 1:
        root = searches[0] if searches[0].is_dir() else searches[0].parent
    else:
        root = Path(os.path.commonpath([str(s) for s in searches]))
    if not include_hidden:
        files = {f for f in files if not _hidden(f.relative_to(root))}
    return root, sorted(files)


class ArtifactStore:
    def __init__(self, base: Path):
        self.base = base
        self.lock = threading.Lock()
        self.names: dict[str, str] = {}  # artifact -> the job that uploaded it

    def upload(self, job: str, name: str, root: Path, files: list[Path]) -> list[str]:
        with self.lock:
            if name in self.names:
                raise ReplayError(f"{job}: an artifact named {name!r} was already uploaded by {self.names[name]} "
                                  "(upload-artifact v4 refuses a second one)")
            self.names[name] = job
        dest = self.base / name
        rels = []
        for f in files:
            rel = f.relative_to(root)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)
            rels.append(rel.as_posix())
        return rels

    def download(self, workspace: Path, spec: dict) -> dict[str, list[str]]:
        name, pattern = spec.get("name"), spec.get("pattern")
        merge = str(spec.get("merge-multiple", False)).lower() == "true"
        target = workspace / spec.get("path", ".")
        if name:
            chosen = [name] if name in self.names else []
            if not chosen:
                raise ReplayError(f"download-artifact: no artifact named {name!r}")
            merge = True  # a single named artifact lands in `path` itself
        else:
            chosen = sorted(n for n in self.names if fnmatch.fnmatchcase(n, pattern or "*"))
            if not chosen:
                raise ReplayError(f"download-artifact: no artifact matches {pattern!r}")
        got = {}
        for n in chosen:
            dest = target if merge else target / n
            rels = []
            for f in sorted(p for p in (self.base / n).rglob("*") if p.is_file()):
                rel = f.relative_to(self.base / n)
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                if (dest / rel).exists() and (dest / rel).read_bytes() != f.read_bytes():
                    raise ReplayError(f"download-artifact: {rel} from {n} overwrites another artifact's file with "
                                      "other bytes (merge-multiple)")
                shutil.copy2(f, dest / rel)
                rels.append(rel.as_posix())
            got[n] = rels
        return got


# ---- the replay ------------------------------------------------------------------------------------------------------


class Replay:
    def __init__(self, workflow: Path, *, repo_url: str, base: Path, runner: Callable[[Job], RunnerModel],
                 github: dict, inputs: dict | None = None, variables: dict | None = None, max_parallel: int = 8,
                 only: set[str] | None = None):
        self.workflow = Path(workflow)
        self.wf, self.jobs = load_jobs(self.workflow)
        if only is not None:  # a part of the graph (job ids), closed under `needs`
            unknown = sorted(only - {j.job for j in self.jobs})
            if unknown:
                raise ReplayError(f"the workflow has no job {', '.join(unknown)}")
            self.jobs = [j for j in self.jobs if j.job in only]
            missing = sorted({n for j in self.jobs for n in j.needs} - only)
            if missing:
                raise ReplayError(f"replaying {', '.join(sorted(only))} needs {', '.join(missing)} too")
        self.repo_url = repo_url
        self.base = base
        self.runner = runner
        self.github = github
        self.inputs = inputs or {}
        self.variables = variables or {}
        self.max_parallel = max_parallel
        self.artifacts = ArtifactStore(base / "artifacts")
        self.results: dict[str, JobResult] = {}
        self.t0 = 0.0

    # ---- one job
    def _ctx(self, job: Job, res: JobResult, steps: dict) -> dict:
        needs = {}
        for n in job.needs:
            mine = [r for r in self.results.values() if r.job.job == n]
            outputs = {}
            for r in mine:
                outputs.update(r.outputs)
            needs[n] = {"outputs": outputs, "result": "success" if all(r.status == "success" for r in mine) else "failure"}
        return {"matrix": job.matrix, "needs": needs, "github": self.github, "inputs": self.inputs,
                "vars": self.variables, "steps": steps, "env": {}, "runner": {"temp": str(res.home.parent / "tmp"),
                                                                              "os": "Linux"}}

    def _functions(self, workspace: Path, failed: list[bool]) -> dict:
        def hash_files(*patterns):
            h = hashlib.sha256()
            for pat in patterns:
                for f in sorted(glob.glob(str(workspace / pat), recursive=True)):
                    if Path(f).is_file():
                        h.update(bytes.fromhex(file_sha256(Path(f))))
            return h.hexdigest()
        return {"hashFiles": hash_files, "always": lambda: True, "success": lambda: not failed[0],
                "failure": lambda: failed[0], "cancelled": lambda: False}

    def run_job(self, job: Job) -> JobResult:
        res = self.results[job.key]
        jobdir = self.base / "jobs" / re.sub(r"[^A-Za-z0-9._-]+", "_", job.key)
        workspace, home, tmp = jobdir / "ws", jobdir / "home", jobdir / "tmp"
        for d in (home, tmp):
            d.mkdir(parents=True, exist_ok=True)
        res.workspace, res.home = workspace, home
        model = self.runner(job)
        steps_ctx: dict = {}
        ctx = self._ctx(job, res, steps_ctx)
        failed = [False]
        functions = self._functions(workspace, failed)
        base_env = {**{k: substitute(v, ctx, functions) for k, v in (self.wf.get("env") or {}).items()},
                    **{k: substitute(v, ctx, functions) for k, v in (job.spec.get("env") or {}).items()}}
        extra_path: list[str] = []
        added_env: dict = {}
        for i, step in enumerate(job.spec.get("steps") or []):
            name = step.get("name") or step.get("uses") or (step.get("run") or "").splitlines()[0]
            if not truthy(step.get("if"), ctx, functions):
                res.steps.append(StepResult(name, "skipped"))
                continue
            started = time.monotonic()
            files = {k: tmp / f"{k}-{i}" for k in ("GITHUB_OUTPUT", "GITHUB_PATH", "GITHUB_ENV")}
            for f in files.values():
                f.write_text("")
            env = {**model.env, **self.runner_vars(), **base_env, **added_env,
                   **{k: substitute(v, ctx, functions) for k, v in (step.get("env") or {}).items()},
                   "HOME": str(home), "RUNNER_TEMP": str(tmp), "GITHUB_WORKSPACE": str(workspace), "CI": "true",
                   "GITHUB_ACTIONS": "true", "RUNNER_OS": "Linux", **{k: str(v) for k, v in files.items()}}
            env["PATH"] = os.pathsep.join([*reversed(extra_path), model.env["PATH"]])
            try:
                if "uses" in step:
                    self._uses(job, res, step, workspace, ctx, functions)
                    res.steps.append(StepResult(name, "uses", step["uses"].split("@")[0], time.monotonic() - started))
                    continue
                run = substitute(step["run"], ctx, functions)
                kind = classify(step["run"])
                log = jobdir / f"step-{i}.log"
                if kind == "apt":
                    if model.apt is None:
                        raise ReplayError(f"{job.key}: this runner has no apt")
                    extra_path += model.apt(env.get("APT_PACKAGES", "").split(), jobdir)
                    res.steps.append(StepResult(name, "setup", "apt: " + env.get("APT_PACKAGES", "")))
                    continue
                if kind == "venv":  # the project installed into .venv: here, the test's own environment
                    if model.venv is None:
                        raise ReplayError(f"{job.key}: this runner model has no environment to stand for .venv")
                    (workspace / ".venv").symlink_to(model.venv)
                    res.steps.append(StepResult(name, "setup", "venv"))
                    continue
                if kind == "pip-install":
                    res.steps.append(StepResult(name, "setup", "pip install (the test's environment)"))
                    continue
                with open(log, "w") as out:
                    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", run], cwd=workspace,
                                          env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                res.steps.append(StepResult(name, "body" if kind == "body" else "setup", run, time.monotonic() - started,
                                            proc.returncode, log))
                if proc.returncode != 0:
                    failed[0] = True
                    res.error = f"step {name!r} exited {proc.returncode}; log {log}"
                    break
                outputs = _read_outputs(files["GITHUB_OUTPUT"])
                if step.get("id"):
                    steps_ctx[step["id"]] = {"outputs": outputs}
                extra_path += [ln.strip() for ln in files["GITHUB_PATH"].read_text().splitlines() if ln.strip()]
                added_env.update(_read_outputs(files["GITHUB_ENV"]))
            except ReplayError as exc:
                failed[0] = True
                res.error = f"step {name!r}: {exc}"
                break
        res.outputs = {k: substitute(v, ctx, functions) for k, v in (job.spec.get("outputs") or {}).items()}
        res.status = "failure" if failed[0] else "success"
        return res

    def runner_vars(self) -> dict[str, str]:
        """The GITHUB_* variables a runner sets in every step, from the `github` context."""
        names = {"repository": "GITHUB_REPOSITORY", "ref": "GITHUB_REF", "sha": "GITHUB_SHA",
                 "event_name": "GITHUB_EVENT_NAME"}
        out = {var: str(self.github[k]) for k, var in names.items() if self.github.get(k)}
        if self.github.get("ref"):
            out["GITHUB_REF_NAME"] = re.sub(r"^refs/(heads|tags)/", "", str(self.github["ref"]))
        return out

    def checkout(self, workspace: Path, ref: str, depth: str) -> None:
        """actions/checkout: the default branch (a clone), or `ref` as the action fetches it: a commit checked out
        detached, a branch at its tip now (a local branch of that name); `depth` "0" is the whole history and tags."""
        deep = [] if depth == "0" else ["--depth", depth]

        def git(*args: str) -> None:
            proc = subprocess.run(["git", *args], cwd=workspace, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ReplayError(f"actions/checkout ref {ref!r}: git {args[0]} failed: {proc.stderr.strip()}")

        if not ref:
            subprocess.run(["git", "clone", "--quiet", *deep, self.repo_url, str(workspace)], check=True,
                           capture_output=True)
            return
        workspace.mkdir(parents=True)
        git("init", "--quiet")
        git("remote", "add", "origin", self.repo_url)
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            git("fetch", "--quiet", "--no-tags", *deep, "origin", ref)
            if depth == "0":
                git("fetch", "--quiet", "origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*")
            git("checkout", "--quiet", "--detach", ref)
            return
        branch = ref.removeprefix("refs/heads/")
        git("fetch", "--quiet", *(["--no-tags", *deep] if deep else []), "origin",
            f"+refs/heads/{branch}:refs/remotes/origin/{branch}", *([] if deep else ["+refs/tags/*:refs/tags/*"]))
        git("checkout", "--quiet", "-B", branch, f"refs/remotes/origin/{branch}")

    def _uses(self, job: Job, res: JobResult, step: dict, workspace: Path, ctx, functions) -> None:
        action = step["uses"].split("@")[0]
        with_ = {k: substitute(v, ctx, functions) for k, v in (step.get("with") or {}).items()}
        if action == "actions/checkout":
            self.checkout(workspace, str(with_.get("ref") or ""), str(with_.get("fetch-depth", "1")))
        elif action in ("actions/setup-python", "actions/cache"):
            pass  # the test's interpreter; a cold cache (path and key are read above, so they must evaluate)
        elif action == "actions/upload-artifact":
            root, files = upload_files(workspace, with_["path"], str(with_.get("include-hidden-files", "false")) == "true")
            if not files and with_.get("if-no-files-found", "warn") == "error":
                raise ReplayError(f"upload-artifact {with_['name']}: no files found at {with_['path']}")
            res.uploaded[with_["name"]] = self.artifacts.upload(job.key, with_["name"], root, files)
        elif action == "actions/download-artifact":
            res.downloaded.update(self.artifacts.download(workspace, with_))
        elif action == "actions/attest-build-provenance":
            subjects = sorted(glob.glob(str(workspace / with_["subject-path"])))
            if not subjects:
                raise ReplayError(f"attest-build-provenance: nothing matches {with_['subject-path']}")
            res.attested = {Path(s).name: file_sha256(Path(s)) for s in subjects if Path(s).is_file()}
        else:
            raise ReplayError(f"{job.key}: the replay does not know the action {action}")

    # ---- the graph
    def run(self) -> dict[str, JobResult]:
        self.results = {j.key: JobResult(job=j) for j in self.jobs}
        self.t0 = time.monotonic()
        pending = list(self.jobs)
        running: dict = {}
        with ThreadPoolExecutor(max_workers=self.max_parallel) as pool:
            while pending or running:
                for job in list(pending):
                    deps = [r for r in self.results.values() if r.job.job in job.needs]
                    if any(r.status in ("failure", "skipped") for r in deps):
                        self.results[job.key].status = "skipped"
                        pending.remove(job)
                    elif all(r.status == "success" for r in deps):
                        pending.remove(job)
                        running[job.key] = pool.submit(self._timed, job)
                if not running:
                    if pending:
                        raise ReplayError("jobs wait on each other: " + ", ".join(j.key for j in pending))
                    break
                done = next(iter(_wait_any(running.values())))
                key = next(k for k, f in running.items() if f is done)
                running.pop(key)
                done.result()
        return self.results

    def _timed(self, job: Job) -> JobResult:
        self.results[job.key].started = time.monotonic() - self.t0  # when a runner took it, not when it was queued
        try:
            return self.run_job(job)
        except Exception as exc:  # a replay fault: the job failed, say why
            self.results[job.key].status = "failure"
            self.results[job.key].error = f"{type(exc).__name__}: {exc}"
            return self.results[job.key]
        finally:
            self.results[job.key].ended = time.monotonic() - self.t0

    def critical_path(self) -> float:
        """The release's wall time on GitHub, where every job has its own runner: the longest chain of `needs`."""
        memo: dict[str, float] = {}

        def finish(key: str) -> float:
            if key not in memo:
                r = self.results[key]
                memo[key] = max((finish(o.job.key) for o in self.results.values() if o.job.job in r.job.needs),
                                default=0.0) + r.seconds
            return memo[key]

        return max((finish(k) for k in self.results), default=0.0)


def _wait_any(futures):
    from concurrent.futures import FIRST_COMPLETED, wait

    done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
    return done


def _read_outputs(path: Path) -> dict:
    out, lines = {}, path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^([A-Za-z0-9_-]+)<<(\S+)$", line)
        if m:
            end = lines.index(m[2], i + 1)
            out[m[1]] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if "=" in line:
            k, _, v = line.partition("=")
            out[k] = v
        i += 1
    return out
