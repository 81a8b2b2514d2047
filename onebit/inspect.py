"""Model inspection: read the facts route needs from a GGUF file (gguf library) or recognise a 1BP package."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

ONEBP_MAGIC = b"1BP\0"
GGUF_MAGIC = b"GGUF"
HADAMARD_KEY = "onebit.hadamard_q4_0"
DFLASH_BLOCK_KEY = "dflash.block_size"


@dataclass(frozen=True)
class ModelFacts:
    path: str
    kind: str  # "gguf" | "1bp"
    arch: str | None = None
    experts: int = 0
    hadamard: int | None = None  # value of onebit.hadamard_q4_0 (32 = rotated file)
    dflash_block_size: int | None = None
    file_type: int | None = None

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def rotated(self) -> bool:
        return self.hadamard == 32

    @property
    def onebp(self) -> bool:
        return self.kind == "1bp"


def _field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - a damaged field reads as absent, never a traceback
        return None


def _stamp(reader, path: Path) -> int | None:
    """The Hadamard stamp: absent -> None; present -> its integer value, or ModelError when it cannot be read.

    A damaged stamp must not read as absent: route would serve a rotated model as an unrotated one (wrong output).
    """
    f = reader.fields.get(HADAMARD_KEY)
    if f is None:
        return None
    try:
        v = f.contents()
    except Exception:  # noqa: BLE001 - the gguf library raises many types on damaged fields
        v = None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelError(f"{path}: the {HADAMARD_KEY} field is present but not an integer ({_describe(v)}); "
                         "the file is damaged or was written by an unknown tool: re-convert the model")
    return v


def _describe(v) -> str:
    if v is None:
        return "unreadable"
    text = repr(v)
    return f"{type(v).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def _int_or_none(v) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def inspect_model(path: str | os.PathLike) -> ModelFacts:
    """Return the model's facts, or raise ModelError with one clear line."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            magic = fh.read(4)
        size = p.stat().st_size
    except FileNotFoundError:
        raise ModelError(f"model file not found: {p}") from None
    except IsADirectoryError:
        raise ModelError(f"model path is a directory, not a file: {p}") from None
    except OSError as e:
        raise ModelError(f"cannot read model {p}: {e.strerror or e}") from None

    if magic == ONEBP_MAGIC:
        return ModelFacts(path=str(p), kind="1bp")
    if magic != GGUF_MAGIC:
        if len(magic) < 4:
            raise ModelError(f"{p}: file is too short to be a GGUF model ({size} bytes)")
        raise ModelError(f"{p}: not a GGUF file (magic {magic!r}, expected b'GGUF') nor a 1BP package")

    import gguf

    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as e:  # noqa: BLE001 - the gguf library raises many types on damaged files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"{p}: malformed or truncated GGUF ({reason}); re-download or re-convert the model") from None

    # The reader maps tensor data lazily; check every tensor lies inside the file so a cut-off download is caught here.
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelError(
                f"{p}: truncated GGUF: tensor {t.name} ends at byte {end} but the file has {size}; "
                "re-download the model"
            )

    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelError(f"{p}: GGUF has no general.architecture; it is not a model file")

    return ModelFacts(
        path=str(p),
        kind="gguf",
        arch=arch,
        experts=_int_or_none(_field(reader, f"{arch}.expert_count")) or 0,
        hadamard=_stamp(reader, p),
        dflash_block_size=_int_or_none(_field(reader, DFLASH_BLOCK_KEY)),
        file_type=_int_or_none(_field(reader, "general.file_type")),
    )
