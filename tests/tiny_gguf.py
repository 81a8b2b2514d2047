"""Write tiny but real GGUF models for tests.

The model is a genuine llama-architecture network (random weights) that a real
llama-server loads and answers from -- the output is gibberish, which is fine.
Options add the metadata that `1bit serve` routes on: expert count (MoE, still
llama architecture, which llama.cpp loads Mixtral-style), the Hadamard stamp
`onebit.hadamard_q4_0`, a drafter's `dflash.block_size` and `general.file_type`.

Importable (`from tiny_gguf import write_tiny_gguf`) and runnable:

    python tests/tiny_gguf.py OUT.gguf [--experts N] [--hadamard 32]
        [--dflash-block-size N] [--file-type N] [--arch NAME] [--truncate N]
        [--onebp]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

import gguf

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_LAYER = 2
N_CTX_TRAIN = 2048

# <unk>, <s>, </s>, then the 256 byte tokens <0x00>..<0xFF> (SentencePiece byte fallback).
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
N_VOCAB = 3 + 256

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

ONEBP_MAGIC = b"1BP\0"


def _tokens() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        types.append(gguf.TokenType.BYTE)
    scores = [0.0] * len(tokens)
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(
    path: str | os.PathLike,
    *,
    experts: int = 0,
    experts_used: int | None = None,
    hadamard: int | None = None,
    dflash_block_size: int | None = None,
    file_type: int | None = None,
    arch: str = "llama",
    f16: bool = False,
    seed: int = 0,
    extra_kv: dict[str, int | str] | None = None,
    n_embd: int = N_EMBD,
    n_layer: int = N_LAYER,
    n_ff: int = N_FF,
) -> Path:
    """Write a tiny loadable llama model to `path` and return the path.

    experts > 0 writes a Mixtral-style MoE (llama architecture with expert
    tensors and llama.expert_count). `arch` other than "llama" only changes the
    metadata name (such a file is for inspection tests, not for loading).
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    N_EMBD, N_LAYER, N_FF = n_embd, n_layer, n_ff  # noqa: N806 - shadow the module defaults for this file
    wdtype = np.float16 if f16 else np.float32

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(wdtype)

    def ones(n: int) -> np.ndarray:
        return np.ones((n,), dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("onebit-tiny")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(N_VOCAB)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(experts_used or min(2, experts))
    if file_type is None:
        file_type = int(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_file_type(file_type)
    if hadamard is not None:
        writer.add_uint32("onebit.hadamard_q4_0", hadamard)
    if dflash_block_size is not None:
        writer.add_uint32("dflash.block_size", dflash_block_size)
    for key, value in (extra_kv or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, int(value))

    tokens, scores, types = _tokens()
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # numpy shape is the reverse of ggml's ne: ggml {n_embd, n_vocab} -> (n_vocab, n_embd)
    writer.add_tensor("token_embd.weight", w(N_VOCAB, N_EMBD))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    writer.add_tensor("output.weight", w(N_VOCAB, N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones(N_EMBD))
        writer.add_tensor(p + "attn_q.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", w(N_EMBD // N_HEAD * N_HEAD_KV, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", w(N_EMBD // N_HEAD * N_HEAD_KV, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "ffn_norm.weight", ones(N_EMBD))
        if experts:
            writer.add_tensor(p + "ffn_gate_inp.weight", w(experts, N_EMBD).astype(np.float32))
            writer.add_tensor(p + "ffn_gate_exps.weight", w(experts, N_FF, N_EMBD))
            writer.add_tensor(p + "ffn_up_exps.weight", w(experts, N_FF, N_EMBD))
            writer.add_tensor(p + "ffn_down_exps.weight", w(experts, N_EMBD, N_FF))
        else:
            writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
            writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
            writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_truncated_gguf(path: str | os.PathLike, keep_bytes: int = 200, **kwargs) -> Path:
    """Write a tiny model, then cut it to its first `keep_bytes` bytes."""
    path = Path(path)
    write_tiny_gguf(path, **kwargs)
    data = path.read_bytes()[:keep_bytes]
    path.write_bytes(data)
    return path


def write_garbage(path: str | os.PathLike, data: bytes = b"this is not a gguf file\n") -> Path:
    """Write a file that is not GGUF at all (wrong magic)."""
    path = Path(path)
    path.write_bytes(data)
    return path


def write_onebp(path: str | os.PathLike, payload: bytes = b"\x01\x00\x00\x00tiny-1bp-package") -> Path:
    """Write a file starting with the 1BP package magic "1BP\\0"."""
    path = Path(path)
    path.write_bytes(ONEBP_MAGIC + payload)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write a tiny real GGUF model for tests")
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--experts", type=int, default=0, help="expert count (MoE)")
    ap.add_argument("--experts-used", type=int, default=None)
    ap.add_argument("--hadamard", type=int, default=None, help="value of onebit.hadamard_q4_0 (e.g. 32)")
    ap.add_argument("--dflash-block-size", type=int, default=None)
    ap.add_argument("--file-type", type=int, default=None, help="general.file_type (0=F32, 1=F16, 2=Q4_0, ...)")
    ap.add_argument("--arch", default="llama", help="general.architecture (non-llama: metadata only)")
    ap.add_argument("--f16", action="store_true", help="store weight matrices as F16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-embd", type=int, default=N_EMBD, help="width (multiple of 4 heads x 16)")
    ap.add_argument("--n-layer", type=int, default=N_LAYER)
    ap.add_argument("--n-ff", type=int, default=N_FF)
    ap.add_argument("--truncate", type=int, default=None, metavar="BYTES", help="cut the file to BYTES bytes")
    ap.add_argument("--onebp", action="store_true", help="write a 1BP package stub instead of GGUF")
    args = ap.parse_args(argv)

    if args.onebp:
        write_onebp(args.out)
        return 0
    write_tiny_gguf(
        args.out,
        experts=args.experts,
        experts_used=args.experts_used,
        hadamard=args.hadamard,
        dflash_block_size=args.dflash_block_size,
        file_type=args.file_type,
        arch=args.arch,
        f16=args.f16,
        seed=args.seed,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_ff=args.n_ff,
    )
    if args.truncate is not None:
        data = Path(args.out).read_bytes()[: args.truncate]
        Path(args.out).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
