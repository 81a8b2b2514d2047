"""Toolchain inputs move like any pin: the pinned wheels (zig, NVIDIA's CUDA wheels) and Debian packages (the Vulkan SDK)
of the recipes. Pure decisions by tables; `pins bump toolchain:NAME` against a fake package index (its JSON API on
127.0.0.1) and a Debian archive on disk (real Packages.xz of several suites, file://); the PR path against the fake
GitHub with a bare origin, as the roots' tests do."""
from __future__ import annotations

import hashlib
import json
import lzma
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from builders.errors import OnebitError
from builders.pins import file_moves, toolchains as tc
from builders.pins import toolchain_inputs as ti, toolchain_moves as tm, toolchain_world as tw
import local_http
from pins_fixtures import (FakeAPI, Project, Upstream, bot_env, branch_pin, branches, bump, evaluate_report, git,
                           refused_tampered, refused_unread)

TOKEN = "t0ken-for-toolchain-tests"
TOP = Path(__file__).resolve().parents[1]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pool(name: str, version: str, arch: str = "amd64") -> str:
    return f"pool/main/{name[0]}/{name}/{name}_{version.split(':')[-1]}_{arch}.deb"


def stanza(name: str, version: str, arch: str = "amd64") -> dict:
    return {"Package": name, "Version": version, "Architecture": arch, "Filename": pool(name, version, arch),
            "SHA256": sha(f"{name} {version}")}


def deb_entry(name: str, version: str, arch: str = "amd64") -> dict:
    return {"path": pool(name, version, arch), "sha256": sha(f"{name} {version}")}


LINUX = "py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64"
MAC = "py3-none-macosx_11_0_arm64"


def wheel_file(package: str, version: str, tags: str = LINUX, **kw) -> dict:
    return {"filename": f"{package.replace('-', '_')}-{version}-{tags}.whl", "packagetype": "bdist_wheel",
            "digests": {"sha256": sha(f"{package} {version} {tags}")}, "yanked": False, **kw}


def wheel_entry(package: str, version: str, tags: str = LINUX) -> dict:
    return {"package": package, "version": version, "sha256": sha(f"{package} {version} {tags}"), "root": "x"}


# ---- pure: which inputs the project has ------------------------------------------------------------------------------------
def test_one_input_per_distinct_list_with_every_place_that_carries_it():
    sdk = [deb_entry("glslc", "2025.2-1"), deb_entry("libvulkan1", "1.3.239.0-1")]
    recipes = {
        "recipes/a.yaml": {"toolchain": [{"tool": "vulkan-sdk", "debs": sdk}, {"tool": "cmake"}]},
        "recipes/b.yaml": {"variants": {"v": {"toolchain": [{"tool": "vulkan-sdk", "debs": list(sdk)}]}}},
        "recipes/z.yaml": {"toolchain": [{"tool": "zig", "version": ">=0.15.2",
                                          "wheels": [wheel_entry("ziglang", "0.15.2")]}]},
    }
    got = {i.name: i for i in ti.find_inputs(recipes)}
    assert sorted(got) == ["vulkan-sdk", "zig"]
    assert [(p.recipe, p.where) for p in got["vulkan-sdk"].places] == [
        ("recipes/a.yaml", "toolchain"), ("recipes/b.yaml", "variants.v.toolchain")]
    assert got["zig"].kind == "wheels" and got["zig"].version == ">=0.15.2" and got["zig"].files == ["recipes/z.yaml"]
    # a recipe whose list differs is another input, named by its recipe
    recipes["recipes/b.yaml"]["variants"]["v"]["toolchain"][0]["debs"] = sdk[:1]
    assert sorted(i.name for i in ti.find_inputs(recipes)) == ["vulkan-sdk-a", "vulkan-sdk-b", "zig"]


def test_the_projects_own_recipes_carry_four_inputs_the_sdk_in_four_recipes():
    got = {i.name: i for i in ti.load_inputs(TOP)}
    assert sorted(got) == ["nvcc", "sysroot", "vulkan-sdk", "zig"]
    assert got["sysroot"].kind == "debs" and len(got["sysroot"].entries) == 9  # the portability sysroot
    assert got["vulkan-sdk"].files == ["recipes/hrx.yaml", "recipes/lean.yaml", "recipes/vulkan.yaml", "recipes/zinc.yaml"]
    assert got["vulkan-sdk"].kind == "debs" and len(got["vulkan-sdk"].entries) == 8
    assert got["nvcc"].files == ["recipes/cuda.yaml"] and got["zig"].files == ["recipes/zinc.yaml"]


@pytest.mark.parametrize("names, given, cadence, want", [
    ((), False, None, ["nvcc", "vulkan-sdk", "zig"]),
    ((), False, "weekly", ["nvcc", "vulkan-sdk", "zig"]),
    ((), False, "daily", []),
    (("zig",), True, None, ["zig"]),
    ((), True, None, []),  # only other things were named (a pin, a root)
])
def test_which_inputs_a_run_moves(names, given, cadence, want):
    assert file_moves.selected(["nvcc", "vulkan-sdk", "zig"], names, given, cadence) == want


