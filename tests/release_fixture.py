"""A small project that release.yml can run on: the real workflow file, the real `onebit` package (serve's source),
and small recipes and bundles carrying the names the workflow uses (cpu, nvidia, strix; hrx, lean, xdna, zinc,
ds4-rocm, ...), every pin a file:// upstream made from tests/mini_project.py's C program.

What builds for real here: the CPU-side parts (cmake + ninja + cc, make + cc, the serve launcher, a shared library).
What cannot (TheRock's amdclang, hipconfig, XRT and the kernel build, zig for zinc, nvcc) comes from recording toolchains
(tests/shims/shim.py): toolchain roots whose programs answer --version and record every call, and cmake/make/zig shims
on the Strix Halo runner's PATH. Nothing here is downloaded: serve vendors no wheels (the test's own environment
provides onebit's dependencies to the launcher's python3).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from mini_project import git, git_repo

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tests" / "shims" / "shim.py"
REPO = "1bit-MONSTER/1bit-engine"

# the versions the recording toolchains answer with: what a Strix Halo runner with TheRock 7.1 and a CUDA 13 wheel
# toolchain would say (the release must name lean-rocm's Lemonade archive rocm-7.1 from hipconfig's answer)
VERSIONS = {
    "amdclang": "AMD clang version 20.0.0git (TheRock roc-7.1.0)",
    "amdclang++": "AMD clang version 20.0.0git (TheRock roc-7.1.0)",
    "hipconfig": "7.1.25424-9bd6a1b1f9",
    "hipcc": "HIP version: 7.1.25424-9bd6a1b1f9",
    "xrt-smi": "Version              : 2.21.0",
    "nvcc": "Cuda compilation tools, release 13.0, V13.0.88",
    "glslc": "shaderc v2023.8 v2023.8\nspirv-tools v2023.6 v2023.6\nglslang 14.2.0",
    "zig": "0.15.2",
}
HARDWARE = "HRX0 Vulkan0 ROCm0 NPU0"  # the Strix Halo runner's devices (shim llama-server, zinc, xrt-smi)

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(llama C)
set(LLAMA_BUILD_COMMIT "unknown" CACHE STRING "commit the build is from")
set(GGML_VULKAN OFF CACHE BOOL "the Vulkan backend")
set(CMAKE_CUDA_ARCHITECTURES "" CACHE STRING "CUDA architectures")
if(GGML_VULKAN)
  # ggml-vulkan's glslc probes, as its configure prints them
  message(STATUS "GL_KHR_cooperative_matrix supported by glslc")
  message(STATUS "GL_EXT_bfloat16 not supported by glslc")
endif()
add_library(ggml SHARED greet.c)
add_executable(llama-server main.c)
target_compile_definitions(llama-server PRIVATE HELLO_COMMIT="${LLAMA_BUILD_COMMIT}" HELLO_ARCHS="${CMAKE_CUDA_ARCHITECTURES}")
target_link_libraries(llama-server PRIVATE ggml)
include(GNUInstallDirs)
install(TARGETS llama-server ggml)
"""
GREET_C = '#include <stdio.h>\nvoid greet(void) { printf("hello from the fixture\\n"); }\n'
MAIN_C = """\
#include <stdio.h>
#include <string.h>
void greet(void);
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) { printf("version: 1 (commit %s)\\n", HELLO_COMMIT); return 0; }
    if (argc > 1 && strcmp(argv[1], "--archs") == 0) { printf("%s\\n", HELLO_ARCHS); return 0; }
    if (argc > 1 && strcmp(argv[1], "--list-devices") == 0) { printf("Available devices:\\n"); return 0; }
    greet();
    return 0;
}
"""
DS4_C = '#include <stdio.h>\nint main(void) { puts("Usage: ds4-server [options]"); puts("  --port N"); return 0; }\n'
MAKEFILE = "cpu:\n\tfor p in ds4 ds4-server ds4-bench ds4-eval ds4-agent; do $(CC) -O2 -o $$p ds4.c; done\n"

PINS = ("llama.cpp", "llama.cpp-1bit-hrx", "rocmfpx", "xdna-driver", "zinc", "ds4", "ds4-rocm", "onebit-engine", "laya")

CMAKE_TOOLS = [{"tool": "cmake", "version": ">=3.16"}, {"tool": "ninja"}, {"tool": "cc"}, {"tool": "patchelf"}]
LLAMA_STAGE = {"root": "libexec/onebit/{variant}", "keep": ["bin/llama-*", "lib/lib*.so*"],
               "binaries": {"llama-server": "bin/llama-server"}, "links": {"bin/llama-server-{variant}": "bin/llama-server"}}
