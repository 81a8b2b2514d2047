"""Reproducibility helpers: the leak check (the prefix-map flags are tested in test_flags.py)."""
from __future__ import annotations

import pytest

from builders.ship import repro


@pytest.mark.parametrize("data, leaks", [
    (b"\0/w/work/src/ggml.c\0", ["work dir"]),
    (b"prefix /home/u/.cache/onebit/git x", ["cache dir", "$HOME"]),
    (b"/home/u", ["$HOME"]),
    (b"/home/user2/x /w/workshop", []),  # another user's home and a sibling of the work dir are not leaks
    (b"/usr/src/onebit/cpu/ggml.c", []),
])
def test_leak_problems(data, leaks):
    forbidden = [("the work dir", "/w/work"), ("the cache dir", "/home/u/.cache/onebit"), ("$HOME", "/home/u"), ("root", "/")]
    found = repro.leak_problems("lib/x.so", data, forbidden)
    assert [p.split("contains ")[1].split(" (")[0].removeprefix("the ") for p in found] == leaks
    assert all(p.startswith("lib/x.so: contains ") for p in found)


def test_scan_tree(tmp_path):
    (tmp_path / "p/lib").mkdir(parents=True)
    (tmp_path / "p/lib/ok.so").write_bytes(b"clean")
    (tmp_path / "p/lib/bad.py").write_text("ROOT = '/w/work/src'\n")
    (tmp_path / "p/lib/link").symlink_to("/w/work/lib.so")
    found = repro.scan_tree(tmp_path / "p", [("the work dir", "/w/work")])
    assert [p.split(" (")[0] for p in found] == ["lib/bad.py: contains the work dir", "lib/link: contains the work dir"]
    assert found[0].endswith("at byte 8)") and "'/w/work/lib.so'" in found[1]


def test_files_vendored_from_a_wheel_keep_their_builders_paths(tmp_path):
    import zipfile
    so = b"\x7fELF /root/usr/lib/gcc/include from the wheel builder"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "yaml-6.0-cp311-cp311-manylinux_x86_64.whl", "w") as z:
        z.writestr("yaml/_yaml.so", so)
    (tmp_path / "p/lib/python/yaml").mkdir(parents=True)
    (tmp_path / "p/lib/python/yaml/_yaml.so").write_bytes(so + b" RPATH patched by stage")
    (tmp_path / "p/lib/python/yaml/extra.so").write_bytes(so)  # not a file of the wheel
    (tmp_path / "p/lib/python/yaml/_yaml2.so").write_bytes(b"/root/.cache/onebit/x")
    forbidden = [("$HOME", "/root"), ("cache dir", "/root/.cache/onebit")]
    found = repro.scan_tree(tmp_path / "p", forbidden, repro.wheel_members([wheels]))
    assert [p.split(":")[0] for p in found] == ["lib/python/yaml/_yaml2.so", "lib/python/yaml/_yaml2.so",
                                                 "lib/python/yaml/extra.so"]
    assert len(repro.scan_tree(tmp_path / "p", forbidden)) == 4
