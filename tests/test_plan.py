"""plan is a pure function: tables over (project, bundle, host facts) -> steps, commands, keys, refusals."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from builders.project import config
from builders.cli import main
from builders.errors import OnebitError
from builders.inputs.host import HostFacts, ToolFact
from builders.plan import all_tools, expand, make_plan, missing_tools
from builders.plan_types import Layout

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)
LAYOUT = Layout(root=ROOT, cache=Path("/cache"), work=Path("/work/strix"), out=Path("/out/strix"))


def facts(found: bool = True, therock: bool = False, **overrides) -> HostFacts:
    """Host facts where every tool of every bundle is found (or none is), at a version that satisfies it. A tool of a
    variant with a build root is found inside the root (its assembled state is `found`); with `therock`, every such
    tool with a variable is taken from the variable instead (the override)."""
    tools = {}
    for bundle in PROJECT.bundles:
        for t in all_tools(PROJECT, bundle):
            if (t.debs or t.wheels) and not t.env:  # a pinned input without a variable (floor.yaml's sysroot)
                tools[t.key] = ToolFact(t.key, f"/tc/{t.tool}/{t.path}", found, None, f"/tc/{t.tool}", fetchable=not found)
                continue
            if t.root and not (therock and t.env):
                tools[t.key] = ToolFact(t.key, t.in_root or f"/usr/bin/{t.tool}", found, "99.0", "/usr",
                                        fetchable=not found)
                continue
            root = f"/tc/{t.env}" if t.env else None
            path = f"{root}/{t.path}" if root else f"/usr/bin/{t.tool}"
            tools[t.key] = ToolFact(t.key, path, found, "99.0", root, override=t.env if t.root and therock else None)
    tools.update(overrides)
    return HostFacts(tools=tools, net_cut=("unshare", "--net", "--"), jobs=16, python="/py/bin/python3", home="/home/u")


def inside(argv):
    """The command a build-root step runs inside bwrap, and bwrap's --setenv pairs."""
    assert argv[0] == "bwrap"
    i = argv.index("--")
    env = {argv[j + 1]: argv[j + 2] for j in range(i) if argv[j] == "--setenv"}
    return argv[i + 1:], env


def test_plan_is_pure_and_deterministic():
    a = make_plan(PROJECT, "strix", facts(), LAYOUT).to_json()
    b = make_plan(PROJECT, "strix", facts(), LAYOUT).to_json()
    assert json.dumps(a) == json.dumps(b)


def test_strix_plan_orders_steps_and_shows_every_variant():
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)
    ids = [s.id for s in plan.steps]
    for v in ("vulkan", "hrx", "lean-vulkan", "lean-rocm", "xdna", "zinc", "cpu", "tokenizers", "laya", "serve"):
        assert ids.index(f"build:{v}") < ids.index(f"stage:{v}") < ids.index(f"package:{v}") < ids.index("bundle:metapackage")
    # vulkan and cpu build the same patched llama.cpp checkout: one fetch, one source step
    assert ids.count("fetch:llama.cpp") == 1
    assert [s for s in ids if s.startswith("source:llama.cpp@")] == ["source:llama.cpp@0c1e570+2p"]
    assert ids[-5:] == ["bundle:metapackage", "bundle:channel", "bundle:tarball", "bundle:checksums", "bundle:publish"]
    for step in plan.steps:
        for need in step.needs:
            assert ids.index(need) < ids.index(step.id)
    assert plan.refusals == [] and plan.missing == []


def cmd(plan, step_id, index=0):
    return plan.step(step_id).commands[index]