VERSION_TEST = [{"name": "version names the pinned commit", "run": ["bin/llama-server", "--version"],
                 "expect": "commit {commit7}\\)"}]
COMMIT_OPTION = {"LLAMA_BUILD_COMMIT": "{commit7}"}


def _recipe(name: str, summary: str | None = None, **body) -> dict:
    return {"schema_version": 1, "name": name, "summary": summary or f"the fixture {name}", "license": "MIT", **body}


def recipes(tc: Path) -> dict[str, dict]:
    """The fixture recipes: the real ones' names, kinds, toolchain variables and checklists; small builds."""
    therock = {"env": "ONEBIT_HRX_TOOLCHAIN", "default": "/opt/rocm-therock"}
    lean_rock = {"env": "ONEBIT_LEAN_ROCM_TOOLCHAIN", "default": "/opt/rocm-therock"}
    return {
        "cpu": _recipe("cpu", source={"pin": "llama.cpp"}, toolchain=CMAKE_TOOLS,
                       build={"kind": "cmake", "options": COMMIT_OPTION}, stage=LLAMA_STAGE,
                       provides={"backend": "cpu", "devices": ["CPU"], "features": ["embedding"]}, tests=VERSION_TEST),
        "vulkan": _recipe("vulkan", source={"pin": "llama.cpp"},
                          toolchain=CMAKE_TOOLS + [{"tool": "glslc", "why": "compiles the Vulkan shaders"}],
                          build={"kind": "cmake", "options": {**COMMIT_OPTION, "GGML_VULKAN": True}}, stage=LLAMA_STAGE,
                          provides={"backend": "vulkan", "devices": ["Vulkan0"], "features": ["embedding"]},
                          tests=VERSION_TEST,
                          hardware_checklist=["nox -s build-strix -- --only vulkan",
                                              "<prefix>/bin/llama-server --list-devices   # expect Vulkan0"]),
        "cuda": _recipe("cuda", source={"pin": "llama.cpp"},
                        toolchain=CMAKE_TOOLS + [{"tool": "nvcc", "env": "CUDA_HOME", "default": f"{tc}/cuda",
                                                  "path": "bin/nvcc", "version": ">=12.4"}],
                        build={"kind": "cmake", "options": {**COMMIT_OPTION, "CMAKE_CUDA_ARCHITECTURES": "80-virtual;90-real"}},
                        requirements={"run": ["__cuda >={tool:nvcc:major}"]}, stage=LLAMA_STAGE,
                        provides={"backend": "cuda", "devices": ["CUDA0"], "features": ["embedding"]}, tests=VERSION_TEST),
        "serve": _recipe("serve", "the serve entry point (no vendored wheels in the fixture)", source={"local": "onebit"},
                         toolchain=[{"tool": "python3", "version": ">=3.11"}],
                         build={"kind": "script",
                                # an empty wheel set for the running CPython: its imports come from the test's environment
                                "commands": [["{python}", "-c", "import os, sys; os.makedirs('{build}/wheels/cp%d%d'"
                                              " % sys.version_info[:2], exist_ok=True)"],
                                             ["{python}", "-m", "builders.ship.serve_install", "{source}", "{prefix}",
                                              "{build}/wheels"]]},
                         stage={"binaries": {"1bit": "bin/1bit"}}, provides={"backend": None, "features": ["serve"]}),
        "hrx": _recipe("hrx", source={"pin": "llama.cpp-1bit-hrx"},
                       toolchain=[{"tool": "cmake", "version": ">=3.25"}, {"tool": "patchelf"}, {"tool": "glslc"},
                                  {"tool": "amdclang++", **therock, "path": "lib/llvm/bin/amdclang++"},
                                  {"tool": "amdclang", **therock, "path": "lib/llvm/bin/amdclang"}],
                       build={"kind": "script", "env": {"CC": "{tool:amdclang}", "CXX": "{tool:amdclang++}"},
                              "commands": [["cmake", "-S", "{source}", "-B", "{build}/llama", "-G", "Ninja",
                                            "-DCMAKE_INSTALL_PREFIX={prefix}", "-DGGML_VULKAN=ON", "-DGGML_HRX=ON",
                                            "-DLLAMA_BUILD_COMMIT={commit7}"],
                                           ["cmake", "--build", "{build}/llama"], ["cmake", "--install", "{build}/llama"]]},
                       stage={"install": "build-system", "root": "libexec/onebit/{variant}",
                              "keep": ["bin/llama-*", "lib/*.so*"], "binaries": {"llama-server": "bin/llama-server"},
                              "links": {"bin/llama-server-{variant}": "bin/llama-server"}},
                       provides={"backend": "hrx", "adapter": "llama-server", "devices": ["HRX0", "Vulkan0"],
                                 "features": ["prefill-split"]},
                       tests=VERSION_TEST,
                       hardware_checklist=["nox -s build-strix -- --only hrx",
                                           "<prefix>/bin/llama-server-hrx --list-devices   # HRX0 and Vulkan0, one binary",
                                           "1bit serve -m <qwen3 moe q4_0> --device hrx   # answers /v1/chat/completions"]),
        "lean": _recipe("lean", source={"pin": "rocmfpx"},
                        toolchain=[{"tool": "cmake", "version": ">=3.25"}, {"tool": "patchelf"}],
                        build={"kind": "cmake", "options": COMMIT_OPTION},
                        stage={**LLAMA_STAGE, "keep": ["bin/llama-*", "lib/*.so*"]},
                        provides={"backend": "lean-vulkan", "devices": ["Vulkan0"], "features": ["hadamard_q4_0"]},
                        variants={
                            "vulkan": {"summary": "the lean tree on Vulkan", "toolchain": [{"tool": "glslc"}],
                                       "build": {"options": {"GGML_VULKAN": True}},
                                       "provides": {"backend": "lean-vulkan", "devices": ["Vulkan0"],
                                                    "features": ["hadamard_q4_0"]}},
                            "rocm": {"summary": "the lean tree on ROCm gfx1151",
                                     "toolchain": [{"tool": "amdclang++", **lean_rock, "path": "lib/llvm/bin/amdclang++"},
                                                   {"tool": "hipconfig", **lean_rock, "path": "bin/hipconfig"}],
                                     "build": {"options": {"GPU_TARGETS": "gfx1151", "CMAKE_HIP_COMPILER": "{tool:amdclang++}"}},
                                     "provides": {"backend": "rocm", "devices": ["ROCm0"],
                                                  "features": ["hadamard_q4_0", "hadamard_w4a4"]}}},
                        tests=VERSION_TEST,
                        hardware_checklist=["nox -s build-strix -- --only lean",
                                            "<prefix>/bin/llama-server --list-devices   # expect ROCm0 and Vulkan0",
                                            "1bit serve -m <hadamard-rotated q4_0 gguf> --dry-run",
                                            "compare perplexity of the rotated file on ROCm0 against the last release"]),
        "xdna": _recipe("xdna", source={"pin": "xdna-driver"},
                        toolchain=[{"tool": "cmake", "version": ">=3.19"}, {"tool": "make"},
                                   {"tool": "xrt-smi", "env": "XILINX_XRT", "default": "/opt/xilinx/xrt", "path": "bin/xrt-smi"},
                                   {"tool": "kernel-headers", "env": "ONEBIT_KERNEL_BUILD", "path": "Makefile"}],
                        build={"kind": "script", "env": {"KERNEL_SRC": "{tool:kernel-headers:root}"},
                               "commands": [["cmake", "-S", "{source}", "-B", "{build}/xdna", "-G", "Unix Makefiles",
                                             "-DCMAKE_INSTALL_PREFIX=/opt/xilinx/xrt", "-DSKIP_KMOD=0"],
                                            ["make", "-C", "{build}/xdna", "-j2"],
                                            ["make", "-C", "{build}/xdna", "install", "DESTDIR={build}/destdir"],
                                            ["mkdir", "-p", "{prefix}/lib/modules"],
                                            ["cp", "-a", "{build}/destdir/opt/xilinx/xrt/.", "{prefix}/"],
                                            ["install", "-m", "0644", "{build}/xdna/drivers/accel/amdxdna.ko",
                                             "{prefix}/lib/modules/amdxdna.ko"]]},
                        stage={"install": "build-system", "root": "libexec/onebit/{variant}",
                               "keep": ["lib/modules/amdxdna.ko", "lib/libxrt_driver_xdna.so*"],
                               "binaries": {"amdxdna.ko": "lib/modules/amdxdna.ko", "xrt-plugin": "lib/libxrt_driver_xdna.so"}},
                        provides={"backend": "npu", "adapter": "npu", "devices": ["NPU0"], "features": []},
                        hardware_checklist=_real_checklist("xdna")),
        "zinc": _recipe("zinc", source={"pin": "zinc"}, toolchain=[{"tool": "zig", "version": ">=0.15.2"}, {"tool": "glslc"}],
                        build={"kind": "zig", "options": {"optimize": "ReleaseFast", "shaders": True}, "targets": ["install"]},
                        stage={"install": "build-system", "root": "libexec/onebit/{variant}",
                               "keep": ["bin/zinc", "share/zinc/shaders/*.spv"], "binaries": {"zinc": "bin/zinc"}},
                        provides={"backend": "zinc", "adapter": "zinc", "devices": ["Vulkan0"], "features": []},
                        tests=[{"name": "zinc prints its usage", "run": ["bin/zinc", "--help"], "expect": "ZINC"}],
                        hardware_checklist=["nox -s build-strix -- --only zinc",
                                            "cd <prefix>/libexec/onebit/zinc && bin/zinc --check   # the Radeon 8060S",
                                            "1bit serve -m <qwen3 q4_k_m gguf> --device zinc --dry-run"]),
        # the real ds4 variants' backends (ds4-cpu, ds4-rocm) are not in the manifest schema's list of backends yet:
        # here the cpu build is a plain package and the ROCm build is the ds4 backend
        "ds4": _recipe("ds4", source={"pin": "ds4"}, toolchain=[{"tool": "make"}, {"tool": "cc"}],
                       build={"kind": "make", "options": {"programs": "ds4 ds4-server ds4-bench ds4-eval ds4-agent"},
                              "targets": ["cpu"]},
                       stage={"install": "build-system", "root": "libexec/onebit/{variant}", "keep": ["bin/ds4*"],
                              "binaries": {"ds4-server": "bin/ds4-server"}},
                       provides={"backend": None, "features": ["1bp"]}, variants={"cpu": {"summary": "ds4 on the CPU"}},
                       tests=[{"name": "ds4-server prints its usage", "run": ["bin/ds4-server", "--help"], "expect": "--port"}]),
        "ds4-rocm": _recipe("ds4-rocm", source={"pin": "ds4-rocm"},
                            toolchain=[{"tool": "make"}, {"tool": "hipcc", "env": "ONEBIT_DS4_ROCM_TOOLCHAIN",
                                                          "default": "/opt/rocm-therock", "path": "bin/hipcc"}],
                            build={"kind": "make", "options": {"ROCM_PATH": "{tool:hipcc:root}", "ROCM_ARCH": "gfx1151",
                                                               "programs": "ds4 ds4-server ds4-bench"}, "targets": ["rocm"]},
                            stage={"install": "build-system", "root": "libexec/onebit/{variant}", "keep": ["bin/ds4*"],
                                   "binaries": {"ds4-server": "bin/ds4-server", "ds4": "bin/ds4"}},
                            provides={"backend": "ds4", "adapter": "ds4", "devices": ["ROCm0"], "features": ["1bp"]},
                            tests=[{"name": "ds4-server prints its usage", "run": ["bin/ds4-server", "--help"],
                                    "expect": "--port"}],
                            hardware_checklist=["nox -s build-strix -- --only ds4-rocm",
                                                "1bit serve -m <model.1bp> --device ds4 --dry-run"]),
        "tokenizers": _recipe("tokenizers", source={"pin": "onebit-engine"}, toolchain=[{"tool": "cc"}],
                              build={"kind": "script", "commands": [
                                  ["mkdir", "-p", "{prefix}/lib", "{prefix}/include"],
                                  ["cc", "-shared", "-fPIC", "-o", "{prefix}/lib/libtokenizers.so", "{source}/greet.c"],
                                  ["cp", "{source}/greet.c", "{prefix}/include/tokenizers.h"]]},
                              stage={"install": "build-system", "keep": ["lib/libtokenizers.so", "include/tokenizers.h"],
                                     "binaries": {"libtokenizers": "lib/libtokenizers.so"}},
                              provides={"backend": None, "features": ["tokenizers-c-abi"]}),
        "laya": _recipe("laya", source={"pin": "laya"},
                        build={"kind": "script", "commands": [
                            ["mkdir", "-p", "{prefix}/share/laya/checkpoint"],
                            ["cp", "{source}/LICENSE", "{prefix}/share/laya/checkpoint/model.safetensors"]]},
                        stage={"install": "build-system", "keep": ["share/laya/checkpoint/*"],
                               "binaries": {"checkpoint": "share/laya/checkpoint/model.safetensors"}},
                        provides={"backend": None, "features": ["laya"]}),
    }


