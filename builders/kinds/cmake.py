"""CMake + Ninja, out of tree, ccache when present; install into a DESTDIR.

The path maps reach the compilers through CFLAGS/CXXFLAGS/... in the environment, which CMake reads to start
CMAKE_<LANG>_FLAGS and upstream's CMakeLists add to; a recipe's own CMAKE_<LANG>_FLAGS option gets them appended."""
from __future__ import annotations

from ..roots import sysroot
from ..plan_types import Command
from . import flags
from .base import KindDefaults, env_items


def cmake_value(value: object) -> str:
    if value is True:
        return "ON"
    if value is False:
        return "OFF"
    return str(value)


SYSROOT_CMAKE_FILE = "onebit-sysroot.cmake"  # in the build dir: the sysroot's toolchain file (builders/roots/sysroot.py)


def toolchain_files(ctx, options) -> tuple[tuple[str, str], ...]:
    """The sysroot's toolchain file a configure reads (written by the executor before it runs it), for the languages
    the build compiles; () without a sysroot."""
    if ctx.sysroot is None:
        return ()
    text = sysroot.cmake_toolchain(ctx.sysroot, sysroot.cmake_families(options, ctx.env), host_libs=ctx.host_libs)
    return ((f"{ctx.build}/{SYSROOT_CMAKE_FILE}", text),)


class CMakeKind(KindDefaults):
    name = "cmake"
    strict_options = True  # every -D is the recipe's: `--set` names one of them

    def configure_argv(self, ctx) -> list[str]:
        argv = [
            "cmake", "-S", ctx.source, "-B", ctx.build, "-G", "Ninja",
            f"-DCMAKE_BUILD_TYPE={ctx.build_type}",
            f"-DCMAKE_INSTALL_PREFIX={ctx.prefix}",
            "-DCMAKE_INSTALL_LIBDIR=lib",
            # link with the install RPATH: no build-tree path reaches the binary (nor its build-id), so stage
            # only has to add $ORIGIN and builds in different directories give the same bytes
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        ]
        if ctx.launcher:
            argv += [f"-DCMAKE_C_COMPILER_LAUNCHER={ctx.launcher}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={ctx.launcher}"]
        argv += [f"-D{k}={cmake_value(v)}" for k, v in flags.cmake_options(ctx.options, ctx.maps).items()]
        if ctx.sysroot is not None:  # the floor's sysroot: CMake reads its toolchain file when it first configures
            argv.append(f"-DCMAKE_TOOLCHAIN_FILE={self.toolchain_file(ctx)}")
        return argv

    def toolchain_file(self, ctx) -> str:
        return f"{ctx.build}/{SYSROOT_CMAKE_FILE}"



    def build(self, ctx) -> list[Command]:
        # HIP sources through ccache too: the environment variable (CMake >= 3.17) sets the launcher only in a project
        # that enables the HIP language, so no -D goes unused in one that does not
        variables = flags.cmake_flag_variables(ctx.options)
        env = env_items(ctx, variables=variables,
                        **({"CMAKE_HIP_COMPILER_LAUNCHER": ctx.launcher} if ctx.launcher and "HIPFLAGS" in variables else {}))
        build = ["cmake", "--build", ctx.build, "--parallel", str(ctx.jobs)]
        targets = [t for t in ctx.targets if t != "all"]
        if targets:
            build += ["--target", *targets]
        return [
            Command(tuple(self.configure_argv(ctx)), env=env, files=toolchain_files(ctx, ctx.options), links=ctx.host_lib_links),
            Command(tuple(build), env=env),
        ]

    def install(self, ctx) -> list[Command]:
        return [Command(("cmake", "--install", ctx.build), env=env_items(ctx, flag_env=False, DESTDIR=ctx.destdir))]


STALE_MARKER = "Manually-specified variables were not used by the project:"


def unused_variables(output: str) -> list[str]:
    """Pure: the variables CMake says it ignored (a stale or misspelt flag that silently builds another path)."""
    if STALE_MARKER not in output:
        return []
    tail = output.split(STALE_MARKER, 1)[1].splitlines()
    names = []
    for line in tail[1:]:
        if not line.strip():
            if names:
                break
            continue
        if not line.startswith("    "):
            break
        names.append(line.strip())
    return names


def check_output(command_index: int, output: str) -> str | None:
    """Called by the executor after each command; a message makes the build fail."""
    if command_index != 0:
        return None
    unused = unused_variables(output)
    if unused:
        return ("CMake ignored these -D options: " + ", ".join(unused) +
                ". A stale or misspelt flag silently builds a different path (say, CPU instead of GPU); "
                "fix or remove it in the recipe's build.options")
    return None


CMakeKind.check_output = staticmethod(check_output)


def note_output(command_index: int, output: str) -> tuple[str | None, dict]:
    """Called after each command like check_output, but it informs instead of failing: what the configure reported
    that the build goes without (ggml-vulkan's glslc probes), as a log line and as facts for the manifest entry."""
    from . import vulkan_report

    if command_index != 0:
        return None, {}
    dropped = vulkan_report.manifest_value(output)
    return vulkan_report.configure_note(0, output), ({"dropped_shader_features": dropped} if dropped else {})


CMakeKind.note_output = staticmethod(note_output)
