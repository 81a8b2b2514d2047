"""Test-only: the pinned Strix build root (Debian sid + experimental's ROCm 7.2.4, linux-headers 7.2, rustc 1.98.1,
XRT 2.25) the Strix compile tests build in, and a way to run a command inside it through the one sandbox."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "ONEBIT_TEST_STRIX_ROOT"
LLVM_PATH = ("/usr/lib/llvm-22/bin", "/usr/bin", "/bin")
BITCODE = "/usr/lib/llvm-22/lib/clang/22/amdgcn/bitcode"  # rocm-device-libs-22's bitcode: HIP_DEVICE_LIB_PATH


@dataclass(frozen=True)
class Root:
    path: Path

    @property
    def root(self) -> "builders.roots.root.Root":  # noqa: F821
        """The project's own value for this build root (builders/roots/root.py): what the build, the stage and the offload
        check enter it with."""
        from builders.roots.root import build_root

        return build_root(NAME, str(self.path))

    def run(self, argv: Sequence[str], *, cwd: Path, rw: Sequence[Path] = (), ro: Sequence[Path] = (),
            env: Mapping[str, str] | None = None, timeout: float = 3600, log: Path | None = None
            ) -> tuple[subprocess.CompletedProcess, float]:
        """argv in the root (no network), cwd and rw bound read-write, LLVM's tools first on PATH; (the result, wall
        seconds)."""
        start = time.monotonic()
        proc = self.root.run(argv, cwd=str(cwd), rw=tuple(str(p) for p in (cwd, *rw)), ro=tuple(str(p) for p in ro),
                             env=env, path=LLVM_PATH, timeout=timeout)
        wall = time.monotonic() - start
        if log is not None:
            log.write_text(proc.stdout + proc.stderr)
        return proc, wall


NAME = "strix-sid"
PROJECT = Path(__file__).resolve().parent.parent


def strix_root() -> Root:
    """roots/strix-sid.yaml assembled into the project cache ($ONEBIT_CACHE or ~/.cache/onebit): ~1.3 GiB of .debs
    downloaded once (verified by sha256), assembled once, shared with `1bit-build build strix`. ONEBIT_TEST_STRIX_ROOT
    names an assembled root instead (a development shortcut)."""
    path = os.environ.get(ROOT_ENV)
    if path:
        return Root(Path(path))
    from builders.roots import assemble as roots
    from builders.session import default_cache

    found, problems = roots.load_roots(PROJECT / "roots")
    assert not problems, problems
    pin = found[NAME]
    cache = default_cache()
    dest = pin.dest(cache)
    roots.assemble(pin, cache / "downloads", dest)
    return Root(dest)


def build_strix(base: Path, only: set[str], request=None):
    """`1bit-build build strix --only ...` through the project's own plan, in the project cache (the root, the git
    objects and ccache shared), work and out under `base`; the source from the mirror directory
    (ONEBIT_GIT_MIRRORS). Returns (plan, layout)."""
    import contextlib

    from builders.project import config
    from builders.inputs import fetch, host
    from builders.build import build
    from builders.plan import all_tools, make_plan, root_dirs
    from builders.plan_types import Layout
    from builders.session import default_cache

    project = config.load_project(PROJECT)
    for variant in only:
        recipe = project.recipes.get(variant) or next(r for n, r in project.recipes.items() if variant.startswith(n + "-"))
        pin = project.pins[recipe.data["source"]["pin"]]
        dirs = fetch.mirror_dirs((), os.environ)
        if not any((d / n).is_dir() for d in dirs for n in config.repo_names(pin.name, pin.url)):
            raise AssertionError(f"{pin.name} {pin.short} comes from GitHub only; set {config.MIRRORS_ENV} to a "
                                 "directory holding it (`nox -s tests` uses ../shared/mirrors)")
    strix_root()  # assembled once into the project cache (a download the first time)
    cache = default_cache()
    layout = Layout(root=PROJECT, cache=cache, work=base / "work", out=base / "out")

    def planned():
        facts = host.gather(all_tools(project, "strix"), toolchains=cache / "toolchains",
                            roots=root_dirs(project, cache))
        return project, make_plan(project, "strix", facts, layout, only=set(only))

    if request is not None:
        from conftest import live_output
        ctx = live_output(request)
    else:
        ctx = contextlib.nullcontext()
    with ctx:
        plan, _ = build(planned)
    assert plan.missing == [], plan.missing
    return plan, layout
