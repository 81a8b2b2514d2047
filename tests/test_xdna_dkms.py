"""The amdxdna DKMS source package (recipes/xdna.yaml, docs/npu.md) proven for real: `1bit-build build strix --only
xdna` stages libexec/onebit/xdna/dkms/xrt-amdxdna-<version>/ (upstream's /usr/src tree, from the pinned and patched
checkout), and `dkms build <that directory>` (what `dkms install` runs before installing) builds amdxdna.ko inside
the pinned root roots/xdna-dkms.yaml, as uid 0, for every kernel whose headers that root holds (Debian sid's 7.2.13,
experimental's 7.3): each module's vermagic names its kernel and its version the pinned commit.
A copy of the project with one recipe patch added shows that the patch reaches the DKMS tree."""
from __future__ import annotations

import difflib
import re
import shutil
import time
from pathlib import Path

import pytest
from packaging.version import Version
from strix_root import PROJECT, build_strix

from builders.roots import assemble as roots, sandbox
from builders.io import tarball
from builders.session import default_cache

pytestmark = pytest.mark.e2e
ROOT_NAME = "xdna-dkms"
SUBTREE = "libexec/onebit/xdna"
DKMS = f"{SUBTREE}/dkms"
NAME = "xrt-amdxdna"  # PACKAGE_NAME: upstream's (CMake/pkg_driver_source.cmake:49)
PATH_INSIDE = "/usr/local/bin:/usr/bin:/usr/sbin"
DRV = "drivers/accel/amdxdna/amdxdna_pci_drv.c"


def _root_pin():
    found, problems = roots.load_roots(PROJECT / "roots")
    assert not problems, problems
    return found[ROOT_NAME]


def kernels() -> list[str]:
    """The kernel releases whose headers roots/xdna-dkms.yaml asks for (linux-headers-<release>[/suite])."""
    return [m.group(1) for p in _root_pin().packages
            if (m := re.fullmatch(r"linux-headers-(\d[^/]*-amd64)(?:/[a-z0-9-]+)?", p))]


@pytest.fixture(scope="module")
def xdna(tmp_path_factory, request):
    """The xdna variant built from the project as it is: (staged prefix, its one DKMS directory, the checkout it was
    built from, the pinned commit, the bundle's out dir)."""
    base = tmp_path_factory.mktemp("xdna-dkms")
    plan, layout = build_strix(base, {"xdna"}, request)
    staged = layout.staged_prefix("xdna")
    (pkg,) = sorted((staged / DKMS).iterdir())
    source = plan.step("build:xdna").data.source_dir
    commit = next(plan.step(n) for n in plan.step("build:xdna").needs if n.startswith("source:")).data.commit
    return staged, pkg, Path(source), commit, layout.out


@pytest.fixture(scope="module")
def dkms_root() -> Path:
    """roots/xdna-dkms.yaml assembled into the project cache (~115 MiB of .debs, downloaded once)."""
    pin = _root_pin()
    cache = default_cache()
    dest = pin.dest(cache)
    roots.assemble(pin, cache / "downloads", dest)
    return dest


def _conf(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"^([A-Z_]+(?:\[\d+\])?)=(.*)$", text, re.M)}


def _modver(source: Path, commit: str) -> tuple[str, str]:
    """(PACKAGE_VERSION, MODULE_VERSION) as the recipe derives them from the checkout and its XDNA_DATE."""
    from builders.project import config

    date = config.load_project(PROJECT).recipes["xdna"].data["build"]["env"]["XDNA_DATE"]
    (base,) = re.findall(r"^XDNA_DRIVER_VERSION \?= *(\S+)$", (source / "drivers/accel/amdxdna/Makefile").read_text(), re.M)
    return f"{base}+git{date}.{commit[:7]}", f"{base}_{date},{commit}"