# ---- pure: where a wheel moves -------------------------------------------------------------------------------------------
ZIG = {
    "0.15.2": [wheel_file("ziglang", "0.15.2"), wheel_file("ziglang", "0.15.2", MAC)],
    "0.15.3": [wheel_file("ziglang", "0.15.3"), wheel_file("ziglang", "0.15.3", MAC)],
    "0.16.0rc1": [wheel_file("ziglang", "0.16.0rc1")],  # a pre-release
    "0.16.0": [wheel_file("ziglang", "0.16.0", MAC)],  # no file with the pinned tags
    "0.17.0": [wheel_file("ziglang", "0.17.0", yanked=True)],
}
NVCC = {v: [wheel_file("nvidia-cuda-nvcc", v)] for v in ("12.9.86", "13.0.88", "13.2.51", "14.0.1")}


@pytest.mark.parametrize("entry, releases, constraint, want", [
    (wheel_entry("ziglang", "0.15.2"), ZIG, ">=0.15.2", ("move", "0.15.3")),
    (wheel_entry("ziglang", "0.15.2"), ZIG, "<0.15.3", ("current", "0.15.2")),
    (wheel_entry("ziglang", "0.15.3"), ZIG, None, ("current", "0.15.3")),
    (wheel_entry("ziglang", "0.15.2", MAC), ZIG, ">=0.15.2", ("move", "0.16.0")),  # the mac file's own line
    (wheel_entry("nvidia-cuda-nvcc", "13.0.88"), NVCC, ">=12.4", ("move", "13.2.51")),  # a cu13 wheel stays 13.x
    (wheel_entry("nvidia-cuda-nvcc", "12.9.86"), NVCC, ">=12.4", ("current", "12.9.86")),
    (wheel_entry("ziglang", "0.14.0"), ZIG, None, ("refused", None)),  # the index has no file with the pinned sha256
    # the pinned release is newer than anything the index offers now (it was yanked): back (held, like a pin)
    (wheel_entry("ziglang", "0.17.0"), ZIG, None, ("back", "0.15.3")),
    (wheel_entry("ziglang", "0.15.2"), {**ZIG, "0.15.2": [wheel_file("ziglang", "0.15.2", yanked=True)],
                                        "0.15.3": []}, None, ("current", "0.15.2")),
    (wheel_entry("ziglang", "0.15.4"), {"0.15.4": [wheel_file("ziglang", "0.15.4", yanked=True)],
                                        "0.15.3": [wheel_file("ziglang", "0.15.3")]}, None, ("back", "0.15.3")),
])
def test_where_a_pinned_wheel_moves(entry, releases, constraint, want):
    step = tm.pick_wheel(entry, releases, constraint)
    assert step.state == want[0]
    if want[0] in ("move", "back"):
        assert step.new == want[1] and step.entry["version"] == want[1] and step.entry["root"] == "x"
        [f] = [f for f in releases[want[1]] if not f.get("yanked") and
               tm.wheel_tags(f["filename"]) == tm.wheel_tags(next(
                   g["filename"] for rel in releases.values() for g in rel if g["digests"]["sha256"] == entry["sha256"]))]
        assert step.entry["sha256"] == f["digests"]["sha256"]
    elif want[0] == "current":
        assert step.new == want[1]


# ---- pure: where a Debian package moves -------------------------------------------------------------------------------------
def indexes(**suites) -> list:
    return [(s, tm.index_debs([stanza(*p) for p in pkgs])) for s, pkgs in suites.items()]


SUITES = dict(
    bookworm=[("libvulkan1", "1.3.239.0-1"), ("libvulkan1", "1.3.239.0-1+deb12u1")],
    trixie=[("libvulkan1", "1.4.309.0-1"), ("libvulkan-dev", "1.4.309.0-1"), ("libvulkan-dev", "1.4.309.0-2"),
            ("glslc", "2025.2-1")],
    sid=[("libvulkan1", "1.4.330.0-1"), ("libvulkan-dev", "1.4.330.0-1"), ("glslc", "2026.1-1"),
         ("clang-22", "1:22.1.8-1")],
    experimental=[("clang-22", "1:22.1.9~rc1-1")],
)


