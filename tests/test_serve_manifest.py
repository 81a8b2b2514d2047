"""Manifest discovery and loading; the schema symlink works materialized too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import onebit
from onebit.errors import ManifestError
from onebit.manifest import default_manifest_path, load_manifest, schema
from serve_fixtures import write_manifest

REPO = Path(__file__).resolve().parent.parent


def test_schema_is_a_relative_symlink_to_the_one_source():
    link = Path(onebit.__file__).parent / "data" / "manifest.schema.json"
    if link.is_symlink():
        assert os.readlink(link) == "../../schemas/manifest.schema.json"
    assert schema() == json.loads((REPO / "schemas" / "manifest.schema.json").read_text())


def test_schema_works_materialized(tmp_path):
    shutil.copytree(Path(onebit.__file__).parent, tmp_path / "onebit", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert not (tmp_path / "onebit/data/manifest.schema.json").is_symlink()
    m = write_manifest(tmp_path / "p", ["cpu"])
    code = ("import onebit, sys; from onebit.manifest import load_manifest, schema; "
            "assert onebit.__file__.startswith(sys.argv[1]); "
            "print(load_manifest(sys.argv[2]).bundle, schema()['title'])")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(m)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("test onebit bundle manifest")


def test_default_path_order(tmp_path):
    inst = tmp_path / "inst"
    m = write_manifest(inst, ["cpu"])
    (inst / "bin").mkdir()
    argv0 = inst / "bin" / "1bit"
    argv0.write_text("")
    other = tmp_path / "sysprefix"
    assert default_manifest_path("x.json", {"ONEBIT_MANIFEST": "e.json"}, str(argv0), str(other)) == Path("x.json")
    assert default_manifest_path(None, {"ONEBIT_MANIFEST": "e.json"}, str(argv0), str(other)) == Path("e.json")
    assert default_manifest_path(None, {}, str(argv0), str(other)) == m.resolve()
    # a symlinked 1bit resolves to its install
    (tmp_path / "link").symlink_to(argv0)
    assert default_manifest_path(None, {}, str(tmp_path / "link"), str(other)) == m.resolve()
    # not found next to argv[0]: sys.prefix
    sp = write_manifest(other, ["cpu"])
    assert default_manifest_path(None, {}, str(tmp_path / "nowhere" / "1bit"), str(other)) == sp


def test_load_manifest_fields(tmp_path):
    m = load_manifest(write_manifest(tmp_path, ["cpu", "rocm"], envs={"cpu": {"A": "1"}}, recipes="share/r.json"))
    assert m.bundle == "test" and m.version == "1.2.3" and m.build_number == 4
    assert m.prefix == tmp_path.resolve()
    assert m.backends["rocm"].features == ("hadamard_w4a4",)
    assert m.backends["cpu"].env == {"A": "1"}
    assert m.backends["cpu"].binary(m.prefix) == m.prefix / "libexec/onebit/cpu/llama-server"
    assert m.recipes == m.prefix / "share/r.json"


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda d: d["backends"].update(tpu=d["backends"]["cpu"]), "invalid manifest at backends"),
        (lambda d: d["backends"]["cpu"]["binaries"].update({"llama-server": "/abs/llama-server"}),
         "backends/cpu/binaries/llama-server"),
        (lambda d: d.pop("version"), "'version' is a required property"),
    ],
)
def test_invalid_manifest(tmp_path, mutate, msg):
    p = write_manifest(tmp_path, ["cpu"])
    d = json.loads(p.read_text())
    mutate(d)
    p.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=msg):
        load_manifest(p)
    p.write_text("{not json")
    with pytest.raises(ManifestError, match=r"manifest.json:1: manifest is not valid JSON"):
        load_manifest(p)
