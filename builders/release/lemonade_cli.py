"""`1bit-build lemonade install` and `1bit-build lemonade fragment`: put release archives into Lemonade's cache offline
and pin them there; write the backend_versions.json fragment for the repository Lemonade downloads them from."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console

from ..errors import OnebitError

console = Console(stderr=True)


def _say(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def cmd_install(args) -> int:
    from . import lemonade_config, lemonade_install

    if not (args.fragment or args.sums or args.no_verify):
        raise OnebitError("nothing to verify the archives against; nothing was installed",
                          hint="pass --sums SHA256SUMS or --fragment backend_versions.json from the same release "
                               "(or --no-verify to install unverified archives)")
    cache = Path(args.lemonade_cache) if args.lemonade_cache else lemonade_install.cache_dir()
    if args.config:
        config = Path(args.config)
    else:
        config = lemonade_config.config_dir(cache=Path(args.lemonade_cache) if args.lemonade_cache else None)
    fragment = Path(args.fragment) if args.fragment else None
    sums = Path(args.sums) if args.sums else None
    checked = []
    for archive in (Path(a) for a in args.archives):  # every archive is verified before anything is written
        if not archive.is_file():
            raise OnebitError(f"{archive}: no such archive; nothing was installed")
        sha = None if args.no_verify else lemonade_install.expected_sha(archive.name, fragment_path=fragment, sums_path=sums)
        checked.append(lemonade_install.check(archive, recipe=args.recipe, backend=args.backend, tag=args.tag, sha=sha))
    targets = lemonade_install.install_all(checked, cache, config=config, pin=not args.no_pin, say=_say)
    for c, target in zip(checked, targets):
        _say(f"installed {c.archive.name} -> {target} ({c.tag}{'' if args.no_verify else ', sha256 verified'})")
    return 0


def cmd_fragment(args) -> int:
    from ..project import yamlio
    from . import lemonade, lemonade_archives

    if args.repo:
        if not lemonade.REPO_RE.fullmatch(args.repo):
            raise OnebitError(f"--repo {args.repo!r} is not owner/name")
        settings = lemonade.Settings(repos={b: args.repo for b in lemonade.BIN_KEY})
    else:
        path = Path(args.root) / "release.yaml"
        settings = lemonade.settings(yamlio.load(path) if path.is_file() else None)
    archives = [Path(a) for a in args.archives]
    for a in archives:
        if not a.is_file():
            raise OnebitError(f"{a}: no such archive")
    tags = {lemonade.parse_name(a.name).tag for a in archives}
    if len(tags) != 1:
        raise OnebitError(f"the archives carry {len(tags)} tags ({', '.join(sorted(tags))}); a fragment is for one release")
    text = json.dumps(lemonade_archives.fragment(settings, tags.pop(), archives), indent=2) + "\n"
    if args.out:
        from ..io.swap import write_text_atomic

        write_text_atomic(Path(args.out), text)
        _say(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def register(sub) -> None:
    from .lemonade_install import LIMITS

    s = sub.add_parser("lemonade", help="Lemonade backends: install release archives offline into Lemonade's cache")
    lsub = s.add_subparsers(dest="lemonade_command", required=True, metavar="ACTION")
    i = lsub.add_parser(
        "install", help="install archives into <cache>/bin/<recipe>/<backend>/ as Lemonade does, and pin them",
        description="Verifies by default: give --sums or --fragment from the archives' release (or --no-verify). "
                    "Verify every archive (checksum, member names, size), then, holding the cache's lock, unpack each "
                    "aside and swap it into <cache>/bin/<recipe>/<backend>/ with version.txt, and record the tag as "
                    "Lemonade's <backend>_bin setting (llamacpp.cpu_bin, ...) in its config.json, so Lemonade keeps "
                    f"this backend instead of replacing it with its stock build. Bound: {LIMITS.text()}.")
    i.add_argument("archives", nargs="+", metavar="ARCHIVE")
    i.add_argument("--cache", dest="lemonade_cache", metavar="DIR",
                   help="Lemonade's cache (default: $LEMONADE_CACHE_DIR, $CACHE_DIRECTORY, $XDG_CACHE_HOME/lemonade, "
                        "~/.cache/lemonade)")
    i.add_argument("--config", metavar="DIR",
                   help="the folder of Lemonade's config.json (default: the --cache folder when one is given, as "
                        "`lemond CACHE` does; else $STATE_DIRECTORY, $XDG_CONFIG_HOME/lemonade, ~/.config/lemonade)")
    i.add_argument("--no-pin", action="store_true", help="do not record the tag as Lemonade's <backend>_bin setting")
    i.add_argument("--recipe", help="Lemonade recipe (default: from the archive name, llamacpp)")
    i.add_argument("--backend", help="Lemonade backend (default: from the archive name: cpu, vulkan, rocm-stable, cuda)")
    i.add_argument("--tag", help="the version written to version.txt (default: from the archive name)")
    g = i.add_mutually_exclusive_group()
    g.add_argument("--fragment", metavar="JSON", help="verify against this backend_versions.json fragment")
    g.add_argument("--sums", metavar="SHA256SUMS", help="verify against this GNU SHA256SUMS file")
    g.add_argument("--no-verify", action="store_true", help="install without a checksum (refused otherwise)")
    i.set_defaults(func=cmd_install)

    f = lsub.add_parser(
        "fragment", help="write the backend_versions.json fragment for archives, keyed by the repo Lemonade downloads from",
        description="llamacpp.<backend> = the tag, and checksums.github.<repo>.<tag>.<asset> = sha256:<hex> for each "
                    "archive. The repo is --repo, else $ONEBIT_LEMONADE_REPO, else release.yaml lemonade.download_repo.")
    f.add_argument("archives", nargs="+", metavar="ARCHIVE")
    f.add_argument("--repo", metavar="OWNER/NAME", help="the repository Lemonade downloads every archive from")
    f.add_argument("--out", metavar="FILE", help="write here (default: standard output)")
    f.set_defaults(func=cmd_fragment)
