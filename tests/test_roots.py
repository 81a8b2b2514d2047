"""Build roots: the pin file, a small real root resolved from Debian's index and assembled from real packages, a real
build step run inside it through bubblewrap, the plan's one-line refusal without bubblewrap, an override changing
the build string and the manifest, and the pin bot moving a root against a local Packages index."""
from __future__ import annotations

import io
import json
import lzma
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from builders.project import config
from builders.roots import debs, assemble as roots, sandbox
from builders.inputs import host
from builders.ship import manifest, toolchain_record
from builders.cli import main
from builders.execute import Executor
from builders.plan import all_tools, make_plan
from builders.plan_types import Command, Layout
from builders.roots.root import PATH_INSIDE, build_root
from builders.project.root_pins import ResolvedDeb, diff, describe, render
from mini_project import add_rooted, make_mini

ROOT = Path(__file__).resolve().parent.parent


# ---- pure ------------------------------------------------------------------------------------------------------------
def deb(package: str, version: str, suite: str = "sid") -> ResolvedDeb:
    return ResolvedDeb(package, version, suite, f"pool/main/{package[0]}/{package}/{package}_{version}_amd64.deb",
                       f"{abs(hash((package, version))):064x}"[:64], 1000)


def test_render_keeps_the_hand_written_part_and_replaces_the_closure():
    head = "# why this root\nschema_version: 1\nname: t\nsummary: s\nsuites: [{suite: sid}]\npackages: [a]\n"
    once = render(head, [deb("b", "2.0-1"), deb("a", "1.0-1")], "20261201T000000Z")
    assert once.startswith(head) and once.index("package: \"a\"") < once.index("package: \"b\"")
    twice = render(once, [deb("a", "1.1-1")], "20261202T000000Z")
    assert twice.startswith(head) and "1.0-1" not in twice and twice.count(roots.GENERATED) == 1
    data = yaml.safe_load(twice)
    assert data["snapshot"] == "20261202T000000Z" and [r["version"] for r in data["resolved"]] == ["1.1-1"]


@pytest.mark.parametrize("old, new, lines", [
    ([deb("a", "1.0-1")], [deb("a", "1.0-1")], []),
    ([deb("a", "1.0-1")], [deb("a", "1.1-1")], ["a: 1.0-1 (sid) -> 1.1-1 (sid)"]),
    ([deb("a", "1.0-1")], [deb("a", "1.0-1"), deb("b", "2-1", "experimental")], ["b: added 2-1 (experimental)"]),
    ([deb("a", "1.0-1"), deb("b", "2-1")], [deb("b", "2-1")], ["a: removed 1.0-1 (sid)"]),
])
def test_diff_of_two_closures(old, new, lines):
    assert describe(diff(old, new)) == lines


@pytest.mark.parametrize("present, want", [
    ({"usr/bin/gcc", "usr/bin/g++", "usr/bin/mawk", "usr/bin/dash"},
     {"usr/bin/cc": "gcc", "usr/bin/c++": "g++", "usr/bin/awk": "mawk", "usr/bin/nawk": "mawk", "usr/bin/sh": "dash"}),
    ({"usr/bin/clang", "usr/bin/sh", "usr/bin/bash"}, {"usr/bin/cc": "clang"}),  # a link the packages ship is kept
    (set(), {}),
])
def test_alternatives_a_compile_needs(present, want):
    assert roots.alternatives(lambda rel: rel in present) == want


def test_glibc_of_a_root_is_its_libc6():
    assert roots.glibc_of([deb("libc6", "2.43-7"), deb("zlib1g", "1:1.3-1")]) == "2.43"
    assert roots.glibc_of([deb("busybox-static", "1:1.37.0-6")]) is None


def test_entering_a_root_is_a_bwrap_command_line_with_only_what_is_bound():
    cmd = build_root("strix-sid", "/c/roots/k").wrap(Command(("make", "-C", "/w/b"), cwd="/w/b", env=(("CC", "cc"),),
                                                              path=("/opt/x/bin",)),
                                                      ro=("/w/src",), rw=("/w/b", "/c/ccache"))
    argv = cmd.argv
    i = argv.index("--")
    assert argv[0] == "bwrap" and argv[i + 1:] == ("make", "-C", "/w/b") and "--share-net" not in argv
    pairs = [argv[j:j + 3] for j in range(i) if argv[j] in ("--ro-bind", "--bind", "--symlink", "--setenv")]
    assert ("--ro-bind", "/c/roots/k/usr", "/usr") in pairs and ("--symlink", "usr/lib", "/lib") in pairs
    assert ("--ro-bind", "/w/src", "/w/src") in pairs and ("--bind", "/w/b", "/w/b") in pairs
    assert ("--setenv", "PATH", "/opt/x/bin:" + PATH_INSIDE) in pairs and ("--setenv", "CC", "cc") in pairs
    assert argv[argv.index("--chdir") + 1] == "/w/b" and "--clearenv" in argv


