"""make in a private copy of the source: for upstreams whose Makefile builds in-tree and has no install target (ds4).

options: make variables (NAME=value on the command line, so they win over the Makefile's `?=` defaults), except
`programs`, a space-separated list of the files the build leaves in the tree that the install step copies to bin/.
targets: the make goals (e.g. `cpu`, `cuda`, `rocm`).
"""
from __future__ import annotations

from ..plan_types import Command
from .base import env_items


def _split(options) -> tuple[list[str], list[str]]:
    opts = dict(options)
    programs = str(opts.pop("programs", "")).split()
    return programs, [f"{k}={v}" for k, v in opts.items()]


class MakeKind:
    name = "make"

    def tree(self, ctx) -> str:
        return f"{ctx.build}/tree"

    def build(self, ctx) -> list[Command]:
        _, variables = _split(ctx.options)
        tree = self.tree(ctx)
        env = env_items(ctx)
        return [
            Command(("rm", "-rf", tree)),
            Command(("cp", "-a", f"{ctx.source}/.", tree)),
            Command(tuple(ctx.net_cut) + ("make", "-C", tree, f"-j{ctx.jobs}", *ctx.targets, *variables), env=env),
        ]

    def install(self, ctx) -> list[Command]:
        programs, _ = _split(ctx.options)
        if not programs:
            return [Command(("mkdir", "-p", ctx.staged_prefix))]
        return [Command(("install", "-D", "-m", "0755", "-t", f"{ctx.staged_prefix}/bin",
                         *[f"{self.tree(ctx)}/{p}" for p in programs]))]
