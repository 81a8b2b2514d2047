"""A list of argv commands from the recipe, placeholders already expanded by the plan."""
from __future__ import annotations

from ..plan_types import Command
from .base import env_items


class ScriptKind:
    name = "script"

    def build(self, ctx) -> list[Command]:
        env = env_items(ctx)
        return [Command(tuple(argv), cwd=ctx.build, env=env) for argv in ctx.commands]

    def install(self, ctx) -> list[Command]:
        # the commands installed into {prefix}, a tree inside the build dir; staging copies it
        return [Command(("mkdir", "-p", ctx.staged_prefix)), Command(("cp", "-a", f"{ctx.build_prefix}/.", ctx.staged_prefix))]
