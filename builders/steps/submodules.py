"""The submodules step: a pin's git submodules at the gitlinks its commit records (builders/inputs/companions.py), locked in
a file the source step checks them out from."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..inputs import companions
from ..project.config import Pin
from ..plan_types import Layout, Step, digest
from .base import Kind, StepContext, described


@dataclass(frozen=True)
class SubmodulesData:
    pin: str
    commit: str
    url: str
    want: tuple[str, ...]
    lock: str
    git_dir: str


def submodules_lock(layout: Layout, pin: Pin, want: Sequence[str]) -> Path:
    return layout.cache / "submodules" / f"{pin.commit}-{digest(sorted(want))[:12]}.json"


def plan_submodules(layout: Layout, pin: Pin, want: Sequence[str]) -> Step:
    """The pin's git submodules at the gitlinks its commit records (companions.py fetches them)."""
    return described(Step(id=f"fetch:submodules:{pin.name}", action="submodules",
                          title=f"fetch submodules of {pin.name} @ {pin.short} at their gitlinks ({', '.join(want)})",
                          key=digest("submodules", pin.url, pin.commit, sorted(want)), needs=(f"fetch:{pin.name}",),
                          data=SubmodulesData(pin=pin.name, commit=pin.commit, url=pin.url, want=tuple(want),
                                              lock=str(submodules_lock(layout, pin, want)),
                                              git_dir=str(layout.git_cache(pin.commit)))), STEP)


class SubmodulesStep(Kind):
    action = "submodules"
    fetches = True

    def run(self, ctx: StepContext, step: Step) -> None:
        d: SubmodulesData = step.data
        subs = companions.fetch_submodules(ctx.layout.git_cache, Path(d.git_dir), d.commit, d.url, list(d.want),
                                           Path(d.lock), offline=ctx.offline, log=ctx.note)
        ctx.log(f"submodules of {d.pin}: " + ", ".join(f"{s.path} @ {s.commit[:7]}" for s in subs))

    def holds(self, ctx: StepContext, step: Step) -> bool:
        d: SubmodulesData = step.data
        subs, _ = companions.read_lock(Path(d.lock), companions.lock_key(d.commit, list(d.want)))
        return subs is not None

    def describe(self, step: Step) -> list[str]:
        d: SubmodulesData = step.data
        return [f"{p}: its .gitmodules URL fetched at the gitlink {d.commit[:7]} records" for p in d.want]


STEP = SubmodulesStep()
