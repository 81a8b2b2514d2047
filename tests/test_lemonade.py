"""Lemonade's contract: archives from a real (gcc-built) prefix, the fragment, and `1bit-build lemonade install`."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from builders.project.config import file_sha256
from builders.cli import main
from builders.errors import OnebitError
from builders.inputs import toolchain
from builders.project import yamlio
from builders.plan_types import RuntimeData
from builders.release import lemonade, lemonade_archives, lemonade_install

TAG = "v2026.48"
MTIME = 1767225600


def build_prefix(root: Path, variants=("cpu", "vulkan")) -> Path:
    """A prefix in the per-backend layout with a real llama-server linked against a real library via $ORIGIN/../lib."""
    prefix = root / "prefix"
    src = root / "src"
    src.mkdir(parents=True)
    (src / "ggml.c").write_text('const char *ggml_name(void) { return "ggml"; }\n')
    (src / "main.c").write_text('#include <stdio.h>\nconst char *ggml_name(void);\n'
                                'int main(void) { printf("server on %s\\n", ggml_name()); return 0; }\n')
    backends = {}
    for v in variants:
        base = prefix / "libexec/onebit" / v
        (base / "lib").mkdir(parents=True)
        (base / "bin").mkdir()
        lib = base / "lib/libggml.so.0"
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libggml.so.0", "-o", lib, src / "ggml.c"], check=True)
        (base / "lib/libggml.so").symlink_to("libggml.so.0")
        subprocess.run(["gcc", "-o", base / "bin/llama-server", src / "main.c", "-L", base / "lib", "-lggml",
                        "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib"], check=True)
        (base / "bin/llama-cli").write_bytes((base / "bin/llama-server").read_bytes())
        backends[v] = {"recipe": v, "package": f"onebit-{v}", "version": "2026.48", "build_number": 0,
                       "root": f"libexec/onebit/{v}", "adapter": "llama-server",
                       "binaries": {"llama-server": f"libexec/onebit/{v}/bin/llama-server"}}
    backends["serve"] = {"recipe": "serve", "binaries": {"1bit": "bin/1bit"}, "adapter": "npu"}
    (prefix / "share/onebit").mkdir(parents=True)
    (prefix / "share/onebit/manifest.json").write_text(json.dumps({"backends": backends}))
    return prefix


# what NVIDIA's CUDA 13.0.2 wheels ship for the cuda variant (recipes/cuda.yaml `ship`), by package
CUDA_RUNTIME = {"nvidia-cuda-runtime": ("13.0.96", ("libcudart.so.13",)),
                "nvidia-cublas": ("13.1.0.3", ("libcublas.so.13", "libcublasLt.so.13"))}


def toolkit_root(root: Path, *, override: bool = False) -> Path:
    """A toolchain root as builders/inputs/toolchain.py leaves one: real shared libraries in lib/, each wheel's license text
    in licenses/<package>/ and onebit-toolchain.json naming them (or, for an override toolkit of one's own, only
    EULA.txt, as NVIDIA's installers lay it down)."""
    (root / "lib").mkdir(parents=True)
    (root / "stub.c").write_text("int cuda_stand_in(void) { return 13; }\n")
    wheels = []
    for package, (version, libs) in CUDA_RUNTIME.items():
        for lib in libs:
            subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{lib}", "-o", root / "lib" / lib, root / "stub.c"],
                           check=True)
        lic = root / "licenses" / package / "License.txt"
        lic.parent.mkdir(parents=True)
        lic.write_text(f"NVIDIA Software License Agreement ({package})\n")
        wheels.append({"package": package, "version": version, "sha256": hashlib.sha256(package.encode()).hexdigest(),
                       "license": "LicenseRef-NVIDIA-Proprietary",
                       "license_files": [f"licenses/{package}/License.txt"],
                       "ship": {lib: file_sha256(root / "lib" / lib) for lib in libs}})
    if override:
        (root / "EULA.txt").write_text("End User License Agreement (CUDA Toolkit)\n")
    else:
        (root / toolchain.METADATA).write_text(json.dumps({"wheels": wheels}))
    return root


def ship_cuda_runtime(prefix: Path, root: Path, variant: str = "cuda") -> list[str]:
    """The variant's subtree as the stage step leaves it: toolchain.ship, for real, of cudart, cuBLAS, cuBLASLt."""
    return toolchain.ship(prefix / "libexec/onebit" / variant,
                          [RuntimeData(str(root), package, libs) for package, (_, libs) in CUDA_RUNTIME.items()])


