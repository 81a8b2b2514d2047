"""The channel, consumed with the clients its users already run: py-rattler solving and installing exactly as pixi
does (the host's detected virtual packages, nothing injected), conda's own package reader (conda-package-handling),
and `bin/1bit` on every CPython the serve package supports, not only the build's."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from builders.project import config
from builders.plan import make_plan
from builders.plan_types import Layout
from serve_fixtures import free_port, wait_http
from test_plan import facts
from tiny_gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)
# what pixi, mamba and conda detect on a Linux host (rattler's VirtualPackage.detect; conda's own plugins)
CLIENT_VIRTUAL = {"__glibc", "__cuda", "__linux", "__unix", "__archspec"}
SERVE_PYTHONS = tuple(PROJECT.recipes["serve"].source["pythons"])


@pytest.mark.parametrize("bundle", sorted(PROJECT.bundles))
def test_every_requirement_is_a_client_virtual_package_or_in_the_bundle(bundle):
    plan = make_plan(PROJECT, bundle, facts(), Layout(ROOT, Path("/c"), Path(f"/w/{bundle}"), Path(f"/o/{bundle}")))
    packages = [s.data for s in plan.steps if s.action == "package"]
    names = {p.name for p in packages}
    for p in packages:
        for spec in p.depends:
            name = spec.split()[0]
            assert name in CLIENT_VIRTUAL or name in names, f"{p.name} requires {spec!r}, which no conda client provides"


def test_serve_supports_the_distros_pythons():
    """Debian 12 has 3.11, Ubuntu 24.04 3.12, Debian 13 3.13."""
    assert {"3.11", "3.12", "3.13"} <= set(SERVE_PYTHONS)


# ---- the real CPU channel -----------------------------------------------------------------------------------------
def pixi_install(channel: Path, prefix: Path, spec: str, cache: Path) -> list:
    """What pixi does with a channel: rattler.solve with the host's detected virtual packages (no overrides, nothing
    added), then rattler.install of the solution."""
    import rattler
    from rattler import Channel, ChannelConfig, VirtualPackage

    async def go():
        source = Channel(channel.as_uri(), ChannelConfig(channel_alias="file:///", root_dir=str(channel.parent)))
        records = await rattler.solve(sources=[source], specs=[spec], platforms=["linux-64", "noarch"],
                                      virtual_packages=VirtualPackage.detect())
        await rattler.install(records, target_prefix=str(prefix), cache_dir=str(cache), show_progress=False)
        return records

    return asyncio.run(go())


def interpreter(minor: str) -> str | None:
    """A CPython `minor` on this machine: on PATH, the distribution's, or pyenv's."""
    found = shutil.which(f"python{minor}")
    candidates = ([found] if found else []) + [f"/usr/bin/python{minor}"]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(str(p) for p in pyenv.glob(f"{minor}.*/bin/python{minor}"))
    for c in candidates:
        if Path(c).is_file() and subprocess.run([c, "-c", "import sys; assert sys.implementation.name == 'cpython'"],
                                                capture_output=True).returncode == 0:
            return c
    return None


def serve_completion(argv: list, model: Path, env: dict) -> dict:
    port = free_port()
    proc = subprocess.Popen([*map(str, argv), "serve", "-m", str(model), "--port", str(port), "--alias", "tiny",
                             "-t", "2", "-c", "256"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=90)
        r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        return r.json()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def clean_env(path_first: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONEBIT_", "CONDA_OVERRIDE")) and k != "LD_LIBRARY_PATH"}
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def pixi_prefix(cpu_bundle, tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("pixi") / "prefix"
    records = pixi_install(cpu_bundle.layout.out / "channel", prefix, "onebit-bundle-cpu", prefix.parent / "pkgs")
    assert sorted(r.name.normalized for r in records) == ["onebit-bundle-cpu", "onebit-cpu", "onebit-serve"]
    return prefix


@pytest.mark.e2e
def test_pixi_style_install_serves_a_completion_with_its_own_1bit(pixi_prefix, tmp_path):
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model)
    answer = serve_completion([pixi_prefix / "bin" / "1bit"], model, clean_env())
    assert answer["choices"][0]["message"] and answer["usage"]["completion_tokens"] == 4


@pytest.mark.e2e
def test_1bit_build_install_is_the_same_solve(cpu_bundle, pixi_prefix):
    """`1bit-build install` (the cpu_bundle fixture installed with it) gets the very packages pixi got."""
    ours = sorted(p.name for p in (cpu_bundle.prefix / "conda-meta").glob("*.json") if p.name != "history")
    theirs = sorted(p.name for p in (pixi_prefix / "conda-meta").glob("*.json") if p.name != "history")
    assert ours == theirs and len(ours) == 3


@pytest.mark.e2e
def test_every_conda_file_opens_with_condas_own_reader(cpu_bundle, tmp_path):
    from conda_package_handling.api import extract

    channel = cpu_bundle.layout.out / "channel"
    repodata = json.loads((channel / "linux-64" / "repodata.json").read_text())["packages.conda"]
    planned = {s.data.name: s.data for s in cpu_bundle.plan.steps if s.action == "package"}
    files = sorted((channel / "linux-64").glob("*.conda"))
    assert len(files) == 3 and set(repodata) == {f.name for f in files}
    for f in files:
        out = tmp_path / f.stem
        extract(str(f), dest_dir=str(out))
        index = json.loads((out / "info" / "index.json").read_text())
        record = repodata[f.name]
        for key in ("name", "version", "build", "build_number", "depends", "license", "subdir"):
            assert index[key] == record[key], (f.name, key)
        assert index["subdir"] == "linux-64"
        assert not any(d.startswith("__python") for d in index["depends"])
        paths = json.loads((out / "info" / "paths.json").read_text())["paths"]
        assert paths and all((out / p["_path"]).exists() or (out / p["_path"]).is_symlink() for p in paths)
        if index["name"] in planned:  # what the plan asked for is what conda reads
            data = planned[index["name"]]
            assert (index["version"], index["build"]) == (data.version, data.build_string)
            assert set(data.depends) <= set(index["depends"])
        else:
            assert index["name"] == "onebit-bundle-cpu" and (out / "share/onebit/manifest.json").is_file()
    serve = json.loads((tmp_path / next(f.stem for f in files if f.name.startswith("onebit-serve-")) / "info" /
                        "index.json").read_text())
    # no __python: bin/1bit runs on the host's CPython; only the glibc its compiled wheels need
    assert [d.split()[0] for d in serve["depends"]] == ["__glibc"], serve["depends"]


@pytest.mark.e2e
def test_the_serve_package_carries_a_wheel_set_per_python(pixi_prefix):
    lib = pixi_prefix / "lib" / "onebit"
    assert (lib / "python" / "onebit" / "cli.py").is_file() and (lib / "python" / "jsonschema").is_dir()
    for minor in SERVE_PYTHONS:
        tag = "cp" + minor.replace(".", "")
        numpy = list((lib / f"python-{tag}" / "numpy" / "_core").glob(f"_multiarray_umath.cpython-{tag[2:]}-*.so"))
        assert numpy, f"no numpy for CPython {minor}"
    assert not (lib / "python" / "numpy").exists()  # compiled wheels only in their Python's set


@pytest.mark.e2e
@pytest.mark.parametrize("minor", SERVE_PYTHONS)
def test_bin_1bit_runs_on_each_supported_cpython(pixi_prefix, minor, tmp_path):
    """`bin/1bit` as a user runs it: `#!/usr/bin/env python3` finds the host's python3, whichever minor it is."""
    exe = interpreter(minor)
    if exe is None:
        pytest.skip(f"no CPython {minor} on this machine (its proof: the H200 has 3.12; see docs/cuda-h200.md)")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").symlink_to(exe)
    env = clean_env(shim)
    out = subprocess.run([pixi_prefix / "bin" / "1bit", "serve", "--help"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and "--device" in out.stdout, out.stderr
    # the launcher's own sys.path, on this Python: the compiled wheels load from its set
    code = (pixi_prefix / "bin" / "1bit").read_text().replace("sys.exit(main())",
                                                               "import numpy, aiohttp, yarl; print(numpy.__file__)")
    probe = subprocess.run([exe, "-c", f"__file__ = {str(pixi_prefix / 'bin' / '1bit')!r}\n" + code],
                           capture_output=True, text=True, env=env)
    tag = "cp" + minor.replace(".", "")
    assert probe.returncode == 0 and f"/lib/onebit/python-{tag}/numpy/" in probe.stdout, probe.stdout + probe.stderr
    check = subprocess.run([pixi_prefix / "bin" / "1bit", "check"], capture_output=True, text=True, env=env, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.e2e
def test_a_completion_on_a_python_other_than_the_builds(pixi_prefix, tmp_path):
    here = "%d.%d" % sys.version_info[:2]
    others = [(m, interpreter(m)) for m in SERVE_PYTHONS if m != here]
    others = [(m, exe) for m, exe in others if exe]
    if not others:
        pytest.skip(f"only CPython {here} here; the H200 (3.12) runs this proof (docs/cuda-h200.md)")
    minor, exe = others[-1]
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model)
    answer = serve_completion([exe, pixi_prefix / "bin" / "1bit"], model, clean_env())
    assert answer["usage"]["completion_tokens"] == 4, (minor, answer)


def test_launcher_on_an_unsupported_python_says_which_to_run(tmp_path):
    """The launcher itself, on a Python outside its set and with none of the set on PATH: one line naming them."""
    from builders.ship.serve_install import LAUNCHER

    prefix = tmp_path / "p"
    (prefix / "bin").mkdir(parents=True)
    launcher = prefix / "bin" / "1bit"
    launcher.write_text(LAUNCHER.replace("{pythons}", repr(("3.98", "3.99"))))
    out = subprocess.run([sys.executable, launcher, "version"], capture_output=True, text=True,
                         env={"PATH": str(tmp_path / "empty")})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "runs on CPython 3.98, 3.99" in out.stderr and "python3.99" in out.stderr


def test_launcher_re_execs_a_supported_python_from_path(tmp_path):
    from builders.ship.serve_install import LAUNCHER

    prefix = tmp_path / "p"
    (prefix / "bin").mkdir(parents=True)
    launcher = prefix / "bin" / "1bit"
    launcher.write_text(LAUNCHER.replace("{pythons}", repr(("3.98", "3.99"))))
    found = tmp_path / "found"
    found.mkdir()
    record = tmp_path / "argv"
    (found / "python3.99").write_text(f"#!/bin/sh\necho \"$@\" > {record}\n")
    (found / "python3.99").chmod(0o755)
    out = subprocess.run([sys.executable, launcher, "serve", "--help"], capture_output=True, text=True,
                         env={"PATH": f"{tmp_path / 'empty'}:{found}"})
    assert out.returncode == 0, out.stderr
    assert record.read_text().split() == [str(launcher.resolve()), "serve", "--help"]
