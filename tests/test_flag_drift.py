"""Build-flag drift in every pin bump: the parsers and comparisons as tables, then the whole check on real local git
repositories whose real Makefile / CMakeLists.txt / build.zig change between two commits (real `make -n`; zig is
only parsed), and through the bot (`pins bump`, `pins check`) against the fake GitHub API."""
from __future__ import annotations

import os
import shutil
import textwrap

import pytest

from builders.pins import flag_calls, flag_make, flag_options, flagdrift, flags, isolate
from builders.pins.__main__ import main
from builders.pins.flag_make import CompileLine, MakeRun, MakeSide
from builders.pins.flag_options import Decl
from builders.pins.flags import Row
from builders.plan_types import Command
from builders.roots.root import Root
from pins_fixtures import FakeAPI, Project, Upstream, branch_pin, git, make_recipe

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is part of the build toolchain (apt make)")

# ------------------------------------------------------------------------------------------------ cmake parser


CMAKE = """\
cmake_minimum_required(VERSION 3.16)
project(demo C)
# option(COMMENTED "a comment is not a declaration" ON)
#[[ option(BRACKET_COMMENTED "nor is a bracket comment" ON) ]]
option(DEMO_FAST "fast path" ON)
OPTION (DEMO_UPPER "commands are case-insensitive")
set(DEMO_LEVEL 3 CACHE STRING
    "multi-line, with (nested) parentheses")
set(DEMO_PLAIN 1)
set(DEMO_QUOTED "CACHE" "not the keyword")
set(DEMO_INTERNAL 1 CACHE INTERNAL "")
set(${PROJECT_NAME}_COMPUTED ON CACHE BOOL "computed names are skipped")
cmake_dependent_option(DEMO_DEP "dep" ON "DEMO_FAST" OFF)
message(STATUS [=[a bracket argument with ) inside]=])
if(DEMO_FAST)
  set(DEMO_LATE "x" CACHE PATH "declared after a bracket argument")
endif()
"""


def test_cmake_commands_and_their_lines():
    cmds = flag_options.cmake_commands(CMAKE)
    names = [c.name for c in cmds]
    assert names[:4] == ["cmake_minimum_required", "project", "option", "option"]
    level = next(c for c in cmds if c.args and c.args[0] == "DEMO_LEVEL")
    assert level.line == 7 and level.args == ("DEMO_LEVEL", "3", "CACHE", "STRING", "multi-line, with (nested) parentheses")
    msg = next(c for c in cmds if c.name == "message")
    assert msg.args == ("STATUS", "a bracket argument with ) inside")


def test_cmake_declarations_name_file_and_line():
    found = flag_options.cmake_declarations({"CMakeLists.txt": CMAKE, "cmake/more.cmake": 'set(DEMO_MORE ON CACHE BOOL "x")\n',
                                      "docs/notes.txt": "option(NOT_CMAKE x)\n", "sub/CMakeLists.txt": "option(DEMO_FAST x)\n"})
    assert {n: d.where for n, d in found.items()} == {
        "DEMO_FAST": "CMakeLists.txt:5",  # the top-level file wins over sub/
        "DEMO_UPPER": "CMakeLists.txt:6",
        "DEMO_LEVEL": "CMakeLists.txt:7",
        "DEMO_DEP": "CMakeLists.txt:13",
        "DEMO_LATE": "CMakeLists.txt:16",
        "DEMO_MORE": "cmake/more.cmake:1",
    }


# ------------------------------------------------------------------------------------------------ zig parser


BUILD_ZIG = """\
const std = @import("std");
pub fn build(b: *std.Build) void {
    const target = b.standardTargetOptions(.{});
    const optimize = b.standardOptimizeOption(.{});
    // const old = b.option(bool, "commented", "a comment is not an option");
    const shaders = b.option(bool, "shaders", "Compile shaders // not a comment inside a string") orelse true;
    const n = b.option(
        u32,
        "threads",
        "multi-line",
    ) orelse 4;
    const list = b.option([]const []const u8, "extra-libs", "slice types have commas? no, but brackets") orelse &.{};
    const mode = b.option(enum { fast, safe }, "mode", "an inline enum type") orelse .fast;
    _ = .{ target, optimize, shaders, n, list, mode };
}
"""


def test_zig_declarations():
    found = flag_options.zig_declarations(BUILD_ZIG)
    assert {n: d.where for n, d in found.items()} == {
        "shaders": "build.zig:6", "threads": "build.zig:7", "extra-libs": "build.zig:12", "mode": "build.zig:13",
        "target": "build.zig:3", "cpu": "build.zig:3", "ofmt": "build.zig:3", "dynamic-linker": "build.zig:3",
        "optimize": "build.zig:4",
    }


