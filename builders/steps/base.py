"""What every step kind shares: the Protocol, the context a step runs with, and the key-file check.

A step kind turns its planner's data into effects (`run`), says whether its output is there and trusted (`holds`),
and says in words what it does that is no command of its own (`describe`: the plan's `--verbose` lines and its JSON's
`describe`). The mechanisms it calls (the folders io/, project/, roots/, inputs/, ship/) stay below; no mechanism
imports a step."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from ..plan_types import Command, Layout, Plan, Step
from ..io.readfile import UnreadableFile, read_text


def _quiet(_: str) -> None:
    pass


def _no_commands(commands: Sequence[Command], checker: Callable | None = None, noter: Callable | None = None) -> dict:
    raise RuntimeError("this context runs no commands (it only asks whether outputs hold)")


@dataclass(frozen=True)
class StepContext:
    """What a step's `run` and `holds` get from the executor: the plan and project, whether it may download, and the
    executor's log line, progress line and command runner (one log file per step: work/logs/<step>.log)."""

    plan: Plan
    project: Any  # config.Project
    offline: bool = False
    log: Callable[[str], None] = _quiet  # a line of the build's output
    note: Callable[[str], None] = _quiet  # the step's progress line: what it is doing now
    # (commands, checker=None, noter=None) -> facts: checker(i, output) may fail the step, noter(i, output) informs
    run_commands: Callable[..., dict] = _no_commands

    @property
    def layout(self) -> Layout:
        return self.plan.layout


class StepKind(Protocol):
    action: str  # the Step.action its planner makes
    fetches: bool  # an input fetched into the cache: `1bit-build fetch` runs it
    replans: bool  # assembles a toolchain the keys depend on: a build runs it first, then plans the bundle again
    bundle: bool  # a bundle step: no stamp of its own; done while the published bundle holds the plan's key

    def run(self, ctx: StepContext, step: Step) -> None: ...

    def holds(self, ctx: StepContext, step: Step) -> bool: ...

    def describe(self, step: Step) -> list[str]: ...


class Kind:
    """A step kind's flags where it says nothing else: it fetches nothing into the cache, assembles no toolchain the
    keys see and is no bundle step. A kind names its action and only the flags it sets (`fetches = True`)."""

    action = ""
    fetches = replans = bundle = False


def described(step: Step, kind: StepKind) -> Step:
    """The step with its kind's words for what it does that is no command of its own (Step.describe)."""
    return dataclasses.replace(step, describe=tuple(kind.describe(step)))


def holds_key(key_file: Path, key: str) -> bool:
    """Whether the key file beside (or in) an output names this key: an output is reused only when it says so."""
    try:
        return read_text(key_file, 4096).strip() == key
    except UnreadableFile:
        return False
