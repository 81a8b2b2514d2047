"""`1bit-build release`, `release-tag` and `release-part`: the weekly release and its CI jobs."""
from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from ..errors import OnebitError

console = Console(stderr=True)


def _today(args):
    import datetime as dt

    return dt.date.fromisoformat(args.date) if args.date else dt.datetime.now(dt.UTC).date()


def decide_tag(client, today, *, store: bool, root: Path) -> str:
    """This run's tag: the week's, respun when the release store (GitHub, or the checkout's git tags offline) has it
    published; this week's unpublished draft is resumed under its tag (tag.release_tag)."""
    from . import flow
    from . import tag as tags
    from .publish import release_tags

    if not store:
        return tags.release_tag(today, flow.local_tags(root))
    published, drafts = release_tags(client)
    return tags.release_tag(today, published, drafts)


def build_part(args, project, name: str, *, version: str, build_number: int, only: set[str] | None = None,
               overrides: dict | None = None) -> Path:
    """Build (part of) a bundle at a release's version and build number, as `1bit-build build` does: toolchain inputs
    fetched first where the plan needs them, every toolchain present or nothing done, the directories locked.
    Returns the out dir, where the build also leaves toolchain.json (what it knew)."""
    from ..build import build
    from ..inputs.host import gather
    from ..plan import all_tools, make_plan, root_dirs
    from ..session import layout_for

    layout = layout_for(args, name)

    def planned():
        facts = gather(all_tools(project, name), toolchains=layout.cache / "toolchains",
                       roots=root_dirs(project, layout.cache))
        return project, make_plan(project, name, facts, layout, build_number=build_number, version=version, only=only,
                                  overrides=overrides or {})

    _, report = build(planned, offline=args.offline, console=console)
    built = sum(1 for s in report.ran if s.startswith("build:"))
    console.print(f"[green]built[/] {name}: {len(report.ran)} step(s) ran ({built} build), {len(report.cached)} cached; "
                  f"output in {layout.out}", highlight=False)
    return layout.out


def composed_bundles(project, cfg, names, parts, *, version: str, build_number: int, scratch: Path) -> list:
    """Every bundle (one per flavor of a fanned-out variant) assembled from the built parts: nothing is built here."""
    from . import compose
    from .flow import BuiltBundle

    out = []
    for name in names:
        for flavor in compose.flavors(project, name, version=version, build_number=build_number, parts=parts,
                                      fan_out=cfg.fan_out, scratch=scratch / "plan"):
            c = compose.compose(project, flavor, parts, scratch / "bundles")
            fixed = {v: {"cuda_arch": c.flavor} for v in c.fanned if c.flavor.startswith("sm_")}
            pins = sorted({(r.get("source") or {}).get("pin") for r in c.records.values()} - {None})
            out.append(BuiltBundle(name=c.name, packages=c.packages, pins=pins, prefix=c.prefix, records=c.records,
                                   gates=c.gates, params=fixed, upstream_licenses=c.upstream_licenses))
            console.print(f"assembled {c.name} {c.version} build {c.build_number} from "
                          + ", ".join(sorted({str(Path(d).name) for d in c.parts.values()})), highlight=False)
    return out


