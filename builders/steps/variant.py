"""What one variant's build, stage and package planners share, worked out once by plan.variant_inputs: the expanded
placeholders, options and environment, the build kind's context, where its commands run and what they see."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..project.config import PLACEHOLDER, Variant, describe_placeholders
from ..errors import OnebitError
from ..project.floor import Floor
from ..inputs.host import HostFacts
from ..kinds import KindContext
from ..plan_types import Command, Layout, Step
from ..roots.root import Root

if TYPE_CHECKING:
    from .source import Source


def expand(text: str, values: Mapping[str, str], where: str | Callable[[], str] = "") -> str:
    """Replace {name} placeholders; an unknown one is an error naming the recipe's file:line (`where`, or a function
    that says it: worked out only for the error)."""

    def sub(m) -> str:
        name = m.group(1)
        if name not in values:
            raise OnebitError(f"unknown placeholder {{{name}}}", where=where() if callable(where) else where,
                              hint=f"known placeholders: {describe_placeholders(set(values))}")
        return values[name]

    return PLACEHOLDER.sub(sub, text)


def on_path(commands: Sequence[Command], path: Sequence[str]) -> tuple[Command, ...]:
    """Pure: the commands with the recipe's toolchain folders first on their PATH."""
    return tuple(dataclasses.replace(c, path=tuple(path)) for c in commands) if path else tuple(commands)


@dataclass(frozen=True)
class Binds:
    """What a variant's commands see of the host inside its build root (the host root sees everything): the source
    (and the git objects its worktree points at), companions, wheels and override toolkits read-only; the build dir
    and the compiler cache read-write; what must exist before bwrap binds it."""

    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    mkdirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class VariantInputs:
    """What the build, stage and package planners of one variant share, worked out once (placeholders expanded)."""

    variant: Variant
    source: Source
    layout: Layout
    host: HostFacts
    values: Mapping[str, str]  # the placeholders' values
    options: Mapping[str, object]
    env: Mapping[str, str]
    commands: tuple[tuple[str, ...], ...]
    ctx: KindContext  # what the build kind turns into commands
    install_prefix: str
    companions: tuple[Step, ...]
    wheels_key: str | None
    overrides: Mapping[str, str]
    build_number: int
    version: str
    patches: tuple[str, ...]
    build_string: str  # <variant>_h<commit7>[_set…][_env…]_<n> (plan.build_string)
    toolchain_overrides: Mapping[str, str]  # the variables that replaced a pinned toolchain (plan.toolchain_overrides)
    path: tuple[str, ...] = ()  # toolchain folders put first on PATH for the build's and the install's commands
    root: Root = field(default_factory=Root)  # where the commands run: the host, or the variant's build root
    binds: Binds = field(default_factory=Binds)  # what of the host a build root shows them
    floor: Floor | None = None  # the project's floor (floor.yaml): the stage gate's and the package's

    @property
    def build_dir(self) -> Path:
        return self.layout.build(self.variant.id)
