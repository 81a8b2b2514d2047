"""Reproducibility: the leak check on what ships (no build machine path in a package), and release comparisons.

Pure where it can be: the stage step calls `scan_tree` on every staged file and fails on any hit (as it already fails
on a build-tree RPATH). The flags that keep build paths out of binaries are the build kinds' (builders/kinds/flags.py).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def _roots(forbidden: Sequence[tuple[str, str]]) -> list[tuple[str, bytes]]:
    out = []
    for label, root in forbidden:
        root = (root or "").rstrip("/")
        if root.count("/") >= 1 and len(root) > 1:  # "/" or "" would match everything: not a useful root
            out.append((label, root.encode()))
    return out


def leak_problems(rel: str, data: bytes, forbidden: Sequence[tuple[str, str]]) -> list[str]:
    """Pure: one line per forbidden root (work dir, cache dir, $HOME) whose path appears inside a shipped file."""
    problems = []
    for label, root in _roots(forbidden):
        at = -1
        for follow in (b"/", b"\0", b"\n", b'"', b"'", b":", b" "):
            at = data.find(root + follow)
            if at >= 0:
                break
        if at < 0 and data.endswith(root):
            at = len(data) - len(root)
        if at >= 0:
            end = data.find(b"\0", at)
            snippet = data[at: end if 0 <= end - at < 120 else at + 120].decode(errors="replace")
            problems.append(f"{rel}: contains {label} ({snippet!r} at byte {at})")
    return problems


def wheel_members(wheel_dirs: Iterable[Path]) -> dict[str, Path]:
    """Every file inside these wheels (member path -> the wheel holding it): what a recipe vendors from upstream."""
    from ..io.archives import members

    out = {}
    for d in wheel_dirs:
        for whl in sorted(Path(d).glob("*.whl")):
            for m in members(whl):
                if not m.name.endswith("/"):
                    out[m.name] = whl
    return out


def _vendored_leak(rel: str, problems: list[str], forbidden, vendored: Mapping[str, Path]) -> bool:
    """True when `rel` is a file of a vendored upstream wheel that already holds these same paths (its builder's,
    e.g. manylinux builds as root, so `/root/...`): stage may have patched its RPATH, so bytes are not compared."""
    from ..io.archives import read

    parts = rel.split("/")
    for i in range(len(parts)):
        member = "/".join(parts[i:])
        if member in vendored:
            data = read(vendored[member], member, limit=1 << 30) or b""
            theirs = {p.split(" (")[0].split(": ", 1)[1] for p in leak_problems(member, data, forbidden)}
            ours = {p.split(" (")[0].split(": ", 1)[1] for p in problems}
            return ours <= theirs
    return False


def scan_tree(prefix: Path, forbidden: Sequence[tuple[str, str]], vendored: Mapping[str, Path] | None = None) -> list[str]:
    """Every leak in the regular files below `prefix` (symlinks are not followed: their targets are checked apart).
    A file of a vendored upstream wheel whose wheel copy holds the same paths is not our leak."""
    problems = []
    for path in sorted(prefix.rglob("*")):
        if path.is_file() and not path.is_symlink():
            rel = path.relative_to(prefix).as_posix()
            found = leak_problems(rel, path.read_bytes(), forbidden)
            if found and vendored and _vendored_leak(rel, found, forbidden, vendored):
                continue
            problems += found
        elif path.is_symlink():
            problems += leak_problems(path.relative_to(prefix).as_posix(), str(path.readlink()).encode(), forbidden)
    return problems


def compare_dirs(a: Path, b: Path, names: Sequence[str] | None = None, *, diffoscope: str | None = None,
                 max_lines: int = 40) -> list[str]:
    """Which files differ between two release directories, and where (diffoscope's first lines when installed)."""
    import shutil as _shutil

    from ..io import runner

    names = sorted(names if names is not None else {p.name for p in a.iterdir() if p.is_file()} |
                   {p.name for p in b.iterdir() if p.is_file()})
    tool = diffoscope or _shutil.which("diffoscope")
    problems = []
    for name in names:
        fa, fb = a / name, b / name
        if not fa.is_file() or not fb.is_file():
            problems.append(f"{name}: only in {a if fa.is_file() else b}")
            continue
        if fa.read_bytes() == fb.read_bytes():
            continue
        problems.append(f"{name}: differs")
        if tool:
            try:
                proc = runner.run([tool, "--text", "-", "--max-report-size", "200000", str(fa), str(fb)], timeout=600)
            except runner.TimedOut:
                problems.append("    diffoscope did not finish within 600 s")
                continue
            problems += ["    " + line for line in proc.stdout.splitlines()[:max_lines]]
    return problems


def drop_bytecode(prefix: Path) -> list[str]:
    """Delete every __pycache__ and .pyc/.pyo below `prefix` (they embed build paths and times); return what went."""
    import shutil as _shutil

    gone = []
    for path in sorted(prefix.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_symlink():
            continue
        if path.is_file() and path.suffix in (".pyc", ".pyo"):
            gone.append(path.relative_to(prefix).as_posix())
            path.unlink()
        elif path.is_dir() and path.name == "__pycache__":
            _shutil.rmtree(path)
    return gone


def builder_python_env() -> list[tuple[str, str]]:
    """The builder's virtual environment as a forbidden root (pip writes its interpreter into script shebangs);
    nothing for a system Python, whose prefix (/usr) is no build-machine path."""
    import sys

    return [("the builder's Python environment", sys.prefix)] if sys.prefix != sys.base_prefix else []
