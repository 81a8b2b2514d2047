"""A recipe's hardware checklist as a release gate on the self-hosted runner: `1bit check`, then every checklist line
that can run unattended, with `<prefix>` and `<model ...>` filled in; the rest is listed as manual.

    python -m builders.release.checklist --prefix P --model M RECIPE...
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Item:
    line: str
    argv: tuple[str, ...] | None  # None: manual (or the build itself, which the job already ran)
    why: str = ""


def plan_items(lines: list[str], prefix: str, model: str | None, which=shutil.which) -> list[Item]:
    """Pure given `which`: each checklist line -> the command to run, or why it is not run."""
    items = []
    for raw in lines:
        line = raw.split("  #", 1)[0].split(" # ", 1)[0].strip()
        if re.match(r"^nox -s build-", line):
            items.append(Item(raw, None, "the build itself (already done by this job)"))
            continue
        text = line.replace("<prefix>", prefix)
        if re.search(r"<[^>]*>", text):
            if model is None:
                items.append(Item(raw, None, "needs a model: pass --model"))
                continue
            text = re.sub(r"<[^>]*>", model, text)
        try:
            argv = tuple(shlex.split(text))
        except ValueError:
            items.append(Item(raw, None, "not a command"))
            continue
        if not argv or ("&&" in argv or "|" in argv) or not (which(argv[0]) or Path(argv[0]).is_absolute()):
            items.append(Item(raw, None, "manual step"))
            continue
        items.append(Item(raw, argv))
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m builders.release.checklist")
    p.add_argument("recipes", nargs="+")
    p.add_argument("--root", default=".")
    p.add_argument("--prefix", required=True)
    p.add_argument("--model")
    args = p.parse_args(argv)
    prefix = str(Path(args.prefix).resolve())
    env = dict(os.environ, PATH=f"{prefix}/bin:{os.environ.get('PATH', '')}")
    failed = 0
    lines = ["1bit check"]
    for name in args.recipes:
        recipe = yaml.safe_load((Path(args.root) / "recipes" / f"{name}.yaml").read_text())
        lines += [str(x) for x in recipe.get("hardware_checklist") or []]
    for item in plan_items(lines, prefix, args.model, which=lambda c: shutil.which(c, path=env["PATH"])):
        if item.argv is None:
            print(f"skip  {item.line}  ({item.why})")
            continue
        proc = subprocess.run(item.argv, env=env, check=False)
        print(f"{'ok  ' if proc.returncode == 0 else 'FAIL'}  {item.line}", flush=True)
        failed += proc.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