def test_cmake_commands_are_exact():
    plan = make_plan(PROJECT, "cpu", facts(), LAYOUT, build_number=42)
    src = plan.step("source:llama.cpp@0c1e570+2p").data.dir
    configure = cmd(plan, "build:cpu", 0)
    assert configure.argv[:3] == ("unshare", "--net", "--")
    argv = configure.argv[3:]
    assert argv[:7] == ("cmake", "-S", src, "-B", "/work/strix/build/cpu", "-G", "Ninja")
    assert "-DCMAKE_C_COMPILER_LAUNCHER=/usr/bin/ccache" in argv
    assert "-DLLAMA_BUILD_NUMBER=42" in argv and "-DLLAMA_BUILD_COMMIT=0c1e570" in argv
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in argv and "-DGGML_NATIVE=OFF" in argv and "-DGGML_BACKEND_DL=ON" in argv
    assert dict(configure.env)["CCACHE_BASEDIR"] == "/work/strix"
    build = cmd(plan, "build:cpu", 1)
    assert build.argv == ("unshare", "--net", "--", "cmake", "--build", "/work/strix/build/cpu", "--parallel", "16")
    install = cmd(plan, "stage:cpu", 0)
    # the install runs where the build ran: the host root, network cut, the declared environment only
    assert install.argv == ("unshare", "--net", "--", "cmake", "--install", "/work/strix/build/cpu")
    assert install.clear and configure.clear and install.inside.argv == ("cmake", "--install", "/work/strix/build/cpu")
    assert dict(install.env)["DESTDIR"] == "/work/strix/stage/.cpu.tmp"


def test_hrx_uses_the_root_rocm_and_therock_overrides_it():
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)
    argv, env = inside(cmd(plan, "build:hrx", 0).argv)
    assert "-DCMAKE_CXX_COMPILER=/usr/lib/llvm-22/bin/clang++" in argv and "-DIREE_ROCM_PATH=/usr" in argv
    assert env["CXX"] == "/usr/lib/llvm-22/bin/clang++"
    assert "_env" not in plan.step("package:hrx").data.build_string
    assert plan.step("stage:hrx").data.manifest_entry["toolchain_overrides"] is None
    tc = "/tc/ONEBIT_HRX_TOOLCHAIN"
    plan = make_plan(PROJECT, "strix", facts(therock=True), LAYOUT)
    argv = cmd(plan, "build:hrx", 0).argv
    assert argv[argv.index(tc) - 1: argv.index(tc) + 2] == ("--ro-bind", tc, tc)  # TheRock bound into the root
    argv, _ = inside(argv)
    assert f"-DCMAKE_CXX_COMPILER={tc}/lib/llvm/bin/amdclang++" in argv
    assert f"-DIREE_ROCM_PATH={tc}" in argv
    assert any(a.startswith("-DHRX_SOURCE_DIR=") and a.endswith("/third_party/hrx-system") for a in argv)
    source = [s for s in plan.steps if s.id.startswith("source:llama.cpp-1bit-hrx")][0]
    assert source.needs == ("fetch:llama.cpp-1bit-hrx", "fetch:hrx-system")


def test_lean_rocm_variant_builds_gfx1151_w4a4():
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)
    argv, env = inside(cmd(plan, "build:lean-rocm", 0).argv)
    assert {"-DGGML_HIP=ON", "-DGPU_TARGETS=gfx1151", "-DGGML_HIP_ROCMI4_W4A4=ON"} <= set(argv)
    assert env["ROCM_PATH"] == "/usr" and "-DCMAKE_HIP_COMPILER=/usr/lib/llvm-22/bin/clang++" in argv
    assert plan.step("stage:lean-rocm").data.manifest_entry["devices"] == ["ROCm0"]
    assert "-DGGML_VULKAN=ON" in cmd(plan, "build:lean-vulkan", 0).argv


def test_zig_and_cargo_kinds():
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)
    zig = cmd(plan, "build:zinc", 0)
    assert zig.argv[3:7] == ("zig", "build", "-Doptimize=ReleaseFast", "-Dshaders=true") and zig.cwd.startswith("/work/strix/src/")
    cargo = cmd(plan, "build:tokenizers", 0)
    assert cargo.argv[0] == "bwrap"  # rustc/cargo 1.98.1 of the build root (recipes/tokenizers.yaml)
    assert cargo.inside.argv[:5] == ("cargo", "rustc", "--release", "--locked", "--offline")


