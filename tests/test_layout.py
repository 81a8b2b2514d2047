"""One prefix, many backends: per-variant subtrees, the clobber check, a step cache that cannot publish stale bytes,
and packages that declare their run requirements. Plan-level checks for every bundle; real builds on the mini project."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from builders.project import config
from builders.inputs import host
from builders.errors import OnebitError, StageError
from builders.execute import Executor
from builders.ship.install import install_bundle
from builders.plan import all_tools, build_string, claims, clobbers, make_plan
from builders.plan_types import Layout
from mini_project import CMAKELISTS, PATCH, git, make_mini
from test_plan import facts

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)


# ---- pure: the clobber check --------------------------------------------------------------------------------------
@pytest.mark.parametrize("owners, expected", [
    ({"a": ["libexec/onebit/a/"], "b": ["libexec/onebit/b/"]}, []),
    ({"a": ["bin/x"], "b": ["bin/y"]}, []),
    ({"a": ["bin/x"], "b": ["bin/x"]}, ["a and b would both install bin/x"]),
    ({"a": ["libexec/onebit/a/"], "b": ["libexec/onebit/a/bin/llama-server"]},
     ["a and b would both install libexec/onebit/a/"]),
    ({"a": ["lib/"], "b": ["lib/libfoo.so"], "c": ["share/x"]}, ["a and b would both install lib/"]),
    ({"a": ["bin/x", "bin/x"]}, []),  # one package listing a path twice is not a clobber
])
def test_clobbers_table(owners, expected):
    assert clobbers(owners) == expected


@pytest.mark.parametrize("bundle", sorted(PROJECT.bundles))
def test_every_bundle_gives_each_backend_its_own_binary_inside_its_own_package(bundle):
    plan = make_plan(PROJECT, bundle, facts(), Layout(ROOT, Path("/c"), Path(f"/w/{bundle}"), Path(f"/o/{bundle}")))
    variants = {v.package_name: v for v in PROJECT.variants(PROJECT.bundle(bundle))}
    assert clobbers({name: claims(v) for name, v in variants.items()}) == []
    stages = [s.data for s in plan.steps if s.action == "stage" and s.data.manifest_entry]
    assert stages, f"{bundle} has no backend"
    binaries = [e.manifest_entry["binaries"]["llama-server"] for e in stages if "llama-server" in e.manifest_entry["binaries"]]
    assert len(binaries) == len(set(binaries)), f"two backends of {bundle} share a llama-server: {binaries}"
    for data in stages:
        entry = data.manifest_entry
        assert entry["package"] == data.package
        for rel in entry["binaries"].values():
            if data.root:  # the binary lies inside the package's own subtree
                assert rel.startswith(data.root + "/") and entry["root"] == data.root
            assert not rel.startswith("bin/") or data.root == "", rel  # only bin/1bit (and links) on PATH
    # links outside a variant's own subtree are the per-backend names on PATH
    on_path = sorted(link for v in variants.values() for link in v.links if not (v.root and link.startswith(v.root + "/")))
    on_path += ["bin/1bit"]
    assert all(p.startswith("bin/") for p in on_path), on_path
    assert len(on_path) == len(set(on_path))


def test_llama_cpp_backends_each_have_a_subtree_and_a_link():
    plan = make_plan(PROJECT, "strix", facts(), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")))
    roots = {s.data.variant: s.data.root for s in plan.steps if s.action == "stage"}
    for v in ("vulkan", "hrx", "lean-vulkan", "lean-rocm", "cpu"):
        assert roots[v] == f"libexec/onebit/{v}"
        build = plan.step(f"build:{v}").commands[0].argv
        if v != "hrx":  # hrx is the fork's three-pass script build, installed into its own tree and copied in
            assert f"-DCMAKE_INSTALL_PREFIX=/opt/onebit/libexec/onebit/{v}" in build
        assert plan.step(f"stage:{v}").data.links == {f"bin/llama-server-{v}": "bin/llama-server"}


def test_two_packages_claiming_one_path_stop_the_plan(tmp_path):
    mini = make_mini(tmp_path / "m")
    data = mini.recipe()
    data["name"] = "hello2"
    (mini.root / "recipes" / "hello2.yaml").write_text(yaml.safe_dump({**data, "provides": {"backend": "vulkan", "devices": ["Vulkan0"]}}))
    (mini.root / "recipes" / "patches" / "hello2").symlink_to("hello")
    bundle = yaml.safe_load((mini.root / "bundles" / "mini.yaml").read_text())
    bundle["components"].append({"recipe": "hello2"})
    (mini.root / "bundles" / "mini.yaml").write_text(yaml.safe_dump(bundle))
    project = config.load_project(mini.root)
    with pytest.raises(OnebitError) as err:
        make_plan(project, "mini", host.gather(all_tools(project, "mini")), Layout(mini.root, tmp_path / "c", tmp_path / "w", tmp_path / "o"))
    assert "onebit-hello and onebit-hello2 would both install bin/hello" in str(err.value)


def test_override_goes_into_build_string_and_manifest():
    lay = Layout(ROOT, Path("/c"), Path("/w"), Path("/o"))
    plan = make_plan(PROJECT, "nvidia", facts(), lay, overrides={"cuda": {"CMAKE_CUDA_ARCHITECTURES": "90-real"}})
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in plan.step("build:cuda").commands[0].argv
    bs = plan.step("package:cuda").data.build_string
    assert bs.startswith("default_h0c1e570_set") and bs.endswith("_0") and bs != "default_h0c1e570_0"
    assert plan.step("stage:cuda").data.manifest_entry["overrides"] == {"CMAKE_CUDA_ARCHITECTURES": "90-real"}
    assert plan.step("package:cpu").data.build_string == "default_h0c1e570_0"  # cpu is untouched
    release = make_plan(PROJECT, "nvidia", facts(), lay)
    assert release.step("build:cuda").key != plan.step("build:cuda").key
    with pytest.raises(OnebitError, match="has no build option 'NOPE'"):
        make_plan(PROJECT, "nvidia", facts(), lay, overrides={"cuda": {"NOPE": "1"}})
    with pytest.raises(OnebitError, match="no recipe or variant 'vulkan'"):
        make_plan(PROJECT, "nvidia", facts(), lay, overrides={"vulkan": {"GGML_VULKAN": "OFF"}})


def test_run_requirements_are_declared():
    plan = make_plan(PROJECT, "nvidia", facts(), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")))
    assert plan.step("package:cuda").data.depends == ("__cuda >=99",)  # facts() finds every tool at 99.0
    assert plan.step("package:serve").data.depends == ()  # runs on the host's CPython: no __python (test_conda_clients)
    assert plan.step("package:cpu").data.glibc_floor == "2.34"  # floor.yaml's policy, never the build host's


def test_build_string_table():
    v = PROJECT.recipes["lean"].variant("rocm")
    assert build_string(v, "b44bf74", 3, {}) == "rocm_hb44bf74_3"
    assert build_string(v, "b44bf74", 3, {"GPU_TARGETS": "gfx1100"}).startswith("rocm_hb44bf74_set")


# ---- real builds on the mini project ------------------------------------------------------------------------------
TAGGED_CMAKE = CMAKELISTS.replace("add_library(greet SHARED greet.c)", textwrap.dedent("""\
    set(GREET_TAG "none" CACHE STRING "which build this library is")
    add_library(greet SHARED greet.c tag.c)
    target_compile_definitions(greet PRIVATE GREET_TAG="${GREET_TAG}")"""))
TAG_C = 'const char *greet_tag(void) { return GREET_TAG; }\n'
TAGGED_MAIN = """\
#include <stdio.h>
#include <string.h>
void greet(void);
const char *greet_tag(void);
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) { printf("hello version (%s)\\n", HELLO_COMMIT); return 0; }
    if (argc > 1 && strcmp(argv[1], "--tag") == 0) { printf("%s\\n", greet_tag()); return 0; }
    greet();
    return 0;
}
"""


def tagged_mini(base: Path, variants: dict | None = None):
    """The mini project re-pinned to an upstream commit whose library carries a build option (GREET_TAG)."""
    mini = make_mini(base)
    (mini.upstream / "tag.c").write_text(TAG_C)
    git(mini.upstream, "add", "tag.c")
    (mini.upstream / "main.c").write_text(TAGGED_MAIN)
    commit = mini.commit_upstream("CMakeLists.txt", TAGGED_CMAKE, "greet: a tag")
    mini.set_pin(commit=commit, tag=None)
    data = mini.pins()
    del data["pins"]["hello"]["tag"]
    mini.write_pins(data)
    mini.commit = commit
    recipe = mini.recipe()
    recipe["build"]["options"]["GREET_TAG"] = "A"
    if variants:
        recipe["stage"]["root"] = "libexec/onebit/{variant}"
        recipe["stage"]["links"] = {"bin/hello-{variant}": "bin/hello"}
        recipe["variants"] = variants
    mini.write_recipe(recipe)
    return mini


def run_build(mini, base: Path):
    project = config.load_project(mini.root)
    layout = Layout(root=mini.root, cache=base / "cache", work=base / "work", out=base / "out")
    plan = make_plan(project, "mini", host.gather(all_tools(project, "mini")), layout)
    return plan, Executor(plan, project).run()


def installed(mini, base: Path, name: str) -> Path:
    prefix = base / name
    install_bundle(base / "out" / "channel", prefix, "mini", cache_dir=base / "pkgs")
    return prefix


def out(argv, **kw) -> str:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=True, **kw).stdout


@pytest.mark.e2e
def test_two_variants_of_one_program_in_one_prefix_each_load_their_own_library(tmp_path):
    variants = {
        "a": {"build": {"options": {"GREET_TAG": "variant-a"}}, "provides": {"backend": "cpu", "devices": ["CPU"]}},
        "b": {"build": {"options": {"GREET_TAG": "variant-b"}}, "provides": {"backend": "vulkan", "devices": ["Vulkan0"]}},
    }
    mini = tagged_mini(tmp_path / "m", variants)
    plan, report = run_build(mini, tmp_path)
    assert sorted(s for s in report.ran if s.startswith("build:")) == ["build:hello-a", "build:hello-b"]
    prefix = installed(mini, tmp_path, "prefix")
    manifest = json.loads((prefix / "share/onebit/manifest.json").read_text())
    for v, backend in (("a", "cpu"), ("b", "vulkan")):
        entry = manifest["backends"][backend]
        assert entry["root"] == f"libexec/onebit/hello-{v}" and entry["binaries"] == {"hello": f"libexec/onebit/hello-{v}/bin/hello"}
        exe = prefix / entry["binaries"]["hello"]
        assert out([exe, "--tag"]) == f"variant-{v}\n"
        assert out([prefix / "bin" / f"hello-hello-{v}", "--tag"]) == f"variant-{v}\n"  # the link runs the same build
        env = {**os.environ, "LD_DEBUG": "libs"}
        env.pop("LD_LIBRARY_PATH", None)
        trace = subprocess.run([exe], capture_output=True, text=True, env=env).stderr
        loaded = [line.split("calling init: ")[1] for line in trace.splitlines() if "calling init:" in line and "libgreet" in line]
        assert loaded == [str(prefix / f"libexec/onebit/hello-{v}/bin/../lib/libgreet.so")], trace[-2000:]
    assert not (prefix / "lib").exists() and sorted(p.name for p in (prefix / "bin").iterdir()) == ["hello-hello-a", "hello-hello-b"]


def _published_tag(base: Path, name: str, mini) -> str:
    prefix = installed(mini, base, name)
    return out([prefix / "bin" / "hello", "--tag"]) + out([prefix / "bin" / "hello"])


@pytest.mark.e2e
def test_a_b_a_over_an_option_publishes_the_right_bytes_each_time(tmp_path):
    mini = tagged_mini(tmp_path / "m")
    seen, builds = [], []
    for i, tag in enumerate(["A", "B", "A"]):
        recipe = mini.recipe()
        recipe["build"]["options"]["GREET_TAG"] = tag
        mini.write_recipe(recipe)
        _, report = run_build(mini, tmp_path)
        builds.append([s for s in report.ran if s.startswith("build:")])
        seen.append(_published_tag(tmp_path, f"p{i}", mini))
    assert seen == ["A\nhello from onebit\n", "B\nhello from onebit\n", "A\nhello from onebit\n"]
    assert builds == [["build:hello"]] * 3  # the third run rebuilt: the build dir held B
    _, again = run_build(mini, tmp_path)
    assert again.ran == []  # and with nothing changed, nothing runs


@pytest.mark.e2e
def test_a_b_a_over_a_patch_publishes_the_right_bytes_each_time(tmp_path):
    mini = tagged_mini(tmp_path / "m")
    patch_file = mini.root / "recipes/patches/hello/0001-greet-say-who-we-are.patch"
    seen = []
    for i, words in enumerate(["from onebit", "from onebit B", "from onebit"]):
        patch_file.write_text(PATCH.replace('printf("hello from onebit\\n")', f'printf("hello {words}\\n")'))
        recipe = mini.recipe()
        recipe["tests"][1]["expect"] = f"hello {words}"
        mini.write_recipe(recipe)
        run_build(mini, tmp_path)
        seen.append(_published_tag(tmp_path, f"p{i}", mini))
    assert seen == ["A\nhello from onebit\n", "A\nhello from onebit B\n", "A\nhello from onebit\n"]


@pytest.mark.e2e
def test_packages_declare_glibc_and_an_old_host_is_refused_by_the_solver(tmp_path, monkeypatch):
    mini = make_mini(tmp_path / "m")
    run_build(mini, tmp_path)
    repodata = json.loads((tmp_path / "out/channel/linux-64/repodata.json").read_text())
    hello = next(p for p in repodata["packages.conda"].values() if p["name"] == "onebit-hello")
    glibc = [d for d in hello["depends"] if d.startswith("__glibc")]
    assert len(glibc) == 1 and glibc[0].startswith("__glibc >=2.")
    monkeypatch.setenv("CONDA_OVERRIDE_GLIBC", "2.1")
    with pytest.raises(OnebitError) as err:
        install_bundle(tmp_path / "out/channel", tmp_path / "old", "mini", cache_dir=tmp_path / "pkgs")
    assert "__glibc" in str(err.value) and not (tmp_path / "old" / "bin").exists()


def test_a_file_installed_twice_is_a_bundle_error(tmp_path):
    from builders.execute import Executor as E
    from builders.plan_types import Plan, Step
    from builders.steps.bundle import check_clobbers
    from builders.steps.package import PackageData

    trees = {}
    for name in ("onebit-a", "onebit-b"):
        prefix = tmp_path / name / "opt/onebit"
        (prefix / "lib").mkdir(parents=True)
        (prefix / "lib" / "libggml.so").write_text(name)
        trees[name] = prefix
    steps = [Step(f"package:{n}", "package", n, n, data=PackageData(n, "1", "x", 0, "MIT", "s", None, str(p), str(tmp_path), (), False))
             for n, p in trees.items()]
    plan = Plan("b", "1", 0, "linux-64", Layout(tmp_path, tmp_path, tmp_path, tmp_path), steps)
    with pytest.raises(StageError, match="onebit-a and onebit-b would both install lib/libggml.so"):
        check_clobbers(E(plan, None).context())


def test_a_host_that_cannot_cut_the_network_is_recorded():
    from dataclasses import replace as dc_replace

    lay = Layout(ROOT, Path("/c"), Path("/w"), Path("/o"))
    cut = make_plan(PROJECT, "cpu", facts(), lay)
    open_net = make_plan(PROJECT, "cpu", dc_replace(facts(), net_cut=()), lay)
    assert cut.step("build:cpu").data.network_isolated and cut.step("stage:cpu").data.manifest_entry["build_network"] is None
    assert not open_net.step("build:cpu").data.network_isolated
    assert open_net.step("stage:cpu").data.manifest_entry["build_network"] == "not isolated"


@pytest.mark.e2e
def test_a_build_shows_plain_progress_lines_when_not_on_a_terminal(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from builders import execute

    monkeypatch.setattr(execute, "PLAIN_PROGRESS_EVERY", 0.0)
    mini = make_mini(tmp_path / "m")
    project = config.load_project(mini.root)
    layout = Layout(root=mini.root, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")
    plan = make_plan(project, "mini", host.gather(all_tools(project, "mini")), layout)
    buf = io.StringIO()
    Executor(plan, project, console=Console(file=buf, force_terminal=False, width=200)).run()
    lines = [line for line in buf.getvalue().splitlines() if line.startswith("... build:hello [")]
    assert lines and all(line.split("]")[0].split("[")[1].count("/") == 1 for line in lines), buf.getvalue()[-2000:]


@pytest.mark.parametrize("output, devices", [
    ("Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (23936 MiB, 23936 MiB free)\n", ["Vulkan0"]),
    ("ggml_cuda_init: found 1 CUDA devices:\nAvailable devices:\n  CUDA0: NVIDIA H200 (143156 MiB, 142523 MiB free)\n",
     ["CUDA0"]),
    ("Available devices:\n  HRX0: gfx1151\n  Vulkan0: Radeon 8060S Graphics (RADV GFX1151)\n", ["HRX0", "Vulkan0"]),
    ("Available devices:\n", []),
    ("load_backend: loaded CPU backend from /x/libggml-cpu.so\nAvailable devices:\n", []),
])
def test_list_devices_table(output, devices):
    from builders.ship.stage import parse_list_devices

    assert parse_list_devices(output) == devices


def test_a_recipe_test_that_hangs_is_one_clear_error(tmp_path):
    from builders.plan_types import RecipeTest, StageData
    from builders.ship.stage import run_recipe_tests

    prefix = tmp_path / "opt/onebit"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "hangs").write_text("#!/bin/sh\nsleep 30\n")
    (prefix / "bin" / "hangs").chmod(0o755)
    data = StageData(variant="v", package="onebit-v", stage_root="", stage_tmp="", tmp_prefix="", prefix=str(prefix),
                     root="", keep=(), binaries={}, links={}, backend=None, manifest_entry=None, build_dir="", home="",
                     tests=(RecipeTest(name="waits for input", run=("bin/hangs",), timeout=1),), test_values={},
                     where="recipes/v.yaml")
    with pytest.raises(StageError) as err:
        run_recipe_tests(data, prefix, log=lambda m: None)
    assert str(err.value).splitlines()[0] == ("recipes/v.yaml: recipe test 'waits for input' of v did not finish in 1 s: "
                                              "bin/hangs")


@pytest.mark.e2e
def test_a_build_dir_left_by_an_older_builder_is_started_clean(tmp_path):
    """A build dir configured against another checkout path (here: one that never recorded its checkout) must not
    reach CMake, which would refuse it: the build starts that dir clean."""
    mini = make_mini(tmp_path / "m")
    project = config.load_project(mini.root)
    layout = Layout(root=mini.root, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")
    plan = make_plan(project, "mini", host.gather(all_tools(project, "mini")), layout)
    stale = Path(plan.step("build:hello").data.build_dir)
    stale.mkdir(parents=True)
    (stale / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=/somewhere/else\n")
    report = Executor(plan, project).run()
    assert "build:hello" in report.ran and (stale / ".onebit-source").read_text().strip() == plan.step("build:hello").data.source_dir


def test_vendored_wheels_name_no_removed_console_script(tmp_path):
    from builders.ship.serve_install import drop_script_records

    info = tmp_path / "idna-3.20.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("../../bin/idna,sha256=abc,213\nidna/__init__.py,sha256=def,849\n")
    drop_script_records(tmp_path)
    assert (info / "RECORD").read_text() == "idna/__init__.py,sha256=def,849\n"
