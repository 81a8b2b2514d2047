"""The toolchain step: a toolchain the build fetches itself (the CUDA toolkit and zig from NVIDIA's and PyPI's pinned
wheels, the Vulkan SDK and the sysroot from pinned Debian packages), each input sha256-checked and assembled into one
root in the cache (builders/inputs/toolchain.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inputs import toolchain as toolchains
from ..project.config import Variant
from ..inputs.host import HostFacts, pinned_root
from ..plan_types import Layout, Step, digest
from .base import Kind, StepContext, described


@dataclass(frozen=True)
class ToolchainData:
    tool: str
    wheels: tuple[Any, ...]  # config.WheelInput: package, version, sha256, the folder inside the wheel, what ships
    dest: str  # the assembled root
    debs: tuple[Any, ...] = ()  # config.DebInput: pool path and sha256 (a toolchain of Debian packages)
    floor: tuple[str, tuple[tuple[str, str], ...]] | None = None  # the sysroot's: the policy and its caps (stand-ins)


def pinned_dir(tool, fact, layout: Layout) -> str:
    """Where a tool's pinned inputs are assembled: where the host facts found them, else (facts gathered without the
    cache's toolchains folder) their content address in this layout's cache; "" for a tool without pinned inputs."""
    if fact is not None and fact.root:
        return fact.root
    return str(pinned_root(tool, layout.cache / "toolchains")) if (tool.wheels or tool.debs) else ""


def plan_toolchain(variant: Variant, host: HostFacts, layout: Layout) -> list[Step]:
    """A toolchain the fetch step provides (the CUDA toolkit from NVIDIA's pinned wheels), when the host uses that copy:
    every wheel fetched by name, version and sha256 and assembled into one root in the cache."""
    out = []
    for tool in variant.toolchain:
        fact = host.tools.get(tool.key)
        if not (tool.pinned and fact is not None and pinned_dir(tool, fact, layout) == str(pinned_root(tool, layout.cache / "toolchains"))):
            continue
        if not fact.root:  # gathered without the cache's toolchains folder: the pinned input goes where the layout says
            fact = dataclasses.replace(fact, root=pinned_dir(tool, fact, layout))
        what = f"{len(tool.wheels)} wheel(s)" if tool.wheels else f"{len(tool.debs)} Debian package(s)"
        out.append(described(Step(
            id=f"toolchain:{tool.tool}", action="toolchain",
            title=f"fetch {what} (sha256-checked) and assemble the {tool.tool} toolchain",
            key=digest("toolchain", fact.root, [dataclasses.astuple(w) for w in tool.wheels],
                       [dataclasses.astuple(d) for d in tool.debs], *([tool.floor] if tool.floor else [])),
            data=ToolchainData(tool=tool.tool, wheels=tool.wheels, dest=fact.root, debs=tool.debs, floor=tool.floor)),
            STEP))
    return out


class ToolchainStep(Kind):
    action = "toolchain"
    fetches = replans = True

    def run(self, ctx: StepContext, step: Step) -> None:
        d: ToolchainData = step.data
        how = toolchains.fetch_and_assemble(d.wheels, ctx.layout.downloads(), Path(d.dest), offline=ctx.offline,
                                            log=ctx.note, debs=d.debs,
                                            floor=(d.floor[0], dict(d.floor[1])) if d.floor else None)
        inputs = [w.requirement for w in d.wheels] + [x.name for x in d.debs]
        ctx.log(f"{d.tool}: {', '.join(inputs)}: {how}")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        d: ToolchainData = step.data
        return toolchains.untrusted(Path(d.dest), d.wheels, d.debs) is None

    def describe(self, step: Step) -> list[str]:
        d: ToolchainData = step.data
        out = [f"the wheel {w.requirement} (sha256 {w.sha256[:12]}…): its {w.root}/ unpacked" for w in d.wheels]
        out += [f"{x.path} from the Debian archives (sha256 {x.sha256[:12]}…): its data unpacked" for x in d.debs]
        out.append(f"assembled into {d.dest}")
        if d.floor:
            out.append(f"link stand-ins of libstdc++ and libgcc_s capped at {d.floor[0]}")
        return out


STEP = ToolchainStep()