# ---- the plan: refusal without bubblewrap, overrides ------------------------------------------------------------------
PROJECT = config.load_project(ROOT)
LAYOUT = Layout(root=ROOT, cache=Path("/cache"), work=Path("/work/strix"), out=Path("/out/strix"))


def test_without_bubblewrap_the_plan_says_so_in_one_line_and_the_build_refuses_first(monkeypatch, tmp_path, capsys):
    why = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    monkeypatch.setattr(sandbox, "why_unavailable", lambda bwrap=sandbox.BWRAP: why)
    args = ["--root", str(ROOT), "--cache", str(tmp_path / "cache"), "--work", str(tmp_path / "work"),
            "--out", str(tmp_path / "out")]
    assert main([*args, "plan", "strix", "--only", "ds4-rocm", "--only", "lean"]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if "bwrap" in ln]
    assert lines == [f"  - build roots for ds4-rocm (strix-sid), lean-rocm (strix-sid): {why}"], out
    assert main([*args, "build", "strix", "--only", "ds4-rocm"]) == 2
    err = capsys.readouterr().err
    assert "nothing was done" in err and err.count(why) == 1
    assert not (tmp_path / "cache" / "roots").exists() and not (tmp_path / "cache" / "downloads").exists()
    assert not (tmp_path / "work" / "build").exists()


def facts_for(project, env: dict[str, str], tmp_path: Path) -> host.HostFacts:
    """This host's facts (host.gather, for real) with the build root assembled at a fake place: only the
    variables in `env` differ between two runs."""
    assembled = tmp_path / "root"
    for rel in ("usr/bin/hipcc", "usr/lib/x86_64-linux-gnu/libhipblas.so", "usr/bin/make", "usr/bin/cc"):
        (assembled / rel).parent.mkdir(parents=True, exist_ok=True)
        (assembled / rel).write_text("")
    (assembled / ".complete").write_text("x\n")
    tools = [t for t in all_tools(project, "strix") if t.root]
    return host.gather(tools, env=env, roots={"strix-sid": str(assembled)})


def test_a_toolchain_override_changes_the_build_string_and_the_manifest(tmp_path):
    therock = tmp_path / "therock"
    for rel in ("bin/hipcc", "lib/libhipblas.so"):
        (therock / rel).parent.mkdir(parents=True, exist_ok=True)
        (therock / rel).write_text("")
    pinned = make_plan(PROJECT, "strix", facts_for(PROJECT, {}, tmp_path), LAYOUT, only={"ds4-rocm"})
    over = make_plan(PROJECT, "strix", facts_for(PROJECT, {"ONEBIT_DS4_ROCM_TOOLCHAIN": str(therock)}, tmp_path), LAYOUT,
                     only={"ds4-rocm"})
    a, b = (p.step("package:ds4-rocm").data.build_string for p in (pinned, over))
    assert a == "default_h7a751eb_0" and b.startswith("default_h7a751eb_env") and b.endswith("_0") and a != b
    ea, eb = (p.step("stage:ds4-rocm").data.manifest_entry for p in (pinned, over))
    assert ea["toolchain_overrides"] is None and eb["toolchain_overrides"] == {"ONEBIT_DS4_ROCM_TOOLCHAIN": str(therock)}
    assert ea["build_string"] != eb["build_string"] and ea["build_root"] == eb["build_root"]
    assert pinned.step("build:ds4-rocm").key != over.step("build:ds4-rocm").key
    make = over.step("build:ds4-rocm").commands[2]
    assert f"GPU_CC={therock}/bin/hipcc" in " ".join(make.argv) and f"ROCM_PATH={therock}" in make.argv
    assert make.argv[make.argv.index(str(therock)) - 1] == "--ro-bind"  # TheRock is bound into the root, read-only
    assert "GPU_CC=/usr/bin/hipcc" in " ".join(pinned.step("build:ds4-rocm").commands[2].argv)
    manifest.make_manifest("strix", "1", 0, "linux-64", [("ds4-rocm", eb)])  # the schema takes both fields


