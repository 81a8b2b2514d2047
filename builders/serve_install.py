"""Install the `onebit` package into a bundle prefix with a relocatable `bin/1bit` launcher.

Run by the serve recipe's build commands: python -m builders.serve_install SOURCE_DIR PREFIX
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

LAUNCHER = '''#!/usr/bin/env python3
"""1bit: the 1bit engine's entry point (`1bit serve`, `1bit version`), installed by onebit-build."""
import os
import sys

TAG = "{tag}"
prefix = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
if "cp%d%d" % sys.version_info[:2] != TAG:
    wanted = "python%s.%s" % (TAG[2], TAG[3:])
    for d in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(d, wanted)
        if os.access(candidate, os.X_OK):
            os.execv(candidate, [candidate, os.path.realpath(__file__)] + sys.argv[1:])
    sys.stderr.write("1bit: this bundle's Python dependencies were built for %s; run it with %s\\n" % (TAG, wanted))
    sys.exit(2)
sys.path.insert(0, os.path.join(prefix, "lib", "onebit", "python"))
from onebit.cli import main  # noqa: E402

sys.exit(main())
'''


def drop_script_records(site: Path) -> None:
    """The removed console scripts stay listed in their wheels' RECORD, with a hash of a file that held the build's
    interpreter path: drop those lines, so the shipped tree names only what it ships and two builds give one byte."""
    for record in sorted(site.glob("*.dist-info/RECORD")):
        lines = record.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("../../bin/")]
        if kept != lines:
            record.write_text("".join(kept))


def install(source: Path, prefix: Path) -> None:
    site = prefix / "lib" / "onebit" / "python"
    site.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts of vendored wheels point at the build's python
    drop_script_records(site)
    target = site / source.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    launcher = prefix / "bin" / "1bit"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(LAUNCHER.replace("{tag}", tag))
    os.chmod(launcher, 0o755)


if __name__ == "__main__":
    install(Path(sys.argv[1]).resolve(), Path(sys.argv[2]))
