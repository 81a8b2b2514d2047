"""Real builds of a small CMake project through the whole flow: fetch (file:// mirrors), patch, build, stage,
package, channel, install. Each takes seconds, so every failure mode is tried for real."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from builders.project import config
from builders.inputs import host
from builders.ship import package
from builders.errors import BuildError, PatchError, StageError
from builders.execute import KEY_FILE, Executor
from builders.ship.install import install_bundle
from builders.plan import all_tools, make_plan
from builders.plan_types import Layout, digest
from mini_project import add_twin, git, make_mini


def plan_for(mini, base: Path, **kw):
    project = config.load_project(mini.root)
    facts = host.gather(all_tools(project, "mini"))
    layout = Layout(root=mini.root, cache=base / "cache", work=base / "work", out=base / "out")
    return project, make_plan(project, "mini", facts, layout, **kw)


def build(mini, base: Path, **kw):
    project, plan = plan_for(mini, base, **kw)
    return plan, Executor(plan, project).run()


@pytest.fixture
def mini(tmp_path):
    return make_mini(tmp_path / "mini")


def test_whole_flow_builds_packages_installs_and_runs(mini, tmp_path):
    plan, report = build(mini, tmp_path)
    out = plan.layout.out
    assert [s for s in report.ran if s.startswith("build:")] == ["build:hello"]
    conda = sorted(p.name for p in (out / "channel" / "linux-64").glob("*.conda"))
    meta_build = digest("meta-build", "mini", [f"onebit-hello ==1.0 default_h{mini.commit[:7]}_0"])[:7]  # path-independent
    assert conda == [f"onebit-bundle-mini-1.0-h{meta_build}_0.conda",
                     f"onebit-hello-1.0-default_h{mini.commit[:7]}_0.conda"]
    sums = (out / "SHA256SUMS").read_text().splitlines()
    assert {line.split("  ")[1] for line in sums} >= {"manifest.json", "onebit-mini-1.0-0-linux-64.tar.zst",
                                                      "channel/linux-64/repodata.json"}
    prefix = tmp_path / "prefix"
    installed = install_bundle(out / "channel", prefix, "mini", cache_dir=tmp_path / "pkgs")
    assert [i.split("-1.0-")[0] for i in installed] == ["onebit-bundle-mini", "onebit-hello"]
    run = subprocess.run([prefix / "bin" / "hello"], capture_output=True, text=True, check=True)
    assert run.stdout == "hello from onebit\n"  # the recipe's patch is in the installed binary
    version = subprocess.run([prefix / "bin" / "hello", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout == f"hello version ({mini.commit[:7]})\n"
    rpath = subprocess.run(["patchelf", "--print-rpath", prefix / "bin" / "hello"], capture_output=True, text=True)
    assert rpath.stdout.strip() == "$ORIGIN/../lib"
    manifest = json.loads((prefix / "share" / "onebit" / "manifest.json").read_text())
    assert manifest["backends"]["cpu"]["source"] == {"pin": "hello", "url": f"file://{mini.upstream}", "commit": mini.commit,
                                                     "patches": ["0001-greet-say-who-we-are.patch"]}
    assert manifest["backends"]["cpu"]["binaries"] == {"hello": "bin/hello"}


def test_second_build_with_nothing_changed_does_no_work(mini, tmp_path):
    build(mini, tmp_path)
    build_dir = tmp_path / "work" / "build" / "hello"
    before = {p: p.stat().st_mtime_ns for p in build_dir.rglob("*") if p.is_file()}
    plan, report = build(mini, tmp_path)
    assert report.ran == []
    assert report.cached == [s.id for s in plan.steps]
    assert {p: p.stat().st_mtime_ns for p in build_dir.rglob("*") if p.is_file()} == before


def test_changed_option_rebuilds_only_what_depends_on_it(mini, tmp_path):
    build(mini, tmp_path)
    recipe = mini.recipe()
    recipe["build"]["options"]["CMAKE_C_FLAGS"] = "-O1"
    mini.write_recipe(recipe)
    _, report = build(mini, tmp_path)
    assert "fetch:hello" in _cached(report) and "build:hello" in report.ran


def _cached(report):
    return set(report.cached)


def test_stale_cmake_flag_is_a_build_error(mini, tmp_path):
    recipe = mini.recipe()
    recipe["build"]["options"]["GGML_VULKAN_TYPO"] = True
    mini.write_recipe(recipe)
    with pytest.raises(BuildError) as err:
        build(mini, tmp_path)
    assert "CMake ignored these -D options: GGML_VULKAN_TYPO" in str(err.value)
    assert str(err.value).startswith(str(mini.root / "recipes" / "hello.yaml"))


def test_rpath_into_the_build_tree_fails_staging(mini, tmp_path):
    recipe = mini.recipe()
    recipe["build"]["options"]["CMAKE_INSTALL_RPATH"] = "{build}"
    mini.write_recipe(recipe)
    with pytest.raises(StageError) as err:
        build(mini, tmp_path)
    assert "bin/hello: RPATH/RUNPATH entry" in str(err.value) and "points into the build tree" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_patch_that_no_longer_applies_names_itself_file_and_hunk(mini, tmp_path):
    new = mini.commit_upstream("greet.c", '#include <stdio.h>\nvoid greet(void) { puts("hi"); }\n', "reword")
    mini.set_pin(commit=new, tag=None)
    data = mini.pins()
    del data["pins"]["hello"]["tag"]
    mini.write_pins(data)
    with pytest.raises(PatchError) as err:
        build(mini, tmp_path)
    text = str(err.value)
    assert "patch 0001-greet-say-who-we-are.patch no longer applies: greet.c @@ -1,2 +1,2 @@" in text
    assert "hello.yaml" in text and "git format-patch" in text
    assert not (tmp_path / "work" / "build" / "hello").exists()  # nothing was built


def test_interrupted_rebuild_leaves_the_previous_bundle_intact(mini, tmp_path, monkeypatch):
    build(mini, tmp_path)
    out = tmp_path / "out"
    snapshot = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def interrupted(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(package, "assemble", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(mini, tmp_path, build_number=7)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot
    monkeypatch.undo()
    plan, report = build(mini, tmp_path, build_number=7)
    assert "package:hello" in report.ran
    assert (out / KEY_FILE).read_text().strip() == plan.step("bundle:publish").key
    assert (out / "onebit-mini-1.0-7-linux-64.tar.zst").is_file()
    assert not (out / "onebit-mini-1.0-0-linux-64.tar.zst").exists()


def test_tarball_is_deterministic_and_holds_the_manifest(mini, tmp_path):
    import tarfile

    import zstandard

    plan, _ = build(mini, tmp_path / "a")
    plan_b, _ = build(mini, tmp_path / "b")
    name = "onebit-mini-1.0-0-linux-64.tar.zst"
    a, b = (plan.layout.out / name).read_bytes(), (plan_b.layout.out / name).read_bytes()
    assert a == b
    with zstandard.ZstdDecompressor().stream_reader(open(plan.layout.out / name, "rb")) as raw:
        with tarfile.open(fileobj=raw, mode="r|") as tar:
            names = [m.name for m in tar]
    assert "onebit-mini-1.0-0-linux-64/share/onebit/manifest.json" in names
    assert "onebit-mini-1.0-0-linux-64/bin/hello" in names


def test_upstream_commit_moved_under_the_same_tag_is_refused(mini, tmp_path):
    moved = mini.commit_upstream("main.c", (mini.upstream / "main.c").read_text() + "\n", "retag")
    git(mini.upstream, "tag", "-f", "v1.0", moved)
    from builders.errors import FetchError

    with pytest.raises(FetchError) as err:
        build(mini, tmp_path)
    assert f"tag 'v1.0' moved: pins.yaml says {mini.commit}, file://{mini.upstream} now says {moved}" in str(err.value)
    assert not (tmp_path / "cache" / "git" / f"{mini.commit}.git").exists()  # nothing entered the cache


# ---- the project's flags: added to the recipe's, one target per checkout, never stale --------------------------
def _ccache_stats(ccache_dir: Path) -> dict[str, int]:
    out = subprocess.run(["ccache", "--print-stats"], env={**os.environ, "CCACHE_DIR": str(ccache_dir)},
                         capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split("\t") for line in out.splitlines() if "\t" in line)}


def _staged(plan, variant: str) -> dict[str, bytes]:
    data = plan.step(f"stage:{variant}").data
    root = Path(data.prefix) / data.root
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_package_bytes_do_not_depend_on_ccache_history(mini, tmp_path, monkeypatch):
    """hello and hello2 build one checkout. Built after hello, hello2's objects come from hello's ccache entries
    (ccache hashes a map option's name, not its value); built alone with an empty ccache it compiles them itself.
    Its staged bytes must be the same both ways."""
    if shutil.which("ccache") is None:
        pytest.fail("ccache is needed (.ci/run installs it)")
    add_twin(mini, backend="vulkan", build_type="RelWithDebInfo")  # debug info records the (mapped) build and source dirs
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache-warm"))
    warm, _ = build(mini, tmp_path / "warm")
    stats = _ccache_stats(tmp_path / "ccache-warm")
    assert stats["direct_cache_hit"] + stats["preprocessed_cache_hit"] >= 2, stats  # hello2 did hit hello's objects
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache-cold"))
    cold, _ = build(mini, tmp_path / "cold", only={"hello2"})
    assert _ccache_stats(tmp_path / "ccache-cold")["cache_miss"] >= 2
    a, b = _staged(warm, "hello2"), _staged(cold, "hello2")
    assert sorted(a) == ["bin/hello", "lib/libgreet.so"]
    assert b"/usr/src/onebit/hello-build" in a["bin/hello"]  # the checkout's build target, whichever variant
    assert a == b


def test_a_recipes_cmake_c_flags_option_keeps_the_maps(mini, tmp_path):
    """A recipe's CMAKE_C_FLAGS replaces CMake's start from CFLAGS: the maps are appended to it, so debug info
    holds the mapped paths and the leak check passes."""
    recipe = mini.recipe()
    recipe["build"]["options"]["CMAKE_C_FLAGS"] = "-O1 -g"
    mini.write_recipe(recipe)
    plan, _ = build(mini, tmp_path)
    binary = _staged(plan, "hello")["bin/hello"]
    assert b"/usr/src/onebit/hello" in binary
    assert str(tmp_path).encode() not in binary


def test_a_build_dir_configured_with_other_maps_starts_clean(mini, tmp_path):
    """CMake reads CFLAGS only when it first configures a build dir: a rebuild with other path maps (here another
    $HOME) in the same dir starts it clean, or the old maps would stay in CMakeCache.txt."""
    project = config.load_project(mini.root)
    facts = host.gather(all_tools(project, "mini"))
    layout = Layout(root=mini.root, cache=tmp_path / "cache", work=tmp_path / "work", out=tmp_path / "out")
    Executor(make_plan(project, "mini", replace(facts, home="/home/first"), layout), project).run()
    recipe = mini.recipe()
    recipe["build"]["options"]["CMAKE_C_FLAGS_RELEASE"] = "-O2 -DNDEBUG"  # any change that reruns the build
    mini.write_recipe(recipe)
    project = config.load_project(mini.root)
    plan = make_plan(project, "mini", replace(facts, home="/home/second"), layout)
    report = Executor(plan, project).run()
    assert "build:hello" in report.ran
    cache_txt = (Path(plan.step("build:hello").data.build_dir) / "CMakeCache.txt").read_text()
    [c_flags] = [line for line in cache_txt.splitlines() if line.startswith("CMAKE_C_FLAGS:")]
    assert "-ffile-prefix-map=/home/second=/home/builder" in c_flags and "/home/first" not in c_flags


def test_logs_off_a_terminal_are_whole_lines_without_source_locations(mini, tmp_path):
    """`1bit-build build` with its output to a pipe (CI): every line is a whole log line (no wrapping at 80 columns
    mid-word), none carries rich's source location (`execute.py:217`), and the plain progress lines still come
    (here every output line: ONEBIT_PROGRESS_EVERY=0; 30 s by default)."""
    import re
    import sys

    env = {**os.environ, "ONEBIT_PROGRESS_EVERY": "0", "COLUMNS": "80", "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "builders.cli", "--root", str(mini.root), "--cache", str(tmp_path / "cache"),
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "build", "mini"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert not [ln for ln in lines if re.search(r"\b\w+\.py:\d+\b", ln)]
    whole = re.compile(r"^(\[\d\d:\d\d:\d\d\] .+|\.\.\. \S+( \[\d+/\d+\])? \d+ s|done: .+)$")
    assert [ln for ln in lines if not whole.match(ln)] == []
    fetched = [ln for ln in lines if " fetched hello @ " in ln]
    assert len(fetched) == 1 and fetched[0].endswith(f"from git file://{mini.upstream}") and len(fetched[0]) > 80
    assert [ln for ln in lines if re.match(r"^\.\.\. build:hello \[\d+/\d+\] \d+ s$", ln)]
    assert [ln for ln in lines if re.search(r"\] step \d+/\d+ build:hello: build hello \(cmake, network cut\)$", ln)]
