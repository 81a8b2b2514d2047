"""The root step: a build root (roots/<name>.yaml), every package fetched by pool path and sha256 and assembled once
into the cache under its content address, shared by every variant that names it (builders/roots/assemble.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..project.config import Project
from ..plan_types import Step, digest
from ..roots.root import Root
from .base import Kind, StepContext, described


@dataclass(frozen=True)
class RootData:
    """A build root (roots/<name>.yaml) assembled into the cache under its content address."""

    name: str
    dest: str
    key: str
    where: str


def root_step_id(name: str) -> str:
    return f"root:{name}"


def plan_root(project: Project, name: str | None, root: Root | None) -> list[Step]:
    """The build root `name` a variant runs in, assembled where `root` (plan.root_of) says; none for the host."""
    if not name:
        return []
    pin = project.roots[name]
    return [described(Step(id=root_step_id(name), action="root",
                           title=f"fetch {len(pin.resolved)} Debian package(s) ({pin.download_size / 2**20:.0f} MiB, "
                                 f"sha256-checked) and assemble build root {name}",
                           key=digest("root", pin.key),
                           data=RootData(name=name, dest=root.dir, key=pin.key, where=str(pin.path))), STEP)]


class RootStep(Kind):
    action = "root"
    fetches = replans = True

    def run(self, ctx: StepContext, step: Step) -> None:
        from ..roots import assemble as roots

        d: RootData = step.data
        how = roots.assemble(ctx.project.roots[d.name], ctx.layout.downloads(), Path(d.dest), offline=ctx.offline,
                             log=ctx.note)
        ctx.log(f"build root {d.name} ({d.key[:16]}): {how}")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        from ..roots import assemble as roots

        return roots.untrusted(Path(step.data.dest), step.data.key) is None

    def describe(self, step: Step) -> list[str]:
        d: RootData = step.data
        return [f"every package of roots/{d.name}.yaml by pool path and sha256, unpacked (no maintainer script runs) "
                f"into {d.dest}, as `1bit-build roots assemble {d.name}` does"]


STEP = RootStep()