@pytest.mark.parametrize("entry, want", [
    (deb_entry("libvulkan1", "1.3.239.0-1"), ("move", "1.3.239.0-1+deb12u1 (bookworm)")),  # stays in bookworm
    (deb_entry("libvulkan-dev", "1.4.309.0-1"), ("move", "1.4.309.0-2 (trixie)")),  # stays in trixie
    (deb_entry("glslc", "2025.2-1"), ("current", "2025.2-1 (trixie)")),  # sid's newer one is not its suite
    (deb_entry("libvulkan1", "1.4.330.0-1"), ("current", "1.4.330.0-1 (sid)")),
    (deb_entry("clang-22", "1:22.1.8-1"), ("current", "1:22.1.8-1 (sid)")),  # the epoch is not in the pool name
    (deb_entry("glslc", "2024.1-1"), ("vanished", tm.VANISHED)),
    ({**deb_entry("glslc", "2025.2-1"), "sha256": "0" * 64}, ("refused", None)),
])
def test_where_a_pinned_debian_package_moves(entry, want):
    step = tm.pick_deb(entry, indexes(**SUITES))
    assert step.state == want[0]
    if want[1]:
        assert step.new == want[1]
    if want[0] == "move":
        version = want[1].split(" ")[0]
        assert step.entry == deb_entry(step.label, version)


def test_a_suite_that_went_back_leaves_the_pin_vanished_not_moved_back():
    """The pinned version left its suite (experimental dropped the upload, a point release was withdrawn): reported,
    never replaced by the older one the suite still has."""
    step = tm.pick_deb(deb_entry("libvulkan1", "1.3.239.0-1+deb12u1"),
                       indexes(bookworm=[("libvulkan1", "1.3.239.0-1")], trixie=[("libvulkan1", "1.4.309.0-1")]))
    assert (step.state, step.new) == ("vanished", tm.VANISHED)


@pytest.mark.parametrize("path, want", [
    ("pool/main/s/shaderc/glslc_2025.2-1_amd64.deb", ("glslc", "2025.2-1", "amd64")),
    ("pool/main/s/spirv-headers/spirv-headers_1.6.1+1.4.309.0-1_all.deb", ("spirv-headers", "1.6.1+1.4.309.0-1", "all")),
    ("pool/main/g/gcc-14/libstdc++6_14.2.0-19_amd64.deb", ("libstdc++6", "14.2.0-19", "amd64")),
])
def test_a_pool_path_names_package_version_and_architecture(path, want):
    assert tm.pool_name(path) == want


def test_a_pool_path_that_is_no_package_file_is_refused():
    with pytest.raises(OnebitError, match="not a Debian package file name"):
        tm.pool_name("pool/main/x/x.deb")


@pytest.mark.parametrize("states, allowed, want", [
    (["current", "current"], False, "current"),
    (["current", "move"], False, "would-propose"),
    (["move", "back"], False, "held"),
    (["move", "back"], True, "would-propose"),
    (["current", "vanished"], False, "refused"),
    (["move", "vanished"], False, "would-propose"),  # the rest moves; the vanished one is told in the detail
    (["refused"], False, "refused"),
])
def test_what_the_entries_do_to_the_input(states, allowed, want):
    steps = [tm.Step("p", s, "1", "2") for s in states]
    assert tm.decide(steps, allowed) == want


# ---- pure: the recipe edit -------------------------------------------------------------------------------------------------
RECIPE = """\
# a recipe: comments and layout stay
toolchain:
  - tool: zig  # the wheel
    version: ">=0.15.2"
    wheels:
      - {{package: ziglang, version: "0.15.2", sha256: {zs}, root: ziglang}}
  - tool: vulkan-sdk
    debs:
      # keep this comment
      - {{path: {gp}, sha256: {gs}}}
      - {{path: {vp}, sha256: {vs}}}
"""


def recipe_text(zig="0.15.2", glslc="2025.2-1", vulkan="1.3.239.0-1") -> str:
    z, g, v = wheel_entry("ziglang", zig), deb_entry("glslc", glslc), deb_entry("libvulkan1", vulkan)
    return RECIPE.format(zs=z["sha256"], gp=g["path"], gs=g["sha256"], vp=v["path"], vs=v["sha256"]).replace(
        '"0.15.2"', f'"{zig}"')


def test_the_edit_rewrites_only_the_moved_entries_and_keeps_comments():
    text = recipe_text()
    old = [deb_entry("glslc", "2025.2-1"), deb_entry("libvulkan1", "1.3.239.0-1")]
    new = [old[0], deb_entry("libvulkan1", "1.3.239.0-1+deb12u1")]
    assert ti.edit_text(text, old, new, "debs") == recipe_text(vulkan="1.3.239.0-1+deb12u1")
    w_old, w_new = [wheel_entry("ziglang", "0.15.2")], [wheel_entry("ziglang", "0.15.3")]
    assert ti.edit_text(text, w_old, w_new, "wheels") == recipe_text(zig="0.15.3")
    with pytest.raises(OnebitError, match="no line pins"):
        ti.edit_text(text, [deb_entry("x", "1")], [deb_entry("x", "2")], "debs", "recipes/a.yaml")


