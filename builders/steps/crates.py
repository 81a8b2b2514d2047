"""The crates step: `cargo vendor` of a checkout's Cargo.toml in the sandbox, network on, cached by source
(builders/inputs/companions.py): {crates}."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..inputs import companions
from ..project.config import Recipe
from ..plan_types import Layout, Step, digest
from ..roots.root import Root
from .base import Kind, StepContext, described
from .root import root_step_id

if TYPE_CHECKING:
    from .source import Source


@dataclass(frozen=True)
class CratesData:
    source: str
    manifest: str
    dir: str
    where: str
    root: Any = None  # the build Root whose cargo vendors (builders/roots/root.py); None: the host's /usr


def plan_crates(layout: Layout, recipe: Recipe, source: Source, root: Root | None = None) -> Step:
    """`cargo vendor` of the checkout's Cargo.toml, cached by source: {crates}. It runs in the sandbox, with the cargo
    of the variant's build root when it has one (`root`; None: the host's)."""
    manifest = recipe.source["crates"]["manifest"]
    key = digest("crates", source.key, manifest)
    dest = layout.cache / "crates" / key[:16]
    where = f"in build root {root.name}'s sandbox" if root else "in the sandbox"
    return described(Step(id=f"fetch:crates:{recipe.name}", action="crates",
                          title=f"cargo vendor the crates of {manifest} for {recipe.name} {where}, network on "
                                "(cached by source, offline afterwards)",
                          key=key,
                          needs=(*((source.step_id,) if source.step_id else ()), *((root_step_id(root.name),) if root else ())),
                          data=CratesData(source=source.dir, manifest=manifest, dir=str(dest), where=str(recipe.path),
                                          root=root)), STEP)


class CratesStep(Kind):
    action = "crates"
    fetches = True

    def run(self, ctx: StepContext, step: Step) -> None:
        d: CratesData = step.data
        how = companions.vendor_crates(Path(d.source), d.manifest, Path(d.dir), offline=ctx.offline,
                                       root=d.root.dir if d.root else None)
        ctx.log(f"crates of {d.manifest}: {how}")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return companions.crates_ready(Path(step.data.dir))

    def describe(self, step: Step) -> list[str]:
        d: CratesData = step.data
        return [f"cargo vendor --locked --versioned-dirs --manifest-path {d.source}/{d.manifest}: into {d.dir}/vendor, "
                "written aside and swapped"]


STEP = CratesStep()
