"""Build kinds behind one small Protocol and a registry, the way cibuildwheel keeps one module per platform.

Adding a kind: write builders/kinds/<name>.py with a class that has `name`, `build(ctx)` and `install(ctx)`,
and add one line to KINDS below. A kind only turns a context into exact commands; it runs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from ..plan_types import Command
from .cargo import CargoKind
from .cmake import CMakeKind
from .make import MakeKind
from .script import ScriptKind
from .zig import ZigKind


@dataclass(frozen=True)
class KindContext:
    source: str
    build: str
    destdir: str  # the stage root; files land in destdir + prefix
    prefix: str  # the install prefix the package is built for
    staged_prefix: str  # destdir + prefix: where the stage step puts files
    jobs: int
    build_type: str
    options: Mapping[str, str]
    env: Mapping[str, str]
    targets: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...] = ()
    launcher: str | None = None  # ccache
    net_cut: tuple[str, ...] = ()  # argv prefix that cuts the network
    extra_env: Mapping[str, str] = field(default_factory=dict)
    build_prefix: str = ""  # for kinds that install as they build (script, zig): an install tree inside the build dir


class BuildKind(Protocol):
    name: str

    def build(self, ctx: KindContext) -> list[Command]: ...

    def install(self, ctx: KindContext) -> list[Command]: ...


KINDS: dict[str, BuildKind] = {
    "cmake": CMakeKind(),
    "zig": ZigKind(),
    "cargo": CargoKind(),
    "script": ScriptKind(),
    "make": MakeKind(),
}


def env_items(ctx: KindContext, **more: str) -> tuple[tuple[str, str], ...]:
    merged = {**ctx.env, **ctx.extra_env, **more}
    return tuple(sorted(merged.items()))