@pytest.fixture
def licenses(tmp_path):
    (tmp_path / "LICENSE").write_text("Apache-2.0\n")
    (tmp_path / "NOTICE").write_text("1bit engine\n")
    (tmp_path / "llama.cpp-LICENSE").write_text("MIT\n")
    return {"LICENSE": tmp_path / "LICENSE", "NOTICE": tmp_path / "NOTICE",
            "licenses/llama.cpp/LICENSE": tmp_path / "llama.cpp-LICENSE"}


SETTINGS = lemonade.Settings(repos={"cpu": "ggml-org/llama.cpp", "vulkan": "ggml-org/llama.cpp",
                                     "rocm-stable": "lemonade-sdk/llama.cpp", "cuda": "lemonade-sdk/llama.cpp"},
                              therock="7.14", cuda_arch=("sm_90", "sm_120"))


# the names Lemonade 11.7.0 asks for on Linux x86_64 (llamacpp_server.cpp get_install_params), with its TheRock 7.14.0
@pytest.mark.parametrize("backend, kw, name", [
    ("cpu", {}, "llama-v2026.48-bin-ubuntu-x64.tar.gz"),
    ("vulkan", {}, "llama-v2026.48-bin-ubuntu-vulkan-x64.tar.gz"),
    ("rocm-stable", {"therock": "7.14"}, "llama-v2026.48-bin-ubuntu-rocm-7.14-x64.tar.gz"),
    ("cuda", {"cuda_arch": "sm_120"}, "llama-v2026.48-ubuntu-cuda-sm_120-x64.tar.xz"),
])
def test_names_round_trip(backend, kw, name):
    assert lemonade.asset_name(backend, TAG, **kw) == name
    parsed = lemonade.parse_name(name)
    assert (parsed.tag, parsed.recipe, parsed.backend) == (TAG, "llamacpp", backend)


@pytest.mark.parametrize("backend, kw", [("rocm-stable", {}), ("rocm-stable", {"therock": "7"}),
                                         ("rocm-stable", {"therock": "7.14.0"}), ("cuda", {"cuda_arch": "120"}),
                                         ("hrx", {}), ("lean-vulkan", {}), ("Bad/Name", {})])
def test_names_refused(backend, kw):
    with pytest.raises(OnebitError):
        lemonade.asset_name(backend, TAG, **kw)


@pytest.mark.parametrize("name", [
    "llama-v2026.48-bin-ubuntu-hrx-x64.tar.gz",  # Lemonade has no hrx or lean-vulkan llamacpp backend
    "llama-v2026.48-bin-ubuntu-lean-vulkan-x64.tar.gz",
    "llama-v2026.48-ubuntu-x64.tar.gz",  # cpu is bin-ubuntu
    "llama-v2026.48-bin-ubuntu-x64.tar.xz",
    "llama-v2026.48-bin-ubuntu-cuda-sm_90-x64.tar.xz",  # cuda is ubuntu-cuda, .tar.xz
    "llama-v2026.48-ubuntu-cuda-sm_90-x64.tar.gz",
    "llama-v2026.48-bin-ubuntu-rocm-7-x64.tar.gz",
    "llama-v2026-48-bin-ubuntu-x64.tar.gz",
    "llama-../x-bin-ubuntu-x64.tar.gz",
])
def test_names_lemonade_never_asks_for_are_refused(name):
    with pytest.raises(OnebitError, match="not the name of a Lemonade llama.cpp archive"):
        lemonade.parse_name(name)


