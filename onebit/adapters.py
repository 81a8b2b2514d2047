"""Launch adapters: one per backend program kind, each speaking that program's own command line.

The manifest names a backend's adapter (`adapter`: llama-server, zinc, ds4 or npu). An adapter knows
  - which entry of the backend's `binaries` is its program (never "the only binary there is"),
  - which serve options the program has an equivalent for (everything else is refused, in one line),
  - how to turn the route's decision into the program's argv and environment,
  - how to ask the program which devices it sees (`1bit check`).

Each command line below follows the program's argument parser at its pin; the citation is next to it.
llama-server's own argv is built by onebit.child (its options, recipes and drafters are route's business); this
module only adds what every adapter shares.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# --- the decision an adapter turns into a command line -------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What route decided for one child, in the adapter's neutral terms."""

    model: str
    host: str
    port: int
    device: str | None  # the manifest device name the child must use (Vulkan0, ROCm0, ZINC0, ...); None for CPU
    ctx_size: int | None = None
    parallel: int | None = None
    extra: tuple[str, ...] = ()  # what the user passed through unchanged


@dataclass(frozen=True)
class Command:
    argv_tail: tuple[str, ...]  # everything after argv[0]
    env: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # things the user must know about this launch (printed by serve, kept in --dry-run)
    bind: str | None = None  # the address the program listens on when that is not the decision's host


@dataclass(frozen=True)
class Adapter:
    name: str
    program: str  # the key of the backend's `binaries` that is this adapter's program
    # serve options this program has an equivalent for; route refuses any other one that the user set
    supports: frozenset[str]
    build: Callable[[Decision], Command] | None  # None: route builds the argv itself (llama-server)
    probe: Callable[[str], list[str]] | None  # binary -> argv that makes the program list its devices
    parse_devices: Callable[[str, str], tuple[str, ...]] | None  # (stdout, stderr) -> device names it sees
    cites: str  # where its command line comes from
    proven: bool = True  # False: no stored source shows the program's parser; the command line is a placeholder
    embeddings: bool = False  # serves embedding / reranking models (llama-server's --embedding, --reranking)
    # --alias without an alias option: the proxy serves the alias in front, and drops "model" from what it forwards
    alias_by_proxy: bool = False
    drops_model: bool = False  # the program reads a request's "model" as a model to load: the proxy removes it
    # the program finds its own files relative to the working directory: it runs in its backend's root
    runs_in_root: bool = False


class AdapterError(ValueError):
    """The decision cannot be expressed in this program's command line."""


# --- llama-server ----------------------------------------------------------------------------------------------------
# llama.cpp at its pin, common/arg.cpp common_print_available_devices() (`--list-devices`): printf "Available
# devices:\n", then "  <name>: <description> (<total> MiB, <free> MiB free)\n" for every device that is not the CPU,
# or "  (none)\n". This is the ONE parser of that listing: builders/ship/stage.py (the recipe tests' device check) uses it.

_DEVICES_HEADER = re.compile(r"^Available devices:\s*$", re.MULTILINE)
_DEVICE_ENTRY = re.compile(r"^\s+([A-Za-z]+[0-9]+):\s", re.MULTILINE)


def list_devices(output: str) -> tuple[str, ...]:
    """The device names of a `llama-server --list-devices` output, in its order, each once: the indented
    `<name><index>: ...` entries after its `Available devices:` line. Log lines (ggml_vulkan: ..., load_backend: ...)
    never count, wherever they are: they are not indented entries, or they come before that line."""
    m = _DEVICES_HEADER.search(output)
    if m is None:
        return ()
    return tuple(dict.fromkeys(e.group(1) for e in _DEVICE_ENTRY.finditer(output, m.end())))


def _llama_devices(stdout: str, stderr: str) -> tuple[str, ...]:
    return list_devices(stdout + "\n" + stderr)


LLAMA_SERVER = Adapter(
    name="llama-server",
    program="llama-server",
    supports=frozenset({"ctx_size", "flash_attn", "alias", "parallel", "dflash", "mtp", "mtp_max", "mtp_p_min", "mmproj",
                        "moe_slots", "prefill_device", "long_model", "adaptive", "laya"}),
    build=None,
    probe=lambda binary: [binary, "--list-devices"],
    parse_devices=_llama_devices,
    cites="ggml-org/llama.cpp common/arg.cpp at the llama.cpp pin (and the forks built from it)",
    embeddings=True,
)


