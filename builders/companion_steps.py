"""Plan steps for companion sources (pure): submodules of a pin, vendored crates, Hugging Face files.

The recipe asks for them in `source:` (`submodules: [path, ...]` or `["*"]`, `crates: {manifest: ...}`,
`huggingface: true` for the pin's `companions.huggingface`); builders/companions.py does the fetching.
"""
from __future__ import annotations

from pathlib import Path

from .config import Pin, Recipe
from .plan_types import Command, CratesData, HfData, Layout, Step, SubmodulesData, digest


def submodules_lock(layout: Layout, pin: Pin, want: list[str]) -> Path:
    return layout.cache / "submodules" / f"{pin.commit}-{digest(sorted(want))[:12]}.json"


def submodule_step(layout: Layout, pin: Pin, want: list[str]) -> Step:
    lock = submodules_lock(layout, pin, want)
    return Step(
        id=f"fetch:submodules:{pin.name}",
        action="submodules",
        title=f"fetch submodules of {pin.name} @ {pin.short} at their gitlinks ({', '.join(want)})",
        key=digest("submodules", pin.url, pin.commit, sorted(want)),
        commands=tuple(Command(("git", "fetch", "--depth=1", f"<.gitmodules url of {p}>", f"<gitlink of {p}>"))
                       for p in want),
        needs=(f"fetch:{pin.name}",),
        data=SubmodulesData(pin=pin.name, commit=pin.commit, url=pin.url, want=tuple(want), lock=str(lock),
                            git_dir=str(layout.git_cache(pin.commit))),
    )


def crates_dir(layout: Layout, key: str) -> Path:
    return layout.cache / "crates" / key[:16]


def crates_step(layout: Layout, recipe: Recipe, source_key: str, source_dir: str, source_step: str) -> Step:
    manifest = recipe.source["crates"]["manifest"]
    key = digest("crates", source_key, manifest)
    dest = crates_dir(layout, key)
    return Step(
        id=f"fetch:crates:{recipe.name}",
        action="crates",
        title=f"cargo vendor the crates of {manifest} for {recipe.name} (cached by source, offline afterwards)",
        key=key,
        commands=(Command(("cargo", "vendor", "--locked", "--versioned-dirs", "--manifest-path",
                           f"{source_dir}/{manifest}", f"{dest}/vendor")),),
        needs=(source_step,),
        data=CratesData(source=source_dir, manifest=manifest, dir=str(dest), where=str(recipe.path)),
    )


def hf_dir(layout: Layout, key: str) -> Path:
    return layout.cache / "hf" / key[:16]


def hf_step(layout: Layout, pin: Pin) -> Step:
    hf = pin.raw["companions"]["huggingface"]
    files = dict(hf["files"])
    key = digest("hf", hf["repo"], hf.get("revision"), sorted(files.items(), key=lambda kv: kv[0]))
    dest = hf_dir(layout, key)
    return Step(
        id=f"fetch:hf:{pin.name}",
        action="hf",
        title=f"fetch {len(files)} file(s) of {hf['repo']} @ {str(hf.get('revision'))[:7]} (sha256 from pins.yaml)",
        key=key,
        commands=tuple(Command(("GET", f"<endpoint>/{hf['repo']}/resolve/{hf.get('revision')}/{name}")) for name in sorted(files)),
        data=HfData(pin=pin.name, repo=hf["repo"], revision=hf.get("revision"), files=tuple(sorted(files.items())),
                    dir=str(dest), where=pin.where),
    )


def hf_unresolved(pin: Pin) -> str | None:
    """Why the pin's checkpoint can't be fetched, or None."""
    hf = (pin.raw.get("companions") or {}).get("huggingface")
    if not hf:
        return "it has no companions.huggingface entry"
    if hf.get("unresolved") or not hf.get("revision"):
        return hf.get("unresolved") or "no revision"
    missing = sorted(n for n, h in hf["files"].items() if not h)
    return f"no sha256 for {', '.join(missing)}" if missing else None
