"""Release notes (markdown) from the changes.json document."""
from __future__ import annotations


HELD = {
    "failure": "failed at step `{step}`",
    "pending": "CI has not finished (`{step}`)",
    "hardware": "waits for its hardware checklist to pass on its runner (`{step}`)",
    "conflict": "does not merge cleanly into the release (`{step}`)",
    "unpushed": "passed, but was not pushed, so it is not in this release (`{step}`)",
}


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "unresolved"


COMPILERS = ("c++", "cc", "amdclang++", "amdclang", "hipcc", "hipconfig", "nvcc", "glslc", "zig", "cargo", "rustc")


def builds_section(builds: dict) -> list[str]:
    """How each bundle was built, from what the build jobs recorded: compilers, the shader features a glslc lacked,
    and the hardware gate each variant passed."""
    if not builds:
        return []
    lines = ["## Builds", "", "| bundle | variant | toolchain | gate |", "| --- | --- | --- | --- |"]
    dropped = []
    for bundle, variants in builds.items():
        for variant, rec in variants.items():
            tools = rec.get("tools") or {}
            shown = ", ".join(f"{t} {tools[t] or '?'}" for t in COMPILERS if t in tools) or "—"
            if rec.get("overrides"):
                shown += " (" + ", ".join(f"{k}={v}" for k, v in rec["overrides"].items()) + ")"
            gate = rec.get("gate")
            verdict = "—" if not gate else ("passed" if gate["passed"] else "FAILED")
            if gate:
                skipped = sum(1 for i in gate["items"] if i["result"] == "skip")
                verdict += f" ({len(gate['items']) - skipped} run, {skipped} skipped)" if skipped else ""
            lines.append(f"| {bundle} | {variant} | {shown} | {verdict} |")
            for ext in rec.get("dropped_shader_features") or []:
                dropped.append(f"- {bundle} {variant}: built without `{ext}` shaders (this glslc lacks it)")
    lines.append("")
    if dropped:
        lines += ["### Shader features dropped", "", *dict.fromkeys(dropped), ""]
    return lines


def render(changes: dict, max_titles: int = 15) -> str:
    tag, prev = changes["tag"], changes.get("previous_tag")
    lines = [f"# 1bit engine {tag}", "", f"Released {changes['date']}" + (f"; previous release {prev}." if prev else "."), ""]
    moved = {n: p for n, p in changes["pins"].items() if p["from"] != p["to"]}
    lines += ["## Upstreams", ""]
    if not moved:
        lines += ["No upstream moved.", ""]
    for name, p in moved.items():
        count = "" if p["commits"] is None else f", {p['commits']} commit{'s' if p['commits'] != 1 else ''}"
        link = f" ([compare]({p['compare']}))" if p["compare"] else ""
        if p["from"] is None:
            lines.append(f"- **{name}**: new, at `{_short(p['to'])}`")
            continue
        lines.append(f"- **{name}**: `{_short(p['from'])}` → `{_short(p['to'])}`{count}{link}")
        for title in p["titles"][:max_titles]:
            lines.append(f"  - {title}")
        if len(p["titles"]) > max_titles:
            lines.append(f"  - … and {len(p['titles']) - max_titles} more")
    lines.append("")
    patches = changes["patches"]
    if any(patches.values()):
        lines += ["## Patches", ""]
        for kind in ("added", "dropped", "refreshed"):
            for name in patches[kind]:
                lines.append(f"- {kind}: `{name}`")
        lines.append("")
    merged = [b for b in changes["bumps"] if b["result"] == "merged"]
    held = [b for b in changes["bumps"] if b["result"] == "held"]
    if merged:
        lines += ["## Merged bumps", ""] + [f"- `{b['branch']}`" for b in merged] + [""]
    lines += ["## Held back", ""]
    if not held:
        lines += ["Nothing was held back.", ""]
    for b in held:
        lines.append(f"- `{b['branch']}`: {HELD[b['why'].get('held_for') or 'failure'].format(step=b['why']['step'])}")
        if b["why"]["log"]:
            lines += ["", "  ```", *("  " + x for x in b["why"]["log"]), "  ```"]
    lines.append("")
    lines += builds_section(changes.get("builds") or {})
    if changes["artifacts"]:
        lines += ["## Artifacts", "", "| file | sha256 |", "| --- | --- |"]
        lines += [f"| `{name}` | `{digest}` |" for name, digest in changes["artifacts"].items()]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
