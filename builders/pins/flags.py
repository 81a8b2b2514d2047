"""flags: build-flag drift's findings: a report's rows (hold, override, upstream, ...) per recipe variant, the hold
reasons, how they show in a PR body, and this machine's paths kept out of them.

Drift is decided by pure modules, text and argv in, rows out (builders/pins/flagdrift.py runs the programs and reads
the trees, thinly): flag_calls.py reads the plan's build step as the cmake, zig and make calls it makes;
flag_options.py compares our -D options with what upstream's CMake and zig files declare; flag_make.py compares what
`make -n` says upstream's build and ours would compile. Every function is tested by a table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

HOLD = "hold"
MAX_ROWS = 40  # per recipe variant in the PR body; the hold reasons are never cut


@dataclass(frozen=True)
class Row:
    """One line of the report. result: hold | override | upstream | new option | removed option | ours | info |
    not compared | matches."""

    result: str
    what: str
    where: str = ""  # upstream file:line
    detail: str = ""

    @property
    def holds(self) -> bool:
        return self.result == HOLD


@dataclass(frozen=True)
class VariantReport:
    variant: str  # the recipe variant's id (ds4, ds4-cuda, vulkan)
    how: str  # what was compared, in words
    rows: tuple[Row, ...]

    @property
    def held(self) -> bool:
        return any(r.holds for r in self.rows)

    def reasons(self) -> list[str]:
        return [f"{self.variant}: {r.what}: {r.detail}" + (f" ({r.where})" if r.where else "") for r in self.rows if r.holds]


def hold_reasons(reports: Iterable[VariantReport]) -> list[str]:
    return [reason for rep in reports for reason in rep.reasons()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rep: VariantReport) -> str:
    lines = [f"{rep.how}", ""]
    if not rep.rows:
        return lines[0] + ": matches (nothing dropped, nothing gone, no new upstream option)."
    shown = sorted(rep.rows, key=lambda r: (not r.holds, r.result == "ours"))  # holds first, our own additions last
    lines += ["| result | what | upstream | detail |", "|---|---|---|---|"]
    for r in shown[:MAX_ROWS]:
        result = f"**{r.result.upper()}**" if r.holds else r.result
        lines.append(f"| {result} | `{_cell(r.what)}` | {_cell(r.where) or '—'} | {_cell(r.detail)} |")
    if len(shown) > MAX_ROWS:
        lines.append(f"| … | {len(shown) - MAX_ROWS} more rows | | |")
    return "\n".join(lines)



def redact(text: str, paths: Mapping[str, str]) -> str:
    """Replace this machine's paths (checkouts, work dirs, $HOME) by stable labels, longest first."""
    for path in sorted((p for p in paths if p and p != "/"), key=len, reverse=True):
        text = text.replace(path.rstrip("/"), paths[path])
    return text
