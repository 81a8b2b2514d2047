"""Build kinds behind one small Protocol and a registry, the way cibuildwheel keeps one module per platform.

Adding a kind: write builders/kinds/<name>.py with a class (on KindDefaults) that has `name`, `build(ctx)` and
`install(ctx)`, and add one line to KINDS below. A kind only turns a context into exact commands, and says what the
plan and the build step ask of it (base.BuildKind: a fresh build dir, strict options, what it reads in its commands'
output); it runs nothing, and nothing outside kinds/ asks which kind it is.
"""
from __future__ import annotations

from . import flags  # noqa: F401  (the project's own flags: path maps, added where upstream leaves room)
from .base import BuildKind, KindContext, KindDefaults, env_items  # noqa: F401  (the kinds' shared API)
from .cargo import CargoKind
from .cmake import CMakeKind
from .make import MakeKind
from .script import ScriptKind
from .zig import ZigKind


KINDS: dict[str, BuildKind] = {
    "cmake": CMakeKind(),
    "zig": ZigKind(),
    "cargo": CargoKind(),
    "script": ScriptKind(),
    "make": MakeKind(),
}
