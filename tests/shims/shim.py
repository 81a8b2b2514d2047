#!/usr/bin/env python3
"""A toolchain shim for tests: stands in for a tool that cannot exist on this machine (TheRock cmake builds of HRX,
XRT, kernel module builds, nvcc, cargo without crates.io).

Installed under the tool's name (a symlink to this file). Each call appends one JSON line to $ONEBIT_SHIM_LOG with the
tool name, argv, working directory and the environment variables named in $ONEBIT_SHIM_ENV (comma separated), then
creates the files the real tool would leave behind, so that the pipeline's later real steps (cp, install, stage,
RPATH check, package) have something to work on. It never compiles anything. The test asserts the exact argv and env.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def record(tool: str, argv: list[str]) -> None:
    keys = [k for k in os.environ.get("ONEBIT_SHIM_ENV", "").split(",") if k]
    line = {"tool": tool, "argv": argv, "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}
    with open(os.environ["ONEBIT_SHIM_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")


def touch(path: Path, text: str = "", mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def value(argv: list[str], flag: str) -> str | None:
    """-DNAME=value or a flag's next argument."""
    for i, a in enumerate(argv):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
    return None


SERVER = "#!/bin/sh\necho 'version: 1 (shim)'\necho 'built with shim for x86_64-linux-gnu'\necho \"commit $ONEBIT_SHIM_COMMIT)\"\n"


def effects(tool: str, argv: list[str]) -> None:
    if tool == "cmake" and "-S" in argv:  # configure: remember the install prefix of this build dir
        build = Path(value(argv, "-B"))
        prefix = value(argv, "-DCMAKE_INSTALL_PREFIX")
        build.mkdir(parents=True, exist_ok=True)
        (build / "CMakeCache.txt").write_text("# shim\n")
        if prefix:
            (build / "shim-prefix").write_text(prefix)
    elif tool == "cmake" and argv[:1] == ["--install"]:
        prefix = Path((Path(argv[1]) / "shim-prefix").read_text())
        touch(prefix / "bin" / "llama-server", SERVER, 0o755)
        for lib in ("libllama.so", "libggml.so", "libggml-hrx.so", "libggml-vulkan.so", "libhrx.so", "libloomc.so"):
            touch(prefix / "lib" / lib)
        touch(prefix / "lib" / "rocm_sysdeps" / "lib" / "libelf.so.1")
    elif tool == "make":
        tree = Path(value(argv, "-C"))
        destdir = next((a.split("=", 1)[1] for a in argv if a.startswith("DESTDIR=")), None)
        if "install" in argv and destdir:  # xdna-driver's `make install`: XRT plugin under the XRT prefix, .ko to /bins
            touch(Path(destdir) / "opt/xilinx/xrt/lib/libxrt_driver_xdna.so")
            touch(Path(destdir) / "bins/driver/amdxdna.ko")
        elif (tree / "CMakeCache.txt").exists():  # a CMake-generated Makefile tree: xdna-driver's module build
            touch(tree / "drivers/accel/amdxdna.ko")
        else:  # ds4: the five programs in its tree
            for p in ("ds4", "ds4-server", "ds4-bench", "ds4-eval", "ds4-agent"):
                touch(tree / p, "#!/bin/sh\necho 'Usage: ds4-server [options]'\necho '  --port N'\n", 0o755)
    elif tool == "cargo":
        target = Path(value(argv, "--target-dir"))
        touch(target / "release" / "libonebit_hf_tokenizers.so")


def main() -> int:
    tool = Path(sys.argv[0]).name
    argv = sys.argv[1:]
    record(tool, argv)
    if tool == "cmake" and argv and argv[0] == "--version":
        print("cmake version 3.31.0")
        return 0
    effects(tool, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