def test_vulkan_sdk_and_cuda_home_are_overrides_of_their_pinned_inputs(tmp_path):
    sdk = tmp_path / "sdk"
    (sdk / "include/vulkan").mkdir(parents=True)
    (sdk / "include/vulkan/vulkan_core.h").write_text("#define VK_HEADER_VERSION 309\n#define VK_HEADER_VERSION_COMPLETE "
                                                      "VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)\n")
    tool = next(t for t in PROJECT.recipes["vulkan"].variant("default").toolchain if t.tool == "vulkan-sdk")
    pinned = host.detect_tool(tool, {}, tmp_path / "toolchains")
    given = host.detect_tool(tool, {"VULKAN_SDK": str(sdk)}, tmp_path / "toolchains")
    assert (pinned.override, given.override, given.version) == (None, "VULKAN_SDK", "1.4.309")
    variant = PROJECT.recipes["vulkan"].variant("default")
    from builders.plan import build_string, toolchain_overrides

    assert toolchain_overrides(variant, {tool.key: given}) == {"VULKAN_SDK": str(sdk)}
    assert build_string(variant, "0c1e570", 3, {}, {"VULKAN_SDK": str(sdk)}) != build_string(variant, "0c1e570", 3, {})
    cuda = next(t for t in PROJECT.recipes["cuda"].variant(PROJECT.recipes["cuda"].variant_names()[0]).toolchain
                if t.env == "CUDA_HOME")
    assert host.detect_tool(cuda, {"CUDA_HOME": str(tmp_path)}, tmp_path / "toolchains").override == "CUDA_HOME"


# ---- a small real root, entered by a real build step -----------------------------------------------------------------
TINY_ROOT = """\
# a root of one static tool and coreutils (the script kind's install copies with cp), from Debian 13
schema_version: 1
name: tiny
summary: busybox and coreutils from trixie, for the tests
essential: false
suites:
  - {suite: trixie, component: main}
packages: [busybox-static, coreutils, libc-bin]
"""
SCRIPT = ("mkdir -p {prefix}/bin"
          " && printf '#!/usr/bin/busybox sh\\necho hello %s\\n' \"$GREETING\" > {prefix}/bin/hello-root"
          " && chmod 755 {prefix}/bin/hello-root"
          " && /usr/bin/cp --version > {build}/cp-version && id -u > {build}/uid && cat /proc/net/dev > {build}/net"
          " && (touch {source}/written 2>/dev/null && echo writable || echo read-only) > {build}/source"
          " && (ls /root/.cache /home/u 2>/dev/null; true) > {build}/host && echo \"$PATH $HOME\" > {build}/env"
          " && cat {source}/greet.c > {build}/greet.c")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The mini project with roots/tiny.yaml resolved against Debian's real trixie index and a recipe built in it."""
    if sandbox.why_unavailable():
        pytest.fail(f"this test needs bubblewrap: {sandbox.why_unavailable()}")
    base = tmp_path_factory.mktemp("tiny")
    mini = make_mini(base)
    add_rooted(mini, "tiny", TINY_ROOT, summary="built inside a tiny pinned root",
               toolchain=[{"tool": "busybox", "in_root": "/usr/bin/busybox"}, {"tool": "cp", "version": ">=9"}],
               build={"kind": "script", "root": "tiny", "network": "none", "env": {"GREETING": "from the root"},
                      "commands": [["busybox", "sh", "-c", SCRIPT]]},
               stage={"keep": ["bin/hello-root"], "binaries": {"hello-root": "bin/hello-root"}},
               tests=[{"name": "runs inside the root", "run": ["bin/hello-root"], "expect": "hello from the root"}])
    assert main(["--root", str(mini.root), "roots", "resolve", "tiny"]) == 0
    return mini