def _real_checklist(name: str) -> list[str]:
    """A real recipe's checklist, as it is (the xdna gate the workflow runs is the real one)."""
    return [str(x) for x in yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())["hardware_checklist"]]


BUNDLES = {
    "cpu": ["cpu", "serve"],
    "nvidia": ["cuda", "cpu", "serve"],
    "strix": ["vulkan", "hrx", {"recipe": "lean", "variants": ["vulkan", "rocm"]}, "xdna", "zinc",
              {"recipe": "ds4", "variants": ["cpu"]}, "ds4-rocm", "cpu", "tokenizers", "laya", "serve"],
}


@dataclass
class Fixture:
    repo: Path  # the project, a git repository (what actions/checkout clones)
    upstream: Path
    commit: str  # every pin's commit
    tc: Path  # the recording toolchain roots
    shims: Path  # shim programs by name (cmake, make, zig, glslc, ...)

    @property
    def url(self) -> str:
        return f"file://{self.repo}"

    def shim_dir(self, dest: Path, tools) -> Path:
        """A folder of recording shims named `tools`, for a runner's PATH."""
        dest.mkdir(parents=True, exist_ok=True)
        for t in tools:
            _link(dest / t, SHIM)
        return dest

    def strix_venv(self, dest: Path, venv: Path) -> Path:
        """What `python3 -m venv .venv && pip install -e '.[build]'` leaves on the Strix Halo runner, with its cmake a
        recording one: the project's programs are the test environment's, and the cmake that would drive TheRock's
        compilers records its calls instead."""
        (dest / "bin").mkdir(parents=True, exist_ok=True)
        for entry in sorted((venv / "bin").iterdir()):
            _link(dest / "bin" / entry.name, SHIM if entry.name == "cmake" else entry)
        return dest

    def upstream_release(self, tag: str) -> str:
        """A new upstream commit, tagged `tag` (what the pin bot's bumps move to); the pinned one stays as it is."""
        (self.upstream / "NEWS").write_text(f"{tag}: the fixture upstream moved\n")
        git(self.upstream, "add", "NEWS")
        git(self.upstream, "commit", "-qm", f"upstream {tag}")
        git(self.upstream, "tag", tag)
        return git(self.upstream, "rev-parse", "HEAD")

    def bump_branch(self, pin: str, commit: str, tag: str) -> tuple[str, str]:
        """The pin bot's proposal as it pushes one: a branch `bump/<pin>-<sha12>` off main moving that pin alone
        (pins.yaml edited by the bot's own line editor). Returns (branch, head commit)."""
        from builders.pins.decide import Edit
        from builders.pins.edit import edit_pins

        branch = f"bump/{pin}-{commit[:12]}"
        git(self.repo, "checkout", "-q", "-b", branch, "main")
        pins = self.repo / "pins.yaml"
        pins.write_text(edit_pins(pins.read_text(), [Edit(("pins", pin, "commit"), commit), Edit(("pins", pin, "tag"), tag)],
                                  where=pins))
        git(self.repo, "commit", "-qam", f"Bump {pin} to {tag} ({commit[:12]})")
        head = git(self.repo, "rev-parse", "HEAD")
        git(self.repo, "checkout", "-q", "main")
        return branch, head

    def origin(self, dest: Path) -> Path:
        """The project as GitHub holds it: a bare repository with every branch, that the jobs clone and push to."""
        subprocess.run(["git", "clone", "--quiet", "--bare", str(self.repo), str(dest)], check=True, capture_output=True)
        return dest

    def strix_env(self) -> dict[str, str]:
        """The Strix Halo runner's own environment: where its TheRock, XRT and kernel build are."""
        return {"ONEBIT_HRX_TOOLCHAIN": str(self.tc / "therock"), "ONEBIT_LEAN_ROCM_TOOLCHAIN": str(self.tc / "therock"),
                "ONEBIT_DS4_ROCM_TOOLCHAIN": str(self.tc / "therock"), "XILINX_XRT": str(self.tc / "xrt"),
                "ONEBIT_KERNEL_BUILD": str(self.tc / "kernel"), "ONEBIT_SHIM_DEVICES": HARDWARE,
                "ONEBIT_SHIM_COMMIT": self.commit[:7]}


