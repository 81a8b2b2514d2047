"""A recipe's hardware checklist as a release gate on the runner that built it: every line that can run unattended runs,
with a timeout; what cannot (prose, a model that was not given) is listed as skipped with the reason.

    python -m builders.release.checklist --prefix P RECIPE...     # ONEBIT_CHECK_MODEL=M.gguf for the model lines

How a line becomes a command (plan_items, pure):
  - `nox -s build-...`: the build itself, which this job already ran: skipped;
  - `<prefix>` is the installed prefix; `<bin:NAME>` (and, for older lines, `<prefix>/bin/NAME`) is the binary NAME of
    each of the recipe's backends AS THE MANIFEST NAMES IT (lean's two builds: two commands), never a fixed path;
  - `{tool:NAME}` is the recipe's toolchain tool as this runner has it (XRT's own xrt-smi);
  - `<a model ...>` is $ONEBIT_CHECK_MODEL (a line that wants a .1bp package needs one);
  - `cd DIR && A && B` runs A then B in DIR, each its own item; `A | grep [-i] PATTERN` checks A's output;
  - `1bit serve ...` without --dry-run starts the server, waits for /health, asks one chat completion, stops it;
  - a line whose first word is no program on PATH is a manual step.
`1bit check` runs first, against the installed manifest, unless every backend there is the NPU runtime (which lists
no devices: its recipe's checklist asks XRT itself). Every command has a timeout, so a hung server fails the gate
instead of running to the job's limit.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..io import runner

MODEL_ENV = "ONEBIT_CHECK_MODEL"
TIMEOUT = 600  # seconds for one command
SERVE_TIMEOUT = 900  # seconds for a server to load its model and answer
CHECK = "1bit check"
MANIFEST_RELPATH = "share/onebit/manifest.json"


@dataclass(frozen=True)
class Item:
    line: str  # the checklist line it came from
    argv: tuple[str, ...] | None  # None: not run (why says why)
    why: str = ""
    cwd: str | None = None
    grep: tuple[str, ...] | None = None  # `| grep ...`: grep's options and pattern, applied to the output
    serve: bool = False  # a server: started, asked, stopped
    timeout: int = TIMEOUT


def _strip_comment(raw: str) -> str:
    return raw.split("  #", 1)[0].split(" # ", 1)[0].strip()


def _model_for(placeholder: str, model: str | None) -> tuple[str | None, str]:
    if model is None:
        return None, f"needs a model: set {MODEL_ENV}"
    if "1bp" in placeholder.lower() and not model.endswith(".1bp"):
        return None, f"needs a .1bp package; {MODEL_ENV} is {Path(model).name}"
    return model, ""


def _segments(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"\s&&\s", text)]


def plan_items(lines: Sequence[str], prefix: str, model: str | None, *, binaries: Mapping[str, Sequence[str]] | None = None,
               tools: Mapping[str, str] | None = None, which: Callable[[str], str | None] = shutil.which) -> list[Item]:
    """Pure given `which`: each checklist line -> the commands to run, or why it is not run.

    binaries: NAME -> the prefix-relative paths the manifest gives the recipe's backends for it; tools: tool -> path."""
    binaries, tools = binaries or {}, tools or {}
    items: list[Item] = []
    for raw in lines:
        line = _strip_comment(raw)
        if re.match(r"^nox -s build-", line):
            items.append(Item(raw, None, "the build itself (this job built it)"))
            continue
        text = re.sub(r"<prefix>/bin/([A-Za-z0-9._+-]+)",
                      lambda m: f"<bin:{m[1]}>" if m[1] in binaries else m[0], line).replace("<prefix>", prefix)
        unknown_tool = next((t for t in re.findall(r"\{tool:([^}]+)\}", text) if not tools.get(t)), None)
        if unknown_tool:
            items.append(Item(raw, None, f"the toolchain's {unknown_tool} is not on this runner"))
            continue
        text = re.sub(r"\{tool:([^}]+)\}", lambda m: shlex.quote(tools[m[1]]), text)
        for placeholder in re.findall(r"<(?!bin:)[^<>]*>", text):
            chosen, why = _model_for(placeholder, model)
            if chosen is None:
                break
            text = text.replace(placeholder, shlex.quote(chosen), 1)
        else:
            why = ""
        if why:
            items.append(Item(raw, None, why))
            continue
        # one command per backend binary the line names (a recipe with two builds checks both)
        names = re.findall(r"<bin:([^>]+)>", text)
        missing = [n for n in names if not binaries.get(n)]
        if missing:
            items.append(Item(raw, None, f"the manifest names no {missing[0]} for this recipe"))
            continue
        variants = [text]
        for name in dict.fromkeys(names):
            variants = [v.replace(f"<bin:{name}>", shlex.quote(f"{prefix}/{rel}")) for v in variants for rel in binaries[name]]
        for text in variants:
            items += _line_items(raw, text, which)
    return items