def test_a_small_real_root_is_resolved_assembled_once_and_entered_by_the_build(tiny, tmp_path):
    pin = config.load_project(tiny.root).roots["tiny"]
    names = {d.package for d in pin.resolved}
    assert {"busybox-static", "coreutils", "libc-bin", "libc6"} <= names and "bash" not in names  # no Essential set
    assert all(d.suite == "trixie" and d.path.startswith("pool/main/") and len(d.sha256) == 64 and d.size > 0
               for d in pin.resolved)
    cache = tmp_path / "cache"
    args = ["--root", str(tiny.root), "--cache", str(cache), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]

    assert main([*args, "fetch", "mini"]) == 0  # fetch assembles the root (a fetch step's sibling)
    dest = pin.dest(cache)
    assert dest.name == pin.key[:16] and (dest / ".complete").is_file()
    meta = json.loads((dest / "onebit-root.json").read_text())
    assert meta["glibc"] == roots.glibc_of(pin.resolved) and meta["key"] == pin.key
    assert sorted(p["package"] for p in meta["packages"]) == sorted(names)
    assert all((dest / link).is_symlink() for link in roots.TOP_LINKS) and (dest / "etc" / "ld.so.cache").is_file()
    assert "nobody:x:65534" in (dest / "etc" / "passwd").read_text()
    # assembled once: the second time is the cache, without download
    assert roots.assemble(pin, cache / "downloads", dest, offline=True) == "cache"

    project = config.load_project(tiny.root)
    lay = Layout(root=tiny.root, cache=cache, work=tmp_path / "work", out=tmp_path / "out")
    facts = host.gather(all_tools(project, "mini"), toolchains=cache / "toolchains",
                        roots={"tiny": str(dest)})
    bb, cp = facts.tools["busybox[tiny]"], facts.tools["cp[tiny]"]
    assert bb.found and bb.path == "/usr/bin/busybox" and bb.root == "/usr"
    assert cp.found and cp.path == "/usr/bin/cp" and int(cp.version.split(".")[0]) >= 9  # asked inside the root
    plan = make_plan(project, "mini", facts, lay)
    assert plan.missing == [] and plan.step("root:tiny").data.dest == str(dest)
    full = list(plan.steps)
    plan.steps = [s for s in plan.steps if s.action in ("fetch", "source", "root", "build", "stage")]
    Executor(plan, project, console=Console(file=io.StringIO())).run()
    # toolchain.json: the root's tools as asked inside it, and the root itself (content address, glibc, packages)
    record = toolchain_record.for_plan(replace(plan, steps=full), project, plan.host.tools, lambda d: {})["variants"]["rooted"]
    assert record["tools"]["cp"] == cp.version and "toolchain_overrides" not in record
    assert (record["build_root"]["key"], record["build_root"]["glibc"]) == (pin.key, meta["glibc"])
    assert len(record["build_root"]["packages"]) == len(pin.resolved)
    build = Path(plan.step("build:rooted").data.build_dir)
    coreutils = next(d.version for d in pin.resolved if d.package == "coreutils").split("-")[0]
    assert f"(GNU coreutils) {coreutils}\n" in (build / "cp-version").read_text()  # the root's cp, not the host's
    assert (build / "uid").read_text().strip() == "65534"
    assert [ln.split(":")[0].strip() for ln in (build / "net").read_text().splitlines()[2:]] == ["lo"]  # network cut
    assert (build / "source").read_text().strip() == "read-only"
    assert (build / "host").read_text() == ""  # nothing of the host but what is bound
    assert (build / "env").read_text().split() == [PATH_INSIDE, sandbox.HOME]
    assert (build / "greet.c").read_text().startswith("#include")  # the pinned, patched checkout, read through the bind
    stage = plan.step("stage:rooted").data
    staged = Path(stage.prefix) / "bin" / "hello-root"
    assert staged.read_text() == "#!/usr/bin/busybox sh\necho hello from the root\n"  # and its test ran inside the root
    assert stage.manifest_entry["build_root"] == {"name": "tiny", "key": pin.key[:16]}
    manifest.make_manifest("mini", "1.0", 0, "linux-64", [("cpu", stage.manifest_entry)])


def test_a_root_is_fetched_from_the_snapshot_archive_when_the_archive_dropped_it(tiny, tmp_path, monkeypatch):
    """A pool path gone from every archive is found at the root's snapshot timestamp (a local stand-in for the snapshot
    archive: <base>/<timestamp>/pool/...), verified by sha256 like any download."""
    pin = config.load_project(tiny.root).roots["tiny"]
    one = next(d for d in pin.resolved if d.package == "libc-bin")
    real = debs.fetch(roots.deb_input(one), tmp_path / "real")
    snap = tmp_path / "snapshot"
    (snap / pin.snapshot / Path(one.path).parent).mkdir(parents=True)
    (snap / pin.snapshot / one.path).write_bytes(real.read_bytes())
    monkeypatch.setenv(roots.SNAPSHOT_ENV, f"file://{snap}")
    archives = roots.archives_for(replace(pin, resolved=(one,)), {roots.SNAPSHOT_ENV: f"file://{snap}",
                                                                   debs.MIRROR_ENV: f"file://{tmp_path}/empty"})
    assert archives[0] == f"file://{tmp_path}/empty" and archives[-1] == f"file://{snap}/{pin.snapshot}"
    got = debs.fetch(roots.deb_input(one), tmp_path / "downloads", archives=[f"file://{tmp_path}/empty", archives[-1]])
    assert got.read_bytes() == real.read_bytes()


