"""Pure decisions tested by tables: RPATHs, CMake's unused variables, patch drift, the manifest."""
from __future__ import annotations


import pytest

from builders.inputs import patch
from builders.errors import PatchError, StageError
from builders.kinds.cmake import unused_variables
from builders.ship.manifest import make_manifest
from builders.ship.stage import kept, new_rpath, origin_rpath, rpath_problems
from mini_project import PATCH, git, make_mini

FORBIDDEN = [("the build tree", "/w/build/cpu"), ("$HOME", "/home/dev")]


@pytest.mark.parametrize("rel, rpath", [
    ("bin/llama-server", "$ORIGIN/../lib"),
    ("lib/libllama.so", "$ORIGIN"),
    ("lib/onebit/python/numpy/core/x.so", "$ORIGIN/../../../.."),
    ("libexec/onebit/hrx/llama-server", "$ORIGIN/../../../lib"),
])
def test_origin_rpath(rel, rpath):
    assert origin_rpath(rel) == rpath


@pytest.mark.parametrize("entries, problems", [
    ([], 0),
    (["$ORIGIN/../lib"], 0),
    (["/opt/rocm/lib"], 0),  # a system toolchain path is not the build tree
    (["/w/build/cpu/bin"], 1),
    (["$ORIGIN", "/home/dev/.local/lib"], 1),
    (["/w/build/cpu", "/home/dev"], 2),
    (["/w/build/cpu-other"], 0),  # a prefix match must end at a path separator
])
def test_rpath_problems(entries, problems):
    found = rpath_problems("bin/x", entries, FORBIDDEN)
    assert len(found) == problems
    assert all(p.startswith("bin/x: RPATH/RUNPATH entry") for p in found)


@pytest.mark.parametrize("rel, current, needs, expected", [
    ("bin/x", [], True, ["$ORIGIN/../lib"]),
    ("bin/x", [], False, None),  # static: nothing to do
    ("lib/y.so", ["$ORIGIN/../y.libs"], True, None),  # vendored wheel, already relocatable
    ("bin/x", ["/w/build/cpu/bin"], True, ["$ORIGIN/../lib", "/w/build/cpu/bin"]),  # kept, so the check reports it
    ("bin/x", ["$ORIGIN/../lib"], True, None),
])
def test_new_rpath(rel, current, needs, expected):
    assert new_rpath(rel, current, needs) == expected


TC = ["/c/toolchains/f5b9"]


@pytest.mark.parametrize("rel, current, needs, expected", [
    # zig's pkg-config libdir in the Vulkan SDK root: link-time only, so it goes (the host's loader is found as usual)
    ("bin/zinc", ["/c/toolchains/f5b9/lib/pkgconfig/../../lib"], True, ["$ORIGIN/../lib"]),
    ("bin/zinc", ["/c/toolchains/f5b9/lib"], False, []),  # nothing else left: the RPATH is removed
    ("bin/x", ["$ORIGIN/../lib", "/c/toolchains/f5b9/lib"], True, ["$ORIGIN/../lib"]),
    ("bin/x", ["/c/toolchains/f5b9x/lib"], True, ["$ORIGIN/../lib", "/c/toolchains/f5b9x/lib"]),  # another root: kept
    ("bin/x", ["/w/build/bin", "/c/toolchains/f5b9"], True, ["$ORIGIN/../lib", "/w/build/bin"]),  # reported later
])
def test_new_rpath_drops_toolchain_roots(rel, current, needs, expected):
    assert new_rpath(rel, current, needs, TC) == expected


@pytest.mark.parametrize("rel, keep, out", [
    ("bin/llama-server", ["bin/llama-*"], True),
    ("include/llama.h", ["bin/llama-*", "lib/lib*.so*"], False),
    ("lib/libggml-cpu.so", ["bin/llama-*", "lib/lib*.so*"], True),
    ("anything", [], True),
])
def test_keep_globs(rel, keep, out):
    assert kept(rel, keep) is out


