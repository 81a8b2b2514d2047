"""lemonade_config: Lemonade's config.json: where it is, the `llamacpp.<backend>_bin` setting that pins an installed
backend, and that setting written in place, every other byte of the file kept (lemonade.py has the contract).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import OnebitError
from ..io import readfile, swap
from .lemonade import BIN_KEY, RECIPE


def config_dir(env: Mapping[str, str] | None = None, *, cache: Path | None = None, home: Path | None = None) -> Path:
    """Pure: the folder of Lemonade's config.json. `lemond CACHE` given a cache folder and no config folder keeps both
    together (cli_parser.cpp), so an explicit cache means that folder; else STATE_DIRECTORY, $XDG_CONFIG_HOME/lemonade,
    ~/.config/lemonade (path_linux.cpp). LEMONADE_CACHE_DIR does not move the config."""
    env = os.environ if env is None else env
    if cache is not None:
        return Path(cache)
    if env.get("STATE_DIRECTORY"):
        return Path(env["STATE_DIRECTORY"])
    if env.get("XDG_CONFIG_HOME"):
        return Path(env["XDG_CONFIG_HOME"]) / "lemonade"
    return (home or Path(env.get("HOME") or Path.home())) / ".config" / "lemonade"



def bin_key(recipe: str, backend: str) -> tuple[str, str] | None:
    """Pure: Lemonade's (config section, setting) that pins this backend's version, or None where it has none."""
    if recipe == RECIPE and backend in BIN_KEY:
        return RECIPE, BIN_KEY[backend]
    return None


def env_override(recipe: str, backend: str) -> str:
    """The environment variable that overrides the setting in Lemonade (LEMONADE_<SECTION>_<KEY>, upper case)."""
    section, key = bin_key(recipe, backend)
    return f"LEMONADE_{section}_{key}".upper()


def with_pins(text: str | None, pins: Mapping[tuple[str, str], str], *, where: str = "config.json") -> str:
    """Pure: config.json's text with each (section, key) set to its tag; every other setting, the key order, the
    indentation and the final newline stay as they were. A new file is written the way Lemonade writes it (2 spaces)."""
    if text is None or not text.strip():
        doc: dict = {}
        indent: str | int | None = 2
        newline = True
    else:
        try:
            doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            raise OnebitError(f"not JSON ({exc.msg}); nothing was changed", where=f"{where}:{exc.lineno}",
                              hint="fix or remove it: Lemonade itself would set it aside as config.json.corrupted") from None
        except _NotJSON as exc:
            raise OnebitError(f"holds {exc}, which JSON cannot carry; nothing was changed", where=where,
                              hint="fix it by hand: rewriting it would lose or corrupt that value") from None
        except RecursionError:
            raise OnebitError("nested too deeply to read; nothing was changed", where=where) from None
        bad = _lone_surrogate(doc)
        if bad is not None:
            raise OnebitError(f"holds a lone surrogate ({bad}), which UTF-8 cannot carry; nothing was changed", where=where,
                              hint="fix it by hand: Lemonade reads config.json as UTF-8")
        if not isinstance(doc, dict):
            raise OnebitError("is not a JSON object; nothing was changed", where=where)
        m = re.match(r"\s*\{\s*?\n([ \t]+)\S", text)
        indent = m[1] if m else None
        newline = text.endswith("\n")
    for (section, key), tag in pins.items():
        block = doc.setdefault(section, {})
        if not isinstance(block, dict):
            raise OnebitError(f"{section!r} is not an object; nothing was changed", where=where)
        block[key] = tag
    separators = None if indent is not None or ": " in (text or ": ") else (",", ":")
    return json.dumps(doc, indent=indent, ensure_ascii=False, separators=separators, allow_nan=False) + ("\n" if newline else "")


class _NotJSON(ValueError):
    pass


def _no_constant(name: str):
    raise _NotJSON(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise _NotJSON(f"the number {text[:40]} (out of a double's range)")
    return value


def _lone_surrogate(value: Any) -> str | None:
    """The first string (or key) of a JSON value that holds a lone surrogate, escaped; None when there is none."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            todo += list(v.keys()) + list(v.values())
        elif isinstance(v, list):
            todo += v
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return ascii(v[exc.start:exc.end])[1:-1]
    return None


def config_file(config: Path) -> Path:
    """The file to write: `<config>/config.json`, or where it links to (written through, beside its target, so the
    link stays a link); a link that leads nowhere, or to something that is not a file, is refused in one line."""
    path = Path(config) / "config.json"
    if not path.is_symlink():
        return path
    target = Path(os.path.realpath(path))
    if not target.exists():
        raise OnebitError(f"is a link to {os.readlink(path)}, which does not exist; nothing was changed", where=str(path),
                          hint="create the file it names, or replace the link by a file")
    if not target.is_file():
        raise OnebitError(f"is a link to {target}, which is not a file; nothing was changed", where=str(path))
    return target


MAX_CONFIG = 16 << 20  # bytes of Lemonade's config.json (a few KiB in practice)


def config_with_pins(config: Path, pins: Mapping[tuple[str, str], str]) -> tuple[Path, str]:
    """config.json's path and its text with the pins set; read by builders/io/readfile.py (a regular file of at most
    MAX_CONFIG bytes: a FIFO, a device or a directory there is refused in one line, never waited on)."""
    path = config_file(config)
    try:
        text = None if readfile.absent(path) else readfile.read_bytes(path, MAX_CONFIG).decode("utf-8")
    except readfile.UnreadableFile as exc:
        raise OnebitError(f"{exc.why}; nothing was changed", where=str(path),
                          hint="replace it by Lemonade's config file, or remove it") from None
    except UnicodeDecodeError:
        raise OnebitError("not UTF-8 text; nothing was changed", where=str(path)) from None
    return path, with_pins(text, pins, where=str(path))


def record_pins(config: Path, pins: Mapping[tuple[str, str], str]) -> Path:
    """Set Lemonade's `<backend>_bin` settings in `<config>/config.json` (or the file it links to), written beside it
    and renamed into place. The caller holds the config's lock (config_lock)."""
    path, text = config_with_pins(config, pins)
    swap.write_text_atomic(path, text)
    return path


def config_lock(config: Path) -> Path:
    """The directory whose lock covers config.json: the folder of the file really written (two caches sharing one
    config, or one config reached through a link, take the same lock)."""
    return config_file(config).parent.resolve() / "config.json"