# ------------------------------------------------------------------------------------------------ our invocation


CUT = ("unshare", "--net", "--")


def test_invocations_from_a_build_steps_commands():
    host = Root(net_cut=CUT)  # each command as the host root wraps it: the drift check reads it as it runs inside
    cmds = [host.wrap(c) for c in [
        Command(("rm", "-rf", "/w/build/ds4/tree")),
        Command(("cp", "-a", "/w/src/ds4@abc/.", "/w/build/ds4/tree")),
        Command(("make", "-C", "/w/build/ds4/tree", "-j16", "cpu", "NATIVE_CPU_FLAG=-march=x86-64-v3", "DEBUG_FLAGS="),
                env=(("CFLAGS", "-ffile-prefix-map=/w=/x"),)),
        Command(("cmake", "-S", "/w/src/ds4@abc", "-B", "/w/b", "-DCMAKE_BUILD_TYPE=Release", "-D", "FOO:BOOL=ON", "-DBAR")),
        Command(("cmake", "--build", "/w/b", "--parallel", "16")),
        Command(("make", "-C", "/w/b/xdna", "-j2")),
        Command(("zig", "build", "-Doptimize=ReleaseFast", "-Dshaders=true", "--prefix", "/w/p"), cwd="/w/src/ds4@abc"),
    ]]
    invs = flag_calls.invocations(cmds, source_dir="/w/src/ds4@abc")
    assert [i.tool for i in invs] == ["make", "cmake", "make", "zig"]
    make, cmake, generated, zig = invs
    assert (make.directory, make.goals, make.variables) == (".", ("cpu",), ("NATIVE_CPU_FLAG=-march=x86-64-v3", "DEBUG_FLAGS="))
    assert make.env == (("CFLAGS", "-ffile-prefix-map=/w=/x"),) and make.label() == "make cpu"
    assert cmake.defines == (("CMAKE_BUILD_TYPE", "Release"), ("FOO", "ON"), ("BAR", ""))
    assert generated.directory is None and generated.plan_dir == "/w/b/xdna"  # CMake's generated tree: not upstream's Makefile
    assert zig.defines == (("optimize", "ReleaseFast"), ("shaders", "true"))


@pytest.mark.parametrize("argv, cwd, expected", [
    (["make", "cpu"], "/s", (".", None, ("cpu",), (), ())),
    (["make", "-C", "sub", "-f", "GNUmakefile", "all", "X=1"], "/s", ("sub", "GNUmakefile", ("all",), ("X=1",), ())),
    (["make", "--directory=/s/a", "-j", "8", "-k", "V:=2", "Y+=3", "t1", "t2"], None, ("a", None, ("t1", "t2"), ("V:=2", "Y+=3"), ("-k",))),
    (["make", "-C/elsewhere", "x"], "/s", (None, None, ("x",), (), ())),
    (["gmake", "-Csub", "-fM.mk", "-l", "2.5", "-W", "f.c", "go"], "/s", ("sub", "M.mk", ("go",), (), ("-W", "f.c"))),
])
def test_parse_make(argv, cwd, expected):
    inv = flag_calls.parse_make(argv, cwd, ["/s"])
    assert (inv.directory, inv.makefile, inv.goals, inv.variables, inv.options) == expected


def test_recipe_variables_come_from_the_command_line_or_the_environment():
    inv = flag_calls.Invocation("make", (), variables=("A=1", "PLAN=x"), env=(("B", "2"), ("CFLAGS", "-pipe")))
    assert flag_calls.recipe_variables(inv, ["A", "B"]) == ("A=1", "B=2")


# ------------------------------------------------------------------------------------------------ make -n output


MAKE_N = """\
cc -O3 -ffast-math -march=native -c -o a.o a.c
cd sub && ccache gcc-12 -O2 -I include -DX=1 \\
    -c b.c
make[1]: Entering directory '/src/sub'
echo "building" ; nvcc -O3 -Xcompiler -march=native -arch=sm_89 -o prog a.o b.o -lm
if [ -z "" ]; then echo no; fi
/opt/rocm/bin/hipcc --offload-arch=gfx1151 -o prog a.o
ar rcs libx.a a.o
"""


def test_compile_lines():
    lines = flag_make.compile_lines(MAKE_N)
    assert lines == {
        "a.o": CompileLine("a.o", "cc", ("-O3", "-ffast-math", "-march=native")),
        "b.c (-c)": CompileLine("b.c (-c)", "gcc-12", ("-O2", "-I include", "-DX=1")),
        "prog": CompileLine("prog", "nvcc", ("-O3", "-Xcompiler -march=native", "-arch=sm_89", "-lm")),
        "prog #2": CompileLine("prog #2", "hipcc", ("--offload-arch=gfx1151",)),
    }


