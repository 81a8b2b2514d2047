"""The wheels step: a recipe's Python requirements as wheels, one folder per supported CPython
(builders/inputs/fetch.py's fetch_wheels): {wheels}."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..inputs import fetch as fetching
from ..project.config import Recipe
from ..inputs.host import HostFacts
from ..plan_types import Layout, Step, digest
from .base import Kind, StepContext, described


@dataclass(frozen=True)
class WheelsData:
    dir: str
    requirements: tuple[str, ...]  # the whole closure, each by exact version
    pythons: tuple[str, ...] = ()  # 'X.Y' of every CPython the wheels are fetched for (one folder each)


def wheels_key(recipe: Recipe, host: HostFacts) -> str:
    """The vendored wheels are fetched for every supported CPython (source.pythons), not the build machine's own."""
    return digest("wheels", recipe.source.get("wheels", []), tuple(recipe.source.get("pythons", ())))


def plan_wheels(recipe: Recipe, host: HostFacts, layout: Layout) -> list[Step]:
    """The recipe's Python requirements as wheels for the build machine's interpreter."""
    wheels = recipe.source.get("wheels", [])
    if not wheels:
        return []
    key = wheels_key(recipe, host)
    return [described(Step(id=f"fetch:wheels:{recipe.name}", action="wheels",
                           title=f"fetch {len(wheels)} Python requirement(s) as wheels for {recipe.name}", key=key,
                           data=WheelsData(dir=str(layout.wheels(key)), requirements=tuple(wheels),
                                           pythons=tuple(recipe.source.get("pythons", ())))), STEP)]


class WheelsStep(Kind):
    action = "wheels"
    fetches = True

    def run(self, ctx: StepContext, step: Step) -> None:
        d: WheelsData = step.data
        fetching.fetch_wheels(list(d.requirements), Path(d.dir), list(d.pythons), offline=ctx.offline, log=ctx.note)

    def holds(self, ctx: StepContext, step: Step) -> bool:
        d: WheelsData = step.data
        return fetching.wheels_untrusted(Path(d.dir), d.requirements, d.pythons) is None

    def describe(self, step: Step) -> list[str]:
        d: WheelsData = step.data
        return [f"pip download --no-deps --only-binary :all: --python-version {p} --dest {d.dir}/cp{p.replace('.', '')} "
                f"{' '.join(d.requirements)}" for p in d.pythons]


STEP = WheelsStep()
