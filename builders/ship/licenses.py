"""Which license file each package carries under info/licenses/ (conda-forge's rule; llama.cpp's MIT license asks for it)."""
from __future__ import annotations

from pathlib import Path

NAMES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "LICENSE-MIT", "COPYING")


def license_in(directory: Path) -> Path | None:
    """The upstream's license file at the top of a checkout, or None."""
    for name in NAMES:
        if (directory / name).is_file():
            return directory / name
    return None


def source_dir_of(plan, step) -> Path | None:
    """Walk a package step's needs (package -> stage -> build -> source) to the checkout it was built from."""
    by_id = {s.id: s for s in plan.steps}
    todo, seen = list(step.needs), set()
    while todo:
        sid = todo.pop(0)
        if sid in seen or sid not in by_id:
            continue
        seen.add(sid)
        s = by_id[sid]
        if s.action == "source":
            return Path(s.data.dir)
        todo += list(s.needs)
    return None


def package_license_files(plan, step, root: Path) -> list[str]:
    """The upstream's license for a pinned source; the project's own LICENSE for a local one (serve)."""
    src = source_dir_of(plan, step)
    found = license_in(src) if src is not None else license_in(root)
    return [str(found)] if found else []
