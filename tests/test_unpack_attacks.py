"""Archives that try to write outside their unpack root through a link of their own (issue 27): the symlink-then-write
class, through the entry points that unpack them for real.

The release assembles a bundle from its bundle tarball (`flow.assemble`, BuiltBundle.tarball: what CI's final job
reads); before the one unpacker, `tarball.extract_tree` created any symlink member and then wrote later members
through it. Each case here wrote outside the root on that code (an absolute link, a relative link climbing out, a
folder made through a link, a file written through a link of its own name); each now leaves the outside untouched and
is refused in one line naming the tarball and the member (or, for the same-name file, the file replaces the link).
The Lemonade install and the wheel unpack refused every link already: their cases here guard that they still do.
"""
from __future__ import annotations

import dataclasses
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
import zstandard
from test_release_flow import run, world  # noqa: F401  (world is a fixture)

from builders.project.config import file_sha256
from builders.io import archives, tarball
from builders.inputs import toolchain
from builders.cli import main
from builders.errors import FetchError, OnebitError
from builders.release import lemonade_install

TOP = "onebit-cpu"


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    """A tar compressed as its name says (.tar.gz, .tar.xz, .tar.zst), members in the order given."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    data = raw.getvalue()
    if path.name.endswith(".tar.zst"):
        data = zstandard.ZstdCompressor().compress(data)
    elif path.name.endswith(".tar.gz"):
        import gzip

        data = gzip.compress(data)
    elif path.name.endswith(".tar.xz"):
        import lzma

        data = lzma.compress(data)
    path.write_bytes(data)
    return path


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    return info, None


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def _bundle_members(good: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The members of a real bundle tarball (the world fixture's, written by the project's tar writer)."""
    out = []
    for m, data in tarball.members(good):
        info = tarfile.TarInfo(m.name)
        info.mode = m.mode
        if m.issym():
            info.type, info.linkname = tarfile.SYMTYPE, m.linkname
        elif m.isdir():
            info.type = tarfile.DIRTYPE
        else:
            info.size = len(data)
        out.append((info, data))
    return out


def _outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    (out / "victim.txt").write_text("kept\n")
    return out


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else "dir")
            for p in sorted(folder.rglob("*"))}


ATTACKS = {
    # an absolute link out of the root, then a file written through it
    "absolute link, then a file through it": lambda out: [_link(f"{TOP}/escape", str(out)),
                                                           _file(f"{TOP}/escape/planted", b"pwned\n")],
    # a relative link that climbs out (to /), then a file at the outside folder's path below it
    "relative link climbing out, then a file": lambda out: [_link(f"{TOP}/up", "../" * 40),
                                                            _file(f"{TOP}/up{out}/planted", b"pwned\n")],
    # a folder made through a link, then a file in it
    "a folder through a link": lambda out: [_link(f"{TOP}/d", str(out)), _dir(f"{TOP}/d/made"),
                                            _file(f"{TOP}/d/made/planted", b"pwned\n")],
    # a link in the bundle's own lib/ (a real folder), then a file through it
    "a link inside a real folder": lambda out: [_link(f"{TOP}/lib/x", str(out)),
                                                _file(f"{TOP}/lib/x/planted", b"pwned\n")],
}


@pytest.mark.parametrize("suffix", [".tar.zst", ".tar.gz", ".tar.xz"])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_bundle_tarball_cannot_write_through_its_own_link(world, tmp_path, suffix, attack):  # noqa: F811
    outside = _outside(tmp_path)
    before = _snapshot(outside)
    hostile = _tar(tmp_path / f"onebit-cpu-2026.48-0-linux-64{suffix}",
                   _bundle_members(world["built"].tarball) + ATTACKS[attack](outside))
    world["built"] = dataclasses.replace(world["built"], tarball=hostile)
    try:
        run(world, tmp_path / "release")
        refused = None
    except archives.ArchiveError as exc:
        refused = exc
    assert _snapshot(outside) == before  # nothing written, made or replaced outside the root
    assert refused is not None
    what = refused.what
    assert "\n" not in what and what.startswith(f"{hostile.name}: member '{TOP}/") and "refusing to unpack it" in what
    assert "leads out of the unpack root" in what
    assert not (tmp_path / "release").exists()