@pytest.mark.parametrize("env, expected", [
    ({"LEMONADE_CACHE_DIR": "/a", "CACHE_DIRECTORY": "/b", "XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/a"),
    ({"CACHE_DIRECTORY": "/b", "XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/b"),
    ({"XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/c/lemonade"),
    ({"HOME": "/h"}, "/h/.cache/lemonade"),
    ({"LEMONADE_CACHE_DIR": "", "HOME": "/h"}, "/h/.cache/lemonade"),
])
def test_cache_dir(env, expected):
    assert lemonade_install.cache_dir(env) == Path(expected)


@pytest.mark.parametrize("name, problem", [("../x", True), ("/etc/x", True), ("top/../../x", True), ("top/a/b", False),
                                           ("", True)])
def test_member_problem(name, problem):
    # lemonade install refuses what every other unpacking step refuses (builders/io/archives.py)
    assert (lemonade_install.member_problem(name) is not None) == problem


def test_archives_hold_the_contract_and_are_deterministic(tmp_path, licenses):
    prefix = build_prefix(tmp_path, ("cpu", "cuda", "hrx", "lean-rocm", "lean-vulkan", "vulkan"))
    made = lemonade_archives.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME, settings=SETTINGS)
    # only the backends Lemonade has a slot for; hrx and lean-vulkan reach it through the onebit backend
    assert [(v, b, p.name) for v, b, p in made] == [
        ("cpu", "cpu", "llama-v2026.48-bin-ubuntu-x64.tar.gz"),
        ("cuda", "cuda", "llama-v2026.48-ubuntu-cuda-sm_90-x64.tar.xz"),
        ("cuda", "cuda", "llama-v2026.48-ubuntu-cuda-sm_120-x64.tar.xz"),
        ("lean-rocm", "rocm-stable", "llama-v2026.48-bin-ubuntu-rocm-7.14-x64.tar.gz"),
        ("vulkan", "vulkan", "llama-v2026.48-bin-ubuntu-vulkan-x64.tar.gz")]
    for _, _, path in made:
        assert lemonade_archives.contract_problems(path) == []
        with tarfile.open(path) as tar:
            names = tar.getnames()
            assert {m.mtime for m in tar.getmembers()} == {MTIME}
        top = path.name.removesuffix(".tar.gz").removesuffix(".tar.xz")
        assert names == sorted(names)
        assert f"{top}/bin/llama-server" in names and f"{top}/lib/libggml.so.0" in names
        assert f"{top}/licenses/llama.cpp/LICENSE" in names
    assert made[0][2].read_bytes()[4:8] == b"\0\0\0\0"  # gzip header mtime 0
    again = lemonade_archives.make_archives(prefix, tmp_path / "out2", TAG, licenses, mtime=MTIME, settings=SETTINGS)
    assert [p.read_bytes() for *_, p in made] == [p.read_bytes() for *_, p in again]

    frag = lemonade_archives.fragment(SETTINGS, TAG, [p for *_, p in made])
    assert frag["llamacpp"] == {"cpu": TAG, "cuda": TAG, "rocm-stable": TAG, "vulkan": TAG}
    # each checksum under the repository Lemonade downloads that backend from, where it looks it up
    sums = frag["checksums"]["github"]
    assert sorted(sums) == ["ggml-org/llama.cpp", "lemonade-sdk/llama.cpp"]
    assert sorted(sums["ggml-org/llama.cpp"][TAG]) == ["llama-v2026.48-bin-ubuntu-vulkan-x64.tar.gz",
                                                       "llama-v2026.48-bin-ubuntu-x64.tar.gz"]
    assert sorted(sums["lemonade-sdk/llama.cpp"][TAG]) == ["llama-v2026.48-bin-ubuntu-rocm-7.14-x64.tar.gz",
                                                           "llama-v2026.48-ubuntu-cuda-sm_120-x64.tar.xz",
                                                           "llama-v2026.48-ubuntu-cuda-sm_90-x64.tar.xz"]
    assert sums["ggml-org/llama.cpp"][TAG]["llama-v2026.48-bin-ubuntu-x64.tar.gz"] == \
        "sha256:" + hashlib.sha256(made[0][2].read_bytes()).hexdigest()


def test_the_cuda_archive_carries_what_it_ships_from_the_toolkit_with_its_license(tmp_path, licenses):
    prefix = build_prefix(tmp_path, ("cpu", "cuda"))
    shipped = ship_cuda_runtime(prefix, toolkit_root(tmp_path / "tk"))
    made = {v: p for v, _, p in lemonade_archives.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME,
                                                       settings=SETTINGS)}
    cuda, cpu = made["cuda"], made["cpu"]  # one archive each for sm_90 and sm_120: the same tree
    top = cuda.name.removesuffix(".tar.xz")
    with tarfile.open(cuda) as tar:
        names = tar.getnames()
        doc = json.loads(tar.extractfile(f"{top}/{toolchain.REDISTRIBUTABLES}").read())
    # cudart, cuBLAS and cuBLASLt, their license texts and the file naming them, beside one llama-server
    assert {f"{top}/{rel}" for rel in shipped} <= set(names)
    assert f"{top}/share/licenses/nvidia-cublas/License.txt" in names and f"{top}/lib/libcublasLt.so.13" in names
    assert [n for n in names if n.endswith("/llama-server")] == [f"{top}/bin/llama-server"]
    assert lemonade_archives.contract_problems(cuda) == []
    with tarfile.open(cpu) as tar:  # a variant that ships nothing from a toolchain carries no share/
        assert not [n for n in tar.getnames() if "/share/" in n]
    again = lemonade_archives.make_archives(prefix, tmp_path / "out2", TAG, licenses, mtime=MTIME, settings=SETTINGS)
    assert {p.name: p.read_bytes() for *_, p in again} == {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}

    # installed as Lemonade installs it, redistributables.json still names what lies beside it, byte for byte
    inst = lemonade_install.install(cuda, tmp_path / "lemonade")
    named = json.loads((inst / toolchain.REDISTRIBUTABLES).read_text())
    assert named == doc and {e["package"] for e in named["redistributables"]} == set(CUDA_RUNTIME)
    for e in named["redistributables"]:
        assert all((inst / rel).read_text().startswith("NVIDIA Software License") for rel in e["license_files"])
        assert {rel: file_sha256(inst / rel) for rel in e["files"]} == e["files"]


def test_an_archive_never_ships_a_redistributable_without_its_license(tmp_path, licenses):
    prefix = build_prefix(tmp_path, ("cuda",))
    ship_cuda_runtime(prefix, toolkit_root(tmp_path / "tk"))
    (prefix / "libexec/onebit/cuda/share/licenses/nvidia-cublas/License.txt").unlink()
    with pytest.raises(OnebitError, match=r"redistributables.json names share/licenses/nvidia-cublas/License.txt "
                                          r"\(nvidia-cublas\), which is not there"):
        lemonade_archives.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME, settings=SETTINGS)
    # and an archive made some other way is caught by the contract check
    from builders.io import tarball
    sub = prefix / "libexec/onebit/cuda"
    entries = {rel: tarball.Entry(src=sub / rel) for rel in ("bin/llama-server", "lib/libcublas.so.13",
                                                             toolchain.REDISTRIBUTABLES)}
    entries.update({name: tarball.Entry(src=path) for name, path in licenses.items()})
    bad = tarball.write(tmp_path / "llama-v2026.48-ubuntu-cuda-sm_90-x64.tar.xz", "top", entries, mtime=MTIME)
    problems = lemonade_archives.contract_problems(bad)
    assert any("names lib/libcudart.so.13 (nvidia-cuda-runtime), which is not there" in p for p in problems)
    assert any("names share/licenses/nvidia-cublas/License.txt" in p for p in problems)


