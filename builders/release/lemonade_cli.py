"""`1bit-build lemonade install`: put release archives into Lemonade's cache offline."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..errors import OnebitError

console = Console(stderr=True)


def _opt(value):
    return Path(value) if value else None


def cmd_install(args) -> int:
    from . import lemonade

    cache = Path(args.lemonade_cache) if args.lemonade_cache else lemonade.cache_dir()
    archives = [Path(a) for a in args.archives]
    for archive in archives:  # verify every checksum before installing anything
        if not archive.is_file():
            raise OnebitError(f"{archive}: no such archive")
        lemonade.expected_sha(archive.name, fragment_path=_opt(args.fragment), sums_path=_opt(args.sums))
    for archive in archives:
        sha = lemonade.expected_sha(archive.name, fragment_path=_opt(args.fragment), sums_path=_opt(args.sums))
        target = lemonade.install(archive, cache, recipe=args.recipe, backend=args.backend, tag=args.tag, sha=sha)
        console.print(f"[green]installed[/] {archive.name} -> {target}", highlight=False)
    return 0


def register(sub) -> None:
    s = sub.add_parser("lemonade", help="Lemonade backends: install a release archive offline into Lemonade's cache")
    lsub = s.add_subparsers(dest="lemonade_command", required=True, metavar="ACTION")
    i = lsub.add_parser("install", help="install archives into <cache>/bin/<recipe>/<backend>/ as Lemonade does")
    i.add_argument("archives", nargs="+", metavar="ARCHIVE")
    i.add_argument("--cache", dest="lemonade_cache", metavar="DIR",
                   help="Lemonade's cache (default: $LEMONADE_CACHE_DIR, $CACHE_DIRECTORY, $XDG_CACHE_HOME/lemonade, "
                        "~/.cache/lemonade)")
    i.add_argument("--recipe", help="Lemonade recipe (default: from the archive name, llamacpp)")
    i.add_argument("--backend", help="Lemonade backend (default: from the archive name)")
    i.add_argument("--tag", help="the version written to version.txt (default: from the archive name)")
    g = i.add_mutually_exclusive_group()
    g.add_argument("--fragment", metavar="JSON", help="verify against this backend_versions.json fragment")
    g.add_argument("--sums", metavar="SHA256SUMS", help="verify against this GNU SHA256SUMS file")
    i.set_defaults(func=cmd_install)
