"""zig build, with -D options, installing straight into the staged prefix."""
from __future__ import annotations

from ..roots import sysroot
from ..plan_types import Command
from .base import KindDefaults, env_items


def zig_value(value: object) -> str:
    """zig build -D takes booleans as true/false (it refuses Python's True)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class ZigKind(KindDefaults):
    name = "zig"

    def build(self, ctx) -> list[Command]:
        options = dict(ctx.options)
        argv = ["zig", "build", *[t for t in ctx.targets if t != "install"]]
        optimize = options.pop("optimize", None)
        if optimize:
            argv.append(f"-Doptimize={optimize}")
        argv += [f"-D{k}={zig_value(v)}" for k, v in options.items()]
        if ctx.glibc and "target" not in options:  # zig links against its own glibc of the floor's version
            argv.append(f"-Dtarget={sysroot.glibc_target(ctx.glibc)}")
        argv += ["--prefix", ctx.build_prefix, "--cache-dir", f"{ctx.build}/zig-cache", "-j" + str(ctx.jobs)]
        return [Command(tuple(argv), cwd=ctx.source, env=env_items(ctx, flag_env=False, ZIG_GLOBAL_CACHE_DIR=f"{ctx.build}/zig-global-cache"))]

    def install(self, ctx) -> list[Command]:
        # `zig build --prefix` installed into the build dir; staging copies it
        return [Command(("mkdir", "-p", ctx.staged_prefix)), Command(("cp", "-a", f"{ctx.build_prefix}/.", ctx.staged_prefix))]
