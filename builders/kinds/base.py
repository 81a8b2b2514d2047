"""What every build kind shares: the context a kind turns into commands, the Protocol, and the environment merge."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from ..plan_types import Command
from . import flags


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
    extra_env: Mapping[str, str] = field(default_factory=dict)  # the builder's own settings (ccache)
    build_prefix: str = ""  # for kinds that install as they build (script, zig): an install tree inside the build dir
    maps: tuple[tuple[str, str], ...] = ()  # path maps (flags.build_maps): each kind adds them where upstream leaves room
    # the pinned sysroot the compilers build against (builders/roots/sysroot.py Sysroot; None: a kind that compiles nothing,
    # or zig, which takes `glibc` as its target), the libraries a link takes but does not ship (sysroot.HostLibs),
    # with the link names the executor makes for them, and the floor's glibc
    sysroot: Any = None
    host_libs: Any = None
    host_lib_links: tuple[tuple[str, str], ...] = ()
    glibc: str = ""


class BuildKind(Protocol):
    name: str
    fresh_dir: bool  # the build dir starts empty every time (a script's: no configure that could go stale)
    strict_options: bool  # a `--set` must name an option the recipe declares (CMake's -D: any other is a typo)

    def build(self, ctx: KindContext) -> list[Command]: ...

    def install(self, ctx: KindContext) -> list[Command]: ...

    def check_output(self, command_index: int, output: str) -> str | None: ...

    def note_output(self, command_index: int, output: str) -> tuple[str | None, dict]: ...


class KindDefaults:
    """What a kind is unless it says otherwise: it reuses its build dir, takes any option, and reads nothing in its
    commands' output (the cmake kind fails on ignored -D options and notes dropped shader features)."""

    fresh_dir = False
    strict_options = False

    @staticmethod
    def check_output(command_index: int, output: str) -> str | None:
        """Called by the executor after each build command; a message makes the build fail."""
        return None

    @staticmethod
    def note_output(command_index: int, output: str) -> tuple[str | None, dict]:
        """Called after each build command like check_output, but it informs: a log line and facts the manifest records."""
        return None, {}


def env_items(ctx: KindContext, *, flag_env: bool = True, variables: tuple[str, ...] | None = None,
              **more: str) -> tuple[tuple[str, str], ...]:
    """The recipe's environment, the builder's own settings, and (flag_env) the path maps appended to the compiler
    flag variables that the build system reads from the environment (`variables`: the ones this build reads; default
    every one: CFLAGS, CXXFLAGS, CUDAFLAGS, RUSTFLAGS, KCFLAGS...)."""
    env = flags.prefix_map_env(ctx.maps, ctx.env, variables) if flag_env else dict(ctx.env)
    return tuple(sorted({**env, **ctx.extra_env, **more}.items()))
