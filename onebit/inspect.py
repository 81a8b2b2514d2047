"""Model inspection: read the facts route needs from a GGUF file (gguf library) or recognise a 1BP package."""

from __future__ import annotations

import mmap
import os
import stat
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

ONEBP_MAGIC = b"1BP\0"
GGUF_MAGIC = b"GGUF"
HADAMARD_KEY = "onebit.hadamard_q4_0"
DFLASH_BLOCK_KEY = "dflash.block_size"


# GGUF value types: fixed sizes of the scalars; 8 = string, 9 = array
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
MAX_ARRAY = 1 << 24  # elements in one metadata array (a 256k-token vocabulary is far below)
MAX_DIMS = 8


class _Bad(Exception):
    pass


def gguf_layout_problem(buf) -> str | None:
    """Walk a GGUF header (counts, keys, values, tensor infos) with every length checked against the file.

    None when the layout is sound, else what is wrong. The gguf library trusts these lengths: reads past the end come
    back empty, so a huge array count makes it loop for hours. Each step here consumes bytes or fails, so the walk
    ends within the file's size.
    """
    end = len(buf)

    def take(off: int, n: int, what: str) -> int:
        if n < 0 or off + n > end:
            raise _Bad(f"{what} at byte {off} runs past the end of the file ({end} bytes)")
        return off + n

    try:
        take(0, 24, "header")
        order = ">" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF == 0 else "<"
        version, n_tensors, n_kv = struct.unpack_from(order + "IQQ", buf, 4)
        if version not in (2, 3):
            raise _Bad(f"unsupported GGUF version {version} (this reader knows 2 and 3)")
        u32, u64 = struct.Struct(order + "I"), struct.Struct(order + "Q")

        def string(off: int, what: str) -> int:
            take(off, 8, what + " length")
            return take(off + 8, u64.unpack_from(buf, off)[0], what)

        def value(off: int, vtype: int, what: str, depth: int = 0) -> int:
            if vtype in _SCALAR_SIZE:
                return take(off, _SCALAR_SIZE[vtype], what)
            if vtype == _STRING:
                return string(off, what)
            if vtype == _ARRAY and depth < 2:
                take(off, 12, what + " array header")
                itype, count = u32.unpack_from(buf, off)[0], u64.unpack_from(buf, off + 4)[0]
                off += 12
                if count > MAX_ARRAY:
                    raise _Bad(f"{what}: array of {count} elements (more than {MAX_ARRAY})")
                if itype in _SCALAR_SIZE:
                    return take(off, count * _SCALAR_SIZE[itype], what)
                for _ in range(count):
                    off = value(off, itype, what, depth + 1)
                return off
            raise _Bad(f"{what}: unknown value type {vtype}")

        off = 24
        for i in range(n_kv):
            key_end = string(off, f"key {i}")
            key = _printable(bytes(buf[off + 8:key_end]).decode("utf-8", "replace"), 60)
            take(key_end, 4, f"type of {key}")
            off = value(key_end + 4, u32.unpack_from(buf, key_end)[0], key)
        for i in range(n_tensors):
            off = string(off, f"tensor {i} name")
            take(off, 4, f"tensor {i} dimension count")
            n_dims = u32.unpack_from(buf, off)[0]
            if n_dims > MAX_DIMS:
                raise _Bad(f"tensor {i} has {n_dims} dimensions")
            off = take(off + 4, 8 * n_dims + 12, f"tensor {i} shape")
    except _Bad as e:
        return str(e)
    return None


def _printable(text: str, limit: int = 200) -> str:
    """Text from a damaged file, safe for one terminal line: control characters escaped, length bounded."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return out if len(out) <= limit else out[:limit] + "..."


def _check_layout(p: Path) -> None:
    try:
        with p.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            problem = gguf_layout_problem(mm)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read model {p}: {getattr(e, 'strerror', None) or e}") from None
    if problem:
        raise ModelError(f"{p}: malformed or truncated GGUF ({problem}); re-download or re-convert the model")


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


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind_problem(p: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((what for test, what in _NOT_REGULAR if test(mode)), "not a regular file")
    raise ModelError(f"model path is {kind}, not a regular file: {p}")


def _read_magic(p: Path) -> tuple[bytes, int]:
    """(first 4 bytes, size) of a regular file. Anything else (FIFO, socket, device, directory) is refused from its
    stat before it is opened; the open itself does not block (O_NONBLOCK) and is checked again, so a FIFO put in
    its place meanwhile is refused too, never waited on."""
    try:
        _kind_problem(p, os.stat(p).st_mode)
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ModelError(f"model file not found: {p}") from None
    except OSError as e:
        raise ModelError(f"cannot read model {p}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        _kind_problem(p, st.st_mode)
        os.set_blocking(fd, True)
        return os.read(fd, 4), st.st_size
    except OSError as e:
        raise ModelError(f"cannot read model {p}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def inspect_model(path: str | os.PathLike) -> ModelFacts:
    """Return the model's facts, or raise ModelError with one clear line."""
    p = Path(path)
    magic, size = _read_magic(p)

    if magic == ONEBP_MAGIC:
        return ModelFacts(path=str(p), kind="1bp")
    if magic != GGUF_MAGIC:
        if len(magic) < 4:
            raise ModelError(f"{p}: file is too short to be a GGUF model ({size} bytes)")
        raise ModelError(f"{p}: not a GGUF file (magic {magic!r}, expected b'GGUF') nor a 1BP package")

    _check_layout(p)
    import gguf

    # numpy, under gguf, warns (RuntimeWarning) on some damaged values; the user gets our one line, not its noise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reader = gguf.GGUFReader(str(p), "r")
            return _facts(p, reader, size)
        except ModelError:
            raise
        except Exception as e:  # noqa: BLE001 - the gguf library raises many types on damaged files
            reason = _printable(str(e)) if str(e) else type(e).__name__
            raise ModelError(f"{p}: malformed or truncated GGUF ({reason}); "
                             "re-download or re-convert the model") from None


def _facts(p: Path, reader, size: int) -> ModelFacts:
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