CMAKE_WARNING = """-- Generating done
CMake Warning:
  Manually-specified variables were not used by the project:

    GGML_HIP_ROCMI4_W4A4
    LLAMA_CURL

-- Build files have been written to: /b
"""


@pytest.mark.parametrize("output, names", [
    (CMAKE_WARNING, ["GGML_HIP_ROCMI4_W4A4", "LLAMA_CURL"]),
    ("-- Configuring done\n-- Generating done\n", []),
])
def test_unused_variables(output, names):
    assert unused_variables(output) == names


def test_patch_drift_report_on_real_git(tmp_path):
    mini = make_mini(tmp_path / "m")
    p = mini.root / "recipes" / "patches" / "hello" / "0001-greet-say-who-we-are.patch"
    assert [r.status for r in patch.drift_report(mini.upstream, mini.commit, [p])] == ["applies"]
    # upstream rewords the same line: the patch fails, and the report names the file and hunk
    new = mini.commit_upstream("greet.c", '#include <stdio.h>\nvoid greet(void) { puts("hey"); }\n', "reword")
    (r,) = patch.drift_report(mini.upstream, new, [p])
    assert (r.status, r.file, r.hunk) == ("fails", "greet.c", "@@ -1,2 +1,2 @@")
    assert "| 0001-greet-say-who-we-are.patch | fails | `greet.c` `@@ -1,2 +1,2 @@` |" in patch.render_markdown([r])
    # upstream merged our change: reported as already applied, not as a failure
    merged = mini.commit_upstream("greet.c", '#include <stdio.h>\nvoid greet(void) { printf("hello from onebit\\n"); }\n', "merge")
    assert [r.status for r in patch.drift_report(mini.upstream, merged, [p])] == ["already-applied"]
    # the scratch worktrees are gone
    assert "worktree" not in git(mini.upstream, "worktree", "list").split("\n", 1)[-1]


def test_apply_all_stops_at_the_first_failure(tmp_path):
    mini = make_mini(tmp_path / "m")
    bad = tmp_path / "0002-bad.patch"
    bad.write_text(PATCH.replace("greet.c", "nothere.c"))
    good = mini.root / "recipes" / "patches" / "hello" / "0001-greet-say-who-we-are.patch"
    wt = tmp_path / "wt"
    git(mini.upstream, "worktree", "add", "--detach", str(wt), mini.commit)
    with pytest.raises(PatchError) as err:
        patch.apply_all(wt, [bad, good], where="recipes/hello.yaml")
    assert "patch 0002-bad.patch no longer applies: nothere.c" in str(err.value)
    assert "hello from upstream" in (wt / "greet.c").read_text()  # the later patch was not applied


ENTRY = {"recipe": "cpu", "package": "onebit-cpu", "version": "1", "build_number": 0, "binaries": {"llama-server": "bin/llama-server"},
         "devices": ["CPU"], "source": {"pin": "llama.cpp", "url": "u", "commit": "0" * 40}, "features": []}


def test_manifest_is_validated_and_backends_are_unique():
    doc = make_manifest("cpu", "1", 0, "linux-64", [("cpu", ENTRY)])
    assert doc["backends"]["cpu"]["binaries"] == {"llama-server": "bin/llama-server"}
    with pytest.raises(StageError, match="two variants provide backend 'cpu'"):
        make_manifest("cpu", "1", 0, "linux-64", [("cpu", ENTRY), ("cpu", ENTRY)])
    with pytest.raises(StageError, match="manifest does not match"):
        make_manifest("cpu", "1", 0, "linux-64", [("cpu", {**ENTRY, "devices": ["GPU7"]})])
    with pytest.raises(StageError, match="binaries/llama-server"):
        make_manifest("cpu", "1", 0, "linux-64", [("cpu", {**ENTRY, "binaries": {"llama-server": "/abs/llama-server"}})])
