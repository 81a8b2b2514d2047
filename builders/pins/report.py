"""The plain-data handoff between the pin bot's two parts (docs/security.md).

The evaluating part (no token; builders/pins/isolate.py runs it sandboxed) writes what it found as JSON; the part that
holds the token reads it back with `load_*`, which accept exactly the shapes `dump_*` writes: every field typed, every
string bounded, no NaN or Infinity, pins.yaml edits only of the pins the outcome names. A report of any other shape is
refused in one line (`ReportError`), so a compromised evaluator can at worst say wrong things in a PR, never make the
token holder run or write anything else.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import OnebitError
from .decide import Edit, Move, Proposal, Verdict
from .flags import Row, VariantReport

VERSION = 1
MAX_TEXT = 200_000  # characters of one string (a release note, a report)
MAX_ITEMS = 2_000  # entries of one list
MAX_FILE = 64 << 20  # bytes of report.json or drift-results.json, as read back (load_file)
SHA = re.compile(r"^[0-9a-f]{40}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class ReportError(OnebitError):
    pass


def _bad(where: str, why: str) -> ReportError:
    return ReportError(f"the evaluation report is malformed at {where}: {why}",
                       hint="the evaluating part of the bot wrote something it never writes; nothing was pushed or opened")


def _str(v: Any, where: str, *, none: bool = False, limit: int = MAX_TEXT) -> str | None:
    if v is None and none:
        return None
    if not isinstance(v, str):
        raise _bad(where, f"expected text, got {type(v).__name__}")
    if len(v) > limit:
        raise _bad(where, f"text longer than {limit} characters")
    return v


def _int(v: Any, where: str, *, none: bool = False) -> int | None:
    if v is None and none:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(where, f"expected an integer, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise _bad(where, f"expected a list, got {type(v).__name__}")
    if len(v) > MAX_ITEMS:
        raise _bad(where, f"more than {MAX_ITEMS} entries")
    return v


def _obj(v: Any, where: str, keys: set[str], required: set[str] = frozenset()) -> dict:
    if not isinstance(v, dict):
        raise _bad(where, f"expected an object, got {type(v).__name__}")
    extra = set(v) - keys
    if extra:
        raise _bad(where, f"unknown field {sorted(extra)[0]!r}")
    missing = required - set(v)
    if missing:
        raise _bad(where, f"missing field {sorted(missing)[0]!r}")
    return v


def _strict_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_strict_constant)
    except (ValueError, RecursionError) as exc:
        raise ReportError(f"{where}: not a JSON report: {exc}") from None


def dumps(data: Any) -> str:
    return json.dumps(data, allow_nan=False, ensure_ascii=True, sort_keys=True)


def write_file(work: Path, name: str, data: Any) -> Path:
    """The one writer of the bot's report files (report.json, drift-results.json, drift.json, roots.json,
    toolchains.json): `work/name` as `dumps` writes it, aside and swapped into place (swap.write_text_atomic). Read
    back by `load_file`."""
    from ..io.swap import write_text_atomic

    out = Path(work) / name
    write_text_atomic(out, dumps(data))
    return out


def load_file(work: Path, name: str, max_bytes: int) -> Any:
    """A report file of a downloaded artifact (`work/name`), as parsed JSON: read by builders/io/readfile.py (a regular
    file only, never through a link, at most `max_bytes` bytes actually read), anything else refused in one line."""
    from ..io.readfile import UnreadableFile, read_bytes

    path = Path(work) / name
    try:
        data = read_bytes(path, max_bytes)
    except UnreadableFile as exc:
        raise ReportError(f"cannot read {name} in {work}: it {exc.why}; nothing was pushed or opened") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"cannot read {name} in {work}: it is not UTF-8 text (byte {exc.start}); nothing was "
                          "pushed or opened") from None
    return loads(text, name)


# ------------------------------------------------------------------------------------------------ flag reports


def dump_variant(rep: VariantReport) -> dict:
    return {"variant": rep.variant, "how": rep.how, "rows": [asdict(r) for r in rep.rows]}


def load_variant(v: Any, where: str) -> VariantReport:
    o = _obj(v, where, {"variant", "how", "rows"}, {"variant", "how", "rows"})
    rows = []
    for i, r in enumerate(_list(o["rows"], f"{where}.rows")):
        w = f"{where}.rows[{i}]"
        r = _obj(r, w, {"result", "what", "where", "detail"}, {"result", "what"})
        rows.append(Row(_str(r["result"], w, limit=40), _str(r["what"], w), _str(r.get("where", ""), w),
                        _str(r.get("detail", ""), w)))
    return VariantReport(_str(o["variant"], where, limit=200), _str(o["how"], where), tuple(rows))


# ------------------------------------------------------------------------------------------------ proposals


def dump_proposal(p: Proposal) -> dict:
    d = asdict(p)
    d["verdict"] = p.verdict.value
    d["edits"] = [{"path": list(e.path), "value": e.value, "replaces": e.replaces, "after": list(e.after)} for e in p.edits]
    return d


_PROPOSAL_KEYS = {"pin", "policy", "moves", "branch", "release_notes", "release_url", "patch_reports", "checklist",
                  "companions", "kept_tag", "rollback_reason", "verdict", "edits", "flag_reports", "held"}


def _edit(v: Any, where: str, pins: set[str]) -> Edit:
    o = _obj(v, where, {"path", "value", "replaces", "after"}, {"path", "value"})
    path = tuple(_str(x, f"{where}.path", limit=300) for x in _list(o["path"], f"{where}.path"))
    if len(path) < 3 or path[0] != "pins" or path[1] not in pins:
        raise _bad(where, f"an edit of {'.'.join(path) or 'nothing'}, outside the pins this outcome moves")
    value = o["value"]
    if value is not None and not isinstance(value, str):
        raise _bad(f"{where}.value", "expected text")
    replaces = _str(o.get("replaces"), f"{where}.replaces", none=True, limit=100)
    after = tuple(_str(x, f"{where}.after", limit=100) for x in _list(o.get("after", []), f"{where}.after"))
    return Edit(path, _str(value, f"{where}.value", none=True, limit=1000), replaces, after)


def load_proposal(v: Any, where: str, pins: set[str]) -> Proposal:
    o = _obj(v, where, _PROPOSAL_KEYS, {"pin", "policy", "moves", "branch", "verdict"})
    moves = []
    for i, m in enumerate(_list(o["moves"], f"{where}.moves")):
        w = f"{where}.moves[{i}]"
        m = _obj(m, w, {"label", "old", "new", "old_tag", "new_tag", "compare", "count"}, {"label", "new"})
        moves.append(Move(_str(m["label"], w, limit=300), _str(m.get("old"), w, none=True, limit=100), _str(m["new"], w, limit=100),
                          _str(m.get("old_tag"), w, none=True, limit=300), _str(m.get("new_tag"), w, none=True, limit=300),
                          _str(m.get("compare"), w, none=True, limit=2000), _int(m.get("count"), w, none=True)))
    if not moves:
        raise _bad(f"{where}.moves", "no move")

    def pairs(key: str, n: int) -> tuple:
        out = []
        for i, item in enumerate(_list(o.get(key, []), f"{where}.{key}")):
            item = _list(item, f"{where}.{key}[{i}]")
            if len(item) != n:
                raise _bad(f"{where}.{key}[{i}]", f"expected {n} entries")
            out.append(item)
        return out

    checklist = tuple((_str(a, where, limit=200), tuple(_str(c, where, limit=2000) for c in _list(b, where)))
                      for a, b in pairs("checklist", 2))
    try:
        verdict = Verdict(_str(o["verdict"], f"{where}.verdict", limit=40))
    except ValueError:
        raise _bad(f"{where}.verdict", f"unknown verdict {o['verdict']!r}") from None
    branch = _str(o["branch"], f"{where}.branch", limit=200)
    if not re.fullmatch(r"bump/[A-Za-z0-9_.-]+-[0-9a-f]{12}", branch or ""):
        raise _bad(f"{where}.branch", f"not a bump branch: {branch!r}")
    return Proposal(
        pin=_str(o["pin"], where, limit=100), policy=_str(o["policy"], where, limit=40), moves=tuple(moves), branch=branch,
        release_notes=_str(o.get("release_notes"), where, none=True), release_url=_str(o.get("release_url"), where, none=True, limit=2000),
        patch_reports=tuple((_str(a, where, limit=200), _str(b, where)) for a, b in pairs("patch_reports", 2)),
        checklist=checklist,
        companions=tuple((_str(a, where, limit=300), _str(b, where, none=True, limit=300), _str(c, where, none=True, limit=300))
                         for a, b, c in pairs("companions", 3)),
        kept_tag=_str(o.get("kept_tag"), where, none=True, limit=200),
        rollback_reason=_str(o.get("rollback_reason"), where, none=True, limit=2000), verdict=verdict,
        edits=tuple(_edit(e, f"{where}.edits[{i}]", pins) for i, e in enumerate(_list(o.get("edits", []), f"{where}.edits"))),
        flag_reports=tuple(_str(x, where) for x in _list(o.get("flag_reports", []), where)),
        held=tuple(_str(x, where, limit=2000) for x in _list(o.get("held", []), where)),
    )


# ------------------------------------------------------------------------------------------------ fork updates


def load_fork(v: Any, where: str) -> dict | None:
    """What the token holder pushes for a fork pin: the new tip (in the bundle), the old tip (kept by a tag)."""
    if v is None:
        return None
    o = _obj(v, where, {"bundle", "old_tip", "new_tip", "mode"}, {"bundle", "old_tip", "new_tip", "mode"})
    for key in ("old_tip", "new_tip"):
        if not SHA.match(_str(o[key], f"{where}.{key}", limit=40) or ""):
            raise _bad(f"{where}.{key}", "not a commit id")
    if o["mode"] not in ("rebase", "merge"):
        raise _bad(f"{where}.mode", f"unknown mode {o['mode']!r}")
    if not re.fullmatch(r"fork-[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.bundle", _str(o["bundle"], f"{where}.bundle", limit=120) or ""):
        raise _bad(f"{where}.bundle", "not a bundle this bot writes")
    return o