@pytest.mark.parametrize("given, expected", [
    (["-O3", "-g", "-O2"], ("-g", "-O2")),
    (["-march=native", "-march=x86-64-v3"], ("-march=x86-64-v3",)),
    (["-ffinite-math-only", "-fno-finite-math-only", "-ffast-math"], ("-fno-finite-math-only", "-ffast-math")),
    (["-Wall", "-Wno-all", "-Wextra"], ("-Wno-all", "-Wextra")),
    (["-mavx2", "-mno-avx2"], ("-mno-avx2",)),
    (["-DA=1", "-DA=2", "-Wl,--as-needed"], ("-DA=1", "-DA=2", "-Wl,--as-needed")),  # not families: all kept
])
def test_effective_flags_last_of_a_family_wins(given, expected):
    assert flag_make.effective(given) == expected


# ------------------------------------------------------------------------------------------------ option comparison


OLD = {"A": Decl("A", "CMakeLists.txt:3"), "B": Decl("B", "cmake/b.cmake:1"), "GONE_UNUSED": Decl("GONE_UNUSED", "CMakeLists.txt:9")}
NEW = {"A": Decl("A", "CMakeLists.txt:3"), "C": Decl("C", "CMakeLists.txt:4")}


@pytest.mark.parametrize("ours, old, expected", [
    ([("A", "ON")], NEW, []),  # unchanged
    ([("A", "ON"), ("CMAKE_BUILD_TYPE", "Release"), ("BUILD_SHARED_LIBS", "ON")], {"A": OLD["A"], "C": NEW["C"]}, []),
    ([("A", "ON"), ("B", "OFF")], OLD, [
        Row("hold", "-DB=OFF", "cmake/b.cmake:1 at old", "the recipe sets it, but nothing at new declares it any more"),
        Row("new option", "C", "CMakeLists.txt:4", "declared at new, not at old"),
        Row("removed option", "GONE_UNUSED", "CMakeLists.txt:9 at old", "removed upstream; the recipe does not set it")]),
    ([("A", "ON"), ("PLAIN", "1")], {"A": OLD["A"], "C": NEW["C"]}, [
        Row("info", "-DPLAIN=1", "", "declared at neither commit; the build's own check decides")]),
    ([("B", "")], None, [Row("info", "-DB", "", "not declared at new (the old commit could not be read)")]),
])
def test_compare_options(ours, old, expected):
    assert flag_options.compare_options("cmake", ours, old, NEW) == expected


# ------------------------------------------------------------------------------------------------ make comparison


def run(text="", rc=0, err=""):
    return MakeRun(rc, text, err)


UP = run("cc -O3 -ffast-math -march=native -c -o a.o a.c\ncc -O3 -ffast-math -march=native -o prog a.o\n")
REC = run("cc -O3 -ffast-math -march=x86-64-v3 -c -o a.o a.c\ncc -O3 -ffast-math -march=x86-64-v3 -o prog a.o\n")
MK = {"Makefile": "ARCH ?= -march=native\nOPT = -O3 -ffast-math\ncpu: prog\n"}
INV = flag_calls.Invocation("make", ("make", "cpu"), directory=".", goals=("cpu",), variables=("ARCH=-march=x86-64-v3",))


def compare(new, old=None, files=MK):
    rows = flag_make.compare_make(INV, new, old, new_files=files, old_files=MK, recipe_vars=("ARCH=-march=x86-64-v3",),
                              recipe_where="recipes/x.yaml:9")
    return [(r.result, r.what, r.where) for r in rows]


def test_make_with_only_the_recipes_overrides_holds_nothing():
    ours = run(REC.out.replace("-march=x86-64-v3", "-march=x86-64-v3 -ffile-prefix-map=/a=/b"))
    assert compare(MakeSide(UP, REC, ours), MakeSide(UP, REC, ours)) == [
        ("override", "-march=native", "Makefile:1"),
        ("override", "-march=x86-64-v3", "recipes/x.yaml:9"),
        ("ours", "-ffile-prefix-map=/a=/b", ""),
    ]


def test_make_flag_dropped_by_our_invocation_holds():
    ours = run(REC.out.replace("-O3 -ffast-math ", "-O2 "))
    rows = flag_make.compare_make(INV, MakeSide(UP, REC, ours), MakeSide(UP, REC, REC), new_files=MK, old_files=MK,
                              recipe_vars=("ARCH=-march=x86-64-v3",), recipe_where="r")
    held = [r for r in rows if r.holds]
    assert [(r.what, r.where) for r in held] == [("-O3", "Makefile:2"), ("-ffast-math", "Makefile:2")]
    assert held[0].detail == "dropped by our `make cpu`: missing from 2 of 2 compile lines (e.g. a.o)"
    assert ("ours", "-O2") in [(r.result, r.what) for r in rows]


