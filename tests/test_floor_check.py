"""scripts/floor_check.py: the floor checked from outside the build. Its decisions by tables; then tiny ELF files made
with the host's compilers, packed as .conda and .tar.bz2 packages of a channel, read back through the project's one
unpacker and auditwheel's readers."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard

from builders.io import archives

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("floor_check", ROOT / "scripts" / "floor_check.py")
fc = importlib.util.module_from_spec(_spec)
sys.modules["floor_check"] = fc  # dataclasses look their module up
_spec.loader.exec_module(fc)

ALLOWED = {"GLIBC": ("2.2.5", "2.17", "2.34"), "GLIBCXX": ("3.4", "3.4.29"), "CXXABI": ("1.3", "1.3.13")}
LIBS = {"libc.so.6", "libstdc++.so.6", "libvulkan.so.1"}


@pytest.mark.parametrize("elf, shipped, want", [
    (fc.Elf("bin/a", ("libc.so.6",), (("libc.so.6", "GLIBC_2.34"),)), set(), []),
    (fc.Elf("bin/a", ("libc.so.6",), (("libc.so.6", "GLIBC_2.35"),)), set(),
     ["bin/a: needs GLIBC_2.35 of libc.so.6, which the policy does not allow"]),
    (fc.Elf("lib/b.so", (), (("libstdc++.so.6", "GLIBCXX_3.4.30"), ("libstdc++.so.6", "CXXABI_1.3.13"))), set(),
     ["lib/b.so: needs GLIBCXX_3.4.30 of libstdc++.so.6, which the policy does not allow"]),
    # a library's own versions are its business; GLIBC_PRIVATE is never allowed
    (fc.Elf("bin/c", (), (("libamdhip64.so.7", "hip_4.2"), ("libc.so.6", "GLIBC_PRIVATE"))), set(),
     ["bin/c: needs GLIBC_PRIVATE of libc.so.6, which the policy does not allow"]),
    (fc.Elf("bin/d", ("libggml.so", "libvulkan.so.1"),), {"libggml.so"}, []),  # shipped, and a host set's
    (fc.Elf("bin/d", ("libgomp.so.1",)), set(),
     ["bin/d: links libgomp.so.1, neither shipped in the package set nor an allowed host library"]),
    (fc.Elf("bin/e", error="bad section"), set(), ["bin/e: an ELF file that cannot be read (bad section)"]),
])
def test_violations(elf, shipped, want):
    assert fc.violations(elf, ALLOWED, LIBS, shipped) == want


@pytest.mark.parametrize("versions, family, want", [
    (["GLIBC_2.2.5", "GLIBC_2.34", "GLIBC_2.17"], "GLIBC", "GLIBC_2.34"),
    (["GLIBCXX_3.4.9", "GLIBCXX_3.4.29", "GLIBCXX_3.4"], "GLIBCXX", "GLIBCXX_3.4.29"),  # numerically, not as text
    (["GLIBC_2.34", "GLIBCXX_3.4.29"], "CXXABI", None),
    (["CXXABI_1.3", "CXXABI_FLOAT128", "CXXABI_1.3.13"], "CXXABI", "CXXABI_1.3.13"),  # names are no number
])
def test_highest(versions, family, want):
    assert fc.highest(versions, family) == want


def test_package_files_and_line():
    assert fc.package_files({"linux-64": ["repodata.json", "a-1-0.conda", "b-1-0.tar.bz2", "x.json"],
                             "noarch": ["repodata.json"]}) == ["linux-64/a-1-0.conda", "linux-64/b-1-0.tar.bz2"]
    pkg = fc.Package("a-1-0.conda", [fc.Elf("bin/a", (), (("libc.so.6", "GLIBC_2.17"), ("libc.so.6", "GLIBC_2.34")))],
                     skipped=2)
    assert fc.package_line(pkg) == "a-1-0.conda: 1 ELF (2 not for the host's loader)  GLIBC 2.34  GLIBCXX -  CXXABI -"


# ---- a real channel of tiny packages --------------------------------------------------------------------------------
def _tar(files: dict[str, bytes | str], mode: str) -> bytes:
    """A tar of `files` (a str value is a symlink's target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            if isinstance(data, str):
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                tar.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o755
                tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _conda(path: Path, files: dict[str, bytes | str]) -> None:
    """A .conda (CEP 2): a zip of metadata.json, pkg-*.tar.zst (the files) and info-*.tar.zst (info/)."""
    stem = path.name.removesuffix(".conda")
    zst = zstandard.ZstdCompressor()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("metadata.json", json.dumps({"conda_pkg_format_version": 2}))
        z.writestr(f"pkg-{stem}.tar.zst", zst.compress(_tar(files, "w")))
        z.writestr(f"info-{stem}.tar.zst", zst.compress(_tar({"info/index.json": b"{}"}, "w")))


def _compile(tmp: Path, compiler: str, source: str, suffix: str, out: str, *args: str) -> bytes:
    exe = shutil.which(compiler)
    if exe is None:
        pytest.skip(f"no {compiler} on this host")
    src = tmp / f"{out}{suffix}"
    src.write_text(source)
    subprocess.run([exe, "-O1", str(src), "-o", str(tmp / out), f"-L{tmp}", *args], check=True, cwd=tmp)
    return (tmp / out).read_bytes()


@pytest.fixture(scope="module")
def elves(tmp_path_factory):
    """A shared library, a C program linking it, and a C++ program waiting on a condition variable (built with the
    host's g++: Debian 12's libstdc++ binds GLIBCXX_3.4.30 for it, above manylinux_2_34)."""
    tmp_path = tmp_path_factory.mktemp("elves")
    lib = _compile(tmp_path, "cc", "#include <stdio.h>\nint shipped(void) { return puts(\"x\"); }\n", ".c", "libshipped.so", "-shared", "-fPIC",
                   "-Wl,-soname,libshipped.so.1")
    prog = _compile(tmp_path, "cc", "int shipped(void);\nint main(void) { return shipped(); }\n", ".c", "prog",
                    "-lshipped")
    waits = _compile(tmp_path, "c++", "#include <condition_variable>\n#include <mutex>\nstd::mutex m; "
                     "std::condition_variable cv;\nint main(int argc, char **) { std::unique_lock<std::mutex> l(m); "
                     "if (argc > 5) cv.wait(l); return 0; }\n", ".cc", "waits", "-pthread")
    return {"lib": lib, "prog": prog, "waits": waits}


def _channel(top: Path, packages: dict[str, dict[str, bytes | str]]) -> Path:
    sub = top / "linux-64"
    sub.mkdir(parents=True)
    (sub / "repodata.json").write_text("{}")
    (top / "noarch").mkdir()
    (top / "noarch" / "repodata.json").write_text("{}")
    for name, files in packages.items():
        if name.endswith(".conda"):
            _conda(sub / name, files)
        else:
            (sub / name).write_bytes(_tar(files, "w:bz2"))
    return top


def test_a_conda_package_unpacks_through_the_one_unpacker(tmp_path):
    _conda(tmp_path / "a-1-0.conda", {"bin/a": b"x", "lib/liba.so": "liba.so.1", "lib/liba.so.1": b"y"})
    got = archives.unpack(tmp_path / "a-1-0.conda", tmp_path / "out")
    assert sorted(got.files) == ["bin/a", "info/index.json", "lib/liba.so.1"]
    assert os.readlink(tmp_path / "out" / "lib" / "liba.so") == "liba.so.1"
    (tmp_path / "broken.conda").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: no tars
    with pytest.raises(archives.Unreadable, match="one pkg-"):
        archives.unpack(tmp_path / "broken.conda", tmp_path / "out2")


def test_a_channel_that_meets_the_floor(tmp_path, elves, capsys):
    ch = _channel(tmp_path / "ch", {"prog-1-0.conda": {"bin/prog": elves["prog"], "README": b"text"},
                                    "lib-1-0.tar.bz2": {"lib/libshipped.so.1": elves["lib"],
                                                        "lib/libshipped.so": "libshipped.so.1"}})
    assert fc.main([str(ch)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("lib-1-0.tar.bz2: 1 ELF  GLIBC 2.")  # sorted by file name
    assert out[1].startswith("prog-1-0.conda: 1 ELF  GLIBC 2.") and out[1].endswith("GLIBCXX -  CXXABI -")
    assert out[-1] == ("2 package(s), 2 ELF file(s) against manylinux_2_34 and floor.yaml's host libraries: "
                       "0 violation(s)")


def test_a_channel_that_does_not(tmp_path, elves, capsys):
    """The program's library is not in the package set, and the C++ program needs Debian 12's libstdc++."""
    ch = _channel(tmp_path / "ch", {"prog-1-0.conda": {"bin/prog": elves["prog"], "bin/waits": elves["waits"]}})
    assert fc.main([str(ch), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (pkg,) = doc["packages"]
    assert pkg["elf"] == 2 and pkg["highest"]["GLIBCXX"] == "GLIBCXX_3.4.30"
    assert pkg["violations"] == [
        "bin/prog: links libshipped.so.1, neither shipped in the package set nor an allowed host library",
        "bin/waits: needs GLIBCXX_3.4.30 of libstdc++.so.6, which the policy does not allow"]


@pytest.mark.parametrize("make, says", [
    (lambda t: t / "nowhere", "nowhere: no such directory"),
    (lambda t: t, "not a conda channel (no <subdir>/repodata.json)"),
    (lambda t: _channel(t / "empty", {}), "no .conda or .tar.bz2 package in the channel(s)"),
    (lambda t: _channel(t / "bad", {"x-1-0.tar.bz2": {}}) and (t / "bad/linux-64/y-1-0.conda").write_bytes(b"no zip")
     and t / "bad", "y-1-0.conda: "),
])
def test_bad_input_is_one_line(tmp_path, capsys, make, says):
    assert fc.main([str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("floor_check: ") and says in err and "Traceback" not in err
