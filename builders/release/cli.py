"""`1bit-build lemonade install` (and, with the release flow, `1bit-build release`)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..errors import OnebitError

console = Console(stderr=True)


def cmd_lemonade_install(args) -> int:
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


def _built(args, project, name: str, tag: str, *, build: bool):
    """Build one bundle at the tag's version (or read a build left in --from) and describe what it made."""
    import dataclasses

    from ..session import layout_for, refuse
    from ..host import gather
    from ..plan import all_tools, make_plan
    from . import tag as tags
    from .flow import BuiltBundle

    bundle = project.bundle(name)
    project.bundles[name] = dataclasses.replace(bundle, version=tags.version(tag), build_number=tags.build_number(tag))
    facts = gather(all_tools(project, name))
    layout = layout_for(args, name)
    if args.built_from:
        layout = dataclasses.replace(layout, out=Path(args.built_from).resolve() / name)
    plan = make_plan(project, name, facts, layout, build_number=tags.build_number(tag))
    if build:
        from ..execute import Executor

        refuse(plan)
        Executor(plan, project, offline=args.offline, console=console).run()
    out = plan.layout.out
    tarballs = sorted(out.glob("*.tar.zst"))
    if len(tarballs) != 1:
        raise OnebitError(f"{out}: expected one bundle tarball, found {len(tarballs)}",
                          hint=f"build the bundle first: 1bit-build build {name}")
    pins = set()
    for s in plan.steps:
        if s.action == "source" and getattr(s.data, "pin", None):
            pins.add(s.data.pin)
            pins.update(e.pin for e in s.data.extra)
    wheels = sorted(w for s in plan.steps if s.action == "wheels" for w in Path(s.data.dir).glob("*.whl"))
    return BuiltBundle(name=name, tarball=tarballs[0], packages=sorted((out / "channel").rglob("*.conda")),
                       pins=sorted(pins), wheels=wheels,
                       toolchain={k: f.version for k, f in facts.tools.items() if getattr(f, "version", None)})


def cmd_release(args) -> int:
    import datetime as dt

    from .. import config
    from ..package import source_date
    from . import bumps as bump_merge
    from . import flow
    from . import tag as tags
    from .publish import GitHubReleases, built_commit, publish, release_tags

    project = config.load_project(args.root)
    cfg = flow.load_config(project.root)
    client = GitHubReleases.from_env(cfg.repo)
    today = dt.date.fromisoformat(args.date) if args.date else dt.datetime.now(dt.UTC).date()
    # a published release's tag is taken (respin); this week's unpublished draft is this run's, resumed (tag.release_tag)
    existing, drafts = release_tags(client) if args.publish else (flow.local_tags(project.root), [])
    the_tag = args.tag or tags.release_tag(today, existing, drafts)
    tags.parse(the_tag)
    bumps = bump_merge.load(args.bumps) if args.bumps else []
    merged = None
    if args.merge_bumps:  # passing bump branches are merged before the build; the held ones are recorded
        merged = bump_merge.merge_passing(project.root, log=lambda m: console.print(m, highlight=False))
        bumps += merged.results
        project = config.load_project(project.root)
    target = args.target or (built_commit(project.root) if args.publish else None)  # the commit the bundles are built from
    built = [_built(args, project, name, the_tag, build=not args.built_from) for name in args.bundles]
    out = Path(args.release_out or project.root / ".onebit" / "release" / the_tag).resolve()
    files = flow.assemble(root=project.root, out=out, tag=the_tag, previous_tag=flow.previous(existing, the_tag),
                          date=today, config=cfg, built=built,
                          git_cache=lambda c: layout_cache(args) / "git" / f"{c}.git",
                          mtime=int(source_date().timestamp()), bumps=bumps)
    for f in files:
        print(f"{f.stat().st_size:>12}  {f.name}")
    console.print(f"[green]release {the_tag}[/]: {len(files)} files in {out}", highlight=False)
    if args.publish:
        if merged and merged.ahead():  # the release points at the built commit, so it must be on GitHub first
            console.print(f"pushed {merged.push()} to {merged.base}", highlight=False)
        rep = publish(client, the_tag, files, title=f"1bit engine {the_tag}", notes=(out / "notes.md").read_text(),
                      target=target)
        console.print(f"[green]published[/] {rep.release_url}{' (resumed draft)' if rep.resumed else ''}: "
                      f"{len(rep.uploaded)} uploaded, {len(rep.skipped)} already there", highlight=False)
    return 0


def layout_cache(args) -> Path:
    from ..session import default_cache

    return Path(args.cache).resolve() if args.cache else default_cache()


def _opt(value):
    return Path(value) if value else None


def register(sub) -> None:
    r = sub.add_parser("release", help="build bundles at this week's tag and assemble (and publish) the release")
    r.add_argument("bundles", nargs="+", metavar="BUNDLE")
    r.add_argument("--out", dest="release_out", metavar="DIR", help="the release directory (default: .onebit/release/TAG)")
    r.add_argument("--publish", action="store_true", help="publish to GitHub Releases (GITHUB_TOKEN; repo from release.yaml)")
    r.add_argument("--tag", help="the release tag (default: v<ISO year>.<ISO week>, respun as .1, .2 when published; "
                   "with --publish, this week's unpublished draft is resumed under its tag)")
    r.add_argument("--date", help="the release date, YYYY-MM-DD (default: today, UTC)")
    r.add_argument("--from", dest="built_from", metavar="DIR", help="use bundles already built in DIR/<bundle> (CI)")
    r.add_argument("--bumps", metavar="JSON", help="bump results: [{branch, failed_step, log, held_for}] "
                   "(what `python -m builders.release.bumps merge --json` writes)")
    r.add_argument("--merge-bumps", action="store_true",
                   help="merge the passing bump/<pin>-<sha12> pull requests into this checkout before building; "
                        "record the held ones (pushed to the base branch with --publish)")
    r.add_argument("--target", metavar="COMMIT", help="the commit the bundles were built from, which the release points "
                   "at (default: HEAD of the checkout, which must be clean)")
    r.add_argument("--offline", action="store_true", help="use only the caches and local mirrors; never download")
    r.set_defaults(func=cmd_release)


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
    i.set_defaults(func=cmd_lemonade_install)