def cmd_release(args) -> int:
    import tempfile

    from ..project import config
    from ..ship.package import source_date
    from . import bumps as bump_merge
    from . import compose, flow
    from . import tag as tags
    from . import target as targets
    from .publish import GitHubReleases, publish, release_tags

    project = config.load_project(args.root)
    cfg = flow.load_config(project.root)
    client = GitHubReleases.from_env(cfg.repo)
    today = _today(args)
    # a published release's tag is taken (respin); this week's unpublished draft is this run's, resumed (tag.release_tag)
    existing = release_tags(client)[0] if args.publish else flow.local_tags(project.root)
    the_tag = args.tag or decide_tag(client, today, store=args.publish, root=project.root)
    version, build_number = tags.version(the_tag), tags.build_number(the_tag)
    bumps = bump_merge.load(args.bumps) if args.bumps else []
    merged = None
    if args.merge_bumps:  # passing bump branches are merged before the build; the held ones are recorded
        if args.built_from:
            raise OnebitError("--merge-bumps with --from: the bumps must be merged before the parts were built",
                              hint="merge them in the workflow's first job (python -m builders.release.bumps merge)")
        merged = bump_merge.merge_passing(project.root, log=lambda m: console.print(m, highlight=False))
        bumps += merged.results
        project = config.load_project(project.root)
    out = Path(args.release_out or project.root / ".onebit" / "release" / the_tag).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    # the commit the release points at is the one it is assembled from: HEAD when building here (checked before the
    # build), the commit the parts recorded with --from (targets.decide)
    if args.built_from:
        parts = compose.find_parts(Path(args.built_from))
        target = targets.for_release(project.root, args.target, parts=parts, publish=args.publish)
    else:
        target = targets.for_release(project.root, args.target, publish=args.publish)
        parts = [p for name in args.bundles for p in compose.find_parts(
            build_part(args, project, name, version=version, build_number=build_number))]
    with tempfile.TemporaryDirectory(prefix=".assemble-", dir=out.parent) as scratch:
        built = composed_bundles(project, cfg, args.bundles, parts, version=version, build_number=build_number,
                                 scratch=Path(scratch))
        # CI's assemble and publish steps must write the same bytes (the first is attested): both read the previous
        # release from the checkout's tags then, not one from git and the other from the release store
        history = flow.local_tags(project.root) if args.built_from else existing
        files = flow.assemble(root=project.root, out=out, tag=the_tag, previous_tag=flow.previous(history, the_tag),
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


def cmd_release_tag(args) -> int:
    """Decide the release's tag once (CI's first job); every later job takes it from here."""
    from ..project import config
    from . import flow
    from . import tag as tags
    from .publish import GitHubReleases

    project = config.load_project(args.root)
    cfg = flow.load_config(project.root)
    the_tag = args.tag or decide_tag(GitHubReleases.from_env(cfg.repo), _today(args), store=not args.offline,
                                     root=project.root)
    values = {"tag": the_tag, "version": tags.version(the_tag), "build_number": str(tags.build_number(the_tag))}
    if args.output:
        with open(args.output, "a") as f:  # GitHub's $GITHUB_OUTPUT: name=value lines
            f.write("".join(f"{k}={v}\n" for k, v in values.items()))
    print(the_tag)
    return 0


def _words(values) -> list[str]:
    """`--only "a b"`, `--only a,b` and `--only a --only b` alike; empty values (an unset matrix field) vanish."""
    import re

    return [w for v in values or [] for w in re.split(r"[\s,]+", v) if w]


def cmd_release_part(args) -> int:
    """One build job of the release: these variants of a bundle at the tag's version and build number; then, with
    --checklist, their recipes' hardware checklists on this runner (gate.json beside the bundle)."""
    import json
    import tempfile

    from ..project import config
    from ..ship.install import install_bundle
    from ..session import parse_overrides
    from ..io.swap import write_text_atomic
    from . import checklist, compose
    from . import tag as tags

    project = config.load_project(args.root)
    tags.parse(args.tag)
    recipes = _words(args.checklist)
    unknown = [r for r in recipes if r not in project.recipes]
    if unknown:  # before building anything
        raise OnebitError(f"--checklist {unknown[0]}: no such recipe", hint=f"recipes: {', '.join(sorted(project.recipes))}")
    only = set(_words(args.only)) or None
    out = build_part(args, project, args.bundle, version=tags.version(args.tag), build_number=tags.build_number(args.tag),
                     only=only, overrides=parse_overrides(_words(args.set)))
    if not recipes:
        return 0
    model = args.model or os.environ.get(checklist.MODEL_ENV) or None
    with tempfile.TemporaryDirectory(prefix="onebit-gate-") as tmp:
        prefix = Path(tmp) / "prefix"
        install_bundle(out / "channel", prefix, args.bundle, cache_dir=Path(tmp) / "pkgs")
        console.print(f"[bold]gate[/] {', '.join(recipes)} on {prefix}", highlight=False)
        doc = checklist.gate(project.root, prefix, recipes, model, say=lambda m: print(m, flush=True))
    write_text_atomic(out / compose.GATE_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    ran = sum(1 for i in doc["items"] if i["result"] != "skip")
    console.print(f"[{'green' if doc['passed'] else 'red'}]gate {'passed' if doc['passed'] else 'FAILED'}[/]: "
                  f"{ran} item(s) ran, {len(doc['items']) - ran} skipped", highlight=False)
    return 0 if doc["passed"] else 1


def layout_cache(args) -> Path:
    from ..session import default_cache

    return Path(args.cache).resolve() if args.cache else default_cache()


def register(sub) -> None:
    r = sub.add_parser("release", help="assemble (and publish) this week's release from bundles built here or by CI")
    r.add_argument("bundles", nargs="+", metavar="BUNDLE")
    r.add_argument("--out", dest="release_out", metavar="DIR", help="the release directory (default: .onebit/release/TAG)")
    r.add_argument("--publish", action="store_true", help="publish to GitHub Releases (GITHUB_TOKEN; repo from release.yaml)")
    r.add_argument("--tag", help="the release tag (default: v<ISO year>.<ISO week>, respun as .1, .2 when published; "
                   "with --publish, this week's unpublished draft is resumed under its tag)")
    r.add_argument("--date", help="the release date, YYYY-MM-DD (default: today, UTC)")
    r.add_argument("--from", dest="built_from", metavar="DIR",
                   help="assemble from the bundles CI built below DIR (each release-part's out dir), building nothing; "
                        "each must be at the tag's version and build number and from this checkout's pins")
    r.add_argument("--bumps", metavar="JSON", help="bump results: [{branch, failed_step, log, held_for}] "
                   "(what `python -m builders.release.bumps merge --json` writes)")
    r.add_argument("--merge-bumps", action="store_true",
                   help="merge the passing bump/<pin>-<sha12> pull requests into this checkout before building; "
                        "record the held ones (pushed to the base branch with --publish)")
    r.add_argument("--target", metavar="COMMIT", help="the commit the release points at, checked against what it is "
                   "assembled from: HEAD of the (clean) checkout when building here; with --from, the commit every part "
                   "recorded (default: that commit, when publishing)")
    r.add_argument("--offline", action="store_true", help="use only the caches and local mirrors; never download")
    r.set_defaults(func=cmd_release)

    t = sub.add_parser("release-tag", help="decide this run's release tag once (print it; --output appends "
                                           "tag=, version=, build_number= lines, as GitHub's $GITHUB_OUTPUT wants)")
    t.add_argument("--date", help="the release date, YYYY-MM-DD (default: today, UTC)")
    t.add_argument("--tag", help="take this tag (checked) instead of deciding one")
    t.add_argument("--offline", action="store_true", help="decide from the checkout's git tags, not GitHub Releases")
    t.add_argument("--output", metavar="FILE", help="append name=value lines to FILE ($GITHUB_OUTPUT)")
    t.set_defaults(func=cmd_release_tag)

    p = sub.add_parser("release-part", help="one build job of the release: build variants of a bundle at the tag's "
                                            "version and build number, and gate them on this runner's hardware")
    p.add_argument("bundle", metavar="BUNDLE")
    p.add_argument("--tag", required=True, help="the release tag (release-tag's output): version and build number")
    p.add_argument("--only", action="append", metavar="VARIANTS", help="recipes or variants, space or comma separated "
                                                                       "(repeatable; none: the whole bundle)")
    p.add_argument("--set", action="append", metavar="RECIPE.OPTION=VALUE",
                   help="override build options (space separated, repeatable), e.g. one CUDA architecture")
    p.add_argument("--checklist", action="append", metavar="RECIPES",
                   help="after building, install into a scratch prefix and run these recipes' hardware checklists "
                        "(gate.json beside the bundle; exit 1 when an item fails)")
    p.add_argument("--model", help="the model for checklist lines that need one (default: $ONEBIT_CHECK_MODEL)")
    p.add_argument("--offline", action="store_true", help="use only the caches and local mirrors; never download")
    p.set_defaults(func=cmd_release_part)