def test_a_file_named_like_its_own_link_replaces_the_link(world, tmp_path):  # noqa: F811
    """`x -> /outside/victim.txt` then a file `x`: the file takes the link's place in the root; the victim is kept."""
    outside = _outside(tmp_path)
    hostile = _tar(tmp_path / "onebit-cpu-2026.48-0-linux-64.tar.zst",
                   _bundle_members(world["built"].tarball)
                   + [_link(f"{TOP}/share/x", str(outside / "victim.txt")), _file(f"{TOP}/share/x", b"pwned\n")])
    into = tmp_path / "prefix"
    tarball.extract_tree(hostile, into)
    assert (outside / "victim.txt").read_text() == "kept\n"
    assert (into / "share/x").read_bytes() == b"pwned\n" and not (into / "share/x").is_symlink()
    world["built"] = dataclasses.replace(world["built"], tarball=hostile)
    assert run(world, tmp_path / "release")  # the release still assembles from it
    assert (outside / "victim.txt").read_text() == "kept\n"


def test_links_that_stay_inside_are_kept_and_links_out_are_skipped(tmp_path):
    """What a bundle tarball may carry: relative links inside the tree are written (last); a link that leads out is
    left out, never followed."""
    arc = _tar(tmp_path / "t.tar.zst", [_dir(f"{TOP}/lib"), _file(f"{TOP}/lib/libx.so.1", b"x"),
                                        _link(f"{TOP}/lib/libx.so", "libx.so.1"),
                                        _link(f"{TOP}/bin/tool", "../lib/libx.so"),
                                        _link(f"{TOP}/bin/out", "../../../etc/passwd"),
                                        _link(f"{TOP}/bin/abs", "/etc/passwd")])
    into = tmp_path / "into"
    got = archives.unpack(arc, into, strip=1)
    assert sorted(p.relative_to(into).as_posix() for p in into.rglob("*")) == [
        "bin", "bin/tool", "lib", "lib/libx.so", "lib/libx.so.1"]
    assert (into / "bin/tool").read_bytes() == b"x"
    assert got.skipped == [f"{TOP}/bin/out -> ../../../etc/passwd", f"{TOP}/bin/abs -> /etc/passwd"]


def test_a_zip_link_then_a_file_through_it_never_leaves_the_root(tmp_path):
    """A zip is read by the same rules: its link is kept aside, the file through it is refused."""
    outside = _outside(tmp_path)
    arc = tmp_path / "a.zip"
    with zipfile.ZipFile(arc, "w") as zf:
        info = zipfile.ZipInfo("pkg/escape")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, str(outside))
        zf.writestr("pkg/escape/planted", "pwned\n")
    with pytest.raises(archives.ArchiveError, match="'pkg/escape/planted' is reached through a link that leads out"):
        archives.unpack(arc, tmp_path / "into")
    assert _snapshot(outside) == {"victim.txt": b"kept\n"}


def test_a_wheel_link_then_write_is_refused_before_anything_is_written(tmp_path):
    """Guard (held before too): the toolchain's wheel unpack refuses any link in the folder it unpacks."""
    outside = _outside(tmp_path)
    whl = tmp_path / "pkg-1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("pkg-1.dist-info/METADATA", "Name: pkg\nLicense: MIT\n")
        info = zipfile.ZipInfo("pkg/escape")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, str(outside))
        zf.writestr("pkg/escape/planted", "pwned\n")
    with pytest.raises(FetchError, match="'pkg/escape' is a link or special file; refusing to unpack it"):
        toolchain._unpack(whl, "pkg", "pkg", tmp_path / "root", {})
    assert _snapshot(outside) == {"victim.txt": b"kept\n"}


def test_a_lemonade_archive_with_a_link_installs_nothing(tmp_path, capsys):
    """Guard (held before too): `lemonade install` refuses an archive holding a link, before writing anything."""
    outside = _outside(tmp_path)
    top = "llama-v2026.48-bin-ubuntu-x64"
    arc = _tar(tmp_path / f"{top}.tar.gz", [_file(f"{top}/bin/llama-server", b"#!/bin/sh\n", 0o755),
                                            _link(f"{top}/lib", str(outside)), _file(f"{top}/lib/planted", b"pwned\n")])
    cache = tmp_path / "cache"
    assert main(["lemonade", "install", str(arc), "--cache", str(cache), "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert f"{arc.name}: member '{top}/lib' is a link; nothing was installed" in err and "Traceback" not in err
    assert not cache.exists() and _snapshot(outside) == {"victim.txt": b"kept\n"}
    with pytest.raises(OnebitError, match="is a link; nothing was installed"):
        lemonade_install.check(arc, sha=file_sha256(arc))


# ---- the unpacker's own decisions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, strip, want", [
    ("top/bin/x", 1, "bin/x"), ("./bin/x", 1, "bin/x"), ("top/", 1, None), ("top", 1, None), ("./", 0, ""),
    ("./usr/lib/", 0, "usr/lib"), ("a//b/./c", 0, "a/b/c"), ("a/b", 2, None), ("x", 0, "x"),
])
def test_stripped(name, strip, want):
    assert archives.stripped(name, strip) == want


