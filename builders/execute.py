"""Execute a plan: each step in order through its kind in builders/steps/ (STEPS), skipping a step whose cache key
was already built and whose output still holds it; show progress; run commands (one log file per step).

The executor knows no step kind: a step's `run(ctx, step)` does its work with the context the executor gives it (the
plan, the project, offline, the log, the step's progress line and the command runner below), its `holds(ctx, step)`
says whether its output is there and trusted, and its `bundle` flag says it has no stamp of its own (the bundle steps:
done while the published bundle holds the plan's key). A plan with an action no kind runs is refused before its first
step."""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .io import gitcmd, runner, swap
from .project.config import Project
from .errors import BuildError, OnebitError
from .session import log_to, new_console
from .plan_types import Command, Plan, Step
from .ship.stage import KEY_FILE  # noqa: F401  (the key file every output holds; tests read it from here)
from .steps import STEPS, StepContext

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_LINES = re.compile(r".*\n|.+\Z")  # an output's lines, each with its newline
PLAIN_PROGRESS_EVERY = 30.0  # seconds between plain progress lines when the output is not a terminal


def progress_every() -> float:
    """Seconds between plain progress lines off a terminal: $ONEBIT_PROGRESS_EVERY, else PLAIN_PROGRESS_EVERY."""
    try:
        return max(0.0, float(os.environ["ONEBIT_PROGRESS_EVERY"]))
    except (KeyError, ValueError):
        return PLAIN_PROGRESS_EVERY


