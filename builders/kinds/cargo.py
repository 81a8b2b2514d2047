"""cargo build --release --locked --offline (crates were vendored by the fetch step)."""
from __future__ import annotations

from ..plan_types import Command


class CargoKind:
    name = "cargo"

    def build(self, ctx) -> list[Command]:
        from . import env_items

        options = dict(ctx.options)
        manifest = options.pop("manifest", "Cargo.toml")
        features = options.pop("features", "")
        argv = ["cargo", "build", "--release", "--locked", "--offline", "--manifest-path", f"{ctx.source}/{manifest}",
                "--target-dir", ctx.build, "-j", str(ctx.jobs)]
        for t in ctx.targets:
            argv += ["-p", t]
        if features:
            argv += ["--features", features]
        return [Command(tuple(ctx.net_cut) + tuple(argv), env=env_items(ctx))]

    def install(self, ctx) -> list[Command]:
        libdir = f"{ctx.staged_prefix}/lib"
        return [
            Command(("mkdir", "-p", libdir)),
            Command(("find", f"{ctx.build}/release", "-maxdepth", "1", "(", "-name", "lib*.so", "-o", "-name", "lib*.a", "-o",
                     "-name", "lib*.rlib", ")", "-exec", "cp", "-t", libdir, "{}", "+")),
        ]