@pytest.mark.parametrize("head, kind", [(b"!<arch>\ndebian", "deb"), (b"PK\x03\x04....", "zip"), (b"PK\x05\x06", "zip"),
                                        (b"\x28\xb5\x2f\xfd....", "tar.zst"), (b"\x1f\x8b\x08", "tar"),
                                        (b"\xfd7zXZ\x00", "tar"), (b"BZh91AY", "tar"), (b"", "tar")])
def test_kind_of(head, kind):
    assert archives.kind_of(head) == kind


def _deb(path: Path, data_name: str, data: bytes) -> Path:
    out = bytearray(b"!<arch>\n")
    for name, part in (("debian-binary", b"2.0\n"), (data_name, data)):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(part):<10}`\n".encode() + part + (b"\n" if len(part) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


TREE = [_dir("pkg/lib"), _file("pkg/lib/libx.so.1", b"x" * 3000, 0o4755), _link("pkg/lib/libx.so", "libx.so.1"),
        _file("pkg/bin/tool", b"#!/bin/sh\n", 0o755)]


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "tar.bz2", "tar.xz", "tar.zst", "zip", "deb"])
def test_every_kind_unpacks_alike(tmp_path, kind):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in TREE:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    plain = raw.getvalue()
    if kind == "zip":
        arc = tmp_path / "a.zip"
        with zipfile.ZipFile(arc, "w") as zf:
            for info, data in TREE:
                z = zipfile.ZipInfo(info.name + ("/" if info.isdir() else ""))
                z.external_attr = ({tarfile.DIRTYPE: stat.S_IFDIR, tarfile.SYMTYPE: stat.S_IFLNK}.get(info.type, stat.S_IFREG)
                                   | info.mode) << 16
                zf.writestr(z, info.linkname if info.issym() else (data or b""))
    elif kind == "deb":
        arc = _deb(tmp_path / "a.deb", "data.tar.zst", zstandard.ZstdCompressor().compress(plain))
    else:
        import bz2
        import gzip
        import lzma

        squash = {"tar": bytes, "tar.gz": gzip.compress, "tar.bz2": bz2.compress, "tar.xz": lzma.compress,
                  "tar.zst": zstandard.ZstdCompressor().compress}[kind]
        arc = tmp_path / f"a.{kind}"
        arc.write_bytes(squash(plain))
    into = tmp_path / "into"
    got = archives.unpack(arc, into, strip=1, kind="deb" if kind == "deb" else None)
    assert (got.count, got.bytes, sorted(got.files)) == (4, 3010, ["bin/tool", "lib/libx.so.1"])
    assert (into / "lib/libx.so").read_bytes() == b"x" * 3000 and os.readlink(into / "lib/libx.so") == "libx.so.1"
    assert stat.S_IMODE((into / "lib/libx.so.1").stat().st_mode) == 0o755  # no setuid bit
    assert stat.S_IMODE((into / "bin/tool").stat().st_mode) == 0o755


def test_the_budget_counts_what_is_written(tmp_path):
    arc = _tar(tmp_path / "a.tar.gz", [_file(f"pkg/f{i}", bytes(1 << 20)) for i in range(3)])
    with pytest.raises(archives.ArchiveError, match=r"^a.tar.gz: unpacks to more than 2,621,440 bytes; refusing"):
        archives.unpack(arc, tmp_path / "into", budget=archives.Budget(bytes=5 << 19))
    assert sum(p.stat().st_size for p in (tmp_path / "into").rglob("*") if p.is_file()) <= 5 << 19
    with pytest.raises(archives.ArchiveError, match=r"^a.tar.gz: more than 2 members; refusing"):
        archives.unpack(arc, tmp_path / "into2", budget=archives.Budget(members=2))


@pytest.mark.parametrize("data", [b"", b"not an archive at all", b"\x1f\x8b\x08\x00" + b"\xff" * 40,
                                  b"\x28\xb5\x2f\xfd" + b"\x00" * 30, b"PK\x03\x04" + b"\x00" * 30])
def test_a_damaged_archive_is_refused_in_one_line(tmp_path, data):
    arc = tmp_path / "broken.tar.gz"
    arc.write_bytes(data)
    with pytest.raises(archives.Unreadable) as exc:
        archives.unpack(arc, tmp_path / "into")
    assert exc.value.what.startswith("broken.tar.gz: not a readable archive (") and "\n" not in exc.value.what