# --- zinc -----------------------------------------------------------------------------------------------------------
# zolotukhin/zinc at the zinc pin (25368165), src/main.zig usage and parseArgs:
#   -m, --model <path>   -p, --port <port>   -d, --device <id> (Vulkan device INDEX)   -c, --context <size>
#   --parallel <n>
# zinc has no --host: src/server/http.zig Server.init binds Address.initIp4(.{0, 0, 0, 0}, port), every interface,
# so route refuses it without --allow-remote. It has no --jinja, no -ngl, no device names, no alias and no embedding
# endpoint (src/server/routes.zig serves /health, /v1/models, /v1/chat/completions, /v1/completions and model
# management). It reads a request's "model" as a managed model id to activate (routes.zig
# ensureRequestedModelActive: 404 "Unknown model id" for a name it does not know), so --alias runs zinc behind the
# proxy, which answers under the alias and drops "model" before zinc.
# `zinc --check` enumerates the Vulkan devices ("GPU <i>: <name> | VRAM ..."); <i> is the Vulkan index, the device
# the manifest lists as Vulkan<i> (recipes/zinc.yaml provides devices [Vulkan0]).

# zinc --check at the pin (src/diagnostics.zig printVulkanProbe): "  Visible GPUs: <n>" and "  Selected GPU: #<i> <name>";
# zinc's -d is the index into those n Vulkan devices. Its instance log ("GPU <i>: <name>", src/vulkan/instance.zig) is
# debug-level, which a ReleaseFast build never prints; it is still read where a debug build prints it.
_ZINC_VISIBLE = re.compile(r"^\s*Visible GPUs: (\d+)\s*$", re.MULTILINE)
_ZINC_GPU = re.compile(r"(?:^|\s)GPU (\d+):")


def _device_index(device: str | None) -> str:
    m = re.search(r"(\d+)$", device or "")
    return m.group(1) if m else "0"


def _zinc(d: Decision) -> Command:
    argv = ["-m", d.model, "-p", str(d.port), "-d", _device_index(d.device)]
    if d.ctx_size is not None:
        argv += ["-c", str(d.ctx_size)]
    if d.parallel is not None:
        argv += ["--parallel", str(d.parallel)]
    notes = (f"zinc has no --host option: it listens on 0.0.0.0:{d.port}, not only on {d.host}",)
    return Command(argv_tail=(*argv, *d.extra), env={}, notes=notes, bind="0.0.0.0")


def _zinc_devices(stdout: str, stderr: str) -> tuple[str, ...]:
    text = stdout + "\n" + stderr
    visible = _ZINC_VISIBLE.search(text)
    if visible:
        return tuple(f"Vulkan{i}" for i in range(int(visible.group(1))))
    return tuple(dict.fromkeys(f"Vulkan{m.group(1)}" for m in _ZINC_GPU.finditer(text)))


ZINC = Adapter(
    name="zinc",
    program="zinc",
    supports=frozenset({"ctx_size", "parallel", "alias"}),
    build=_zinc,
    probe=lambda binary: [binary, "--check"],
    parse_devices=_zinc_devices,
    cites="zolotukhin/zinc src/main.zig, src/server/http.zig and src/server/routes.zig at the zinc pin",
    alias_by_proxy=True,
    drops_model=True,
    # src/main.zig:1521 opens zig-out/share/zinc/shaders/*.spv relative to the working directory; the recipe's link
    # zig-out -> . in the backend's root makes that resolve there (recipes/zinc.yaml)
    runs_in_root=True,
)


