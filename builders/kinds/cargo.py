"""cargo build --release --locked --offline, against the crates that the fetch step vendored (`cargo vendor`).

options (everything else is an error of the recipe, not a cargo flag):
  manifest        the Cargo.toml, relative to the source (default Cargo.toml)
  features        --features
  vendor_config   the cargo config that `cargo vendor` printed, kept beside the vendored crates ({crates}/config.toml);
                  passed as --config so the build reads crates from there and never from the network
  crate_type      build the library as this crate type (cdylib for a C ABI shared library) with
                  `cargo rustc --lib --crate-type`, whatever [lib] crate-type the upstream declares
  install         space-separated FROM:TO pairs copied into the staged prefix; FROM is relative to the release
                  dir (target/release) or, with a leading `source:`, to the source. Default: every lib*.so/.a/.rlib
"""
from __future__ import annotations

from ..roots import sysroot
from ..plan_types import Command
from . import flags
from .base import KindDefaults, env_items


class CargoKind(KindDefaults):
    name = "cargo"

    def build(self, ctx) -> list[Command]:
        options = dict(ctx.options)
        manifest = options.pop("manifest", "Cargo.toml")
        features = options.pop("features", "")
        vendor_config = options.pop("vendor_config", "")
        crate_type = options.pop("crate_type", "")
        if crate_type:
            argv = ["cargo", "rustc", "--release", "--locked", "--offline"]
        else:
            argv = ["cargo", "build", "--release", "--locked", "--offline"]
        if vendor_config:
            argv += ["--config", vendor_config]
        argv += ["--manifest-path", f"{ctx.source}/{manifest}", "--target-dir", ctx.build, "-j", str(ctx.jobs)]
        for t in ctx.targets:
            argv += ["-p", t]
        if features:
            argv += ["--features", features]
        if crate_type:
            argv += ["--lib", "--crate-type", crate_type]
        env = dict(env_items(ctx, variables=flags.CARGO_FLAG_VARIABLES))
        if ctx.sysroot is not None:  # rustc links with cc: the sysroot's link flags; build scripts' C compiles too
            for var, family, part in (("RUSTFLAGS", "rustc-linker", "link"), ("CFLAGS", "gcc", "compile"),
                                      ("CXXFLAGS", "g++", "compile")):
                more = getattr(sysroot.flags(family, ctx.sysroot, host_libs=ctx.host_libs if var == "RUSTFLAGS" else None),
                               part)
                env[var] = flags.append(env.get(var), more)
        return [Command(tuple(argv), env=tuple(sorted(env.items())), links=ctx.host_lib_links)]

    def install(self, ctx) -> list[Command]:
        pairs = str(dict(ctx.options).get("install", "")).split()
        if not pairs:
            libdir = f"{ctx.staged_prefix}/lib"
            return [
                Command(("mkdir", "-p", libdir)),
                Command(("find", f"{ctx.build}/release", "-maxdepth", "1", "(", "-name", "lib*.so", "-o", "-name", "lib*.a",
                         "-o", "-name", "lib*.rlib", ")", "-exec", "cp", "-t", libdir, "{}", "+")),
            ]
        commands = []
        for pair in pairs:
            src, _, dst = pair.rpartition(":")
            origin = f"{ctx.source}/{src.removeprefix('source:')}" if src.startswith("source:") else f"{ctx.build}/release/{src}"
            mode = "0755" if ".so" in dst else "0644"
            commands.append(Command(("install", "-D", "-m", mode, origin, f"{ctx.staged_prefix}/{dst}")))
        return commands
