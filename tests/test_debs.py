"""Debian packages as toolchain inputs: where the archive is (the host's apt sources), a pinned .deb fetched and
verified, its data member unpacked safely. The packages are built here in Debian's own format (ar + tar)."""
from __future__ import annotations

import os

import io
import tarfile
import time

import pytest

from builders.roots import debs
from builders.io import treepath
from builders.project.config import DebInput, file_sha256
from builders.errors import FetchError


@pytest.mark.parametrize("text, deb822, want", [
    ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
     "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n",
     True, [("http://mirror.example/debian", ("bookworm", "bookworm-updates")),
            ("http://mirror.example/debian-security", ("bookworm-security",))]),
    ("Types: deb-src\nURIs: http://src.example/debian\nSuites: trixie\n", True, []),
    ("Types: deb\nURIs: http://off.example/debian\nSuites: trixie\nEnabled: no\n", True, []),
    ("# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://a.example/debian trixie main\n"
     "deb-src http://a.example/debian trixie main\ndeb http://b.example/debian bookworm main # tail\n", False,
     [("http://a.example/debian", ("trixie",)), ("http://b.example/debian", ("bookworm",))]),
])
def test_apt_sources(text, deb822, want):
    assert debs.parse_sources(text, deb822=deb822) == want


def test_the_security_archive_holds_no_pool():
    sources = [("http://m.example/debian/", ("bookworm", "bookworm-updates")),
               ("http://m.example/debian-security", ("bookworm-security",)), ("cdrom:[x]/", ("bookworm",)),
               ("http://m.example/debian", ("trixie",))]
    assert debs.debian_archives(sources) == ["http://m.example/debian"]


def test_mirror_setting_first(tmp_path):
    (tmp_path / "debian.sources").write_text("Types: deb\nURIs: http://host.example/debian\nSuites: trixie\n")
    assert debs.mirrors({debs.MIRROR_ENV: "file:///srv/debian/"}, [tmp_path]) == ["file:///srv/debian",
                                                                                 "http://host.example/debian"]
    assert debs.mirrors({}, [tmp_path / "none"]) == []


@pytest.mark.parametrize("path, ok", [
    ("pool/main/s/shaderc/glslc_2025.2-1_amd64.deb", True),
    ("pool/main/libs/libstdc++/libstdc++6_14.2.0-19_amd64.deb", True),
    ("pool/main/s/shaderc/../../../etc/passwd.deb", False),
    ("/pool/main/s/shaderc/glslc.deb", False),
    ("pool/main/s/shaderc/glslc_2025.2-1_amd64.tar", False),
])
def test_pool_paths(path, ok):
    assert (debs.pool_path_problem(path) is None) == ok


def _tar_xz(members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for m in members:
            info, data = m if isinstance(m, tuple) else (m, None)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name, *, data=b"", kind=tarfile.REGTYPE, link="", mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode, ti.size, ti.mtime = kind, link, mode, len(data), int(time.time())
    return (ti, data) if kind == tarfile.REGTYPE else ti


def make_deb(path, members) -> None:
    """A .deb as dpkg-deb writes it: ar with debian-binary, control.tar.xz, data.tar.xz."""
    parts = [("debian-binary", b"2.0\n"), ("control.tar.xz", _tar_xz([_info("./control", data=b"Package: t\n")])),
             ("data.tar.xz", _tar_xz(members))]
    out = bytearray(b"!<arch>\n")
    for name, data in parts:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))


GOOD = [_info("./", kind=tarfile.DIRTYPE, mode=0o755), _info("./usr/bin/", kind=tarfile.DIRTYPE, mode=0o755),
        _info("./usr/bin/tool", data=b"#!/bin/sh\necho tool\n", mode=0o755),
        _info("./usr/lib/libx.so.1", data=b"lib"), _info("./usr/lib/libx.so", kind=tarfile.SYMTYPE, link="libx.so.1"),
        _info("./usr/lib64/ld.so", kind=tarfile.SYMTYPE, link="/lib/x86_64-linux-gnu/ld.so")]


@pytest.fixture
def archive(tmp_path):
    """A local Debian archive (file: URL) holding one package at its pool path."""
    root = tmp_path / "archive"
    deb = root / "pool/main/t/tool/tool_1.0-1_amd64.deb"
    deb.parent.mkdir(parents=True)
    make_deb(deb, GOOD)
    return root, DebInput("pool/main/t/tool/tool_1.0-1_amd64.deb", file_sha256(deb))