# --- ds4 (DwarfStar) -------------------------------------------------------------------------------------------------
# antirez/ds4 ds4_server.c parse_options(): -m/--model FILE, -c/--ctx N, --host HOST (default 127.0.0.1),
# --port N (default 8000), -t/--threads N, and the backend as --metal | --cuda | --cpu | --backend NAME.
# The ROCm build is the pinned `rocm` branch (7a751eb5), whose parser has no rocm backend: ds4_server.c:7968-7975
# parse_backend_arg accepts exactly metal, cuda and cpu ("valid server backends are: metal, cuda, cpu", exit 2 for
# anything else, so `--backend rocm` never starts), and the ROCm build IS the CUDA backend compiled by hipcc: Makefile
# :24-34 (GPU_BACKEND=rocm) builds ds4_cuda.cu with $(ROCM_PATH)/bin/hipcc, ds4_cuda.cu:1-2 includes ds4_rocm.h
# under __HIP_PLATFORM_AMD__ (cuda* names #defined to hip*), and ds4_server.c:7977-7985 makes DS4_BACKEND_CUDA the
# default of every non-Apple GPU build. So the GPU of a ROCm build is `--backend cuda`; the real ds4-server of the
# ds4-rocm recipe, built in the pinned root, answers that argv (tests/test_strix_ds4.py). ds4-server serves one
# session: no --parallel. It has no device-listing option, so `1bit check` can only see that it runs (`--help`).

_DS4_BACKEND = {"ROCm0": "cuda", "CUDA0": "cuda", None: "cpu", "CPU": "cpu"}


def _ds4(d: Decision) -> Command:
    backend = _DS4_BACKEND.get(d.device)
    if backend is None:
        raise AdapterError(f"ds4-server has no backend for device {d.device} (it knows cuda, which is HIP in its ROCm "
                           "build, and cpu)")
    argv = ["-m", d.model, "--host", d.host, "--port", str(d.port), "--backend", backend]
    if d.ctx_size is not None:
        argv += ["--ctx", str(d.ctx_size)]
    return Command(argv_tail=(*argv, *d.extra), env={})


DS4 = Adapter(
    name="ds4",
    program="ds4-server",
    supports=frozenset({"ctx_size"}),
    build=_ds4,
    probe=lambda binary: [binary, "--help"],
    parse_devices=None,
    cites="antirez/ds4 ds4_server.c parse_options() and parse_backend_arg() at the ds4 and ds4-rocm pins",
)


# --- the NPU runtime (UNPROVEN) --------------------------------------------------------------------------------------
# The bundle's npu backend (recipe xdna) ships the amdxdna driver and XRT, not a program that serves a model. The
# engine serves the NPU from its own C++ `1bit serve -m <Q4NX model dir> --device npu` (engine docs/npu.md); no
# stored source shows that program's argument parser, and no recipe here builds it. So this adapter needs a
# binary listed as `npu-server` and, until one exists, route refuses --device npu in one line instead of running
# whatever the backend ships. The command line below is the engine's documented one and is NOT proven.


def _npu(d: Decision) -> Command:
    argv = ["serve", "-m", d.model, "--device", "npu", "--host", d.host, "--port", str(d.port)]
    return Command(argv_tail=(*argv, *d.extra), env={},
                   notes=("the NPU command line is unproven: no stored source shows the NPU runtime's parser",))


NPU = Adapter(
    name="npu",
    program="npu-server",
    supports=frozenset(),
    build=_npu,
    probe=None,
    parse_devices=None,
    cites="1bit-MONSTER/engine docs/npu.md (documented usage only)",
    proven=False,
)


ADAPTERS: dict[str, Adapter] = {a.name: a for a in (LLAMA_SERVER, ZINC, DS4, NPU)}

# serve flag names (ServeFlags fields) -> how a refusal spells them
FLAG_SPELLING = {
    "ctx_size": "--ctx-size", "flash_attn": "--flash-attn", "alias": "--alias", "parallel": "--parallel",
    "dflash": "--dflash", "mtp": "--mtp", "mtp_max": "--mtp-max", "mtp_p_min": "--mtp-p-min", "mmproj": "--mmproj",
    "moe_slots": "--moe-slots", "prefill_device": "--prefill-device", "long_model": "--long-model",
    "adaptive": "--adaptive", "laya": "--laya",
}


def unsupported(adapter: Adapter, given: Mapping[str, object]) -> list[str]:
    """The serve options the user set that this adapter's program has no equivalent for, as the user spelled them."""
    return [FLAG_SPELLING[k] for k, v in given.items() if k in FLAG_SPELLING and v not in (None, False)
            and k not in adapter.supports]
