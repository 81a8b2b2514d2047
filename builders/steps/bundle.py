"""The bundle steps, five kinds that make one bundle of the packages: the metapackage (with the manifest and
toolchain.json), the local channel, the tarball, SHA256SUMS, and the move into place (builders/ship/bundle.py,
package.py, manifest.py). They share one cache state: done while the published bundle holds the plan's key."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..ship import bundle as bundles
from ..ship import manifest, toolchain_record
from ..io import swap
from ..ship import package as conda
from ..ship import stage as staging
from ..project.config import Bundle
from ..errors import StageError
from ..plan_types import Layout, Step, digest
from ..ship.stage import KEY_FILE
from .base import Kind, StepContext, holds_key
from .build import notes


@dataclass(frozen=True)
class BundleData:
    name: str  # the metapackage
    summary: str
    packages: tuple[str, ...]  # package step ids
    out: str
    dir: str  # the channel dir, tarball file or SHA256SUMS file this step writes (by action)
    to: str = ""  # publish: the out dir


def plan_bundle(bundle: Bundle, version: str, build_number: int, packages: Sequence[Step], layout: Layout) -> list[Step]:
    """The metapackage (with the manifest), the channel, the tarball, SHA256SUMS, and the move into place."""
    meta_key = digest("meta", bundle.name, version, build_number, [p.key for p in packages])
    nxt = layout.next_out()
    tar_name = f"onebit-{bundle.name}-{version}-{build_number}-{bundle.platform}.tar.zst"
    common = dict(name=f"onebit-bundle-{bundle.name}", summary=bundle.summary, packages=tuple(p.id for p in packages),
                  out=str(layout.packages(meta_key)))
    return [
        Step("bundle:metapackage", "metapackage", f"metapackage onebit-bundle-{bundle.name} with share/onebit/manifest.json",
             meta_key, needs=tuple(p.id for p in packages), data=BundleData(**common, dir=str(nxt))),
        Step("bundle:channel", "channel", "index a local conda channel (py-rattler index_fs)",
             digest("channel", meta_key), needs=("bundle:metapackage",), data=BundleData(**common, dir=str(nxt / "channel"))),
        Step("bundle:tarball", "tarball", f"tar.zst of the installed tree: {tar_name}",
             digest("tarball", meta_key), needs=("bundle:channel",), data=BundleData(**common, dir=str(nxt / tar_name))),
        Step("bundle:checksums", "checksums", "SHA256SUMS of every artifact", digest("sums", meta_key),
             needs=("bundle:tarball",), data=BundleData(**common, dir=str(nxt / "SHA256SUMS"))),
        Step("bundle:publish", "publish", f"move the finished bundle into place: {layout.out}", digest("publish", meta_key),
             needs=("bundle:checksums",), data=BundleData(**common, dir=str(nxt), to=str(layout.out))),
    ]


def clobbers(owners: Mapping[str, Sequence[str]]) -> list[str]:
    """Pure: every prefix path two packages would both install. A claim ending in '/' owns the whole subtree.

    owners: package name -> its claims (or, after staging, its real file list)."""
    problems = []
    flat = sorted((path, pkg) for pkg, paths in owners.items() for path in paths)
    for i, (a, pa) in enumerate(flat):
        for b, pb in flat[i + 1:]:
            if pa == pb:
                continue
            if a == b or (a.endswith("/") and b.startswith(a)) or (b.endswith("/") and a.startswith(b)):
                problems.append(f"{pa} and {pb} would both install {min(a, b, key=len)}")
    return problems


def package_steps(ctx: StepContext) -> list[Step]:
    return [s for s in ctx.plan.steps if s.action == "package"]


def check_clobbers(ctx: StepContext) -> None:
    """Two packages of the bundle never install the same path: a build error naming both, not conda's warning."""
    owners = {s.data.name: staging.staged_files(Path(s.data.prefix)) for s in package_steps(ctx)}
    owners["onebit-bundle-" + ctx.plan.bundle] = [manifest.MANIFEST_PATH]
    problems = clobbers(owners)
    if problems:
        raise StageError(f"bundle {ctx.plan.bundle}: two packages install the same path:\n    " + "\n    ".join(problems[:20]),
                         hint="give each variant its own stage.root, or drop the file from one of them (stage.keep)")


