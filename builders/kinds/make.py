"""make in a private copy of the source: for upstreams whose Makefile builds in-tree and has no install target (ds4).

options: make variables (NAME=value on the command line, so they win over the Makefile's `?=` defaults), except
`programs`, a space-separated list of the files the build leaves in the tree that the install step copies to bin/.
targets: the make goals (e.g. `cpu`, `cuda`, `rocm`).

The project's own flags never replace upstream's: a Makefile's `CFLAGS ?= -O3 ...` is skipped when CFLAGS is in the
environment, and a command-line CFLAGS replaces even its `CFLAGS += ...`. So the path maps go into the compiler
variables the recipe passes (CC="cc -ffile-prefix-map=...", NVCC, GPU_CC, ...; CC=cc when it passes none), and the
flag variables are removed from the environment make inherits (the command's `unset`: `env -u CFLAGS ...` as a
shell line) unless the recipe sets them. ccache, where the host (or the build root) has it, goes in front of each
compiler variable, as CMake's compiler launcher does.
"""
from __future__ import annotations

from ..roots import sysroot
from ..plan_types import Command
from . import flags
from .base import KindDefaults, env_items


def _split(options) -> tuple[list[str], dict[str, str]]:
    opts = dict(options)
    programs = str(opts.pop("programs", "")).split()
    return programs, {k: str(v) for k, v in opts.items()}


class MakeKind(KindDefaults):
    name = "make"

    def tree(self, ctx) -> str:
        return f"{ctx.build}/tree"

    def build(self, ctx) -> list[Command]:
        _, variables = _split(ctx.options)
        variables = flags.make_variables(variables, ctx.maps)
        if ctx.launcher:  # ccache in front of every compiler variable (CC, GPU_CC: hipcc runs under ccache too)
            variables = {k: f"{ctx.launcher} {v}" if flags.compiler_family(k) else v for k, v in variables.items()}
        if ctx.sysroot is not None:  # the floor's sysroot after each compiler's command (builders/roots/sysroot.py)
            variables = sysroot.make_variables(variables, ctx.sysroot, host_libs=ctx.host_libs)
        tree = self.tree(ctx)
        return [
            Command(("rm", "-rf", tree)),
            Command(("cp", "-a", f"{ctx.source}/.", tree)),
            Command(("make", "-C", tree, f"-j{ctx.jobs}", *ctx.targets,
                                          *[f"{k}={v}" for k, v in variables.items()]),
                    env=env_items(ctx, flag_env=False),
                    unset=tuple(v for v in flags.MAKE_FLAG_VARIABLES if v not in ctx.env), links=ctx.host_lib_links),
        ]

    def install(self, ctx) -> list[Command]:
        programs, _ = _split(ctx.options)
        if not programs:
            return [Command(("mkdir", "-p", ctx.staged_prefix))]
        return [Command(("install", "-D", "-m", "0755", "-t", f"{ctx.staged_prefix}/bin",
                         *[f"{self.tree(ctx)}/{p}" for p in programs]))]
