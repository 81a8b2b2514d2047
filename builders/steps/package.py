"""The package step: one .conda of a variant's staged prefix, with its run requirements and its license
(builders/ship/package.py), in a directory named by the step's key."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..io import elf
from ..ship import licenses
from ..ship import package as conda
from ..plan_types import Step, digest
from .base import Kind, StepContext
from .variant import VariantInputs, expand


@dataclass(frozen=True)
class PackageData:
    name: str
    version: str
    build_string: str
    build_number: int
    license: str
    summary: str
    homepage: str | None
    prefix: str  # the staged prefix whose files the package carries
    out: str  # a directory of its own per cache key
    depends: tuple[str, ...]  # run requirements known at plan time (virtual packages a conda client detects: __cuda)
    glibc_floor: str | None  # the floor's glibc: `__glibc >=X` is declared when the package ships any ELF file

    @property
    def file(self) -> Path:
        return Path(self.out) / f"{self.name}-{self.version}-{self.build_string}.conda"


def plan_package(v: VariantInputs, stage: Step) -> Step:
    """One .conda of the staged prefix, with its run requirements."""
    variant = v.variant
    recipe = variant.recipe
    own = len(recipe.data.get("requirements", {}).get("run", []))
    depends = tuple(expand(d, v.values, partial(recipe.doc.where, ("requirements", "run", i) if i < own else
                                                ("variants", variant.name, "requirements", "run", i - own)))
                    for i, d in enumerate(variant.depends))
    key = digest("package", stage.key, variant.package_name, v.version, v.build_string, v.build_number, depends)
    return Step(id=f"package:{variant.id}", action="package",
                title=f"package {variant.package_name}-{v.version}-{v.build_string}.conda", key=key, needs=(stage.id,),
                data=PackageData(name=variant.package_name, version=v.version, build_string=v.build_string,
                                 build_number=v.build_number, license=recipe.data["license"], summary=recipe.data["summary"],
                                 homepage=recipe.data.get("homepage"), prefix=stage.data.prefix,
                                 out=str(v.layout.packages(key)), depends=depends,
                                 glibc_floor=v.floor.glibc if v.floor else None))


class PackageStep(Kind):
    action = "package"

    def run(self, ctx: StepContext, step: Step) -> None:
        d: PackageData = step.data
        depends = list(d.depends)
        if d.glibc_floor and elf.any_elf(Path(d.prefix)):
            depends.append(f"__glibc >={d.glibc_floor}")
        conda.assemble(name=d.name, version=d.version, build_string=d.build_string, build_number=d.build_number,
                       files_dir=Path(d.prefix), out_dir=Path(d.out), platform=ctx.plan.platform, license=d.license,
                       summary=d.summary, homepage=d.homepage, depends=depends,
                       license_files=licenses.package_license_files(ctx.plan, step, ctx.layout.root))

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return step.data.file.is_file()  # its directory is named by the key

    def describe(self, step: Step) -> list[str]:
        return []  # builders/ship/package.py writes the .conda; no command of its own


STEP = PackageStep()