@pytest.mark.parametrize(
    "change, same",
    [
        (lambda f: replace(f, jobs=2), True),  # parallelism does not change the output
        (lambda f: replace(f, net_cut=()), True),
        (lambda f: replace(f, tools={**f.tools, "cmake": replace(f.tools["cmake"], version="3.31.0")}), False),
    ],
)
def test_build_key_depends_on_what_changes_the_output(change, same):
    base = make_plan(PROJECT, "cpu", facts(), LAYOUT)
    other = make_plan(PROJECT, "cpu", change(facts()), LAYOUT)
    assert (base.step("build:cpu").key == other.step("build:cpu").key) is same


def test_build_number_changes_package_but_not_fetch():
    a = make_plan(PROJECT, "cpu", facts(), LAYOUT, build_number=1)
    b = make_plan(PROJECT, "cpu", facts(), LAYOUT, build_number=2)
    assert a.step("fetch:llama.cpp").key == b.step("fetch:llama.cpp").key
    assert a.step("package:cpu").key != b.step("package:cpu").key
    assert a.step("package:cpu").data.build_string == "default_h0c1e570_1"


def test_missing_is_what_the_host_must_bring_and_the_rest_is_fetched_once_per_input():
    plan = make_plan(PROJECT, "strix", facts(found=False), LAYOUT)
    missing, fetched = "\n".join(plan.missing), plan.to_fetch
    # the host's own tools are missing, one line each; nothing the build fetches itself is
    assert "cmake >=3.21 for vulkan: 'cmake' is not on PATH; install it" in missing
    assert "build root" not in missing and "fetch" not in missing and "ccache" not in missing  # optional
    # one line per build root and per pinned input, with the variants that use it and the variables that replace it
    [root] = [f for f in fetched if f.startswith("build root strix-sid: ")]
    assert "Debian package(s), 1278 MiB (for hrx, lean-rocm, xdna, ds4-rocm, tokenizers;" in root
    for var in ("ONEBIT_HRX_TOOLCHAIN", "ONEBIT_LEAN_ROCM_TOOLCHAIN", "XILINX_XRT", "ONEBIT_KERNEL_BUILD",
                "ONEBIT_DS4_ROCM_TOOLCHAIN"):
        assert var in root, var
    assert "zig: ziglang==0.15.2 (wheel) (for zinc; ONEBIT_ZIG would replace it)" in fetched
    [sdk] = [f for f in fetched if f.startswith("vulkan-sdk: ")]
    assert sdk.startswith("vulkan-sdk: 8 Debian package(s)") and "VULKAN_SDK would replace it" in sdk
    [sysroot] = [f for f in fetched if f.startswith("sysroot: ")]  # floor.yaml's: every cmake, make and cargo variant
    assert sysroot.startswith("sysroot: 9 Debian package(s), ")
    assert "(for vulkan, hrx, lean-vulkan, lean-rocm, ds4-cpu, ds4-rocm, cpu, tokenizers)" in sysroot
    assert "zinc" not in sysroot and "xdna" not in sysroot  # zig takes its own glibc; a kernel module is the kernel's
    assert len(fetched) == len(set(fetched)) == 4


def test_too_old_tool_is_reported():
    variant = PROJECT.recipes["zinc"].variant("default")
    f = facts(**{"zig@ONEBIT_ZIG": ToolFact("zig@ONEBIT_ZIG", "/opt/zig/zig", True, "0.15.1", "/opt/zig")})
    assert missing_tools(variant, f.tools) == ["zig >=0.15.2 for zinc: found 0.15.1 at /opt/zig/zig; need >=0.15.2 "
                                               "(set ONEBIT_ZIG)"]


