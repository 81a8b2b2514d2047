"""Host facts: toolchains found through their variables (fake TheRock/XRT trees stand in for hardware toolchains)."""
from __future__ import annotations

import os
from pathlib import Path

from builders.project import config
from builders.project.config import Tool
from builders.inputs.host import detect_tool, gather, parse_version, version_ok
from builders.plan import all_tools, missing_tools

ROOT = Path(__file__).resolve().parent.parent


def fake_tool(path: Path, version: str) -> None:
    """A stand-in for a toolchain binary that cannot exist here: it records its argv and prints a version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {path.parent}/calls.log\necho 'AMD clang version {version} (TheRock)'\n")
    path.chmod(0o755)


def test_toolchain_found_through_its_variable(tmp_path):
    therock = tmp_path / "therock"
    fake_tool(therock / "lib/llvm/bin/amdclang++", "20.0.0")
    tool = Tool(tool="amdclang++", version=">=19", env="ONEBIT_HRX_TOOLCHAIN", default="/opt/rocm-therock",
                path="lib/llvm/bin/amdclang++")
    fact = detect_tool(tool, {"ONEBIT_HRX_TOOLCHAIN": str(therock), "PATH": os.environ["PATH"]})
    assert (fact.found, fact.version, fact.root) == (True, "20.0.0", str(therock))
    assert (therock / "lib/llvm/bin/calls.log").read_text() == f"{therock}/lib/llvm/bin/amdclang++ --version\n"
    # unset: the default root, which is absent here
    missing = detect_tool(tool, {"PATH": os.environ["PATH"]})
    assert (missing.found, missing.path) == (False, "/opt/rocm-therock/lib/llvm/bin/amdclang++")


def test_marker_file_toolchain(tmp_path):
    (tmp_path / "Makefile").write_text("all:\n")
    tool = Tool(tool="kernel-headers", env="ONEBIT_KERNEL_BUILD", path="Makefile")
    assert detect_tool(tool, {"ONEBIT_KERNEL_BUILD": str(tmp_path)}).found


def test_strix_toolchains_with_fake_roots_leave_only_path_tools_missing(tmp_path, monkeypatch):
    therock = tmp_path / "therock"
    for rel in ("lib/llvm/bin/amdclang++", "lib/llvm/bin/amdclang", "bin/hipconfig"):
        fake_tool(therock / rel, "20.0.0")
    (therock / "lib/libhsa-runtime64.so").write_text("")  # a marker file, bundled by the hrx build
    fake_tool(tmp_path / "xrt/bin/xrt-smi", "2.19.0")
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel/Makefile").write_text("")
    monkeypatch.setenv("ONEBIT_HRX_TOOLCHAIN", str(therock))
    monkeypatch.setenv("ONEBIT_LEAN_ROCM_TOOLCHAIN", str(therock))
    monkeypatch.setenv("XILINX_XRT", str(tmp_path / "xrt"))
    monkeypatch.setenv("ONEBIT_KERNEL_BUILD", str(tmp_path / "kernel"))
    project = config.load_project(ROOT)
    facts = gather(all_tools(project, "strix"))
    # only tools found through a root variable are faked here: tools looked up on PATH or through pkg-config are this
    # host's business, and pinned inputs (hrx's Vulkan SDK) the fetch step's, so whatever is missing must be one of those
    for variant in (project.recipes["hrx"].variant("default"), project.recipes["xdna"].variant("default"),
                    project.recipes["lean"].variant("rocm")):
        rooted = {t.tool for t in variant.toolchain if t.env and not (t.wheels or t.debs)}  # a pinned input: fetch
        assert rooted, variant.id
        missing = missing_tools(variant, facts.tools)
        assert [m for m in missing if m.split()[0] in rooted] == [], (variant.id, missing)


def test_version_rules():
    assert parse_version("cmake version 3.25.1\n") == "3.25.1"
    assert parse_version("zig 0.16.0-dev") == "0.16.0"
    assert version_ok("3.25.1", ">=3.21") and not version_ok("3.20", ">=3.21")
    assert version_ok(None, None) and not version_ok(None, ">=1")
