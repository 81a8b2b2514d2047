"""Model inspection with the gguf library: the facts route needs, and one clear error for bad files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onebit.errors import ModelError
from onebit.inspect import inspect_model
from tiny_gguf import write_garbage, write_onebp, write_tiny_gguf, write_truncated_gguf


@pytest.mark.parametrize(
    "kwargs,want",
    [
        ({}, dict(arch="llama", experts=0, hadamard=None, dflash_block_size=None, file_type=0)),
        ({"experts": 8}, dict(arch="llama", experts=8, hadamard=None)),
        ({"hadamard": 32}, dict(hadamard=32, experts=0)),
        ({"hadamard": 32, "experts": 4}, dict(hadamard=32, experts=4)),
        ({"dflash_block_size": 16}, dict(dflash_block_size=16)),
        ({"file_type": 2}, dict(file_type=2)),
        ({"f16": True}, dict(file_type=1)),
        ({"arch": "qwen3", "experts": 4}, dict(arch="qwen3", experts=4)),
    ],
)
def test_facts(tmp_path, kwargs, want):
    p = write_tiny_gguf(tmp_path / "m.gguf", **kwargs)
    facts = inspect_model(p)
    assert facts.kind == "gguf" and facts.path == str(p)
    for k, v in want.items():
        assert getattr(facts, k) == v, k
    assert facts.moe == (kwargs.get("experts", 0) > 1)
    assert facts.rotated == (kwargs.get("hadamard") == 32)


def test_onebp(tmp_path):
    facts = inspect_model(write_onebp(tmp_path / "m.1bp"))
    assert facts.kind == "1bp" and facts.onebp and facts.arch is None


def test_every_truncation_is_one_clear_error(tmp_path):
    full = write_tiny_gguf(tmp_path / "full.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    # every prefix length through the header and metadata, then a stride through the tensor data
    lengths = list(range(0, 4096, 7)) + list(range(4096, len(full), 4093))
    for n in lengths:
        cut.write_bytes(full[:n])
        with pytest.raises(ModelError) as e:
            inspect_model(cut)
        msg = str(e.value)
        assert "\n" not in msg and str(cut) in msg, (n, msg)


def test_truncated_in_tensor_data_says_truncated(tmp_path):
    p = write_truncated_gguf(tmp_path / "t.gguf", keep_bytes=len(write_tiny_gguf(tmp_path / "x.gguf").read_bytes()) - 10)
    with pytest.raises(ModelError, match="truncated"):
        inspect_model(p)


@pytest.mark.parametrize(
    "data,msg",
    [
        (b"", "too short"),
        (b"GG", "too short"),
        (b"PK\x03\x04 a zip file", "not a GGUF file"),
        (b"GGUF" + b"\xff" * 60, "malformed or truncated GGUF"),
    ],
)
def test_malformed(tmp_path, data, msg):
    p = write_garbage(tmp_path / "bad.gguf", data)
    with pytest.raises(ModelError, match=msg):
        inspect_model(p)


def test_missing_and_directory(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        inspect_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelError, match="is a directory"):
        inspect_model(tmp_path)


def _special(tmp_path, kind):
    """A path of the given kind; (path, what the refusal calls it, things to clean up)."""
    import socket

    if kind == "fifo":
        path = tmp_path / "model.gguf"
        os.mkfifo(path)
        return path, "a FIFO (named pipe)", []
    if kind == "fifo-symlink":
        fifo = tmp_path / "pipe"
        os.mkfifo(fifo)
        path = tmp_path / "model.gguf"
        path.symlink_to(fifo)
        return path, "a FIFO (named pipe)", []
    if kind == "socket":
        path = tmp_path / "model.gguf"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        s.listen(1)
        return path, "a socket", [s]
    if kind == "char-device":
        return Path("/dev/null"), "a character device", []
    return tmp_path, "a directory", []


@pytest.mark.parametrize("kind", ["fifo", "fifo-symlink", "socket", "char-device", "directory"])
def test_a_path_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path, kind):
    """A FIFO with no writer blocks open() for ever: the refusal comes from stat, in a child with a deadline."""
    path, what, keep = _special(tmp_path, kind)
    code = ("import sys\nfrom onebit.errors import ModelError\nfrom onebit.inspect import inspect_model\n"
            "try:\n    inspect_model(sys.argv[1])\nexcept ModelError as e:\n    print(e)\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=20,
                           cwd=Path(__file__).resolve().parent.parent)
    finally:
        for k in keep:
            k.close()
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"model path is {what}, not a regular file: {path}\n"


def test_tiny_gguf_cli(tmp_path):
    script = Path(__file__).with_name("tiny_gguf.py")
    out = tmp_path / "cli.gguf"
    subprocess.run([sys.executable, str(script), str(out), "--experts", "4", "--hadamard", "32",
                    "--dflash-block-size", "8", "--file-type", "2"], check=True)
    f = inspect_model(out)
    assert (f.experts, f.hadamard, f.dflash_block_size, f.file_type) == (4, 32, 8, 2)
    subprocess.run([sys.executable, str(script), str(tmp_path / "p.1bp"), "--onebp"], check=True)
    assert (tmp_path / "p.1bp").read_bytes()[:4] == b"1BP\0"
    subprocess.run([sys.executable, str(script), str(tmp_path / "t.gguf"), "--truncate", "100"], check=True)
    assert (tmp_path / "t.gguf").stat().st_size == 100
