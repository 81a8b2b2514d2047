"""Shared fixtures. tests/ is on sys.path so test modules import their helpers (tiny_gguf, serve_fixtures, ...)."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from cpu_bundle import BuiltBundle, build_cpu_bundle  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if os.environ.get("ONEBIT_SKIP_E2E"):
        skip = pytest.mark.skip(reason="ONEBIT_SKIP_E2E is set")
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(skip)


def missing_host_tool(why: str):
    """A host tool a test needs is absent: `nox -s tests` installs every one first (ONEBIT_REQUIRE_TOOLCHAINS), so
    there it is a failure; a bare `pytest` elsewhere skips with the same one-line reason."""
    if os.environ.get("ONEBIT_REQUIRE_TOOLCHAINS"):
        pytest.fail(f"{why} (`nox -s tests` should have installed it)")
    pytest.skip(why)


def working_cargo() -> str | None:
    """A cargo that runs: the one on PATH, else Debian's. A rustup proxy with no default toolchain does not count."""
    import subprocess

    for exe in (shutil.which("cargo"), "/usr/bin/cargo"):
        if exe and Path(exe).is_file() and subprocess.run([exe, "--version"], capture_output=True).returncode == 0:
            return exe
    return None


@pytest.fixture
def cargo(monkeypatch) -> str:
    """The path of a working cargo, first on PATH for the code under test."""
    exe = working_cargo()
    if exe is None:
        missing_host_tool("no working cargo: apt-get install cargo")
    monkeypatch.setenv("PATH", f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


@contextmanager
def live_output(request):
    """Let a long fixture build's progress reach the terminal or CI log (pytest captures it otherwise): the builder's
    plain `... build:cpu [n/m] s` lines then show every 30 s instead of minutes of silence."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        yield
        return
    with capman.global_and_fixture_disabled():
        yield


@pytest.fixture(scope="session")
def cpu_bundle(tmp_path_factory, request) -> BuiltBundle:
    """The real CPU bundle: fetched through the sdist mirror, patched, built with CMake (ccache allowed), staged,
    packaged, indexed and installed offline into a prefix. Built once per test session."""
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.fail("cmake and ninja are needed for the end-to-end build (.ci/run installs them)")
    with live_output(request):
        return build_cpu_bundle(tmp_path_factory.mktemp("cpu-bundle"))


@pytest.fixture(scope="session")
def cpu_bundle_prefix(cpu_bundle) -> Path:
    return cpu_bundle.prefix
