"""The hf step: a pin's Hugging Face files at its revision, each checked against its sha256 (builders/inputs/companions.py):
{hf}."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..inputs import companions
from ..project.config import Pin
from ..plan_types import Layout, Step, digest
from .base import Kind, StepContext, described


@dataclass(frozen=True)
class HfData:
    pin: str
    repo: str
    revision: str
    files: tuple[tuple[str, str], ...]  # (name, sha256)
    dir: str
    where: str


def plan_hf(layout: Layout, pin: Pin) -> Step:
    """The pin's Hugging Face files at its revision, each checked against its sha256: {hf}."""
    hf = pin.raw["companions"]["huggingface"]
    files = dict(hf["files"])
    key = digest("hf", hf["repo"], hf.get("revision"), sorted(files.items(), key=lambda kv: kv[0]))
    return described(Step(id=f"fetch:hf:{pin.name}", action="hf",
                          title=f"fetch {len(files)} file(s) of {hf['repo']} @ {str(hf.get('revision'))[:7]} "
                                "(sha256 from pins.yaml)",
                          key=key,
                          data=HfData(pin=pin.name, repo=hf["repo"], revision=hf.get("revision"),
                                      files=tuple(sorted(files.items())), dir=str(layout.cache / "hf" / key[:16]),
                                      where=pin.where)), STEP)


def hf_unresolved(pin: Pin) -> str | None:
    """Why the pin's checkpoint can't be fetched, or None."""
    hf = (pin.raw.get("companions") or {}).get("huggingface")
    if not hf:
        return "it has no companions.huggingface entry"
    if hf.get("unresolved") or not hf.get("revision"):
        return hf.get("unresolved") or "no revision"
    missing = sorted(n for n, h in hf["files"].items() if not h)
    return f"no sha256 for {', '.join(missing)}" if missing else None


class HfStep(Kind):
    action = "hf"
    fetches = True

    def run(self, ctx: StepContext, step: Step) -> None:
        d: HfData = step.data
        how = companions.fetch_hf(d.repo, d.revision, dict(d.files), Path(d.dir), where=d.where, offline=ctx.offline,
                                  log=ctx.note)
        ctx.log(f"{d.repo} @ {d.revision[:7]}: {how}")

    def holds(self, ctx: StepContext, step: Step) -> bool:
        return companions.hf_ready(Path(step.data.dir), dict(step.data.files))

    def describe(self, step: Step) -> list[str]:
        d: HfData = step.data
        return [f"GET <the Hugging Face endpoint>/{d.repo}/resolve/{d.revision}/{name}, sha256 {sha256[:12]}…"
                for name, sha256 in d.files]


STEP = HfStep()