@pytest.mark.parametrize("env, want", [
    ({"PIP_INDEX_URL": "http://127.0.0.1:9/simple"}, "http://127.0.0.1:9"),
    ({"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}, "http://127.0.0.1:9"),
    ({"PIP_INDEX_URL": "http://127.0.0.1:9/root/pypi/+simple http://other"}, "http://127.0.0.1:9/root/pypi/+simple"),
])
def test_the_index_is_pips(env, want):
    assert tw.pypi_base(env) == want


@pytest.mark.parametrize("listing, want", [
    ("global.index-url='http://127.0.0.1:9/simple'\nglobal.cert='/x'", "http://127.0.0.1:9/simple"),
    ("global.extra-index-url='file:///x/simple'\nglobal.find-links='/w'", None),
    ("global.index-url='http://a/simple'\ninstall.index-url='http://b/simple'", "http://b/simple"),
    ("", None),
])
def test_pips_configured_index_is_read_from_its_config_listing(listing, want):
    assert tw.index_setting(listing) == want


def test_without_a_setting_the_index_is_the_one_pip_uses(tmp_path, monkeypatch):
    """No $PIP_INDEX_URL: the configured one of `pip config list`, as the pip that downloads the wheels sees it."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = http://127.0.0.1:9/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    assert tw.pypi_base({}) == "http://127.0.0.1:9"


# ---- the bump: a fake package index, a Debian archive on disk ---------------------------------------------------------------
class FakeIndex:
    """A package index's JSON API (`/pypi/<name>/json`) on 127.0.0.1."""

    def __init__(self):
        self.releases: dict[str, dict] = {}
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[0] == "pypi" and parts[2] == "json" and parts[1] in index.releases:
                    body = json.dumps({"info": {"name": parts[1]}, "releases": index.releases[parts[1]]}).encode()
                    self.send_response(200)
                else:
                    body = b'{"message": "Not Found"}'
                    self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server, base = local_http.serve(Handler)
        self.url = f"{base}/simple"

    def close(self):
        local_http.stop(self.server)


class Archive:
    def __init__(self, tmp: Path):
        self.root = tmp / "debian"

    def publish(self, **suites) -> None:
        for suite, pkgs in suites.items():
            f = self.root / "dists" / suite / "main" / "binary-amd64" / "Packages.xz"
            f.parent.mkdir(parents=True, exist_ok=True)
            text = "\n".join("".join(f"{k}: {v}\n" for k, v in stanza(*p).items()) + "Size: 100\n" for p in pkgs)
            f.write_bytes(lzma.compress(text.encode()))


SDK_RECIPE = """\
# recipe {name}: this comment stays
schema_version: 1
name: {name}
{where}
      - tool: vulkan-sdk  # the SDK
        version: ">=1.3.239"
        debs:
          - {{path: {gp}, sha256: {gs}}}
          - {{path: {vp}, sha256: {vs}}}
      - {{tool: cmake}}
"""


def sdk_recipe(name: str, variant: bool) -> str:
    g, v = deb_entry("glslc", "2025.2-1"), deb_entry("libvulkan1", "1.3.239.0-1")
    where = "variants:\n  v:\n    toolchain:" if variant else "toolchain:"
    text = SDK_RECIPE.format(name=name, where=where, gp=g["path"], gs=g["sha256"], vp=v["path"], vs=v["sha256"])
    return text if variant else text.replace("\n      ", "\n  ")


ZIG_RECIPE = recipe_text().split("  - tool: vulkan-sdk")[0]

BASE = dict(bookworm=[("libvulkan1", "1.3.239.0-1")], trixie=[("glslc", "2025.2-1"), ("libvulkan1", "1.4.309.0-1")],
            sid=[("glslc", "2026.1-1"), ("libvulkan1", "1.4.330.0-1")], experimental=[])
MOVED = dict(BASE, bookworm=[("libvulkan1", "1.3.239.0-1"), ("libvulkan1", "1.3.239.0-1+deb12u1")],
             sid=[("glslc", "2026.2-1"), ("libvulkan1", "1.4.331.0-1")])


@pytest.fixture
def world(tmp_path, monkeypatch):
    api = FakeAPI()
    index = FakeIndex()
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    archive = Archive(tmp_path)
    archive.publish(**BASE)
    bot_env(monkeypatch, api, TOKEN, archive=archive.root)
    index.releases["ziglang"] = {"0.15.2": [wheel_file("ziglang", "0.15.2")]}
    up = Upstream(tmp_path / "owner" / "tool")
    sha1 = up.commit("one")
    proj = Project(tmp_path, branch_pin("tool", up.url, sha1), recipes={"a": sdk_recipe("a", False), "b": sdk_recipe("b", True), "z": ZIG_RECIPE})
    yield proj, archive, index, api
    api.close()
    index.close()


def read(proj: Project, name: str) -> str:
    return (proj.root / "recipes" / f"{name}.yaml").read_text()


def test_nothing_moved_is_current(world, capsys):
    proj, *_ = world
    assert bump(proj, "toolchain:vulkan-sdk", "toolchain:zig") == 0
    out = capsys.readouterr().out
    assert out.count("current") >= 2 and git(proj.root, "status", "--porcelain") == ""


def test_a_local_run_edits_every_recipe_carrying_the_input_in_place(world, capsys):
    proj, archive, index, _ = world
    a, b, z = read(proj, "a"), read(proj, "b"), read(proj, "z")
    archive.publish(**MOVED)
    index.releases["ziglang"].update({"0.15.3": [wheel_file("ziglang", "0.15.3")],
                                      "0.16.0rc1": [wheel_file("ziglang", "0.16.0rc1")]})
    assert bump(proj, "toolchain:vulkan-sdk", "--dry-run") == 0
    assert "would-propose" in capsys.readouterr().out and git(proj.root, "status", "--porcelain") == ""

    assert bump(proj, "toolchain:vulkan-sdk") == 0
    out = capsys.readouterr().out
    assert "edited" in out and "libvulkan1: 1.3.239.0-1 (bookworm) -> 1.3.239.0-1+deb12u1 (bookworm)" in out
    old_v, new_v = deb_entry("libvulkan1", "1.3.239.0-1"), deb_entry("libvulkan1", "1.3.239.0-1+deb12u1")
    # only that entry changed, in both recipes (glslc stays trixie's although sid has newer); comments kept
    for name, before in (("a", a), ("b", b)):
        want = before.replace(old_v["path"], new_v["path"]).replace(old_v["sha256"], new_v["sha256"])
        assert read(proj, name) == want and "this comment stays" in want
    assert read(proj, "z") == z  # another input, not named
    assert bump(proj, "toolchain:vulkan-sdk") == 0 and "current" in capsys.readouterr().out

    assert bump(proj, "toolchain:zig") == 0  # the pre-release is skipped
    assert read(proj, "z") == recipe_text(zig="0.15.3").split("  - tool: vulkan-sdk")[0]


def test_a_vanished_package_is_reported_not_moved(world, capsys):
    proj, archive, *_ = world
    archive.publish(**dict(BASE, trixie=[("glslc", "2025.2-2")]))
    a = read(proj, "a")
    assert bump(proj, "toolchain:vulkan-sdk") == 1
    res = capsys.readouterr()
    assert "refused" in res.out and "glslc" in res.err and tm.VANISHED in res.err
    assert read(proj, "a") == a


def test_an_input_that_would_move_back_is_held(world, capsys):
    proj, _, index, _ = world
    index.releases["ziglang"]["0.15.3"] = [wheel_file("ziglang", "0.15.3")]
    assert bump(proj, "toolchain:zig") == 0
    proj.commit_all("zig moved")
    moved = read(proj, "z")
    index.releases["ziglang"]["0.15.3"] = [wheel_file("ziglang", "0.15.3", yanked=True)]  # the release was yanked
    capsys.readouterr()
    assert bump(proj, "toolchain:zig") == 1
    res = capsys.readouterr()
    assert "held" in res.out and "ziglang: 0.15.3 -> 0.15.2" in res.err and "--allow-rollback" in res.err
    assert read(proj, "z") == moved
    assert bump(proj, "toolchain:zig", "--allow-rollback", "--reason", "0.15.3 was yanked") == 0
    assert read(proj, "z") == ZIG_RECIPE


def test_an_unknown_input_is_named(world, capsys):
    proj, *_ = world
    assert bump(proj, "toolchain:nonesuch") == 1
    assert "no toolchain input named 'nonesuch'" in capsys.readouterr().err


def evaluate(proj: Project, out: Path, monkeypatch, *names: str) -> dict:
    """The evaluating job: no token in the environment."""
    return evaluate_report(proj, out, monkeypatch, TOKEN, tc.REPORT, *names)


def test_evaluate_then_deliver_opens_one_pr_per_input_changing_exactly_its_recipes(world, tmp_path, monkeypatch, capsys):
    proj, archive, index, api = world
    head = git(proj.root, "rev-parse", "HEAD")
    committed = {n: read(proj, n) for n in "abz"}
    archive.publish(**MOVED)
    index.releases["ziglang"]["0.15.3"] = [wheel_file("ziglang", "0.15.3")]
    out = tmp_path / "artifact"
    data = evaluate(proj, out, monkeypatch)  # every pin, root and input of the run
    assert {"report.json", "roots.json", tc.REPORT} <= {p.name for p in out.iterdir()}
    got = {e["name"]: e for e in data["inputs"]}
    assert got["vulkan-sdk"]["state"] == got["zig"]["state"] == "would-propose"
    assert [f["path"] for f in got["vulkan-sdk"]["files"]] == ["recipes/a.yaml", "recipes/b.yaml"]
    assert git(proj.root, "status", "--porcelain") == "" and not api.state.opened()

    assert bump(proj, "--from-report", str(out), "--open-pr") == 0
    prs = {pr["title"]: pr for pr in api.state.opened()}
    assert sorted(prs) == ["toolchains: move vulkan-sdk (1 entries changed)", "toolchains: move zig (1 entries changed)"]
    sdk = prs["toolchains: move vulkan-sdk (1 entries changed)"]
    branch = sdk["head"]["ref"]
    assert tc.is_branch_of("vulkan-sdk", branch) and "- `libvulkan1: 1.3.239.0-1 -> 1.3.239.0-1+deb12u1`" in sdk["body"]
    origin = proj.origin.path
    assert git(origin, "rev-parse", f"refs/heads/{branch}^") == head
    assert git(origin, "diff", "--name-only", "main", f"refs/heads/{branch}").split() == ["recipes/a.yaml", "recipes/b.yaml"]
    for f in got["vulkan-sdk"]["files"]:
        assert proj.origin.show(f"refs/heads/{branch}", f["path"]) == f["text"]
    zig = prs["toolchains: move zig (1 entries changed)"]["head"]["ref"]
    assert git(origin, "diff", "--name-only", "main", f"refs/heads/{zig}").split() == ["recipes/z.yaml"]
    assert {n: read(proj, n) for n in "abz"} == committed and git(proj.root, "rev-parse", "HEAD") == head

    capsys.readouterr()
    assert bump(proj, "--from-report", str(out), "--open-pr") == 0
    assert len(api.state.opened()) == 2 and "already-proposed" in capsys.readouterr().out

    # the index moves on: a new PR for zig supersedes the older one
    index.releases["ziglang"]["0.15.4"] = [wheel_file("ziglang", "0.15.4")]
    out2 = tmp_path / "artifact2"
    evaluate(proj, out2, monkeypatch, "toolchain:zig")
    assert bump(proj, "toolchain:zig", "--from-report", str(out2), "--open-pr") == 0
    newest = api.state.opened()[-1]
    assert newest["title"] == "toolchains: move zig (1 entries changed)" and "0.15.2 -> 0.15.4" in newest["body"]
    closed = [pr for pr in api.state.opened() if pr["head"]["ref"] == zig]
    assert closed[0]["state"] == "closed"


def test_open_pr_evaluates_and_delivers_in_one_process(world, capsys):
    proj, archive, _, api = world
    archive.publish(**MOVED)
    assert bump(proj, "toolchain:vulkan-sdk", "--open-pr", "--dry-run") == 0
    assert "would-propose" in capsys.readouterr().out and not api.state.opened() and branches(proj) == ["main"]
    assert bump(proj, "toolchain:vulkan-sdk", "--open-pr") == 0
    [pr] = api.state.opened()
    assert tc.is_branch_of("vulkan-sdk", pr["head"]["ref"])


def test_a_held_input_opens_no_pr_unless_a_rollback_is_allowed(world, tmp_path, monkeypatch, capsys):
    proj, _, index, api = world
    index.releases["ziglang"]["0.15.3"] = [wheel_file("ziglang", "0.15.3")]
    assert bump(proj, "toolchain:zig") == 0
    proj.commit_all("zig moved")
    git(proj.root, "push", "--quiet", "origin", "main")
    index.releases["ziglang"]["0.15.3"] = [wheel_file("ziglang", "0.15.3", yanked=True)]
    out = tmp_path / "artifact"
    [entry] = evaluate(proj, out, monkeypatch, "toolchain:zig")["inputs"]
    assert entry["state"] == "held" and "ziglang: 0.15.3 -> 0.15.2" in entry["detail"]
    capsys.readouterr()
    assert bump(proj, "toolchain:zig", "--from-report", str(out), "--open-pr") == 1
    assert "held" in capsys.readouterr().out and not api.state.opened() and branches(proj) == ["main"]
    assert bump(proj, "toolchain:zig", "--from-report", str(out), "--open-pr", "--allow-rollback",
                "--reason", "0.15.3 was yanked") == 0
    [pr] = api.state.opened()
    assert "**Rollback**: 0.15.3 was yanked" in pr["body"] and "> - ziglang: 0.15.3 -> 0.15.2" in pr["body"]
    assert api.state.labels[pr["number"]] == ["rollback"]
    assert git(proj.origin.path, "diff", "--name-only", "main", f"refs/heads/{pr['head']['ref']}") == "recipes/z.yaml"


# ---- a report tampered with ------------------------------------------------------------------------------------------------
def _base(e):
    e["files"][0]["base_sha256"] = "0" * 64


def _one_file_less(e):
    e["files"].pop()


def _lists_differ(e):
    f = e["files"][1]
    new_v = deb_entry("libvulkan1", "1.3.239.0-1+deb12u1")
    f["text"] = f["text"].replace(new_v["sha256"], sha("other"))


def _other_line(e):
    for f in e["files"]:
        f["text"] = f["text"].replace("this comment stays", "changed")


def _other_package(e):
    for f in e["files"]:
        f["text"] = f["text"].replace("libvulkan1_1.3.239.0-1+deb12u1", "libevil_1.3.239.0-1+deb12u1")


def _not_a_recipe(e):
    for f in e["files"]:
        f["text"] = "toolchain: {{{\n"


def _unknown(e):
    e["name"] = "nonesuch"


def _not_carrying(e):
    e["files"][0]["path"] = "recipes/z.yaml"


@pytest.mark.parametrize("tamper, says", [
    (_base, "made from another recipes/a.yaml"),
    (_one_file_less, "exactly the files that carry it"),
    (_lists_differ, "differ between the files"),
    (_other_line, "not the committed file with only toolchain:vulkan-sdk's entries moved"),
    (_other_package, "another package's file"),
    (_unknown, "'nonesuch' is not a toolchain input"),
    (_not_a_recipe, "does not carry one vulkan-sdk list"),
    (_not_carrying, "does not carry toolchain:vulkan-sdk"),
])
def test_a_tampered_report_is_refused_in_one_line_and_nothing_is_pushed(world, tmp_path, monkeypatch, capsys,
                                                                       tamper, says):
    proj, archive, _, api = world
    archive.publish(**MOVED)
    out = tmp_path / "artifact"
    data = evaluate(proj, out, monkeypatch, "toolchain:vulkan-sdk")
    tamper(data["inputs"][0])
    (out / tc.REPORT).write_text(json.dumps(data))
    refused_tampered(proj, api, capsys, out / tc.REPORT, says, "toolchain:vulkan-sdk")


# ---- toolchains.json tampered with as a whole (the roots.json forms), and not a plain file ---------------------------------
def _oversize_text(data):
    data["inputs"][0]["files"][0]["text"] += "#" * (tc.MAX_FILE + 1)
    return json.dumps(data)


def _unknown_field(data):
    data["inputs"][0]["extra"] = 1
    return json.dumps(data)


def _current_with_files(data):
    data["inputs"][0]["state"] = "current"
    return json.dumps(data)


def _a_workflow_file(data):
    data["inputs"][0]["files"][0]["path"] = ".github/workflows/ci.yml"
    return json.dumps(data)


def _twice(data):
    data["inputs"].append(data["inputs"][0])
    return json.dumps(data)


def _other_version(data):
    data["version"] = 2
    return json.dumps(data)


def _not_json(data):
    return json.dumps(data).replace('"version": 1', '"version": NaN')


@pytest.mark.parametrize("tamper, says", [
    (_oversize_text, "text longer than"),
    (_unknown_field, "unknown field 'extra'"),
    (_current_with_files, "a current input carries no new file"),
    (_a_workflow_file, "'.github/workflows/ci.yml' does not carry toolchain:vulkan-sdk"),
    (_twice, "'vulkan-sdk' comes twice"),
    (_other_version, "version"),
    (_not_json, "not a JSON report: NaN is not JSON"),
])
def test_a_toolchains_json_tampered_as_a_whole_is_refused_in_one_line_and_nothing_is_pushed(
        world, tmp_path, monkeypatch, capsys, tamper, says):
    proj, archive, _, api = world
    archive.publish(**MOVED)
    out = tmp_path / "artifact"
    data = evaluate(proj, out, monkeypatch, "toolchain:vulkan-sdk")
    (out / tc.REPORT).write_text(tamper(data))
    refused_tampered(proj, api, capsys, out / tc.REPORT, says, "toolchain:vulkan-sdk")


@pytest.mark.parametrize("form", ["dev_zero", "fifo", "directory", "too_large", "link"])
def test_a_toolchains_json_that_is_not_a_plain_file_is_refused_in_one_line_without_reading_it(
        world, tmp_path, monkeypatch, form):
    """The token holder as its own process under an address-space limit (pins_fixtures.bump_child): a link to
    /dev/zero is never read, a FIFO never blocks, a file past the bound is refused on the bytes read."""
    proj, archive, _, api = world
    archive.publish(**MOVED)
    out = tmp_path / "artifact"
    evaluate(proj, out, monkeypatch, "toolchain:vulkan-sdk")
    refused_unread(proj, api, out / tc.REPORT, tc.MAX_REPORT, form, "toolchain:vulkan-sdk")


# ---- the project's own recipes, copied: the real lists move and stay loadable and equal ----------------------------------
def test_the_projects_recipes_move_alike_and_still_load(tmp_path, monkeypatch):
    """A copy of this checkout's recipes against an archive that holds exactly the pinned SDK files (in the suites
    the issue names: libvulkan1 in bookworm, the rest in trixie) plus a bookworm point release of libvulkan1 and
    newer sid uploads, the sysroot's Debian 12 files in bookworm beside a glibc point release (and newer trixie
    uploads it must not take), and an index that holds the pinned wheels plus newer ones: the edited recipes load with
    the project's loader, the four SDK lists are still one list, and only the moved entries changed."""
    import shutil

    import yaml

    from builders.project import config
    from builders.pins.bump import Options

    copy = tmp_path / "project"
    copy.mkdir()
    for f in ("pins.yaml", "floor.yaml"):  # floor.yaml carries the sysroot
        shutil.copy(TOP / f, copy / f)
    for d in ("recipes", "roots"):
        shutil.copytree(TOP / d, copy / d)
    (copy / "onebit").mkdir()  # recipes/serve.yaml's local source
    inputs = {i.name: i for i in ti.load_inputs(copy)}
    sdk = inputs["vulkan-sdk"]
    suites: dict[str, list[dict]] = {"bookworm": [], "trixie": [], "sid": [], "experimental": []}
    for e in sdk.entries:
        name, version, arch = tm.pool_name(e["path"])
        suite = "bookworm" if name == "libvulkan1" else "trixie"
        suites[suite].append({"Package": name, "Version": version, "Architecture": arch, "Filename": e["path"],
                              "SHA256": e["sha256"]})
        suites["sid"].append(stanza(name, version + "+sid1", arch))
    suites["bookworm"].append(stanza("libvulkan1", "1.3.239.0-1+deb12u1"))
    for e in inputs["sysroot"].entries:  # Debian 12's: a bookworm point release of glibc, newer ones in trixie and sid
        name, version, arch = tm.pool_name(e["path"])
        suites["bookworm"].append({"Package": name, "Version": version, "Architecture": arch, "Filename": e["path"],
                                   "SHA256": e["sha256"]})
        suites["trixie"].append(stanza(name, version + "+trixie1", arch))
    suites["bookworm"].append(stanza("libc6", "2.36-9+deb12u15"))
    archive = tmp_path / "debian"
    for suite, stanzas in suites.items():
        f = archive / "dists" / suite / "main" / "binary-amd64" / "Packages.xz"
        f.parent.mkdir(parents=True)
        f.write_bytes(lzma.compress("\n".join("".join(f"{k}: {v}\n" for k, v in s.items()) for s in stanzas).encode()))
    index = FakeIndex()
    try:
        for inp in (inputs["zig"], inputs["nvcc"]):
            for e in inp.entries:
                pinned = {"filename": f"{e['package'].replace('-', '_')}-{e['version']}-{LINUX}.whl",
                          "packagetype": "bdist_wheel", "digests": {"sha256": e["sha256"]}, "yanked": False}
                index.releases[e["package"]] = {str(e["version"]): [pinned]}
        index.releases["ziglang"]["0.15.3"] = [wheel_file("ziglang", "0.15.3")]
        index.releases["nvidia-cuda-nvcc"]["13.1.80"] = [wheel_file("nvidia-cuda-nvcc", "13.1.80")]
        index.releases["nvidia-cuda-nvcc"]["14.0.1"] = [wheel_file("nvidia-cuda-nvcc", "14.0.1")]
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        files = [*(copy / "recipes").glob("*.yaml"), copy / "floor.yaml"]
        before = {f.name: f.read_text() for f in files}
        world = tw.World(copy, archives=[archive.as_uri()])
        out = {o.pin: o for o in tc.bump_inputs(copy, Options(), names_given=False, world=world)}
    finally:
        index.close()
    assert {k: o.state for k, o in out.items()} == {"toolchain:nvcc": "edited", "toolchain:sysroot": "edited",
                                                    "toolchain:vulkan-sdk": "edited", "toolchain:zig": "edited"}
    # the sysroot moves within bookworm only: never past the floor's glibc
    assert "libc6: 2.36-9+deb12u14 (bookworm) -> 2.36-9+deb12u15 (bookworm)" in out["toolchain:sysroot"].detail
    assert "1 change(s)" in out["toolchain:sysroot"].detail
    assert "libvulkan1: 1.3.239.0-1 (bookworm) -> 1.3.239.0-1+deb12u1 (bookworm)" in out["toolchain:vulkan-sdk"].detail
    assert "1 change(s)" in out["toolchain:vulkan-sdk"].detail  # nothing jumped to sid
    assert "nvidia-cuda-nvcc: 13.0.88 -> 13.1.80" in out["toolchain:nvcc"].detail  # 14.x is another major
    after = {f.name: f.read_text() for f in files}
    changed = sorted(n for n in after if after[n] != before[n])
    assert changed == ["cuda.yaml", "floor.yaml", "hrx.yaml", "lean.yaml", "vulkan.yaml", "zinc.yaml"]
    for n in changed:  # one line per moved entry, and the comments untouched
        diff = [(a, b) for a, b in zip(before[n].splitlines(), after[n].splitlines()) if a != b]
        assert len(before[n].splitlines()) == len(after[n].splitlines())
        assert len(diff) == {"cuda.yaml": 1, "zinc.yaml": 2}.get(n, 1), (n, diff)
        assert all(not a.lstrip().startswith("#") for a, _ in diff)
    moved = {i.name: i for i in ti.load_inputs(copy)}
    assert sorted(moved) == ["nvcc", "sysroot", "vulkan-sdk", "zig"]  # still one SDK list, in the same four recipes
    assert moved["vulkan-sdk"].files == sdk.files
    assert tm.pool_name(moved["vulkan-sdk"].entries[-1]["path"])[1] == "1.3.239.0-1+deb12u1"
    config.load_project(copy)  # the project's loader takes the edited recipes
    assert yaml.safe_load(after["zinc.yaml"])["toolchain"][0]["wheels"][0]["version"] == "0.15.3"
