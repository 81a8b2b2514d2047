"""`1bit-build release`: build the bundles at the week's tag, assemble the release, publish it."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ..errors import OnebitError

console = Console(stderr=True)


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
    import json

    from .. import config
    from ..package import source_date
    from . import changes, flow
    from . import tag as tags
    from .publish import GitHubReleases, publish

    project = config.load_project(args.root)
    cfg = flow.load_config(project.root)
    client = GitHubReleases.from_env(cfg.repo)
    today = dt.date.fromisoformat(args.date) if args.date else dt.datetime.now(dt.UTC).date()
    existing = client.tags() if args.publish else flow.local_tags(project.root)
    the_tag = args.tag or tags.next_tag(today, existing)
    tags.parse(the_tag)
    if args.tag is None and args.built_from and args.publish:
        # the assemble step and the publish step of one CI run must agree on the tag: reuse an unpublished draft's
        the_tag = _draft_or(client, today, the_tag)
    bumps = []
    if args.bumps:
        bumps = [changes.BumpResult(b["branch"], b.get("failed_step"), b.get("log", ""))
                 for b in json.loads(Path(args.bumps).read_text())]
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
        rep = publish(client, the_tag, files, title=f"1bit engine {the_tag}", notes=(out / "notes.md").read_text())
        console.print(f"[green]published[/] {rep.release_url}: {len(rep.uploaded)} uploaded, {len(rep.skipped)} "
                      "already there", highlight=False)
    return 0


def _draft_or(client, today, fallback: str) -> str:
    from . import tag as tags

    base = tags.week_tag(today)
    drafts = [r["tag_name"] for r in client.releases() if r.get("draft") and r["tag_name"].startswith(base)]
    return max(drafts, key=tags.parse) if drafts else fallback


def layout_cache(args) -> Path:
    from ..session import default_cache

    return Path(args.cache).resolve() if args.cache else default_cache()


def register(sub) -> None:
    r = sub.add_parser("release", help="build bundles at this week's tag and assemble (and publish) the release")
    r.add_argument("bundles", nargs="+", metavar="BUNDLE")
    r.add_argument("--out", dest="release_out", metavar="DIR", help="the release directory (default: .onebit/release/TAG)")
    r.add_argument("--publish", action="store_true", help="publish to GitHub Releases (GITHUB_TOKEN; repo from release.yaml)")
    r.add_argument("--tag", help="the release tag (default: v<ISO year>.<ISO week>, respun as .1, .2 when it exists)")
    r.add_argument("--date", help="the release date, YYYY-MM-DD (default: today, UTC)")
    r.add_argument("--from", dest="built_from", metavar="DIR", help="use bundles already built in DIR/<bundle> (CI)")
    r.add_argument("--bumps", metavar="JSON", help="bump results: [{branch, failed_step, log}]")
    r.add_argument("--offline", action="store_true", help="use only the caches and local mirrors; never download")
    r.set_defaults(func=cmd_release)
