"""The build step: the build kind's commands (configure + build, or make, or the recipe's script) in the variant's
build dir, in its Root (the host, or its build root), the network cut where the recipe asks and the root can."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..ship import stage as staging
from ..io import swap
from ..kinds import KINDS, flags
from ..plan_types import Step, digest
from ..ship.stage import KEY_FILE
from .base import Kind, StepContext, holds_key
from .variant import VariantInputs, on_path

BUILDER_VERSION = "5"  # bump to invalidate every build step key (5: serve vendors one wheel set per CPython)
NOTES_FILE = ".onebit-notes.json"  # in a build dir: what its configure reported (kinds' note_output)


@dataclass(frozen=True)
class BuildData:
    variant: str
    kind: str
    build_dir: str  # stable per variant so ninja rebuilds incrementally; .onebit-key says which key it holds
    source_dir: str  # a build dir configured against another source dir is wiped first
    fresh_dir: bool  # the kind starts from an empty dir every time (a script's)
    where: str
    network_isolated: bool = True  # False: the recipe asks for no network but this host cannot cut it
    flags: str = ""  # digest of the path maps: a build dir configured with other flags is wiped first (CMake reads
    #                  CFLAGS only on its first configure)


def sysroot_key(v: VariantInputs) -> list:
    """What of the sysroot a build's key takes (its content address, never where the cache is, and the host
    libraries its link takes); a build dir configured with another is wiped first (CMake reads a toolchain file only
    when it first configures)."""
    if not v.root.sysroot_dir:
        return []
    hl = v.ctx.host_libs
    return [("sysroot", Path(v.root.sysroot_dir).name, v.root.sysroot_cxx,
             (Path(hl.links).name, hl.rpath_link) if hl is not None else None, [t for _, t in v.ctx.host_lib_links])]


def plan_build(v: VariantInputs, needs: Sequence[str]) -> Step:
    """The build kind's commands (configure + build, or make, or the recipe's script) in the variant's build dir."""
    variant = v.variant
    toolchain = sorted((t.key, (v.host.tools.get(t.key).version if v.host.tools.get(t.key) else None))
                       for t in variant.toolchain if not t.optional)
    key = digest("build", BUILDER_VERSION, flags.PREFIX_MAPS, v.source.key, variant.kind, v.options, variant.targets,
                 v.env, v.commands, variant.build_type, toolchain, v.wheels_key, v.install_prefix,
                 *[c.key for c in v.companions], *([v.path] if v.path else []),
                 *([("root", v.root.name, v.root.key)] if not v.root.is_host else []),
                 *([v.toolchain_overrides] if v.toolchain_overrides else []), *sysroot_key(v))
    kind = KINDS[variant.kind]
    commands = on_path(kind.build(v.ctx), v.path)
    net = variant.network != "none"
    where = ("" if v.root.is_host else f", in {v.root.describe()}") + (", network cut" if not net and v.root.cuts_network else "")
    return Step(id=f"build:{variant.id}", action="build",
                title=f"build {variant.id} ({variant.kind}{where})", key=key,
                commands=v.root.wrap_all(commands, ro=v.binds.ro, rw=v.binds.rw, mkdirs=v.binds.mkdirs, net=net),
                needs=tuple(needs),
                data=BuildData(variant=variant.id, kind=variant.kind, build_dir=str(v.build_dir), source_dir=v.source.dir,
                               fresh_dir=kind.fresh_dir, where=str(variant.recipe.path),
                               network_isolated=net or v.root.cuts_network,
                               flags=digest(v.ctx.maps, *sysroot_key(v))))


def notes(build_dir: Path) -> dict:
    """What the build reported about itself, plus what its stage found (stage.OFFLOAD_NOTES: the offload targets)."""
    out: dict = {}
    for name in (NOTES_FILE, staging.OFFLOAD_NOTES):
        try:
            out.update(json.loads((build_dir / name).read_text()))
        except (OSError, ValueError):
            pass
    return out


def cmake_home(build_dir: Path) -> str | None:
    """The source dir a CMake build dir was configured for (CMakeCache.txt's CMAKE_HOME_DIRECTORY), if any."""
    try:
        text = (build_dir / "CMakeCache.txt").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            return line.split("=", 1)[1].strip()
    return None


class BuildStep(Kind):
    action = "build"

    def run(self, ctx: StepContext, step: Step) -> None:
        d: BuildData = step.data
        build_dir = Path(d.build_dir)
        (build_dir / KEY_FILE).unlink(missing_ok=True)
        (build_dir / staging.OFFLOAD_NOTES).unlink(missing_ok=True)  # the next stage lists the new build's targets
        source_file, flags_file = build_dir / ".onebit-source", build_dir / ".onebit-flags"
        configured = cmake_home(build_dir)
        used = build_dir.is_dir() and any(build_dir.iterdir())
        stale = (used and not (holds_key(source_file, d.source_dir) and holds_key(flags_file, d.flags))) or (
            configured is not None and configured != d.source_dir)
        if d.fresh_dir or stale:
            # configured against another checkout or with other path maps (CMake reads CFLAGS only when it first
            # configures), or by a builder that did not record which: start clean
            shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        source_file.write_text(d.source_dir + "\n")
        flags_file.write_text(d.flags + "\n")
        kind = KINDS[d.kind]
        if not d.network_isolated:
            ctx.log(f"[yellow]network not isolated[/] for {d.variant}: this host cannot cut it (unshare --net "
                    "is unavailable or refused); the manifest records `build_network: not isolated`")
        facts = ctx.run_commands(step.commands, checker=kind.check_output, noter=kind.note_output)
        swap.write_text_atomic(build_dir / NOTES_FILE, json.dumps(facts, sort_keys=True))
        (build_dir / KEY_FILE).write_text(step.key + "\n")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return holds_key(Path(step.data.build_dir) / KEY_FILE, step.key)

    def describe(self, step: Step) -> list[str]:
        return []  # its commands are the step's own


STEP = BuildStep()