def _link(path: Path, target: Path) -> None:
    """A symlink, once: the runner models of jobs that start together make the same links at the same time."""
    try:
        path.symlink_to(target)
    except FileExistsError:
        pass


def _toolchains(tc: Path) -> None:
    """Recording toolchain roots: every program a link to the shim, every library a file where the recipe looks."""
    progs = {"therock/lib/llvm/bin/amdclang": "amdclang", "therock/lib/llvm/bin/amdclang++": "amdclang++",
             "therock/bin/hipconfig": "hipconfig", "therock/bin/hipcc": "hipcc", "xrt/bin/xrt-smi": "xrt-smi",
             "cuda/bin/nvcc": "nvcc"}
    for rel, name in progs.items():
        path = tc / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # named like the tool (the shim records its own name), reached through the toolchain root's path
        target = tc / "shim-names" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(SHIM)
        path.symlink_to(target)
    (tc / "kernel").mkdir(parents=True, exist_ok=True)
    (tc / "kernel" / "Makefile").write_text("# the kernel build tree's Makefile (a marker the recipe looks for)\n")


def make_fixture(base: Path) -> Fixture:
    up = base / "upstream"
    files = {"CMakeLists.txt": CMAKELISTS, "greet.c": GREET_C, "main.c": MAIN_C, "ds4.c": DS4_C, "Makefile": MAKEFILE,
             "LICENSE": "MIT License\n\nCopyright (c) the fixture upstream\n"}
    commit = git_repo(up, files, "upstream 1.0", "v1.0")

    tc = base / "toolchains"
    _toolchains(tc)

    repo = base / "project"
    (repo / "recipes").mkdir(parents=True)
    (repo / "bundles").mkdir()
    (repo / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / ".github" / "workflows" / "release.yml", repo / ".github" / "workflows" / "release.yml")
    shutil.copytree(ROOT / "onebit", repo / "onebit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, repo / name)
    release = yaml.safe_load((ROOT / "release.yaml").read_text())  # the real settings (Lemonade's, fan_out), our repo
    (repo / "release.yaml").write_text(yaml.safe_dump({**release, "repo": REPO}, sort_keys=False))
    (repo / ".gitignore").write_text(".onebit/\nbuilt/\ndist/\n.venv\n")
    pins = "".join(f"  {name}:\n    url: file://{up}\n    policy: release\n    tag: v1.0\n    commit: {commit}\n"
                   f"    cadence: weekly\n    license: MIT\n    mirrors:\n      - git: file://{up}\n" for name in PINS)
    (repo / "pins.yaml").write_text("schema_version: 1\npins:\n" + pins)
    # the project's floor without its sysroot: these builds are shims that compile nothing, offline
    floor = (ROOT / "floor.yaml").read_text()
    (repo / "floor.yaml").write_text(floor[:floor.index("\ntoolchain:")] + "\n")
    for name, data in recipes(tc).items():
        (repo / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for name, comps in BUNDLES.items():
        lines = "".join(f"  - recipe: {c}\n" if isinstance(c, str) else
                        f"  - recipe: {c['recipe']}\n    variants: [{', '.join(c['variants'])}]\n" for c in comps)
        (repo / "bundles" / f"{name}.yaml").write_text(
            f"schema_version: 1\nname: {name}\nsummary: the fixture {name} bundle\nbuild_number: 0\n"
            f"platform: linux-64\ncomponents:\n{lines}")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "the fixture project")
    return Fixture(repo=repo, upstream=up, commit=commit, tc=tc, shims=base / "shims")


def shim_versions() -> str:
    return json.dumps(VERSIONS)


# The shims' settings, kept by the host root for its build commands (builders/roots/root.py: a build's environment is
# declared, nothing else of the caller's reaches it)
SHIM_PASS_ENV = {"ONEBIT_PASS_ENV": "ONEBIT_SHIM_LOG ONEBIT_SHIM_ENV ONEBIT_SHIM_VERSIONS ONEBIT_SHIM_COMMIT ONEBIT_SHIM_DEVICES"}


def clean_env() -> dict[str, str]:
    """The environment every replayed job starts from: this process's, without what a runner would not have, plus
    the shims' settings passed to the build commands."""
    drop = ("ONEBIT_", "CUDA_HOME", "XILINX_XRT", "GITHUB_", "RUNNER_", "CCACHE_", "CMAKE_", "VIRTUAL_ENV", "PYTEST_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **SHIM_PASS_ENV}
