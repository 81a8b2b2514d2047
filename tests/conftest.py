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