def test_make_target_gone_and_other_failures():
    gone = run(rc=2, err="make: *** No rule to make target 'cpu'.  Stop.\n")
    assert compare(MakeSide(gone, gone, gone)) == [("hold", "make target cpu", "Makefile:3 at old")]
    broken = run(rc=2, err="Makefile:9: *** missing separator.  Stop.\n")
    rows = flag_make.compare_make(INV, MakeSide(broken, broken, broken), None, new_files=MK, old_files=None, recipe_vars=(),
                              recipe_where="r")
    assert [(r.result, r.detail) for r in rows] == [("hold", "upstream's own invocation fails at new: Makefile:9: *** missing separator.  Stop.")]
    ours_fails = flag_make.compare_make(INV, MakeSide(UP, REC, broken), None, new_files=MK, old_files=None, recipe_vars=(), recipe_where="r")
    assert ours_fails[-1].holds and "our invocation fails at new where upstream's succeeds" in ours_fails[-1].detail
    slow = MakeRun(None, "", "timed out after 120 s")
    assert compare(MakeSide(slow, slow, slow)) == [("hold", "make -n cpu", "")]  # a hang cannot dodge the check
    # failing the same way at both commits is this host (a $(error) on a missing tool), not drift
    nohip = run(rc=2, err="Makefile:30: *** hipcc not found.  Stop.\n")
    assert compare(MakeSide(nohip, nohip, nohip), MakeSide(nohip, nohip, nohip)) == [("not compared", "make -n cpu", "")]
    assert compare(MakeSide(UP, REC, nohip), MakeSide(UP, REC, nohip))[-1] == ("not compared", "make -n cpu", "")
    assert compare(MakeSide(UP, REC, nohip), MakeSide(UP, REC, REC))[-1] == ("hold", "make -n cpu", "")


def test_upstream_changes_between_commits_are_reported_not_held():
    new_up = run(UP.out.replace("-ffast-math", "-ffast-math -fno-plt"))
    new_rec = run(REC.out.replace("-ffast-math", "-ffast-math -fno-plt"))
    rows = flag_make.compare_make(INV, MakeSide(new_up, new_rec, new_rec), MakeSide(UP, REC, REC),
                              new_files={"Makefile": MK["Makefile"].replace("-ffast-math", "-ffast-math -fno-plt")},
                              old_files=MK, recipe_vars=("ARCH=-march=x86-64-v3",), recipe_where="r")
    assert ("upstream", "-fno-plt", "Makefile:2") in [(r.result, r.what, r.where) for r in rows]
    assert not any(r.holds for r in rows)


def test_report_rendering_and_reasons():
    rep = flags.VariantReport("ds4", "**ds4**: `make cpu`", (Row("override", "-g", "Makefile:10", "replaced"),
                                                           Row("hold", "-O3", "Makefile:11", "dropped | by us")))
    md = flags.render_markdown(rep)
    assert md.splitlines()[4] == "| **HOLD** | `-O3` | Makefile:11 | dropped \\| by us |"  # holds first, pipes escaped
    assert rep.reasons() == ["ds4: -O3: dropped | by us (Makefile:11)"] and rep.held
    assert flags.render_markdown(flags.VariantReport("x", "**x**: cmake", ())).endswith("matches (nothing dropped, nothing gone, "
                                                                                       "no new upstream option).")


# ------------------------------------------------------------------------------------------------ real repositories


MAKEFILE_OLD = """\
CC ?= cc
ARCH_FLAG ?= -march=native
OPT = -O3 -ffast-math
ifdef LEGACY_BUILD
OPT = -O1
endif
WARN = -Wall
ALL = $(OPT) $(ARCH_FLAG) $(WARN) -std=c99 $(CFLAGS)

cpu: prog

prog: main.o util.o
\t$(CC) $(ALL) -o prog main.o util.o -lm

%.o: %.c
\t$(CC) $(ALL) -c -o $@ $<
"""
SOURCES = {"main.c": "int main(void) { return 0; }\n", "util.c": "int util(void) { return 1; }\n"}


def cmake_recipe(name: str, options: dict) -> str:
    opts = "".join(f"\n    {k}: {v}" for k, v in options.items())
    return textwrap.dedent(f"""\
        schema_version: 1
        name: {name}
        summary: a cmake-built upstream
        license: MIT
        source:
          pin: {name}
        build:
          kind: cmake
          network: none
          options:OPTS
          targets: [all]
        stage:
          keep: [bin/demo]
          binaries:
            demo: bin/demo
        provides:
          backend: null
          devices: [CPU]
          features: []
        """).replace("OPTS", opts)


