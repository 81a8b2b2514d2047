"""`python -m builders.pins [--root DIR] status|bump|check` (the same command as `1bit-build pins ...`)."""
from __future__ import annotations

import argparse
import sys

from .cli import register


def main(argv: list[str] | None = None) -> int:
    rest = list(sys.argv[1:] if argv is None else argv)
    root = "."
    if rest[:1] == ["--root"] and len(rest) > 1:
        root, rest = rest[1], rest[2:]
    elif rest and rest[0].startswith("--root="):
        root, rest = rest[0].split("=", 1)[1], rest[1:]
    parser = argparse.ArgumentParser(prog="python -m builders.pins")
    parser.add_argument("--root", default=".", help="project root (default: current directory)")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["--root", root, "pins", *rest])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