def bundle_manifest(ctx: StepContext) -> dict:
    """The plan's entries, plus what each build reported about itself (dropped shader features)."""
    plan = ctx.plan
    entries = [(s.data.backend, {**s.data.manifest_entry, **notes(Path(s.data.build_dir))}) for s in plan.steps
               if s.action == "stage" and s.data.manifest_entry]
    return manifest.make_manifest(plan.bundle, plan.version, plan.build_number, plan.platform, entries)


def meta_depends(ctx: StepContext) -> list[str]:
    return [bundles.pin_spec(s.data.name, s.data.version, s.data.build_string) for s in package_steps(ctx)]


def meta_file(ctx: StepContext) -> Path:
    meta = ctx.plan.step("bundle:metapackage")
    build_string = bundles.meta_build_string(ctx.plan.bundle, meta_depends(ctx), ctx.plan.build_number)
    return Path(meta.data.out) / conda.conda_filename(meta.data.name, ctx.plan.version, build_string)


def conda_files(ctx: StepContext) -> list[Path]:
    return [s.data.file for s in package_steps(ctx)] + [meta_file(ctx)]


def bundle_done(ctx: StepContext) -> bool:
    """The published bundle says it holds this plan's (its publish step's key)."""
    publish = next((s for s in ctx.plan.steps if s.action == "publish"), None)
    return publish is not None and holds_key(ctx.layout.out / KEY_FILE, publish.key)


class BundleStep(Kind):
    """What the five bundle kinds share: no stamp of their own, done while the published bundle holds the plan's key,
    no words beyond their titles."""

    bundle = True

    def run(self, ctx: StepContext, step: Step) -> None:
        raise NotImplementedError

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return bundle_done(ctx)

    def describe(self, step: Step) -> list[str]:
        return []


class MetapackageStep(BundleStep):
    action = "metapackage"

    def run(self, ctx: StepContext, step: Step) -> None:
        plan = ctx.plan
        check_clobbers(ctx)
        nxt = Path(step.data.dir)
        shutil.rmtree(nxt, ignore_errors=True)
        nxt.mkdir(parents=True)
        text = manifest.dumps(bundle_manifest(ctx))
        (nxt / "manifest.json").write_text(text)
        # what this build knew (toolchain versions, sources, dropped shader features) travels beside its bundle:
        # the facts that made the plan's keys, never a second probe
        record = toolchain_record.for_plan(plan, ctx.project, plan.host.tools, lambda d: notes(Path(d)))
        (nxt / toolchain_record.FILE).write_text(toolchain_record.dumps(record))
        bundles.write_metapackage(bundle=plan.bundle, version=plan.version, build_number=plan.build_number,
                                  platform=plan.platform, summary=step.data.summary, depends=meta_depends(ctx),
                                  manifest_text=text, out_dir=Path(step.data.out), scratch=ctx.layout.work / "meta-files")


class ChannelStep(BundleStep):
    action = "channel"

    def run(self, ctx: StepContext, step: Step) -> None:
        conda.index_channel(conda_files(ctx), Path(step.data.dir), ctx.plan.platform)


class TarballStep(BundleStep):
    action = "tarball"

    def run(self, ctx: StepContext, step: Step) -> None:
        trees = [Path(s.data.prefix) for s in package_steps(ctx)]
        text = (ctx.layout.next_out() / "manifest.json").read_bytes()  # written by the metapackage step
        bundles.write_tarball(Path(step.data.dir), trees, text, mtime=int(conda.source_date().timestamp()))


class ChecksumsStep(BundleStep):
    action = "checksums"

    def run(self, ctx: StepContext, step: Step) -> None:
        f = Path(step.data.dir)
        conda.sha256sums(f.parent, f)


class PublishStep(BundleStep):
    action = "publish"

    def run(self, ctx: StepContext, step: Step) -> None:
        src = Path(step.data.dir)
        (src / KEY_FILE).write_text(step.key + "\n")
        swap.replace_dir(src, Path(step.data.to))


STEPS = (MetapackageStep(), ChannelStep(), TarballStep(), ChecksumsStep(), PublishStep())