ZIG_RECIPE = """\
schema_version: 1
name: zinc
summary: a zig-built upstream
license: MIT
source:
  pin: zinc
build:
  kind: zig
  network: none
  options:
    optimize: ReleaseFast
    shaders: true
  targets: [install]
stage:
  keep: [bin/zinc]
  binaries:
    zinc: bin/zinc
provides:
  backend: zinc
  adapter: zinc
  devices: [Vulkan0]
  features: []
"""


def setup(tmp_path, name: str, recipe: str, files: dict[str, str]):
    up = Upstream(tmp_path / "up" / name)
    old = up.commit("old", files)
    proj = Project(tmp_path, branch_pin(name, up.url, old), recipes={name: recipe})
    return up, proj, old


def drift(proj: Project, name: str, up: Upstream, old: str, new: str) -> list[flags.VariantReport]:
    return isolate.flag_reports(proj.root, name, up.url, old, new, [name])


def table(reports) -> list[tuple[str, str, str]]:
    return [(r.result, r.what, r.where) for rep in reports for r in rep.rows]


@needs_make
def test_make_unchanged_upstream_has_no_drift(tmp_path):
    up, proj, old = setup(tmp_path, "dsx", make_recipe("dsx"), {"Makefile": MAKEFILE_OLD, **SOURCES})
    new = up.commit("docs only", {"README": "hello\n"})
    [rep] = drift(proj, "dsx", up, old, new)
    assert not rep.held, rep.reasons()
    rows = table([rep])
    assert ("override", "-march=native", "Makefile:2") in rows  # the recipe's deliberate ARCH_FLAG
    assert ("override", "-march=x86-64-v3", "recipes/dsx.yaml:13") in rows
    assert [r[0] for r in rows if r[0] not in ("override", "ours")] == []  # nothing else: upstream did not change
    assert rep.how.startswith(f"**dsx**: `make cpu` at `{old[:12]}` → `{new[:12]}`")


@needs_make
def test_make_flag_dropped_by_our_invocation_is_held(tmp_path):
    # the recipe's environment makes upstream's Makefile take its legacy path: -O3 -ffast-math are lost
    up, proj, old = setup(tmp_path, "dsx", make_recipe("dsx", env={"LEGACY_BUILD": "1"}), {"Makefile": MAKEFILE_OLD, **SOURCES})
    new = up.commit("upstream adds -fno-plt", {"Makefile": MAKEFILE_OLD.replace("WARN = -Wall", "WARN = -Wall -fno-plt")})
    [rep] = drift(proj, "dsx", up, old, new)
    assert rep.reasons() == [
        "dsx: -O3: dropped by our `make cpu`: missing from 3 of 3 compile lines (e.g. main.o) (already so at the old commit) (Makefile:3)",
        "dsx: -ffast-math: dropped by our `make cpu`: missing from 3 of 3 compile lines (e.g. main.o) (already so at the old commit) "
        "(Makefile:3)",
    ]
    assert ("upstream", "-fno-plt", "Makefile:7") in table([rep])  # upstream's own change: reported, not held


@needs_make
def test_make_target_renamed_is_held(tmp_path):
    up, proj, old = setup(tmp_path, "dsx", make_recipe("dsx"), {"Makefile": MAKEFILE_OLD, **SOURCES})
    new = up.commit("rename cpu to native", {"Makefile": MAKEFILE_OLD.replace("cpu: prog", "native: prog")})
    [rep] = drift(proj, "dsx", up, old, new)
    [reason] = rep.reasons()
    assert reason == (f"dsx: make target cpu: gone at {new[:12]}: make: *** No rule to make target 'cpu'.  Stop. "
                      f"(Makefile:10 at {old[:12]})")