def test_the_rocm_and_cuda_archives_need_their_names_configured(tmp_path, licenses):
    prefix = build_prefix(tmp_path, ("lean-rocm",))
    with pytest.raises(OnebitError, match="TheRock major.minor"):
        lemonade_archives.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME, settings=lemonade.Settings())
    prefix = build_prefix(tmp_path / "c", ("cuda",))
    with pytest.raises(OnebitError, match="none is configured"):
        lemonade_archives.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME, settings=lemonade.Settings())
    with pytest.raises(OnebitError, match="no download repository for Lemonade's cpu backend"):
        lemonade_archives.fragment(lemonade.Settings(), TAG, [tmp_path / "llama-v2026.48-bin-ubuntu-x64.tar.gz"])


RELEASE_YAML = """repo: o/r
lemonade:
  read_from: lemonade-sdk/lemonade@e385039e
  therock: "7.14"
  download_repo:
    cpu: ggml-org/llama.cpp
    cuda: lemonade-sdk/llama.cpp
  cuda_arch: [sm_90]
"""


def test_settings_from_release_yaml():
    doc = yamlio.load_text(RELEASE_YAML, "release.yaml")
    got = lemonade.settings(doc, {})
    assert got == lemonade.Settings(repos={"cpu": "ggml-org/llama.cpp", "cuda": "lemonade-sdk/llama.cpp"},
                                    therock="7.14", cuda_arch=("sm_90",), read_from="lemonade-sdk/lemonade@e385039e")
    # one download repository for every backend: the environment, or one string
    assert set(lemonade.settings(doc, {"ONEBIT_LEMONADE_REPO": "me/mirror"}).repos.values()) == {"me/mirror"}
    one = lemonade.settings(yamlio.load_text("lemonade:\n  download_repo: me/mirror\n", "release.yaml"), {})
    assert one.repos == {b: "me/mirror" for b in ("cpu", "cuda", "rocm-stable", "vulkan")}
    assert lemonade.settings(None, {}) == lemonade.Settings()