def test_fetch_verify_unpack_then_offline(tmp_path, archive):
    root, deb = archive
    got = debs.fetch(deb, tmp_path / "dl", archives=[f"file://{tmp_path / 'nowhere'}", f"file://{root}"])
    assert got == tmp_path / "dl" / deb.sha256 / deb.name and file_sha256(got) == deb.sha256
    out = tmp_path / "out"
    assert debs.unpack(got, out) == 6  # the absolute link is kept, re-rooted inside the root
    assert (out / "usr/bin/tool").read_bytes().startswith(b"#!/bin/sh") and (out / "usr/bin/tool").stat().st_mode & 0o111
    assert (out / "usr/lib/libx.so").is_symlink() and (out / "usr/lib/libx.so").resolve() == out / "usr/lib/libx.so.1"
    assert os.readlink(out / "usr/lib64/ld.so") == "../../lib/x86_64-linux-gnu/ld.so"
    # offline: the cache answers, no archive is asked
    assert debs.fetch(deb, tmp_path / "dl", offline=True, archives=[]) == got


def test_wrong_bytes_are_refused(tmp_path, archive):
    root, deb = archive
    bad = DebInput(deb.path, "0" * 64)
    with pytest.raises(FetchError, match="does not match the pinned"):
        debs.fetch(bad, tmp_path / "dl", archives=[f"file://{root}"])
    assert not (tmp_path / "dl" / ("0" * 64)).exists()
    with pytest.raises(FetchError, match="--offline forbids downloading"):
        debs.fetch(bad, tmp_path / "dl", offline=True)
    with pytest.raises(FetchError, match="could not be downloaded"):
        debs.fetch(DebInput("pool/main/t/tool/gone_1_amd64.deb", "1" * 64), tmp_path / "dl", archives=[f"file://{root}"])
    with pytest.raises(FetchError, match="no Debian archive"):
        debs.fetch(deb, tmp_path / "dl2", archives=[])


@pytest.mark.parametrize("member", [_info("./../escape", data=b"x"), _info("/etc/abs", data=b"x"),
                                    _info("./dev", kind=tarfile.CHRTYPE)])
def test_unsafe_members_refuse_the_unpack(tmp_path, member):
    deb = tmp_path / "bad.deb"
    make_deb(deb, [member])
    with pytest.raises(FetchError, match="unsafe|refusing"):
        debs.unpack(deb, tmp_path / "out")


def test_not_a_deb(tmp_path):
    (tmp_path / "x.deb").write_bytes(b"PK\x03\x04 zip")
    with pytest.raises(FetchError, match="not a Debian package"):
        debs.unpack(tmp_path / "x.deb", tmp_path / "out")


# ---- links and the realpath-overflow class (issue 21) ------------------------------------------------------------
LINKS = {"lib": "usr/lib", "usr/lib/x86_64-linux-gnu/libfoo.so": "libfoo.so.1", "loop": "loop", "up": "../..",
         "usr/bin/abs": "/usr/bin/real"}


@pytest.mark.parametrize("member, target, want", [
    ("usr/lib/x86_64-linux-gnu/libfoo.so", "libfoo.so.1", "libfoo.so.1"),  # in-tree relative: kept as written
    ("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
     "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),  # absolute, inside: re-rooted
    ("lib/x86_64-linux-gnu/ld.so", "/usr/lib/ld.so", "../ld.so"),  # the parent lib -> usr/lib is where it lives
    ("usr/share/x", "../../../etc/passwd", None),  # climbs out
    ("usr/share/x", "/../../etc/passwd", None),  # absolute and climbing out
    ("usr/share/x", "../../loop/a", None),  # a loop
    ("usr/share/x", "../../up/etc", None),  # through a link that climbs out
    ("up/x", "y", None),  # its own directory is out of the root
    ("usr/bin/a", "abs", "abs"),  # to a link whose absolute target is inside
    ("usr/bin/a", "", None),
])
def test_link_in_root(member, target, want):
    assert treepath.link_in_root(member, target, LINKS.get) == want


@pytest.mark.parametrize("path, absolute, want", [
    ("lib/x86_64-linux-gnu/libfoo.so", "reroot", "usr/lib/x86_64-linux-gnu/libfoo.so.1"),
    ("/lib/a", "reroot", "usr/lib/a"), ("/lib/a", "refuse", None), ("usr/bin/abs", "refuse", None),
    ("usr/bin/abs", "reroot", "usr/bin/real"), ("loop", "reroot", None), ("up/x", "reroot", None), ("a/../b", "refuse", "b"),
    ("a/" + "b/" * 300, "refuse", None),
])
def test_resolve(path, absolute, want):
    assert treepath.resolve(path, LINKS.get, absolute=absolute) == want


def test_a_link_chain_longer_than_path_max_writes_nothing_outside(tmp_path):
    """The realpath-overflow attack (CPython gh-135034; this interpreter is older than its fix): links whose
    expansion exceeds PATH_MAX so realpath stops resolving, then a hard link and a file through them."""
    outer = tmp_path / "outer"
    dest = outer / "dest"
    outer.mkdir()
    (outer / "flag").write_text("kept\n")
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf(outer, "PC_PATH_MAX") - len(str(dest)) - 1) // (len(steps) + 1))
    members, path = [], ""
    for step in steps:
        members.append(_info(os.path.join(path, component), kind=tarfile.DIRTYPE, mode=0o777))
        members.append(_info(os.path.join(path, step), kind=tarfile.SYMTYPE, link=component))
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(_info(linkpath, kind=tarfile.SYMTYPE, link=os.path.join(*[".."] * len(steps))))
    members.append(_info("escape", kind=tarfile.SYMTYPE, link=os.path.join(linkpath, "..")))
    members.append(_info("flaglink", kind=tarfile.LNKTYPE, link="escape/flag"))
    members.append(_info("flaglink", data=b"overwrite\n"))
    members.append(_info("escape/newfile", data=b"new\n"))
    deb = tmp_path / "chain.deb"
    make_deb(deb, members)
    with pytest.raises(FetchError, match="refusing to unpack"):
        debs.unpack(deb, dest)
    assert (outer / "flag").read_text() == "kept\n" and sorted(p.name for p in outer.iterdir()) == ["dest", "flag"]