def _line_items(raw: str, text: str, which) -> list[Item]:
    out: list[Item] = []
    cwd = None
    for seg in _segments(text):
        grep = None
        if "|" in seg:
            left, _, right = seg.partition("|")
            try:
                rhs = shlex.split(right)
            except ValueError:
                return [Item(raw, None, "not a command")]
            if not rhs or rhs[0] != "grep" or "|" in right or len(rhs) < 2:
                return [Item(raw, None, "manual step (a pipe into something other than grep)")]
            seg, grep = left.strip(), tuple(rhs[1:])
        try:
            argv = tuple(shlex.split(seg))
        except ValueError:
            return [Item(raw, None, "not a command")]
        if not argv:
            return [Item(raw, None, "not a command")]
        if argv[0] == "cd" and len(argv) == 2:
            cwd = argv[1]
            continue
        program = argv[0]
        known = Path(program).is_absolute() or "/" in program or which(program)
        if not known:
            return [Item(raw, None, f"manual step (no program {program!r} on PATH)")]
        serve = argv[:2] == ("1bit", "serve") and "--dry-run" not in argv and "--help" not in argv
        out.append(Item(raw, argv, cwd=cwd, grep=grep, serve=serve, timeout=SERVE_TIMEOUT if serve else TIMEOUT))
    return out


# ---- running ----------------------------------------------------------------------------------------------------


@dataclass
class Result:
    line: str
    argv: list[str] | None
    result: str  # ok, fail, skip
    why: str = ""
    seconds: float = 0.0
    output: str = ""  # the last lines


