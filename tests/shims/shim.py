#!/usr/bin/env python3
"""A toolchain shim for tests: stands in for a tool that cannot exist on this machine (TheRock cmake builds of HRX,
XRT, kernel module builds, nvcc, cargo without crates.io).

Installed under the tool's name (a symlink to this file). Each call appends one JSON line to $ONEBIT_SHIM_LOG with the
tool name, argv, working directory and the environment variables named in $ONEBIT_SHIM_ENV (comma separated), then
creates the files the real tool would leave behind, so that the pipeline's later real steps (cp, install, stage,
RPATH check, package) have something to work on. It never compiles anything. The test asserts the exact argv and env.

`<tool> --version` answers with $ONEBIT_SHIM_VERSIONS[tool] (a JSON object) where the test gives one, so a recorded
toolchain reports the version a real one would (hipconfig's ROCm version, nvcc's CUDA release). The llama-server it
leaves lists the devices in $ONEBIT_SHIM_DEVICES: the hardware of the runner the test stands in for.
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


SERVER = """#!/bin/sh
if [ "$1" = --list-devices ]; then
  echo 'Available devices:'
  for d in $ONEBIT_SHIM_DEVICES; do echo "  $d: shim device (1024 MiB, 1024 MiB free)"; done
  exit 0
fi
echo 'version: 1 (shim)'
echo 'built with shim for x86_64-linux-gnu'
echo "commit $ONEBIT_SHIM_COMMIT)"
"""
ZINC = """#!/bin/sh
case "$1" in
  --check) n=0; for d in $ONEBIT_SHIM_DEVICES; do case "$d" in Vulkan*) n=$((n+1));; esac; done
           echo '[4/5] Vulkan Device'; echo "  Visible GPUs: $n"; [ "$n" -gt 0 ] && echo '  Selected GPU: #0 shim';;
  *) echo 'ZINC inference engine (shim)'; echo 'usage: zinc -m <model> [-p port] [-d device]';;
esac
"""


def effects(tool: str, argv: list[str]) -> None:
    if tool == "cmake" and "-S" in argv:  # configure: remember the install prefix of this build dir
        build = Path(value(argv, "-B"))
        prefix = value(argv, "-DCMAKE_INSTALL_PREFIX")
        build.mkdir(parents=True, exist_ok=True)
        (build / "CMakeCache.txt").write_text("# shim\n")
        if prefix:
            (build / "shim-prefix").write_text(prefix)
    elif tool == "cmake" and argv[:1] == ["--install"]:
        prefix = Path(os.environ.get("DESTDIR", "") + (Path(argv[1]) / "shim-prefix").read_text())
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
    elif tool == "zig" and argv[:1] == ["build"]:  # zinc's build.zig: bin/zinc and its compiled shaders
        prefix = Path(value(argv, "--prefix"))
        touch(prefix / "bin" / "zinc", ZINC, 0o755)
        touch(prefix / "share" / "zinc" / "shaders" / "matmul.spv", "\x03\x02\x23\x07")
    elif tool == "xrt-smi" and argv[:1] == ["examine"]:  # XRT's view of the runner's NPU, if it has one
        print("System Configuration\nDevice(s) Present")
        if "NPU0" in os.environ.get("ONEBIT_SHIM_DEVICES", "").split():
            print("|BDF             |Name            |\n|[0000:c5:00.1]  |NPU Strix Halo  |")
    elif tool == "cargo":
        target = Path(value(argv, "--target-dir"))
        touch(target / "release" / "libonebit_hf_tokenizers.so")


def main() -> int:
    tool = Path(sys.argv[0]).name
    argv = sys.argv[1:]
    record(tool, argv)
    versions = json.loads(os.environ.get("ONEBIT_SHIM_VERSIONS") or "{}")
    if argv in (["--version"], ["version"]) and (tool in versions or tool == "cmake"):
        print(versions.get(tool, "cmake version 3.31.0"))
        return 0
    effects(tool, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