def test_symlink_then_write_through_it_is_refused(tmp_path):
    deb = tmp_path / "t.deb"
    make_deb(deb, [_info("./etc", kind=tarfile.SYMTYPE, link="/../../../../../etc"), _info("./etc/x", data=b"x")])
    with pytest.raises(FetchError, match="leads out of the unpack root"):
        debs.unpack(deb, tmp_path / "out")
    deb2 = tmp_path / "t2.deb"
    make_deb(deb2, [_info("./usr/lib/", kind=tarfile.DIRTYPE, mode=0o755), _info("./lib", kind=tarfile.SYMTYPE, link="usr/lib"),
                    _info("./lib/libz.so.1", data=b"z", mode=0o4755)])
    assert debs.unpack(deb2, tmp_path / "out2") == 3
    got = tmp_path / "out2" / "usr" / "lib" / "libz.so.1"
    assert got.read_bytes() == b"z" and got.stat().st_mode & 0o7777 == 0o755  # written through the in-root link, no setuid


def test_a_download_is_cut_off_at_the_pinned_size(tmp_path, archive):
    root, deb = archive
    size = (root / deb.path).stat().st_size
    assert debs.fetch(DebInput(deb.path, deb.sha256, size), tmp_path / "dl", archives=[f"file://{root}"]).is_file()
    big = root / "pool/main/b/big/big_1_amd64.deb"
    big.parent.mkdir(parents=True)
    big.write_bytes(b"\0" * (1 << 20) * 3)
    with pytest.raises(FetchError, match="more than the pinned 100 bytes; download stopped before hashing"):
        debs.fetch(DebInput("pool/main/b/big/big_1_amd64.deb", "2" * 64, 100), tmp_path / "dl", archives=[f"file://{root}"])
    assert not list((tmp_path / "dl").glob("2222*"))


@pytest.fixture
def not_found():
    """An archive on 127.0.0.1 that serves nothing (404 for every path)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_one_mirror_loop_tries_every_archive_in_order_and_names_each_failure(tmp_path, archive, not_found):
    """A .deb (debs.fetch) and a suite's Packages index (roots.read_index) through the one loop: the first archive
    that serves it wins; when none does, one error with a line per archive, in order, saying why."""
    import lzma
    import socket

    from builders.roots import assemble as roots

    root, deb = archive
    index = root / "dists/sid/main/binary-amd64/Packages.xz"
    index.parent.mkdir(parents=True)
    index.write_bytes(lzma.compress(b"Package: tool\n"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}"
    bad = [f"file://{tmp_path / 'nowhere'}", not_found, refused]
    assert file_sha256(debs.fetch(deb, tmp_path / "dl", archives=[*bad, f"file://{root}"])) == deb.sha256
    assert roots.read_index("sid", "main", [*bad, f"file://{root}"]) == "Package: tool\n"
    for fetch, head in ((lambda a: debs.fetch(deb, tmp_path / "dl2", archives=a), f"{deb.name} could not be downloaded:"),
                        (lambda a: roots.read_index("sid", "main", a),
                         "no Debian archive served dists/sid/main/binary-amd64/Packages.xz:")):
        with pytest.raises(FetchError) as caught:
            fetch(bad)
        lines = caught.value.what.splitlines()
        assert lines[0] == head and [ln.strip().split(": ", 1)[0] for ln in lines[1:]] == bad
        assert "FileNotFoundError" in lines[1] and lines[2].strip() == f"{not_found}: HTTP 404"
        assert lines[3].strip().startswith(f"{refused}: ConnectionError: ")
    assert list((tmp_path / "dl2").iterdir()) == []  # nothing half-downloaded is left