@pytest.mark.parametrize("text, line, match", [
    ("lemonade:\n  therock: 7.14\n", 2, "major.minor in quotes"),
    ("lemonade:\n  therock: '7.14.0'\n", 2, "major.minor"),
    ("lemonade:\n  download_repo:\n    hrx: a/b\n", 3, "no llamacpp backend 'hrx'"),
    ("lemonade:\n  download_repo:\n    cpu: nope\n", 3, "not owner/name"),
    ("lemonade:\n  cuda_arch: [90]\n", 2, "sm_xx"),
    ("lemonade:\n  rocm: '7.1'\n", 2, "unknown key 'rocm'"),
    ("lemonade: [1]\n", 1, "must be a mapping"),
])
def test_settings_refuse_with_file_and_line(text, line, match):
    with pytest.raises(OnebitError, match=match) as e:
        lemonade.settings(yamlio.load_text(text, "release.yaml"), {})
    assert str(e.value).startswith(f"release.yaml:{line}: ")


def test_the_projects_release_yaml_reads():
    root = Path(__file__).resolve().parent.parent
    got = lemonade.settings(yamlio.load(root / "release.yaml"), {})
    assert got.therock and set(got.repos) == {"cpu", "vulkan", "rocm-stable", "cuda"} and got.cuda_arch
    assert got.read_from.startswith("lemonade-sdk/lemonade@")


def test_two_servers_refused(tmp_path, licenses):
    prefix = build_prefix(tmp_path, ("cpu",))
    (prefix / "libexec/onebit/cpu/lib/llama-server").write_text("x")
    with pytest.raises(OnebitError, match="exactly one llama-server"):
        lemonade_archives.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME)


def test_contract_problems_on_a_bad_archive(tmp_path):
    from builders.io import tarball
    (tmp_path / "s").write_text("x")
    bad = tarball.write(tmp_path / "bad.tar.gz", "top", {"a/llama-server": tarball.Entry(src=tmp_path / "s"),
                                                         "b/llama-server": tarball.Entry(src=tmp_path / "s")}, mtime=0)
    problems = lemonade_archives.contract_problems(bad)
    assert any("2 files named llama-server" in p for p in problems)
    assert any("no LICENSE" in p for p in problems) and any("no NOTICE" in p for p in problems)


# ---------------------------------------------------------------------------------------------- lemonade install


@pytest.fixture
def release(tmp_path, licenses):
    prefix = build_prefix(tmp_path)
    out = tmp_path / "release"
    made = lemonade_archives.make_archives(prefix, out, TAG, licenses, mtime=MTIME, settings=SETTINGS)
    (out / "backend_versions.json").write_text(json.dumps(lemonade_archives.fragment(SETTINGS, TAG, [p for *_, p in made])))
    (out / "SHA256SUMS").write_text("".join(f"{file_sha256(p)}  {p.name}\n" for *_, p in made))
    return {b: p for _, b, p in made} | {"dir": out}


def test_install_layout_and_run_without_ld_library_path(tmp_path, release, monkeypatch):
    cache = tmp_path / "lemonade"
    monkeypatch.setenv("LEMONADE_CACHE_DIR", str(cache))  # the cache moves; Lemonade's config stays in XDG_CONFIG_HOME
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert main(["lemonade", "install", str(release["cpu"]), str(release["vulkan"]),
                 "--fragment", str(release["dir"] / "backend_versions.json")]) == 0
    assert json.loads((tmp_path / "xdg/lemonade/config.json").read_text()) == {
        "llamacpp": {"cpu_bin": TAG, "vulkan_bin": TAG}}
    for backend in ("cpu", "vulkan"):
        inst = cache / "bin/llamacpp" / backend
        assert (inst / "version.txt").read_bytes() == TAG.encode()
        assert {p.relative_to(inst).as_posix() for p in inst.rglob("*") if p.is_file()} >= {
            "bin/llama-server", "lib/libggml.so.0", "LICENSE", "NOTICE", "version.txt"}
        assert all(p.stat().st_mode & 0o777 == 0o755 for p in inst.rglob("*") if p.is_file())
        run = subprocess.run([inst / "bin/llama-server"], check=True, capture_output=True, text=True, env={"PATH": os.defpath})
        assert run.stdout == "server on ggml\n"
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu", "vulkan"]  # nothing left aside
    assert sorted(p.name for p in cache.iterdir()) == ["bin", "bin.lock"]