def test_the_tree_is_upstreams_from_the_checkout(xdna):
    staged, pkg, source, commit, _ = xdna
    version, modver = _modver(source, commit)
    assert pkg.name == f"{NAME}-{version}"
    conf = _conf((pkg / "dkms.conf").read_text())
    template = (source / "drivers/accel/CMake/config/dkms.conf.in").read_text()
    assert "@" not in (pkg / "dkms.conf").read_text()
    # every field upstream's template sets, plus the ones its @MODULE_DRV@ expands to
    assert set(_conf(template)) | {"BUILT_MODULE_NAME[0]", "BUILT_MODULE_LOCATION[0]", "DEST_MODULE_LOCATION[0]"} == set(conf)
    assert (conf["PACKAGE_NAME"], conf["PACKAGE_VERSION"], conf["BUILT_MODULE_NAME[0]"]) == (NAME, version, "amdxdna")
    assert conf["PRE_BUILD"] == "./configure_kernel.sh" and conf["AUTOINSTALL"] == "yes"
    script = pkg / "configure_kernel.sh"
    assert script.read_bytes() == (source / "drivers/accel/tools/configure_kernel.sh").read_bytes()
    assert script.stat().st_mode & 0o111
    # the sources are the checkout's (where the recipe's patches are applied), byte for byte, but MODULE_VERSION
    shipped = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file())
    ours = sorted(p.relative_to(source).as_posix() for d in ("drivers/accel/amdxdna", "include")
                  for p in (source / d).rglob("*") if p.is_file())
    assert shipped == sorted(ours + ["dkms.conf", "configure_kernel.sh"])
    for rel in ours:
        if rel != DRV:
            assert (pkg / rel).read_bytes() == (source / rel).read_bytes(), rel
    diff = [line for line in difflib.unified_diff((source / DRV).read_text().splitlines(),
                                                  (pkg / DRV).read_text().splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert diff == ['-MODULE_VERSION("0.1");', f'+MODULE_VERSION("{modver}");'], diff
    # the prebuilt module for the pinned headers stays
    assert (staged / SUBTREE / "lib/modules/amdxdna.ko").is_file()


def test_the_bundle_tarball_carries_it_executable(xdna):
    _, pkg, _, _, out = xdna
    (tar,) = sorted(out.glob("onebit-strix-*.tar.zst"))
    modes = {info.name: info.mode for info, _ in tarball.members(tar)}
    where = next(n for n in modes if n.endswith(f"{DKMS}/{pkg.name}/dkms.conf")).removesuffix("/dkms.conf")
    assert modes[f"{where}/configure_kernel.sh"] == 0o755
    assert modes[f"{where}/dkms.conf"] == 0o644
    assert f"{where}/{DRV}" in modes


def test_the_root_offers_two_kernels_from_6_14():
    found = kernels()
    assert len(found) >= 2, found
    assert all(Version(re.match(r"\d+\.\d+(\.\d+)?", k).group(0)) >= Version("6.14") for k in found), found


@pytest.mark.parametrize("kernel", kernels())
def test_dkms_builds_it_for_the_kernel(xdna, dkms_root, tmp_path, kernel):
    """What a distribution's DKMS package does (dh_dkms: the tree in /usr/src/<name>-<version>, then `dkms add -m -v`),
    then `dkms build` against /usr/src/linux-headers-<kernel>; dkms's own trees in tmp_path (the root's /usr is
    read-only). As the sandbox's unprivileged user: only `dkms install` (which loads nothing here) needs root."""
    _, pkg, source, commit, _ = xdna
    version, modver = _modver(source, commit)
    release = (dkms_root / f"usr/src/linux-headers-{kernel}/include/config/kernel.release").read_text().strip()
    assert release == kernel
    trees = f'--dkmstree "{tmp_path}/var" --sourcetree "{tmp_path}/src"'
    script = (f'set -e; mkdir -p "{tmp_path}/var" "{tmp_path}/src"; cp -r "$1" "{tmp_path}/src/{NAME}-{version}"; '
              f'dkms {trees} add -m {NAME} -v {version}; '
              f'dkms {trees} build -m {NAME} -v {version} -k "$2" --kernelsourcedir "/usr/src/linux-headers-$2"; '
              f'dkms {trees} status')
    sb = sandbox.Sandbox(env={"PATH": PATH_INSIDE, "LANG": "C.UTF-8"}, cwd=str(tmp_path), root=str(dkms_root),
                         ro=(str(pkg),), rw=(str(tmp_path),), timeout=3600)
    started = time.monotonic()
    proc = sandbox.run(sb, ["bash", "-c", script, "dkms-build", str(pkg), kernel])
    print(f"dkms build {NAME}/{version} for {kernel}: {time.monotonic() - started:.0f} s")
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("var/*/*/build/make.log"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    assert f"{NAME}/{version}, {kernel}, x86_64: built" in proc.stdout, proc.stdout
    assert (tmp_path / "src" / f"{NAME}-{version}" / "dkms.conf").is_file()  # the tree, as in /usr/src
    (ko,) = (tmp_path / "var" / NAME / version / kernel / "x86_64" / "module").glob("amdxdna.ko*")

    def modinfo(field: str) -> list[str]:
        look = sandbox.Sandbox(env={"PATH": PATH_INSIDE, "LANG": "C.UTF-8"}, cwd=str(tmp_path), root=str(dkms_root),
                               ro=(str(ko),), timeout=300)
        got = sandbox.run(look, ["modinfo", "-F", field, str(ko)])
        assert got.returncode == 0, got.stderr
        return got.stdout.splitlines()

    (vermagic,) = modinfo("vermagic")
    assert vermagic.split()[0] == kernel, vermagic
    assert modinfo("version") == [modver]
    assert "pci:v00001022d000017F0sv*sd*bc*sc*i*" in modinfo("alias")  # Strix Halo's NPU


def test_a_recipe_patch_reaches_the_dkms_tree(xdna, tmp_path, request, monkeypatch):
    """The project copied with one patch added to recipes/xdna.yaml: the DKMS tree carries the patched source."""
    import strix_root

    _, _, source, _, _ = xdna
    copy = tmp_path / "project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns(".git", ".nox", "__pycache__", "*.lock", ".venv"))
    old = (source / DRV).read_text()
    assert old.count('MODULE_DESCRIPTION("amdxdna driver");') == 1
    new = old.replace('MODULE_DESCRIPTION("amdxdna driver");', 'MODULE_DESCRIPTION("amdxdna driver, patched");')
    patch = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                         f"a/{DRV}", f"b/{DRV}"))
    (copy / "recipes/patches/xdna").mkdir(parents=True)
    (copy / "recipes/patches/xdna/0001-test-description.patch").write_text(f"diff --git a/{DRV} b/{DRV}\n{patch}")
    recipe = copy / "recipes/xdna.yaml"
    text = recipe.read_text()
    assert "  pin: xdna-driver\n" in text
    recipe.write_text(text.replace("  pin: xdna-driver\n", "  pin: xdna-driver\n  patches:\n"
                                   "    - {file: 0001-test-description.patch, purpose: a test, upstream: not for upstream}\n"))
    monkeypatch.setattr(strix_root, "PROJECT", copy)
    plan, layout = build_strix(tmp_path / "b", {"xdna"}, request)
    assert plan.step("build:xdna").data.source_dir != str(source)  # a patched checkout of its own
    (pkg,) = sorted((layout.staged_prefix("xdna") / DKMS).iterdir())
    assert 'MODULE_DESCRIPTION("amdxdna driver, patched");' in (pkg / DRV).read_text()