def test_cmake_option_removed_is_held_and_option_added_is_reported(tmp_path):
    cm = 'cmake_minimum_required(VERSION 3.16)\nproject(demo C)\noption(DEMO_FAST "fast" ON)\ninclude(cmake/opts.cmake)\n'
    opts = 'set(DEMO_LEGACY OFF CACHE BOOL\n    "the legacy path")\n'
    up, proj, old = setup(tmp_path, "demo", cmake_recipe("demo", {"DEMO_FAST": "ON", "DEMO_LEGACY": "ON", "DEMO_HINT": "1"}),
                          {"CMakeLists.txt": cm, "cmake/opts.cmake": opts})
    same = up.commit("a source change", {"demo.c": "int main(void) { return 0; }\n"})
    [rep] = drift(proj, "demo", up, old, same)
    assert table([rep]) == [("info", "-DDEMO_HINT=1", "")]  # unchanged: nothing held, a plain variable noted
    new = up.commit("drop the legacy path, add a new one", {
        "cmake/opts.cmake": "# legacy path removed\n",
        "CMakeLists.txt": cm + 'cmake_dependent_option(DEMO_NEW "new" ON "DEMO_FAST" OFF)\n'})
    [rep] = drift(proj, "demo", up, same, new)
    assert rep.reasons() == [f"demo: -DDEMO_LEGACY=ON: the recipe sets it, but nothing at {new[:12]} declares it any more "
                             f"(cmake/opts.cmake:1 at {same[:12]})"]
    assert ("new option", "DEMO_NEW", "CMakeLists.txt:5") in table([rep])
    assert rep.how == f"**demo**: cmake -D options (3) at `{same[:12]}` → `{new[:12]}`"


def test_zig_option_renamed_is_held(tmp_path):
    up, proj, old = setup(tmp_path, "zinc", ZIG_RECIPE, {"build.zig": BUILD_ZIG})
    new = up.commit("rename shaders", {"build.zig": BUILD_ZIG.replace('"shaders"', '"spirv"')})
    [rep] = drift(proj, "zinc", up, old, new)
    assert rep.reasons() == [f"zinc: -Dshaders=true: the recipe sets it, but nothing at {new[:12]} declares it any more "
                             f"(build.zig:6 at {old[:12]})"]
    assert ("new option", "spirv", "build.zig:6") in table([rep])  # -Doptimize is std.Build's: still declared


def test_the_source_fetches_only_the_build_files_it_needs(tmp_path):
    up = Upstream(tmp_path / "up")
    commit = up.commit("tree", {"CMakeLists.txt": "option(A x)\n", "cmake/b.cmake": "", "src/big.c": "x" * 100_000,
                                "Makefile": "all:\n"})
    with flagdrift.Source(up.url, None) as src:
        tree = src.checkout(commit, tmp_path / "sparse", flagdrift.is_build_file)
        files = sorted(p.relative_to(tree.path).as_posix() for p in tree.path.rglob("*") if p.is_file())
        assert files == ["CMakeLists.txt", "Makefile", "cmake/b.cmake"]
        big = git(up.path, "rev-parse", f"{commit}:src/big.c")
        missing = git(src.scratch.dir, "rev-list", "--objects", "--missing=print", "--no-object-names", commit)
        assert f"?{big}" in missing.splitlines()  # its blob was never fetched
        full = src.checkout(commit, tmp_path / "full", None)  # make -n needs every file
        assert (full.path / "src" / "big.c").read_text() == "x" * 100_000


def test_a_recipe_that_cannot_be_compared_says_why(tmp_path):
    up, proj, old = setup(tmp_path, "demo", "schema_version: 1\nname: demo\nsource: {pin: demo}\n", {"CMakeLists.txt": ""})
    new = up.commit("two")
    [rep] = drift(proj, "demo", up, old, new)
    assert not rep.held and rep.rows[0].result == "not compared" and "schema" in rep.rows[0].detail
    (proj.root / "recipes" / "demo.yaml").write_text(cmake_recipe("demo", {"DEMO_FAST": "ON"}))
    [rep] = isolate.flag_reports(proj.root, "demo", up.url, old, "f" * 40, ["demo"])  # a commit upstream does not have
    assert not rep.held and rep.rows[0].result == "not compared" and "cannot check out the new commit" in rep.rows[0].detail
    [rep] = isolate.flag_reports(proj.root, "demo", up.url, "e" * 40, new, ["demo"])  # the old one is gone: new side only
    assert [r.result for r in rep.rows] == ["info", "info"] and "the old commit cannot be checked out" in rep.rows[-1].detail


HOSTILE_MAKEFILE = """\
IFACES := $(shell tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' _)
PROCS := $(shell ls -d /proc/[0-9]* | wc -l)
WROTE := $(shell touch $(CURDIR)/planted 2>/dev/null && echo yes || echo no)
OUT := $(shell touch {src}/planted 2>/dev/null)
MEM := $(shell python3 -c 'b = bytearray(3 << 30); print("big")' 2>/dev/null || echo bounded)
cpu:
\tcc -DIFACES=$(IFACES) -DWROTE=$(WROTE) -DMEM=$(MEM) -c -o a.o a.c
slow:
\t@echo $(shell sleep 30)
"""