def test_install_with_sums_and_overrides(tmp_path, release):
    cache = tmp_path / "c"
    assert main(["lemonade", "install", str(release["cpu"]), "--cache", str(cache), "--recipe", "onebit",
                 "--backend", "llama-cpu", "--sums", str(release["dir"] / "SHA256SUMS")]) == 0
    assert (cache / "bin/onebit/llama-cpu/version.txt").read_text() == TAG
    assert not (cache / "config.json").exists()  # Lemonade has no version setting for that recipe to pin


def test_checksum_mismatch_installs_nothing(tmp_path, release, capsys):
    cache = tmp_path / "c"
    lemonade_install.install(release["cpu"], cache)
    before = (cache / "bin/llamacpp/cpu/bin/llama-server").read_bytes()
    sums = release["dir"] / "SHA256SUMS"
    sums.write_text(sums.read_text().replace(file_sha256(release["cpu"]), "0" * 64))
    assert main(["lemonade", "install", str(release["cpu"]), "--cache", str(cache), "--sums", str(sums)]) == 2
    assert "does not match" in capsys.readouterr().err
    assert (cache / "bin/llamacpp/cpu/bin/llama-server").read_bytes() == before
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu"]


def test_an_error_while_unpacking_keeps_the_previous_install(tmp_path, release, monkeypatch):
    cache = tmp_path / "c"
    lemonade_install.install(release["cpu"], cache, tag="v2026.47")
    real = lemonade_install.shutil.copyfileobj
    calls = []

    def interrupt(src, dst, *a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(src, dst, *a)

    monkeypatch.setattr(lemonade_install.shutil, "copyfileobj", interrupt)
    with pytest.raises(KeyboardInterrupt):
        lemonade_install.install(release["cpu"], cache)
    monkeypatch.undo()
    assert (cache / "bin/llamacpp/cpu/version.txt").read_text() == "v2026.47"
    assert (cache / "bin/llamacpp/cpu/bin/llama-server").is_file()
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu"]


@pytest.mark.parametrize("member, kind", [("../evil", "file"), ("/abs", "file"), ("top/link", "symlink"),
                                          ("top/hard", "hardlink")])
def test_bad_members_refused(tmp_path, member, kind):
    import io
    arc = tmp_path / "llama-v2026.48-bin-ubuntu-x64.tar.gz"
    with tarfile.open(arc, "w:gz") as tar:
        for name in ("top/bin/llama-server", member):
            ti = tarfile.TarInfo(name)
            if name == member and kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
            elif name == member and kind == "hardlink":
                ti.type, ti.linkname = tarfile.LNKTYPE, "top/bin/llama-server"
            tar.addfile(ti, io.BytesIO(b""))
    cache = tmp_path / "c"
    with pytest.raises(OnebitError, match="nothing was installed"):
        lemonade_install.install(arc, cache, tag=TAG)
    assert not (cache / "bin/llamacpp/cpu").exists()
    assert not (tmp_path / "evil").exists()


def test_fragment_command_keys_checksums_under_the_download_repo(tmp_path, release, capsys, monkeypatch):
    archives = [str(release["cpu"]), str(release["vulkan"])]
    monkeypatch.delenv("ONEBIT_LEMONADE_REPO", raising=False)
    assert main(["lemonade", "fragment", *archives, "--repo", "packager/mirror", "--out", str(tmp_path / "f.json")]) == 0
    frag = json.loads((tmp_path / "f.json").read_text())
    assert frag["llamacpp"] == {"cpu": TAG, "vulkan": TAG}
    assert list(frag["checksums"]["github"]) == ["packager/mirror"]
    assert frag["checksums"]["github"]["packager/mirror"][TAG][release["cpu"].name] == \
        "sha256:" + hashlib.sha256(release["cpu"].read_bytes()).hexdigest()
    # without --repo: release.yaml's lemonade.download_repo at --root, or ONEBIT_LEMONADE_REPO
    (tmp_path / "release.yaml").write_text("repo: o/r\nlemonade:\n  download_repo: {cpu: a/cpu, vulkan: a/vk}\n")
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "lemonade", "fragment", *archives]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["checksums"]["github"]) == ["a/cpu", "a/vk"]
    monkeypatch.setenv("ONEBIT_LEMONADE_REPO", "env/repo")
    assert main(["--root", str(tmp_path), "lemonade", "fragment", *archives]) == 0
    assert list(json.loads(capsys.readouterr().out)["checksums"]["github"]) == ["env/repo"]
    assert main(["lemonade", "fragment", *archives, "--repo", "not a repo"]) == 2
    assert "--repo 'not a repo' is not owner/name" in capsys.readouterr().err