def _tail(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _grep_ok(options: Sequence[str], text: str) -> bool:
    flags = re.IGNORECASE if "-i" in options else 0
    pattern = [o for o in options if not o.startswith("-")]
    if len(pattern) != 1:
        return False
    regex = re.escape(pattern[0]) if "-F" in options else pattern[0]
    return any(re.search(regex, line, flags) for line in text.splitlines())


STOP_GRACE = 10  # seconds a command's group has between SIGTERM and SIGKILL


def run_command(item: Item, env: Mapping[str, str]) -> Result:
    started = time.monotonic()
    try:
        proc = runner.run(item.argv, cwd=item.cwd, env=env, stderr=runner.STDOUT, timeout=item.timeout,
                          grace=STOP_GRACE)
    except runner.TimedOut:
        return Result(item.line, list(item.argv), "fail", f"timed out after {item.timeout} s",
                      time.monotonic() - started)
    except OSError as exc:
        return Result(item.line, list(item.argv), "fail", f"cannot run {item.argv[0]}: {exc.strerror or exc}")
    out = proc.stdout
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        return Result(item.line, list(item.argv), "fail", f"exit {proc.returncode}", seconds, _tail(out))
    if item.grep is not None and not _grep_ok(item.grep, out):
        return Result(item.line, list(item.argv), "fail", f"output has no match for grep {' '.join(item.grep)}",
                      seconds, _tail(out))
    return Result(item.line, list(item.argv), "ok", "", seconds, _tail(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(item: Item, env: Mapping[str, str], poll: float = 1.0) -> Result:
    """Start the server, wait for /health, ask one chat completion, stop it: all within the item's timeout."""
    import requests

    argv = list(item.argv)
    if "--port" not in argv:
        argv += ["--port", str(_free_port())]
    port = argv[argv.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    deadline = started + item.timeout
    try:
        proc = runner.start(argv, cwd=item.cwd, env=env, stdout=runner.DEVNULL, stderr=runner.DEVNULL)
    except OSError as exc:
        return Result(item.line, argv, "fail", f"cannot run {argv[0]}: {exc.strerror or exc}")
    try:
        while True:
            if proc.poll() is not None:
                return Result(item.line, argv, "fail", f"the server exited {proc.returncode} before it answered",
                              time.monotonic() - started)
            if time.monotonic() > deadline:
                return Result(item.line, argv, "fail", f"no healthy server after {item.timeout} s",
                              time.monotonic() - started)
            try:
                if requests.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(poll)
        left = max(5.0, deadline - time.monotonic())
        try:
            r = requests.post(f"{base}/v1/chat/completions", timeout=left,
                              json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})
        except requests.RequestException as exc:
            return Result(item.line, argv, "fail", f"chat completion: {exc}", time.monotonic() - started)
        ok = r.status_code == 200 and bool((r.json() if r.headers.get("content-type", "").startswith("application/json")
                                            else {}).get("choices"))
        return Result(item.line, argv, "ok" if ok else "fail", "" if ok else f"chat completion: HTTP {r.status_code}",
                      time.monotonic() - started, _tail(r.text))
    finally:
        runner.stop(proc, STOP_GRACE)
        proc.wait()


def run_items(items: Sequence[Item], env: Mapping[str, str], say: Callable[[str], None] = print) -> list[Result]:
    results = []
    for item in items:
        if item.argv is None:
            res = Result(item.line, None, "skip", item.why)
        elif item.serve:
            res = run_server(item, env)
        else:
            res = run_command(item, env)
        say(f"{res.result:<4}  {item.line}" + (f"  ({res.why})" if res.why else ""))
        if res.result == "fail" and res.output:
            say("      " + res.output.replace("\n", "\n      "))
        results.append(res)
    return results


# ---- a gate: the recipes' checklists against an installed prefix ------------------------------------------------


def manifest_binaries(manifest: Mapping, recipes: Sequence[str]) -> dict[str, list[str]]:
    """Pure: binary name -> the prefix-relative paths the manifest gives the recipes' backends, in backend order."""
    out: dict[str, list[str]] = {}
    for _, entry in sorted((manifest.get("backends") or {}).items()):
        if entry.get("recipe") in recipes:
            for name, rel in sorted((entry.get("binaries") or {}).items()):
                out.setdefault(name, []).append(rel)
    return out


def wants_check(manifest: Mapping) -> bool:
    """Pure: `1bit check` proves something unless every backend is the NPU runtime, which lists no devices."""
    backends = (manifest.get("backends") or {}).values()
    return any(b.get("adapter", "llama-server") != "npu" for b in backends)


def recipe_tools(root: Path, recipes: Sequence[str]) -> dict[str, str]:
    """tool -> its path on this runner, for the recipes' toolchains (a tool the runner lacks is left out)."""
    from ..project.config import load_project
    from ..inputs.host import detect_tool

    project = load_project(root)
    out: dict[str, str] = {}
    for name in recipes:
        for variant in project.recipes[name].variant_names():
            for tool in project.recipes[name].variant(variant).toolchain:
                fact = detect_tool(tool, os.environ)
                if fact.found and tool.tool not in out:
                    out[tool.tool] = fact.path
    return out


def gate(root: Path, prefix: Path, recipes: Sequence[str], model: str | None, *,
         env: Mapping[str, str] | None = None, say: Callable[[str], None] = print) -> dict:
    """Run the recipes' checklists (after `1bit check` where it proves something) against an installed prefix.
    Returns the gate document (gate.json): every item with its result, and whether the gate passed."""
    prefix = Path(prefix).resolve()
    manifest_path = prefix / MANIFEST_RELPATH
    manifest = json.loads(manifest_path.read_text())
    base = dict(os.environ if env is None else env)
    run_env = {**base, "PATH": f"{prefix}/bin{os.pathsep}{base.get('PATH', '')}", "ONEBIT_MANIFEST": str(manifest_path)}
    lines = [CHECK] if wants_check(manifest) else []
    for name in recipes:
        recipe = yaml.safe_load((Path(root) / "recipes" / f"{name}.yaml").read_text()) or {}
        lines += [str(x) for x in recipe.get("hardware_checklist") or []]
    tools = recipe_tools(Path(root), recipes) if any("{tool:" in line for line in lines) else {}
    items = plan_items(lines, str(prefix), model, binaries=manifest_binaries(manifest, recipes), tools=tools,
                       which=lambda c: shutil.which(c, path=run_env["PATH"]))
    if not wants_check(manifest):
        items.insert(0, Item(CHECK, None, "every backend here is the NPU runtime, which lists no devices: "
                                          "its checklist asks XRT"))
    results = run_items(items, run_env, say)
    failed = [r for r in results if r.result == "fail"]
    return {"schema": 1, "recipes": list(recipes), "bundle": manifest.get("bundle"), "version": manifest.get("version"),
            "model": Path(model).name if model else None, "items": [asdict(r) for r in results],
            "passed": not failed and any(r.result == "ok" for r in results)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m builders.release.checklist",
                                description="run recipes' hardware checklists against an installed prefix")
    p.add_argument("recipes", nargs="+")
    p.add_argument("--root", default=".")
    p.add_argument("--prefix", required=True)
    p.add_argument("--model", default=os.environ.get(MODEL_ENV) or None,
                   help=f"the model for the checklist lines that need one (default: ${MODEL_ENV})")
    args = p.parse_args(argv)
    prefix = Path(args.prefix)
    if not (prefix / MANIFEST_RELPATH).is_file():
        print(f"error: {prefix}: no {MANIFEST_RELPATH}; install a bundle there first", file=sys.stderr)
        return 2
    missing = [r for r in args.recipes if not (Path(args.root) / "recipes" / f"{r}.yaml").is_file()]
    if missing:
        print(f"error: no recipe {missing[0]!r} under {Path(args.root) / 'recipes'}", file=sys.stderr)
        return 2
    doc = gate(Path(args.root), prefix, args.recipes, args.model)
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