@needs_make
def test_make_n_runs_in_its_sandbox_without_network_write_access_or_unbounded_memory(tmp_path, monkeypatch):
    from builders.roots import sandbox

    if sandbox.why_unavailable():
        pytest.skip(sandbox.why_unavailable())
    up = Upstream(tmp_path / "up" / "dsx")
    old = up.commit("old", {"Makefile": MAKEFILE_OLD, **SOURCES})
    proj = Project(tmp_path, branch_pin("dsx", up.url, old), recipes={"dsx": make_recipe("dsx")})
    new = up.commit("hostile", {"Makefile": HOSTILE_MAKEFILE.replace("{src}", str(tmp_path))})
    [rep] = drift(proj, "dsx", up, old, new)
    flags_seen = {r.what for r in rep.rows}
    assert {"-DIFACES=lo_", "-DWROTE=no", "-DMEM=bounded"} <= flags_seen, sorted(flags_seen)  # loopback only; tree read-only
    assert not (tmp_path / "planted").exists()
    monkeypatch.setenv("ONEBIT_PINS_MAKE_TIMEOUT", "1")
    slow = up.commit("slow", {"Makefile": HOSTILE_MAKEFILE.replace("cpu:", "cpu: slow\nnever:")})
    [rep] = drift(proj, "dsx", up, old, slow)
    assert ("hold", "make -n cpu", "") in table([rep]) and "timed out after 1 s" in rep.rows[0].detail


def test_without_the_sandbox_make_is_not_run_and_the_bump_is_held(tmp_path, monkeypatch):
    from builders.roots import sandbox

    up = Upstream(tmp_path / "up" / "dsx")
    old = up.commit("old", {"Makefile": MAKEFILE_OLD, **SOURCES})
    proj = Project(tmp_path, branch_pin("dsx", up.url, old), recipes={"dsx": make_recipe("dsx")})
    new = up.commit("docs", {"README": "x\n"})
    monkeypatch.setattr(sandbox, "why_unavailable", lambda bwrap=sandbox.BWRAP: "bubblewrap (bwrap) is not installed")
    [rep] = drift(proj, "dsx", up, old, new)
    assert rep.reasons() == ["dsx: make cpu: make -n not run: this host cannot make the sandbox "
                             "(bubblewrap (bwrap) is not installed)"]


def test_build_files_are_never_read_through_a_link_out_of_the_tree(tmp_path):
    outside = tmp_path / "outside.cmake"
    outside.write_text('option(FROM_OUTSIDE "x" ON)\n')
    cm = 'cmake_minimum_required(VERSION 3.16)\nproject(demo C)\noption(DEMO_FAST "fast" ON)\n'
    up, proj, old = setup(tmp_path, "demo", cmake_recipe("demo", {"DEMO_FAST": "ON"}),
                          {"CMakeLists.txt": cm, "cmake/in.cmake": 'option(DEMO_IN "in" ON)\n'})
    for name, target in (("s.cmake", str(outside)), ("z.cmake", "/dev/zero"), ("p.cmake", "/proc/self/environ"),
                         ("up.cmake", "../../outside.cmake"), ("ok.cmake", "in.cmake")):
        os.symlink(target, up.path / "cmake" / name)
    git(up.path, "add", "cmake")
    git(up.path, "commit", "-qm", "links")
    new = up.head()
    [rep] = drift(proj, "demo", up, old, new)
    rows = table([rep])
    assert not any("FROM_OUTSIDE" in r[1] for r in rows)
    assert not any("ok.cmake" in r[1] for r in rows)  # a link inside the tree is read like its target
    refused = sorted(r.what for r in rep.rows if r.detail == "not read")
    assert refused == [f"cmake/{n}: a link out of the tree" for n in ("p.cmake", "s.cmake", "up.cmake", "z.cmake")]


def test_build_files_are_read_with_a_size_cap(tmp_path, monkeypatch):
    from builders.pins import readtree

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.cmake").write_text("x" * 100)
    (tmp_path / "t" / "b.cmake").write_text("y" * 100)
    monkeypatch.setattr(readtree, "MAX_FILE", 150)
    refused: list[str] = []
    assert readtree.read_files(tmp_path / "t", lambda r: True, refused=refused, limit=150) == {"a.cmake": "x" * 100}
    assert refused == ["b.cmake: the build files of this tree exceed 64 MiB; not read"]
    monkeypatch.setattr(readtree, "MAX_FILE", 50)
    refused = []
    assert readtree.read_files(tmp_path / "t", lambda r: True, refused=refused) == {}
    assert refused == ["a.cmake: larger than 0 MiB", "b.cmake: larger than 0 MiB"]


# ------------------------------------------------------------------------------------------------ through the bot


