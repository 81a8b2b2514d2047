"""Lemonade's contract: archives from a real (gcc-built) prefix, the fragment, and `1bit-build lemonade install`."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from builders.cli import main
from builders.errors import OnebitError
from builders.release import lemonade

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


@pytest.fixture
def licenses(tmp_path):
    (tmp_path / "LICENSE").write_text("Apache-2.0\n")
    (tmp_path / "NOTICE").write_text("1bit engine\n")
    (tmp_path / "llama.cpp-LICENSE").write_text("MIT\n")
    return {"LICENSE": tmp_path / "LICENSE", "NOTICE": tmp_path / "NOTICE",
            "licenses/llama.cpp/LICENSE": tmp_path / "llama.cpp-LICENSE"}


@pytest.mark.parametrize("variant, kw, name", [
    ("cpu", {}, "llama-v2026.48-bin-ubuntu-x64.tar.gz"),
    ("vulkan", {}, "llama-v2026.48-bin-ubuntu-vulkan-x64.tar.gz"),
    ("lean-rocm", {"rocm": "7.1"}, "llama-v2026.48-bin-ubuntu-rocm-7.1-x64.tar.gz"),
    ("cuda", {"cuda_arch": "sm_120"}, "llama-v2026.48-ubuntu-cuda-sm_120-x64.tar.xz"),
    ("hrx", {}, "llama-v2026.48-bin-ubuntu-hrx-x64.tar.gz"),
    ("lean-vulkan", {}, "llama-v2026.48-bin-ubuntu-lean-vulkan-x64.tar.gz"),
])
def test_names_round_trip(variant, kw, name):
    assert lemonade.asset_name(variant, TAG, **kw) == name
    parsed = lemonade.parse_name(name)
    assert (parsed.tag, parsed.recipe, parsed.backend) == (TAG, "llamacpp", lemonade.BACKENDS[variant])


@pytest.mark.parametrize("variant, kw", [("lean-rocm", {}), ("lean-rocm", {"rocm": "7"}), ("cuda", {"cuda_arch": "120"}),
                                         ("Bad/Name", {})])
def test_names_refused(variant, kw):
    with pytest.raises(OnebitError):
        lemonade.asset_name(variant, TAG, **kw)


@pytest.mark.parametrize("env, expected", [
    ({"LEMONADE_CACHE_DIR": "/a", "CACHE_DIRECTORY": "/b", "XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/a"),
    ({"CACHE_DIRECTORY": "/b", "XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/b"),
    ({"XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/c/lemonade"),
    ({"HOME": "/h"}, "/h/.cache/lemonade"),
    ({"LEMONADE_CACHE_DIR": "", "HOME": "/h"}, "/h/.cache/lemonade"),
])
def test_cache_dir(env, expected):
    assert lemonade.cache_dir(env) == Path(expected)


@pytest.mark.parametrize("name, problem", [("../x", True), ("/etc/x", True), ("top/../../x", True), ("top/a/b", False),
                                           ("", True)])
def test_member_problem(name, problem):
    # lemonade install refuses what every other unpacking step refuses (builders/archives.py)
    assert (lemonade.member_problem(name) is not None) == problem


def test_archives_hold_the_contract_and_are_deterministic(tmp_path, licenses):
    prefix = build_prefix(tmp_path)
    made = lemonade.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME)
    assert [(v, b, p.name) for v, b, p in made] == [
        ("cpu", "cpu", "llama-v2026.48-bin-ubuntu-x64.tar.gz"),
        ("vulkan", "vulkan", "llama-v2026.48-bin-ubuntu-vulkan-x64.tar.gz")]
    for _, _, path in made:
        assert lemonade.contract_problems(path) == []
        with tarfile.open(path) as tar:
            names = tar.getnames()
            assert {m.mtime for m in tar.getmembers()} == {MTIME}
        top = path.name.removesuffix(".tar.gz")
        assert names == sorted(names)
        assert f"{top}/bin/llama-server" in names and f"{top}/lib/libggml.so.0" in names
        assert f"{top}/licenses/llama.cpp/LICENSE" in names
        assert path.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header mtime 0
    again = lemonade.make_archives(prefix, tmp_path / "out2", TAG, licenses, mtime=MTIME)
    assert [p.read_bytes() for *_, p in made] == [p.read_bytes() for *_, p in again]

    frag = lemonade.fragment("1bit-MONSTER/1bit-engine", TAG, {b: p for _, b, p in made})
    assert frag["llamacpp"] == {"cpu": TAG, "vulkan": TAG}
    sums = frag["checksums"]["github"]["1bit-MONSTER/1bit-engine"][TAG]
    assert sums["llama-v2026.48-bin-ubuntu-x64.tar.gz"] == "sha256:" + lemonade.sha256(made[0][2])


def test_two_servers_refused(tmp_path, licenses):
    prefix = build_prefix(tmp_path, ("cpu",))
    (prefix / "libexec/onebit/cpu/lib/llama-server").write_text("x")
    with pytest.raises(OnebitError, match="exactly one llama-server"):
        lemonade.make_archives(prefix, tmp_path / "out", TAG, licenses, mtime=MTIME)


def test_contract_problems_on_a_bad_archive(tmp_path):
    from builders import tarball
    (tmp_path / "s").write_text("x")
    bad = tarball.write(tmp_path / "bad.tar.gz", "top", {"a/llama-server": tarball.Entry(src=tmp_path / "s"),
                                                         "b/llama-server": tarball.Entry(src=tmp_path / "s")}, mtime=0)
    problems = lemonade.contract_problems(bad)
    assert any("2 files named llama-server" in p for p in problems)
    assert any("no LICENSE" in p for p in problems) and any("no NOTICE" in p for p in problems)


# ---------------------------------------------------------------------------------------------- lemonade install


@pytest.fixture
def release(tmp_path, licenses):
    prefix = build_prefix(tmp_path)
    out = tmp_path / "release"
    made = lemonade.make_archives(prefix, out, TAG, licenses, mtime=MTIME)
    (out / "backend_versions.json").write_text(
        json.dumps(lemonade.fragment("o/r", TAG, {b: p for _, b, p in made})))
    (out / "SHA256SUMS").write_text("".join(f"{lemonade.sha256(p)}  {p.name}\n" for *_, p in made))
    return {b: p for _, b, p in made} | {"dir": out}


def test_install_layout_and_run_without_ld_library_path(tmp_path, release, monkeypatch):
    cache = tmp_path / "lemonade"
    monkeypatch.setenv("LEMONADE_CACHE_DIR", str(cache))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert main(["lemonade", "install", str(release["cpu"]), str(release["vulkan"]),
                 "--fragment", str(release["dir"] / "backend_versions.json")]) == 0
    for backend in ("cpu", "vulkan"):
        inst = cache / "bin/llamacpp" / backend
        assert (inst / "version.txt").read_bytes() == TAG.encode()
        assert {p.relative_to(inst).as_posix() for p in inst.rglob("*") if p.is_file()} >= {
            "bin/llama-server", "lib/libggml.so.0", "LICENSE", "NOTICE", "version.txt"}
        assert all(p.stat().st_mode & 0o777 == 0o755 for p in inst.rglob("*") if p.is_file())
        run = subprocess.run([inst / "bin/llama-server"], check=True, capture_output=True, text=True, env={"PATH": os.defpath})
        assert run.stdout == "server on ggml\n"
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu", "vulkan"]  # no .staging/.old left


def test_install_with_sums_and_overrides(tmp_path, release):
    cache = tmp_path / "c"
    assert main(["lemonade", "install", str(release["cpu"]), "--cache", str(cache), "--recipe", "onebit",
                 "--backend", "llama-cpu", "--sums", str(release["dir"] / "SHA256SUMS")]) == 0
    assert (cache / "bin/onebit/llama-cpu/version.txt").read_text() == TAG


def test_checksum_mismatch_installs_nothing(tmp_path, release, capsys):
    cache = tmp_path / "c"
    lemonade.install(release["cpu"], cache)
    before = (cache / "bin/llamacpp/cpu/bin/llama-server").read_bytes()
    sums = release["dir"] / "SHA256SUMS"
    sums.write_text(sums.read_text().replace(lemonade.sha256(release["cpu"]), "0" * 64))
    assert main(["lemonade", "install", str(release["cpu"]), "--cache", str(cache), "--sums", str(sums)]) == 2
    assert "does not match" in capsys.readouterr().err
    assert (cache / "bin/llamacpp/cpu/bin/llama-server").read_bytes() == before
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu"]


def test_interrupted_install_keeps_the_previous_one(tmp_path, release, monkeypatch):
    cache = tmp_path / "c"
    lemonade.install(release["cpu"], cache, tag="v2026.47")
    real = lemonade.shutil.copyfileobj
    calls = []

    def interrupt(src, dst, *a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(src, dst, *a)

    monkeypatch.setattr(lemonade.shutil, "copyfileobj", interrupt)
    with pytest.raises(KeyboardInterrupt):
        lemonade.install(release["cpu"], cache)
    monkeypatch.undo()
    assert (cache / "bin/llamacpp/cpu/version.txt").read_text() == "v2026.47"
    assert (cache / "bin/llamacpp/cpu/bin/llama-server").is_file()
    # a swap interrupted between its renames (only .old left) is restored by the next install
    os.replace(cache / "bin/llamacpp/cpu", cache / "bin/llamacpp/cpu.old")
    (cache / "bin/llamacpp/cpu.staging").mkdir()
    lemonade.install(release["cpu"], cache)
    assert sorted(p.name for p in (cache / "bin/llamacpp").iterdir()) == ["cpu"]
    assert (cache / "bin/llamacpp/cpu/version.txt").read_text() == TAG


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
        lemonade.install(arc, cache)
    assert not (cache / "bin/llamacpp/cpu").exists()
    assert not (tmp_path / "evil").exists()