def test_unresolved_pin_refuses_its_recipe(tmp_path):
    project = config.load_project(ROOT)
    pin = project.pins["llama.cpp"]
    project.pins["llama.cpp"] = replace(pin, commit=None, unresolved="no commit known")
    plan = make_plan(project, "nvidia", facts(), LAYOUT)
    assert [r.split(":")[0] for r in plan.refusals] == ["cuda", "cpu"]
    assert "pin 'llama.cpp' is unresolved" in plan.refusals[0] and "no commit known" in plan.refusals[0]
    assert [s.id for s in plan.steps if s.action == "build"] == ["build:serve"]


def test_unknown_placeholder_names_the_recipe():
    with pytest.raises(OnebitError) as err:
        expand("{nope}", {"source": "/s"}, "recipes/x.yaml")
    assert "recipes/x.yaml: unknown placeholder {nope}" in str(err.value) and "{source}" in str(err.value)


@pytest.fixture
def host_with(monkeypatch):
    """`1bit-build` on a host whose tools are all found (True) or all missing (False)."""
    from builders import cli

    def use(found: bool):
        monkeypatch.setattr(cli.host, "gather", lambda *a, **kw: facts(found=found))
    return use


def test_cli_plan_strix_is_a_short_table(capsys, host_with):
    host_with(True)
    assert main(["--root", str(ROOT), "--cache", "/nonexistent/c", "plan", "strix", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for v in ("build:vulkan", "build:hrx", "build:lean-vulkan", "build:lean-rocm", "build:xdna", "build:zinc", "build:cpu"):
        assert v in out
    lines = out.splitlines()
    header = lines.index(next(ln for ln in lines if ln.split()[:2] == ["#", "step"]))
    assert lines[header].split() == ["#", "step", "what", "key", "cached"]
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)
    rows = lines[header + 1:]
    assert [r.split()[1] for r in rows] == [s.id for s in plan.steps]
    assert all(r.split()[-1] == "no" and len(r.split()[-2]) == 12 for r in rows)  # an empty cache: nothing cached
    assert "export " not in out and "FLAGS" not in out and len(out) < 12_000  # commands and env only with -v / --json


def test_cli_plan_lists_missing_toolchains_first_and_exits_non_zero(capsys, host_with):
    host_with(False)
    assert main(["--root", str(ROOT), "--cache", "/nonexistent/c", "plan", "strix"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[1] == "missing on this host (a build stops before doing anything):"
    fetch = lines.index("to fetch (the build does it first; `1bit-build fetch strix` does only that):")
    assert all(ln.startswith("  - ") for ln in lines[2:fetch]) and "cmake >=3.21 for vulkan" in "\n".join(lines[2:fetch])
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"error: this host cannot build bundle 'strix': {fetch - 2} toolchain(s) missing (listed first above); "
        "build a subset with `1bit-build build strix --only RECIPE`"]


def test_cli_build_dry_run_exits_non_zero_when_the_host_cannot_build(tmp_path, capsys, host_with):
    host_with(False)
    dirs = ["--cache", str(tmp_path / "c"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]
    assert main(["--root", str(ROOT), *dirs, "build", "strix", "--dry-run"]) == 1
    assert capsys.readouterr().err.count("error: this host cannot build bundle 'strix'") == 1
    assert not any((tmp_path / d).exists() for d in ("c", "w", "o"))
    host_with(True)
    assert main(["--root", str(ROOT), *dirs, "build", "strix", "--dry-run", "--only", "cpu"]) == 0


def test_cli_only_an_unknown_name_is_an_error_naming_the_known_ones(capsys, host_with):
    host_with(True)
    assert main(["--root", str(ROOT), "plan", "strix", "--only", "nosuch"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--only nosuch: bundle 'strix' has no recipe or variant 'nosuch'" in err
    assert "it has: cpu, ds4, ds4-cpu, ds4-rocm, hrx, laya, lean, lean-rocm, lean-vulkan, serve, tokenizers, vulkan" in err


@pytest.mark.parametrize("env, shown, caller, lines, after", [
    ({"A": "1"}, {"A": "1"}, {"A": "1"}, [], {"A": "1"}),  # the caller's value: nothing to say
    ({"A": "2 3"}, {"A": "1"}, {"A": "1"}, ["export A='2 3'"], {"A": "2 3"}),
    ({}, {"A": "1", "D": "/x"}, {"A": "1"}, ["unset D"], {"A": "1"}),  # the previous command's DESTDIR goes
    ({}, {"A": "2"}, {"A": "1"}, ["export A=1"], {"A": "1"}),  # back to the caller's value
])
def test_env_lines_table(env, shown, caller, lines, after):
    from builders.cli import env_lines

    assert env_lines(env, shown, caller) == lines and shown == after


def test_env_lines_unset_what_the_command_removes():
    from builders.cli import env_lines

    shown = {"CFLAGS": "-O0", "PATH": "/bin"}
    assert env_lines({"X": "1"}, shown, {"CFLAGS": "-O0", "PATH": "/bin"}, ("CFLAGS", "LDFLAGS")) == ["unset CFLAGS", "export X=1"]
    assert shown == {"PATH": "/bin", "X": "1"}


def test_verbose_steps_paste_into_a_shell(tmp_path):
    """--verbose prints only what a step adds to the caller's environment, as lines a shell runs to the executor's
    exact environment: run them in bash with `env` in place of each command (a host command's cleared environment
    is on its own `env -i` line)."""
    import shlex
    import subprocess

    from builders.cli import format_plan

    caller = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CFLAGS": "-O0", "CCACHE_NOHASHDIR": "true"}
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)  # cmake (CFLAGS added) and make (CFLAGS removed)
    lines = format_plan(plan, verbose=True, caller_env=caller)
    assert "     export CCACHE_NOHASHDIR=true" not in lines  # the caller has it already
    for sid in ("build:cpu", "stage:cpu", "build:ds4-cpu"):
        step = plan.step(sid)
        start = lines.index(f"     # {step.title}")
        block = [ln.strip() for ln in lines[start + 1:start + 1 + 40] if ln.startswith("     ")]
        script, n = [], 0
        for ln in block:
            if ln.startswith(("export ", "unset ", "cd ")):
                script.append(ln if not ln.startswith("cd ") else "true")
            elif n < len(step.commands):
                argv = shlex.join(step.commands[n].argv)
                lead = ln[: -len(argv)] if ln.startswith("env -i ") and ln.endswith(argv) else ""
                script.append(f"{lead}env > {tmp_path}/env{n}")
                n += 1
        subprocess.run(["bash", "-c", "\n".join(script)], env=caller, check=True)
        for i, cmd in enumerate(step.commands):
            got = dict(ln.split("=", 1) for ln in (tmp_path / f"env{i}").read_text().splitlines() if "=" in ln)
            got = {k: v for k, v in got.items() if k not in ("PWD", "SHLVL", "_", "OLDPWD")}
            assert got == cmd.environ(caller), sid


def test_the_executor_runs_every_action_the_planners_make():
    from builders.execute import Executor
    from builders.errors import BuildError
    from builders.plan_types import Step
    from builders.steps import STEPS

    made = {s.action for b in PROJECT.bundles for s in make_plan(PROJECT, b, facts(), LAYOUT).steps}
    assert made <= set(STEPS) and all(callable(k.run) for k in STEPS.values())
    plan = make_plan(PROJECT, "cpu", facts(), LAYOUT)
    plan.steps = [Step("x:1", "teleport", "an action nobody runs", "k")]
    with pytest.raises(BuildError) as err:
        Executor(plan, PROJECT).run()
    assert "no executor for step action(s) teleport" in str(err.value)


def test_cli_plan_strix_on_a_fresh_cache_lists_what_the_build_fetches_and_exits_0(tmp_path, capsys, monkeypatch):
    """Pure: `plan strix` on a fresh cache names what a build fetches first (the build root and the pinned inputs, one
    line each, with the variables that would replace them), names the bundle in its hints, exits 0 (this host can
    build it: the build fetches those first) and writes nothing; the build's refusal of a root that lacks a tool is
    tested on the small real root in tests/test_roots.py."""
    for var in ("ONEBIT_HRX_TOOLCHAIN", "ONEBIT_LEAN_ROCM_TOOLCHAIN", "XILINX_XRT", "ONEBIT_KERNEL_BUILD", "ONEBIT_ZIG",
                "VULKAN_SDK", "ONEBIT_DS4_ROCM_TOOLCHAIN"):
        monkeypatch.delenv(var, raising=False)
    code = main(["--root", str(ROOT), "--cache", str(tmp_path / "c"), "--work", str(tmp_path / "w"), "--out",
                 str(tmp_path / "o"), "plan", "strix"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 0, text
    assert "to fetch (the build does it first; `1bit-build fetch strix` does only that):" in text
    assert "BUNDLE" not in text and "missing" not in text
    for needle in ("ONEBIT_HRX_TOOLCHAIN", "ONEBIT_LEAN_ROCM_TOOLCHAIN", "zig: ziglang==0.15.2", "build root strix-sid: ",
                   "ONEBIT_DS4_ROCM_TOOLCHAIN", "ONEBIT_KERNEL_BUILD"):
        assert needle in text, needle
    head = text.split("  #  step")[0]  # the root is named once before the step table, not once per tool
    assert head.count("strix-sid") == 1 and "is not assembled" not in text
    assert not any((tmp_path / d).exists() for d in ("c", "w", "o"))


def test_plan_json(capsys, host_with):
    host_with(True)  # the exit status says whether this host can build it: here it can
    assert main(["--root", str(ROOT), "plan", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bundle"] == "cpu" and doc["steps"][0]["id"] == "fetch:llama.cpp"
    assert all(len(s["key"]) == 64 for s in doc["steps"])


def test_the_walk_of_a_bundle_name_crosses_eight_modules_without_going_back():
    """Following a bundle name through make_plan takes at most 8 modules: plan.py (the planners' composition),
    config (the bundle's variants), host (is a tool new enough), the build kinds, the step kinds' planners (one module
    per kind, each folder counted once), root (where a variant runs) with sandbox (the bwrap command line of a rooted
    variant) and sysroot (the flags the floor's sysroot gives each compiler); plan_types holds the data the steps are
    made of. The floor's and a root pin's facts (key, glibc, host-library items, content address, size) are worked out
    once when the project is read, not again per variant. No module calls back into one that called it.
    Measured from the functions that run, not from the imports."""
    import sys

    calls: set[tuple[str, str]] = set()

    def module(frame) -> str | None:
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(ROOT / "builders"):
            return None
        m = path.relative_to(ROOT).with_suffix("").as_posix()
        return m.rsplit("/", 1)[0] if m.startswith(("builders/kinds/", "builders/steps/")) else m

    def profile(frame, event, arg):
        if event == "call" and (callee := module(frame)):
            calls.add((module(frame.f_back) if frame.f_back else None, callee))

    sys.setprofile(profile)
    try:
        make_plan(PROJECT, "strix", facts(), LAYOUT)
    finally:
        sys.setprofile(None)
    modules = {callee for _, callee in calls} - {"builders/plan_types"}
    assert modules == {"builders/plan", "builders/project/config", "builders/inputs/host", "builders/kinds",
                       "builders/steps", "builders/roots/root", "builders/roots/sandbox", "builders/roots/sysroot"}, \
        sorted(modules)
    between = {(a, b) for a, b in calls if a and a != b}
    assert not {(a, b) for a, b in between if (b, a) in between}, sorted(between)  # no back and forth


def test_a_hint_from_deep_in_a_step_names_the_real_bundle(tmp_path, capsys):
    """An offline build with an empty cache stops at its first fetch; the hint names the bundle being built, never a
    placeholder."""
    dirs = ["--cache", str(tmp_path / "c"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]
    assert main(["--root", str(ROOT), *dirs, "build", "cpu", "--offline", "--only", "serve"]) == 2
    err = capsys.readouterr().err
    assert "`1bit-build fetch cpu`" in err and "BUNDLE" not in err, err


def test_every_compiled_variant_builds_against_the_floors_sysroot():
    """The sysroot enters through the variant's Root (builders/roots/root.py) and the build kinds (builders/roots/sysroot.py):
    a CMake build reads a toolchain file the plan writes, a make build's compiler variables carry the flags, a script
    that runs CMake names the file, zig takes the floor's glibc; a build root links the user's ROCm by SONAME only."""
    plan = make_plan(PROJECT, "strix", facts(), LAYOUT)
    sysroot_dir = plan.step("build:cpu").commands[0].inside.files[0][1].split('set(CMAKE_SYSROOT "')[1].split('"')[0]
    assert sysroot_dir.endswith("/debian")
    for variant in ("cpu", "vulkan", "lean-vulkan"):  # cmake on the host: gcc and g++ against gcc 11's headers
        configure = plan.step(f"build:{variant}").commands[0]
        (path, text), = configure.inside.files
        assert f"-DCMAKE_TOOLCHAIN_FILE={path}" in configure.argv and path.endswith("/onebit-sysroot.cmake")
        assert "-nostdinc++" in text and "c++/11" in text and "CMAKE_EXE_LINKER_FLAGS_INIT" in text
    (path, text), = plan.step("build:lean-rocm").commands[0].inside.files  # in the root: clang++ for C++ and HIP
    assert "set(CMAKE_HIP_FLAGS_INIT" in text and "--gcc-toolchain=" in text and "-Wl,--allow-shlib-undefined" in text
    hrx = plan.step("build:hrx").commands[0].inside  # a script running CMake names the file
    assert f"-DCMAKE_TOOLCHAIN_FILE={hrx.files[0][0]}" in hrx.argv and "--gcc-toolchain=" in hrx.files[0][1]
    make = plan.step("build:ds4-rocm").commands[2].inside  # make in the root: CC, and hipcc linking the user's ROCm
    cc = next(a for a in make.argv if a.startswith("CC="))
    gpu = next(a for a in make.argv if a.startswith("GPU_CC="))
    assert f"--sysroot={sysroot_dir}" in cc and "--allow-shlib-undefined" not in cc
    assert f"--gcc-toolchain={sysroot_dir}/usr" in gpu and "-Wl,-rpath-link,/usr/lib/x86_64-linux-gnu" in gpu
    links = dict(make.links)
    host_libs = "/work/strix/build/ds4-rocm/onebit-host-libs"
    assert f"-L{host_libs}" in gpu and links[f"{host_libs}/libhipblas.so"] == "/usr/lib/x86_64-linux-gnu/libhipblas.so.3"
    assert "-L/usr/lib/x86_64-linux-gnu" not in gpu  # the root's libc.so would win over the sysroot's
    assert "-Dtarget=x86_64-linux-gnu.2.34" in plan.step("build:zinc").commands[0].argv
    assert not any(t.tool == "sysroot" for t in PROJECT.recipes["xdna"].variant("default").toolchain)
    # the sysroot is part of each build's key: a new sysroot (or floor) rebuilds
    assert plan.step("build:cpu").key != make_plan(PROJECT, "strix", facts(**{
        "sysroot": ToolFact("sysroot", "/tc/elsewhere/x", True, None, "/tc/elsewhere")}), LAYOUT).step("build:cpu").key