# ---- the pin bot moves a root against a local Packages index -------------------------------------------------------------
def packages(*entries: tuple[str, str, str]) -> bytes:
    text = "\n".join(f"Package: {n}\nVersion: {v}\nArchitecture: amd64\n" + (f"Depends: {d}\n" if d else "")
                     + f"Filename: pool/main/{n[0]}/{n}/{n}_{v}_amd64.deb\nSize: 100\nSHA256: {'a' * 63}{len(v) % 10}\n"
                     for n, v, d in entries)
    return lzma.compress(text.encode())


def test_the_pin_bot_moves_a_root_reports_the_drift_and_holds_a_rollback(tmp_path, monkeypatch, capsys):
    mirror = tmp_path / "mirror"
    index = mirror / "dists" / "sid" / "main" / "binary-amd64" / "Packages.xz"
    index.parent.mkdir(parents=True)
    index.write_bytes(packages(("app", "1.0-1", "libx1"), ("libx1", "1.0-1", "")))
    monkeypatch.setenv(debs.MIRROR_ENV, f"file://{mirror}")
    project = tmp_path / "project"
    (project / "roots").mkdir(parents=True)
    (project / "pins.yaml").write_text((ROOT / "pins.yaml").read_text())
    head = "schema_version: 1\nname: t\nsummary: test\nessential: false\nsuites: [{suite: sid}]\npackages: [app]\n"
    (project / "roots" / "t.yaml").write_text(head)
    args = ["--root", str(project), "pins", "bump", "root:t"]

    assert main(args) == 0  # first resolution: everything is added
    first = yaml.safe_load((project / "roots" / "t.yaml").read_text())
    assert [(r["package"], r["version"]) for r in first["resolved"]] == [("app", "1.0-1"), ("libx1", "1.0-1")]
    assert (project / "roots" / "t.yaml").read_text().startswith(head)

    index.write_bytes(packages(("app", "1.1-1", "libx1 (>= 1.1), liby"), ("libx1", "1.1-1", ""), ("liby", "2-1", "")))
    capsys.readouterr()
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would-propose" in out and "app: 1.0-1 (sid) -> 1.1-1 (sid)" in out and "liby: added 2-1 (sid)" in out
    assert yaml.safe_load((project / "roots" / "t.yaml").read_text()) == first  # a dry run writes nothing
    assert main(args) == 0
    moved = yaml.safe_load((project / "roots" / "t.yaml").read_text())
    assert {r["package"]: r["version"] for r in moved["resolved"]} == {"app": "1.1-1", "libx1": "1.1-1", "liby": "2-1"}
    assert main(args) == 0 and "current" in capsys.readouterr().out

    index.write_bytes(packages(("app", "1.0-1", "libx1"), ("libx1", "1.0-1", "")))  # the suite went back
    assert main(args) == 1
    out = capsys.readouterr()
    assert "held" in out.out and "app: 1.1-1 (sid) -> 1.0-1 (sid)" in out.out
    assert yaml.safe_load((project / "roots" / "t.yaml").read_text()) == moved  # held: unchanged

    index.write_bytes(packages(("other", "1-1", "")))  # the requested package left the suite
    assert main(args) == 1
    assert "refused" in capsys.readouterr().out


def test_a_pinned_toolchain_input_of_a_rooted_variant_is_bound_into_the_root(tmp_path):
    """The Vulkan SDK (pinned Debian packages, assembled in the cache) of a variant that builds in a root stays a
    toolchain input: its toolchain step, and its root bound read-only into the build root."""
    import copy

    recipe = PROJECT.recipes["vulkan"]
    data = copy.deepcopy(recipe.data)
    data["build"]["root"] = "strix-sid"
    project = replace(PROJECT, recipes={**PROJECT.recipes, "vulkan": replace(recipe, data=data)})
    facts = host.gather([t for t in all_tools(project, "vulkan")], env={}, toolchains=tmp_path / "toolchains",
                        roots={"strix-sid": str(tmp_path / "root")})
    sdk = next(f for k, f in facts.tools.items() if k.startswith("vulkan-sdk"))
    assert sdk.root.startswith(str(tmp_path / "toolchains")) and sdk.fetchable
    plan = make_plan(project, "vulkan", facts, replace(LAYOUT, cache=tmp_path))
    assert "toolchain:vulkan-sdk" in [s.id for s in plan.steps] and "root:strix-sid" in [s.id for s in plan.steps]
    argv = plan.step("build:vulkan").commands[0].argv
    assert argv[argv.index(sdk.root) - 1] == "--ro-bind"
