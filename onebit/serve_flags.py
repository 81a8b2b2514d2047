"""serve_flags: what `1bit serve` was asked, as route reads it: ServeFlags (serve's own options), the llama-server
options given after them (their spellings: `canonical`, `split_options`; the ones that make an embedding server),
and RouteEnv (the environment the caller captured for route: $ONEBIT_LLAMA_SERVER*, PATH's llama-server, free ports,
the host's libraries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .hostlibs import Found

DEFAULT_PORT = 8080

# canonical names for llama-server options, so a user's spelling overrides ours whatever alias either uses
_ALIASES = {
    "-m": "--model",
    "-c": "--ctx-size",
    "-fa": "--flash-attn",
    "-np": "--parallel",
    "-b": "--batch-size",
    "-ub": "--ubatch-size",
    "-ngl": "--n-gpu-layers",
    "--gpu-layers": "--n-gpu-layers",
    "-dev": "--device",
    "-a": "--alias",
    "-md": "--spec-draft-model",
    "--model-draft": "--spec-draft-model",
    "-ngld": "--spec-draft-ngl",
    "--gpu-layers-draft": "--spec-draft-ngl",
    "--n-gpu-layers-draft": "--spec-draft-ngl",
    "--draft-p-min": "--spec-draft-p-min",
    "-ot": "--override-tensor",
    "-t": "--threads",
}


def canonical(flag: str) -> str:
    flag = flag.split("=", 1)[0]
    return _ALIASES.get(flag, flag)


def _is_flag(tok: str) -> bool:
    if not tok.startswith("-") or tok == "-":
        return False
    try:
        float(tok)
        return False
    except ValueError:
        return True


def split_options(tokens: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Group a flat argv into (canonical flag, tokens) pairs: a flag followed by its non-flag values."""
    out: list[tuple[str, list[str]]] = []
    for tok in tokens:
        if _is_flag(tok) or not out:
            out.append((canonical(tok), [tok]))
        else:
            out[-1][1].append(tok)
    return out


@dataclass(frozen=True)
class ServeFlags:
    model: str
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int | None = None
    ctx_size: int | None = None
    flash_attn: str | None = None
    alias: str | None = None
    parallel: int | None = None
    dflash: str | None = None
    mtp: str | None = None
    mtp_max: int | None = None
    mtp_p_min: float | None = None
    mmproj: str | None = None
    moe_slots: int | None = None
    prefill_device: str | None = None
    prefill_min_tokens: int = 1024
    long_model: str | None = None
    long_from: int = 2048
    adaptive: bool = False
    adaptive_at: int = 8
    laya: bool = False
    laya_model: str | None = None  # the Laya checkpoint directory (--laya-model DIR implies --laya)
    route_policy: str | None = None  # the policy file, for the plan (the caller loads it)
    llama_server: str | None = None
    allow_remote: bool = False  # a child or the proxy may listen beyond loopback
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class RouteEnv:
    """The environment route may look at, captured by the caller."""

    env: Mapping[str, str] = field(default_factory=dict)
    path_llama_server: str | None = None  # shutil.which("llama-server"), or None
    free_ports: tuple[int, ...] = ()  # loopback ports for proxied children
    # where this host's dynamic loader finds each SONAME the manifest's backends need from the host
    # (onebit.hostlibs.look_up); None: not looked up, every backend is taken as able to start
    host_libs: Mapping[str, Found] | None = None


def named_llama_server(backend: str, flags: ServeFlags | None, renv: RouteEnv) -> str | None:
    """The llama-server the user named for `backend`: --llama-server, else $ONEBIT_LLAMA_SERVER_<BACKEND>, else
    $ONEBIT_LLAMA_SERVER; None when they named none (the bundle's own, or PATH's)."""
    if flags is not None and flags.llama_server:
        return flags.llama_server
    specific = "ONEBIT_LLAMA_SERVER_" + backend.upper().replace("-", "_")
    return renv.env.get(specific) or renv.env.get("ONEBIT_LLAMA_SERVER") or None


# llama-server options that make it an embedding or reranking server
EMBEDDING_FLAGS = frozenset({"--embedding", "--embeddings", "--pooling", "--reranking", "--rerank"})


def embedding_flag(extra: Sequence[str]) -> str | None:
    """The first of the user's llama-server options that makes an embedding or reranking server, if any."""
    return next((t.split("=", 1)[0] for t in extra if t.split("=", 1)[0] in EMBEDDING_FLAGS), None)
