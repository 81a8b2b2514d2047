"""What the build-flag report of a pin bump costs, and what fetching only the build files saves, side by side.

    python bench/bench_flag_drift.py [--tree DIR] [--files 3000] [--size 60000]

An upstream is made as a local git repository with two commits: DIR's files (a llama.cpp checkout, say) or a
synthetic tree of --files sources of --size bytes with a CMakeLists.txt per directory. Then, for the old and the
new commit:
  whole    a depth-1 fetch of every blob and a worktree (what the patch report's scratch does)
  sparse   builders.pins.flagdrift.Source: a blob-less depth-1 fetch, then the build files only (what the cmake and
           zig comparisons read)
and the cmake declarations read from each checkout, which must agree.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builders.pins import flag_options, gitops  # noqa: E402
from builders.pins.flagdrift import Source, Tree, is_build_file  # noqa: E402

ENV = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *ENV, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_upstream(base: Path, tree: Path | None, files: int, size: int) -> tuple[str, str, str]:
    up = base / "upstream"
    if tree:
        shutil.copytree(tree, up, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    else:
        for i in range(files):
            d = up / f"dir{i // 100:03d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"src{i}.c").write_text(f"/* {i} */\n" + "x" * size)
            if not (d / "CMakeLists.txt").exists():
                (d / "CMakeLists.txt").write_text(f'option(OPT_{i // 100} "dir {i // 100}" ON)\n')
        (up / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(b C)\n")
    git(up.parent, "init", "-q", "-b", "main", str(up))
    for key in ("uploadpack.allowFilter", "uploadpack.allowAnySHA1InWant"):
        git(up, "config", key, "true")
    git(up, "add", "-A")
    git(up, "commit", "-q", "-m", "old")
    old = git(up, "rev-parse", "HEAD")
    with (up / "CMakeLists.txt").open("a") as fh:
        fh.write('\noption(BENCH_NEW "added by the new commit" OFF)\n')
    git(up, "commit", "-q", "-am", "new")
    return up.as_uri(), old, git(up, "rev-parse", "HEAD")


def whole(url: str, commits: list[str], base: Path) -> tuple[float, list[dict]]:
    t = time.monotonic()
    decls = []
    with gitops.Scratch() as s:
        for c in commits:
            s.fetch_tree(url, c)
            gitops.git(["worktree", "add", "--quiet", "--detach", str(base / f"whole-{c[:7]}"), c], cwd=s.dir)
            decls.append(Tree(base / f"whole-{c[:7]}", c).cmake())
    return time.monotonic() - t, decls


def sparse(url: str, commits: list[str], base: Path) -> tuple[float, list[dict]]:
    t = time.monotonic()
    decls = []
    with Source(url, None) as src:
        for c in commits:
            decls.append(src.checkout(c, base / f"sparse-{c[:7]}", is_build_file).cmake())
    return time.monotonic() - t, decls


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", type=Path, help="a source tree to use as the upstream (default: a synthetic one)")
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--size", type=int, default=60_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flags-") as tmp:
        base = Path(tmp)
        url, old, new = make_upstream(base, args.tree, args.files, args.size)
        t_whole, d_whole = whole(url, [old, new], base)
        t_sparse, d_sparse = sparse(url, [old, new], base)
        assert d_whole == d_sparse, "the two checkouts read different declarations"
        n = len(d_sparse[1])
        gone = flag_options.compare_options("cmake", [], d_sparse[0], d_sparse[1])
        print(f"upstream: {args.tree or f'{args.files} files of {args.size} bytes'}; {n} declarations at new, "
              f"{sum(r.result == 'new option' for r in gone)} new")
        print(f"whole tree, old + new : {t_whole:7.2f} s")
        print(f"build files only      : {t_sparse:7.2f} s")
        print(f"ratio                 : {t_whole / t_sparse:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
