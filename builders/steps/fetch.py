"""The fetch step: a pin's commit into the content-addressed git cache from the first of its mirrors that has it
(builders/inputs/fetch.py, git through builders/io/gitcmd.py), verified by its object id."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inputs import fetch as fetching
from ..project.config import MIRRORS_ENV, Pin
from ..plan_types import Layout, Step, digest
from .base import Kind, StepContext, described


@dataclass(frozen=True)
class FetchData:
    pin: str
    commit: str
    dest: str
    # (recipe, its source.may_lack globs) for each recipe that uses the pin: the absent files of a partial clone
    # that all of them tolerate (fetch.untolerated)
    may_lack: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the pin's mirrors in the order the plan shows them (config.Mirror; $ONEBIT_GIT_MIRRORS stands for the mirror
    # directories the fetch reads when it runs), and the download cache a sdist mirror lands in
    mirrors: tuple[Any, ...] = ()
    downloads: str = ""


def plan_fetch(pin: Pin, layout: Layout, may_lack: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Step:
    """The pin's commit from its mirrors in order; the step runs no command of its own, so the plan describes the
    mirrors."""
    dirs = layout.mirror_dirs if layout.mirror_dirs is not None else (Path(f"${MIRRORS_ENV}"),)
    return described(Step(id=f"fetch:{pin.name}", action="fetch",
                          title=f"fetch {pin.name} @ {pin.short} (verified by commit SHA; mirrors in order)",
                          key=digest("fetch", pin.url, pin.commit),
                          data=FetchData(pin=pin.name, commit=pin.commit, dest=str(layout.git_cache(pin.commit)),
                                         may_lack=may_lack, mirrors=pin.fetch_order(dirs),
                                         downloads=str(layout.downloads()))), STEP)


def fetch_for(steps: dict[str, Step], pin: Pin, layout: Layout, user: tuple[str, tuple[str, ...]]) -> None:
    """The pin's fetch step, with this recipe among those whose `source.may_lack` a partial clone must satisfy."""
    sid = f"fetch:{pin.name}"
    step = steps.get(sid) or plan_fetch(pin, layout)
    if user not in step.data.may_lack:
        step = dataclasses.replace(step, data=dataclasses.replace(step.data, may_lack=step.data.may_lack + (user,)))
    steps[sid] = step


class FetchStep(Kind):
    action = "fetch"
    fetches = True

    def run(self, ctx: StepContext, step: Step) -> None:
        pin = ctx.project.pins[step.data.pin]
        how = fetching.fetch_pin(pin, Path(step.data.dest), ctx.layout.downloads(), offline=ctx.offline, log=ctx.note,
                                 mirror_dirs=fetching.mirror_dirs(ctx.layout.mirror_dirs, os.environ),
                                 may_lack=step.data.may_lack)
        ctx.log(f"fetched {pin.name} @ {pin.short} from {how}")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        d: FetchData = step.data
        return fetching.cached(Path(d.dest), d.commit, d.may_lack)

    def describe(self, step: Step) -> list[str]:
        d: FetchData = step.data
        out = []
        for mirror in d.mirrors:
            if mirror.kind == "mirror_dir":  # its objects copied (a partial clone: only if the absent files are tolerated)
                out.append(f"from the mirror directory {mirror.spec}: its objects of {d.commit[:7]} copied")
            elif mirror.kind == "pypi_sdist":
                spec = mirror.spec
                out.append(f"from the sdist {spec['package']}=={spec['version']} (sha256 {spec['sha256'][:12]}…, "
                           f"into {Path(d.downloads) / spec['sha256']}): its {spec['git_dir']}")
            else:
                out.append(f"from {mirror.spec}: git fetch --depth=1 {d.commit}")
        out.append(f"verified: the commit's object id is {d.commit}")
        return out


STEP = FetchStep()
