"""A list of argv commands from the recipe, placeholders already expanded by the plan."""
from __future__ import annotations

from ..plan_types import Command
from .base import KindDefaults, env_items
from .cmake import SYSROOT_CMAKE_FILE, toolchain_files


class ScriptKind(KindDefaults):
    name = "script"
    fresh_dir = True  # the recipe's commands start from an empty build dir every time

    def build(self, ctx) -> list[Command]:
        env = env_items(ctx)
        # a script that runs CMake itself names the sysroot's toolchain file ({sysroot:cmake}): written before it runs
        files = toolchain_files(ctx, {}) if any(SYSROOT_CMAKE_FILE in a for argv in ctx.commands for a in argv) else ()
        return [Command(tuple(argv), cwd=ctx.build, env=env, files=files if i == 0 else (),
                        links=ctx.host_lib_links if i == 0 else ()) for i, argv in enumerate(ctx.commands)]

    def install(self, ctx) -> list[Command]:
        # the commands installed into {prefix}, a tree inside the build dir; staging copies it
        return [Command(("mkdir", "-p", ctx.staged_prefix)), Command(("cp", "-a", f"{ctx.build_prefix}/.", ctx.staged_prefix))]
