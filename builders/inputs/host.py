"""Host facts: which tools exist where, at which version. Gathered once (impure); everything after is pure."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..project.config import Tool
from ..roots.root import Root, build_root, parse_version
from ..roots.root import host as host_root
from .toolchain import ASSEMBLY


@dataclass(frozen=True)
class ToolFact:
    key: str
    path: str  # where the tool is, or where it is expected (for a toolchain root that is missing)
    found: bool
    version: str | None = None
    root: str | None = None
    override: str | None = None  # the variable that replaced the pinned input or build root (VULKAN_SDK, CUDA_HOME,
    #                              ONEBIT_*_TOOLCHAIN): recorded in the build string and the manifest
    fetchable: bool = False  # absent until the fetch step assembles its pinned input or build root


@dataclass(frozen=True)
class HostFacts:
    tools: Mapping[str, ToolFact] = field(default_factory=dict)
    net_cut: tuple[str, ...] = ()  # argv prefix that runs a command without network; () where the host can't
    sandbox: str | None = None  # why this host cannot enter a build root (sandbox.why_unavailable), None: it can
    roots: Mapping[str, str] = field(default_factory=dict)  # build root name -> its assembled directory in the cache
    jobs: int = 2
    python: str = sys.executable
    platform: str = "linux-64"
    home: str = str(Path.home())
    env: Mapping[str, str] = field(default_factory=dict)  # the host root's base environment (root.HOST_BASE of the caller's)


def version_ok(version: str | None, spec: str | None) -> bool:
    if not spec:
        return True
    if version is None:
        return False
    try:
        return Version(version) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion):
        return False


def pinned_root(tool: Tool, toolchains: Path) -> Path:
    """Where the toolchain step assembles a tool's pinned inputs (wheels, or Debian packages): one folder named by
    their sha256s (and the assembly's own version, and for the sysroot the floor its stand-ins are capped at), so
    other inputs, or another assembly, never reuse it."""
    floor = [f"floor {tool.floor[0]} " + " ".join(f"{k}={v}" for k, v in tool.floor[1])] if tool.floor else []
    h = hashlib.sha256("\n".join([ASSEMBLY, *sorted(w.sha256 for w in tool.wheels),
                                  *sorted(d.sha256 for d in tool.debs), *floor]).encode()).hexdigest()
    return toolchains / h[:16]


# Headers carry their version in a #define, not behind --version: a tool whose `path` is such a header is versioned
# by it (a Vulkan SDK root, pinned or given with VULKAN_SDK, is checked by its vulkan_core.h).
def header_version(name: str, text: str) -> str | None:
    """Pure: the version a header states (vulkan_core.h: VK_HEADER_VERSION_COMPLETE's major.minor and
    VK_HEADER_VERSION's patch, e.g. 1.4.309), or None."""
    if name != "vulkan_core.h":
        return None
    complete = re.search(r"#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*\d+\s*,\s*(\d+)\s*,\s*(\d+)", text)
    patch = re.search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", text)
    if not (complete and patch):
        return None
    return f"{complete.group(1)}.{complete.group(2)}.{patch.group(1)}"


ROOT_PREFIX = "/usr"  # `{tool:T:root}` of a tool found in a build root: Debian's prefix (ROCM_PATH=/usr)
ROOT_BIN = ("usr/bin", "usr/sbin")


def detect_in_root(tool: Tool, env: Mapping[str, str], root: Root) -> ToolFact:
    """A tool of a variant that builds inside a build root: its `env`, when set, overrides the root's copy with a
    toolkit of the host (found as detect_tool finds it, bound read-only into the root); otherwise it is looked up
    inside the root (`in_root`, or its name in /usr/bin and /usr/sbin) and asked its version there."""
    if tool.env and env.get(tool.env):
        import dataclasses

        fact = detect_tool(dataclasses.replace(tool, root=None, wheels=(), debs=()), env)
        return dataclasses.replace(fact, key=tool.key, override=tool.env)
    assembled = bool(root.dir) and (Path(root.dir) / ".complete").is_file()
    if tool.pkgconfig:
        version = None
        if assembled and root.why_not is None:
            proc = root.run(["pkg-config", "--modversion", tool.pkgconfig], timeout=30)
            version = parse_version(proc.stdout) if proc.returncode == 0 else None
        return ToolFact(tool.key, f"pkg-config:{tool.pkgconfig}", version is not None, version, ROOT_PREFIX,
                        fetchable=not assembled)
    inside = tool.in_root or (assembled and root.which(tool.tool)) or f"/{ROOT_BIN[0]}/{tool.tool}"
    # `{tool:T:root}`: what in_root names, less the tool's `path` where it ends with it (the kernel headers' build
    # tree for in_root .../linux-headers-X/Makefile, path Makefile); else Debian's prefix
    prefix = ROOT_PREFIX
    if tool.path and inside.endswith("/" + tool.path.strip("/")) and len(inside) > len(tool.path) + 1:
        prefix = inside[: -len(tool.path.strip("/")) - 1]
    if not assembled:
        return ToolFact(tool.key, inside, False, None, prefix, fetchable=True)
    host_path = root.host_path(inside)
    found = host_path.is_file()
    version = None
    if found and os.access(host_path, os.X_OK):
        version = root.version(inside)
    elif found and host_path.suffix == ".h":
        version = header_version(host_path.name, host_path.read_text(errors="replace")[:400_000])
    return ToolFact(tool.key, inside, found, version, prefix)


def detect_tool(tool: Tool, env: Mapping[str, str], toolchains: Path | None = None,
                roots: Mapping[str, str] | None = None) -> ToolFact:
    if tool.root and not (tool.wheels or tool.debs):  # a pinned input (the Vulkan SDK) stays one, bound into the root
        where = (roots or {}).get(tool.root)
        return detect_in_root(tool, env, build_root(tool.root, where) if where else Root(name=tool.root, dir=""))
    if tool.pkgconfig:
        here = host_root(env, net_cut=())
        pc = here.which("pkg-config")
        proc = here.run([pc, "--modversion", tool.pkgconfig], timeout=20) if pc else None
        version = parse_version(proc.stdout) if proc is not None and proc.returncode == 0 else None
        return ToolFact(tool.key, f"pkg-config:{tool.pkgconfig}", version is not None, version)
    if tool.env or tool.path:
        root = env.get(tool.env, "") if tool.env else ""
        override = tool.env if root and tool.pinned else None  # the variable is an override of the pinned inputs
        if not root and tool.pinned and toolchains is not None:
            root = str(pinned_root(tool, toolchains))
        root = root or tool.default or ""
        exe = Path(root) / (tool.path or tool.tool)
        found = exe.is_file()  # a program, or a marker file such as the kernel headers' Makefile
        runnable = found and os.access(exe, os.X_OK)
        version = None
        if found:
            if runnable:  # zig has no --version: `zig version` is asked when --version says nothing
                version = host_root(env, net_cut=()).version(str(exe))
            elif exe.suffix == ".h":
                version = header_version(exe.name, exe.read_text(errors="replace")[:400_000])
        return ToolFact(tool.key, str(exe), found, version, root, override=override,
                        fetchable=tool.pinned and not override and not found)
    path = shutil.which(tool.tool, path=env.get("PATH"))
    if path is None:
        return ToolFact(tool.key, tool.tool, False)
    # zig has no --version: `zig version` (and go, ...) is asked only when --version says nothing
    return ToolFact(tool.key, path, True, host_root(env, net_cut=()).version(path))


def gather(tools: Iterable[Tool], env: Mapping[str, str] | None = None, *, toolchains: Path | None = None,
           roots: Mapping[str, str] | None = None) -> HostFacts:
    """toolchains: the cache folder where the toolchain step assembles wheel toolchain inputs; roots: each build
    root's assembled directory (asked only when a tool lives in one, and then whether this host can enter it)."""
    from ..roots import sandbox

    env = dict(os.environ if env is None else env)
    facts: dict[str, ToolFact] = {}
    tools = list(tools)
    for tool in tools:
        if tool.key not in facts:
            facts[tool.key] = detect_tool(tool, env, toolchains, roots)
    why = sandbox.why_unavailable() if any(t.root for t in tools) else None
    base = host_root(env)
    return HostFacts(tools=facts, net_cut=base.net_cut, jobs=os.cpu_count() or 2, python=sys.executable,
                     sandbox=why, roots=dict(roots or {}), env=dict(base.base), home=base.base["HOME"])