@dataclass
class Report:
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class Executor:
    def __init__(self, plan: Plan, project: Project, *, offline: bool = False, force: bool = False,
                 console: Console | None = None):
        self.plan = plan
        self.project = project
        self.offline = offline
        self.force = force
        self.console = console or new_console()
        self.log = log_to(self.console)
        self.layout = plan.layout
        self.report = Report()
        self.log_dir = self.layout.work / "logs"

    # ---- what a step kind gets ----------------------------------------------------------------------------------
    def context(self, step: Step | None = None, progress: Progress | None = None, task=None) -> StepContext:
        """What a step kind gets: for `step`, its progress line and a command runner logging to its log file."""
        if step is None or progress is None:
            return StepContext(plan=self.plan, project=self.project, offline=self.offline, log=self.log)

        def run_commands(commands, checker: Callable | None = None, noter: Callable | None = None) -> dict:
            return self._run_commands(step, commands, progress, task, checker=checker, noter=noter)

        return StepContext(plan=self.plan, project=self.project, offline=self.offline, log=self.log,
                           note=lambda m: progress.update(task, description=f"{step.title}: {m}"),
                           run_commands=run_commands)

    # ---- cache: a step is reused only when its stamp exists AND its output says it holds that key ------------------
    def is_cached(self, step: Step) -> bool:
        kind = STEPS.get(step.action)
        if self.force or kind is None:
            return False
        if kind.bundle:
            return kind.holds(self.context(), step)
        # a cache entry with a marker is reused only when it is trusted: its marker names its key, its record agrees
        return self.layout.step_stamp(step.key).is_file() and kind.holds(self.context(), step)

    def _stamp(self, step: Step) -> None:
        if STEPS[step.action].bundle:
            return
        swap.write_text_atomic(self.layout.step_stamp(step.key), json.dumps({"id": step.id, "key": step.key, "time": time.time()}))

    # ---- running -----------------------------------------------------------------------------------------------
    def run(self) -> Report:
        unknown = sorted({s.action for s in self.plan.steps} - set(STEPS))
        if unknown:
            raise BuildError(f"no executor for step action(s) {', '.join(unknown)}",
                             hint="a planner and builders/steps/ disagree: each action is one kind in STEPS")
        live = self.console.is_terminal  # off a terminal: one line per step and plain progress lines, no live bars
        with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False, disable=not live) as progress:
            overall = progress.add_task(f"{self.plan.bundle}: {len(self.plan.steps)} steps", total=len(self.plan.steps))
            for i, step in enumerate(self.plan.steps, 1):
                if self.is_cached(step):
                    self.report.cached.append(step.id)
                    progress.advance(overall)
                    continue
                if not live:
                    self.log(f"step {i}/{len(self.plan.steps)} {step.id}: {step.title}")
                task = progress.add_task(step.title, total=None)
                started = time.monotonic()
                try:
                    STEPS[step.action].run(self.context(step, progress, task), step)
                except OnebitError as exc:
                    raise exc.for_bundle(self.plan.bundle)
                self._stamp(step)
                self.report.seconds[step.id] = time.monotonic() - started
                self.report.ran.append(step.id)
                progress.update(task, total=1, completed=1)
                progress.advance(overall)
        return self.report

    def _run_commands(self, step: Step, commands, progress: Progress, task, *, checker: Callable | None = None,
                      noter: Callable | None = None) -> dict:
        """Run the commands, logging to work/logs/<step>.log; checker(i, output) may fail the step, noter(i, output)
        may inform (a log line, and facts the manifest records). Returns the facts."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / (step.id.replace(":", "-").replace("/", "_") + ".log")
        facts: dict = {}
        with open(log_path, "w") as log:
            for i, cmd in enumerate(commands):
                output = self._run_one(cmd, log, progress, task, label=step.id)
                problem = checker(i, output) if checker else None
                if problem:
                    raise BuildError(problem, where=getattr(step.data, "where", step.id), hint=f"full log: {log_path}")
                if noter:
                    note, more = noter(i, output)
                    if note:
                        self.log(f"[yellow]{step.id}[/]: {note}")
                        log.write(f"# onebit: {note}\n")
                    facts.update(more)
        return facts

    def _run_one(self, cmd: Command, log, progress: Progress, task, label: str = "") -> str:
        env = cmd.environ(os.environ)
        argv = list(cmd.argv)
        if argv[:1] == ["git"]:  # every git call hardened the one way (builders/io/gitcmd.py), with its deadline
            gitcmd.refuse_special_files(argv[1:], cmd.cwd)
            argv, env = gitcmd.bounded_argv(argv[1:]), gitcmd.env(base=env)
        for d in cmd.mkdirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, text in cmd.files:  # what the command reads that the plan wrote (a CMake toolchain file)
            swap.write_text_atomic(Path(path), text)
            log.write(f"# onebit: wrote {path}\n")
        for path, target in cmd.links:  # link names the command links against (the user's ROCm in a build root)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            if Path(path).is_symlink() or Path(path).exists():
                Path(path).unlink()
            os.symlink(target, path)
        log.write(f"$ {cmd.shell()}\n")
        log.flush()
        started = time.monotonic()
        last = [started]
        every = progress_every()

        def on_line(line: str) -> None:
            m = _NINJA.match(line)
            if m:
                progress.update(task, completed=int(m.group(1)), total=int(m.group(2)))
                log.flush()  # so `tail -f` on the log follows the build
            now = time.monotonic()
            if not self.console.is_terminal and now - last[0] >= every:
                # CI logs: a plain line about every 30 s, since the live bar only draws on a terminal
                last[0] = now
                done = f" [{m.group(1)}/{m.group(2)}]" if m else ""
                self.console.print(f"... {label or cmd.argv[0]}{done} {int(now - started)} s", highlight=False, markup=False,
                                   soft_wrap=True)

        try:
            proc = runner.tee(argv, log=log, on_line=on_line, cwd=cmd.cwd, env=env)
        except FileNotFoundError:
            raise BuildError(f"command not found: {cmd.argv[0]}", hint="install it, or check the recipe's toolchain") from None
        if proc.returncode != 0:
            tail = "".join(_LINES.findall(proc.stdout)[-25:])
            raise BuildError(f"command failed (exit {proc.returncode}): {cmd.shell()}\n{tail}", hint=f"full log: {log.name}")
        return proc.stdout