@pytest.fixture
def api(monkeypatch):
    fake = FakeAPI()
    monkeypatch.setenv("ONEBIT_GITHUB_API", fake.url)
    monkeypatch.setenv("ONEBIT_HF_ENDPOINT", fake.url)
    monkeypatch.setenv("ONEBIT_BOT_TOKEN", "t0ken")
    for var in ("GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_REF_NAME", "GITHUB_EVENT_PATH", "GITHUB_STEP_SUMMARY",
                "ONEBIT_PINS_REMOTE", "ONEBIT_PINS_BASE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    yield fake
    fake.close()


@needs_make
def test_the_bot_holds_a_bump_whose_make_target_is_gone(tmp_path, api, capsys):
    up = Upstream(tmp_path / "antirez" / "dsx")
    old = up.commit("old", {"Makefile": MAKEFILE_OLD, **SOURCES})
    proj = Project(tmp_path, branch_pin("dsx", up.url, old), recipes={"dsx": make_recipe("dsx")})
    new = up.commit("rename cpu", {"Makefile": MAKEFILE_OLD.replace("cpu: prog", "native: prog")})
    before = proj.text()
    # a local bump does not move a held pin
    assert main(["--root", str(proj.root), "bump"]) == 1
    err = capsys.readouterr().err
    assert "dsx: held:" in err and "make target cpu: gone" in err and proj.text() == before
    # a PR bump opens the PR with the report, labelled held, and says so
    assert main(["--root", str(proj.root), "bump", "--open-pr"]) == 1
    [pr] = api.state.opened()
    assert pr["title"] == f"Bump dsx to {new[:12]} (held)" and api.state.labels == {1: ["held"]}
    body = pr["body"]
    assert "> **Held**: a recipe no longer matches upstream's build at the new commit:" in body
    assert f"> - dsx: make target cpu: gone at {new[:12]}" in body
    assert "### Build-flag report" in body and f"| **HOLD** | `make target cpu` | Makefile:10 at {old[:12]} |" in body
    assert body.index("### Patch report") < body.index("### Build-flag report") < body.index("### Hardware checklist")
    # the pin guard refuses the held PR until the label is gone
    git(proj.root, "fetch", "--quiet", "origin")
    git(proj.root, "checkout", "--quiet", pr["head"]["ref"])
    assert main(["--root", str(proj.root), "check", "--base", "origin/main", "--label", "held"]) == 1
    assert "carries the 'held' label" in capsys.readouterr().err
    assert main(["--root", str(proj.root), "check", "--base", "origin/main"]) == 0


@needs_make
def test_the_bot_proposes_a_matching_bump_with_its_report(tmp_path, api):
    up = Upstream(tmp_path / "antirez" / "dsx")
    old = up.commit("old", {"Makefile": MAKEFILE_OLD, **SOURCES})
    proj = Project(tmp_path, branch_pin("dsx", up.url, old), recipes={"dsx": make_recipe("dsx")})
    new = up.commit("upstream adds -fno-plt", {"Makefile": MAKEFILE_OLD.replace("WARN = -Wall", "WARN = -Wall -fno-plt")})
    assert main(["--root", str(proj.root), "bump", "--open-pr"]) == 0
    [pr] = api.state.opened()
    assert pr["title"] == f"Bump dsx to {new[:12]}" and api.state.labels == {}
    assert "**Held**" not in pr["body"]
    assert "| upstream | `-fno-plt` | Makefile:7 | new in upstream's compile lines at" in pr["body"]
    assert "| override | `-march=native` | Makefile:2 | replaced by the recipe's ARCH_FLAG=-march=x86-64-v3 |" in pr["body"]


def test_held_cmake_and_zig_files_are_parsed_never_executed(tmp_path):
    marker = tmp_path / "ran"
    cm = (f'cmake_minimum_required(VERSION 3.16)\nproject(demo C)\nexecute_process(COMMAND touch {marker})\n'
          f'file(WRITE {marker} "x")\noption(DEMO_FAST "fast" ON)\n')
    up, proj, old = setup(tmp_path, "demo", cmake_recipe("demo", {"DEMO_FAST": "ON"}), {"CMakeLists.txt": cm})
    new = up.commit("more", {"CMakeLists.txt": cm + f"execute_process(COMMAND sh -c \"touch {marker}2\")\n"})
    [rep] = drift(proj, "demo", up, old, new)
    assert not rep.held and not marker.exists() and not (tmp_path / "ran2").exists()
    zup, zproj, zold = setup(tmp_path / "z", "zinc", ZIG_RECIPE, {"build.zig": BUILD_ZIG})
    znew = zup.commit("hostile", {"build.zig": BUILD_ZIG + f'\n// @cImport touch {marker}\nconst x = @embedFile("/etc/passwd");\n'})
    drift(zproj, "zinc", zup, zold, znew)
    assert not marker.exists()
