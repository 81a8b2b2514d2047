"""Route: a pure function (model facts, flags, manifest, environment) -> LaunchPlan | Refusal.

Nothing here touches the file system, the network or the process: the caller inspects the model files, loads the
manifest and recipes, looks up llama-server on PATH and picks free ports, and passes all of it in.

Argument precedence inside one child's command line: what the user gave (serve flags or extra llama-server args)
beats a serve recipe, which beats the route's own defaults. Environment the user already set always wins over
anything serve would set (manifest defaults < route rules < recipes < user).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from .adapters import ADAPTERS, Adapter, AdapterError, Decision, unsupported
from .bundles import BUNDLES
from .hostlibs import Found, missing, missing_text
from .hosts import bind_refusal
from .inspect import ModelFacts
from .laya import Policy
from .manifest import Manifest, default_adapter
from .recipes import Recipe, RecipeFacts

DEVICES = ("auto", "vulkan", "hrx", "rocm", "npu", "zinc", "ds4", "cpu", "cuda")
# llama-server --device names; a device missing here (cpu) gets no --device and -ngl 0. zinc, ds4 and the NPU are
# not llama-server devices: their adapters take the device from the manifest entry.
DEVICE_FLAG = {"vulkan": "Vulkan0", "hrx": "HRX0", "rocm": "ROCm0", "cuda": "CUDA0"}
# which manifest backends serve a device, in order of preference
DEVICE_BACKENDS = {
    "vulkan": ("vulkan", "lean-vulkan"),
    "hrx": ("hrx",),
    "rocm": ("rocm",),
    "npu": ("npu",),
    "zinc": ("zinc",),
    "ds4": ("ds4", "ds4-rocm", "ds4-cuda", "ds4-cpu"),  # the ds4 recipe's variants provide ds4-<variant>
    "cpu": ("cpu",),
    "cuda": ("cuda",),
}
# A device the engine's Lemonade backend asks for by name, served by another backend where this bundle has no program
# of its own for it: `--device zinc` is how 1bit-MONSTER/lemonade reaches an NVIDIA GPU, and the nvidia bundle reaches
# it through cuda (on an H200, llama.cpp's CUDA build decoded 1.8x ZINC's rate on F16 and 3.4x on Q8_0: docs/zinc.md)
STANDINS = {"zinc": ("cuda", "zinc is not in this bundle: CUDA0 serves the NVIDIA GPU through the cuda backend")}
# what --device auto picks for an ordinary GGUF, first present in the manifest wins
AUTO_ORDER = ("vulkan", "cuda", "hrx", "rocm", "cpu")
HADAMARD_FEATURE = "hadamard_w4a4"
DEFAULT_PORT = 8080
DEFAULT_DFLASH_N_MAX = 16

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


@dataclass(frozen=True)
class Child:
    role: str
    backend: str
    device: str
    binary: str
    argv: tuple[str, ...]  # argv[0] is the binary
    env: Mapping[str, str]  # what serve adds to the inherited environment (user-set names already left out)
    host: str
    port: int
    recipes: tuple[str, ...] = ()
    slots: int | None = None  # adaptive: how many requests this child takes before the next one overflows
    adapter: str = "llama-server"
    notes: tuple[str, ...] = ()  # what the adapter says the user must know (zinc listens on 0.0.0.0, ...)
    bind: str = ""  # the address the program will actually listen on (zinc: 0.0.0.0 whatever host says)
    drop_model: bool = False  # the proxy removes "model" from requests to it (zinc loads the model a request names)
    cwd: str | None = None  # the working directory it must run in (zinc: its backend's root); None: serve's own


@dataclass(frozen=True)
class ProxySpec:
    host: str
    port: int
    policy: str  # "long" | "adaptive" | "laya" | "single" (one child whose program cannot take the alias: zinc)
    alias: str
    long_from: int | None = None
    adaptive_at: int | None = None
    laya: LayaSpec | None = None


@dataclass(frozen=True)
class LayaSpec:
    """How the proxy routes by Laya class: each class (and the default) names the role of a child."""

    model_dir: str
    policy: str  # path of the policy file (for the log)
    min_confidence: float
    default: str  # role of the default device
    classes: Mapping[str, str]  # class -> role (a device the bundle can serve; others fell back to the default)


@dataclass(frozen=True)
class LaunchPlan:
    mode: str  # "exec" | "proxy"
    children: tuple[Child, ...]
    proxy: ProxySpec | None = None
    model: ModelFacts | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["ok"] = True
        for c in d["children"]:
            c["argv"] = list(c["argv"])
            c["env"] = dict(c["env"])
            c["recipes"] = list(c["recipes"])
            c["notes"] = list(c["notes"])
        return d


@dataclass(frozen=True)
class Refusal:
    message: str
    rule: str

    def to_json(self) -> dict:
        return {"ok": False, "refused": self.rule, "message": self.message}


class _Refused(Exception):
    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.refusal = Refusal(message=message, rule=rule)


class _Args:
    """Ordered llama-server options with their source, so precedence is user > recipe > route."""

    RANK = {"route": 0, "recipe": 1, "user": 2}

    def __init__(self) -> None:
        self.opts: dict[str, tuple[list[str], str]] = {}

    def set(self, tokens: Sequence[str], source: str = "route") -> bool:
        key = canonical(tokens[0])
        have = self.opts.get(key)
        if have is not None and self.RANK[have[1]] > self.RANK[source]:
            return False
        if have is not None:
            self.opts[key] = (list(tokens), source)
        else:
            self.opts[key] = (list(tokens), source)
        return True

    def drop(self, key: str) -> None:
        self.opts.pop(key, None)

    def flat(self) -> list[str]:
        return [t for toks, _ in self.opts.values() for t in toks]


def _backend_for(device: str, manifest: Manifest | None, renv: RouteEnv | None = None,
                 flags: ServeFlags | None = None) -> str | None:
    """The backend that serves `device`: the first of its backends in the manifest, and with `renv`, the first whose
    programs can start on this host (cannot_start)."""
    if manifest is None:
        return DEVICE_BACKENDS[device][0]
    for b in DEVICE_BACKENDS[device]:
        if manifest.has(b) and (renv is None or cannot_start(b, manifest, renv, flags) is None):
            return b
    return None


def cannot_start(backend: str, manifest: Manifest | None, renv: RouteEnv, flags: ServeFlags | None = None) -> str | None:
    """Why `backend`'s program cannot start on this host: the host libraries its manifest entry lists that the loader
    would not find, and what provides them; None when it can, or when the program is not the bundle's (a llama-server
    the user named with --llama-server or $ONEBIT_LLAMA_SERVER*, which brings its own libraries)."""
    if manifest is None or renv.host_libs is None or backend not in manifest.backends:
        return None
    b = manifest.backends[backend]
    if b.adapter == "llama-server" and ((flags is not None and flags.llama_server) or _env_llama_server(backend, renv)):
        return None
    lacking = missing(b.host_libraries, renv.host_libs)
    return missing_text(lacking, renv.host_libs) if lacking else None


def _env_llama_server(backend: str, renv: RouteEnv) -> str | None:
    """The llama-server $ONEBIT_LLAMA_SERVER_<BACKEND> or $ONEBIT_LLAMA_SERVER names, if any."""
    specific = "ONEBIT_LLAMA_SERVER_" + backend.upper().replace("-", "_")
    return renv.env.get(specific) or renv.env.get("ONEBIT_LLAMA_SERVER") or None


def _unstartable(devices: str | Sequence[str], manifest: Manifest | None, renv: RouteEnv, flags: ServeFlags,
                 what: str) -> _Refused:
    """The refusal for devices whose every backend in this bundle lacks host libraries here, in one line."""
    devices = (devices,) if isinstance(devices, str) else devices
    why = [f"the {b} backend cannot run on this host: {cannot_start(b, manifest, renv, flags)}"
           for d in devices for b in DEVICE_BACKENDS[d] if manifest is not None and manifest.has(b)]
    return _Refused("host-libraries", f"{what}: {' | '.join(why)}")


def _passed_over(want: str, device: str, backend: str, manifest: Manifest | None, renv: RouteEnv,
                 flags: ServeFlags) -> tuple[str, ...]:
    """Notes for the backends route passed over because they cannot start here: those ahead of `backend` for its
    device, and, for --device auto, the devices ahead of `device` whose backends all lack host libraries."""
    if manifest is None or renv.host_libs is None:
        return ()
    skipped = []
    if want == "auto" and device in AUTO_ORDER:
        for dev in AUTO_ORDER[:AUTO_ORDER.index(device)]:
            skipped += [b for b in DEVICE_BACKENDS[dev] if manifest.has(b)]
    ahead = DEVICE_BACKENDS.get(device, ())
    if backend in ahead:
        skipped += [b for b in ahead[:ahead.index(backend)] if manifest.has(b)]
    return tuple(f"{b} cannot run on this host ({why}); {backend} serves instead"
                 for b in skipped if (why := cannot_start(b, manifest, renv, flags)))


def _held(manifest: Manifest | None) -> str:
    if manifest is None:
        return "(no manifest)"
    return ", ".join(sorted(manifest.backends)) or "(none)"


def elsewhere(device: str, manifest: Manifest | None) -> str:
    """Which other bundle serves `device` (onebit/data/bundles.json), as the end of a refusal: what to install."""
    serving, without_program = [], []
    for info in BUNDLES.values():
        if manifest is not None and info.name == manifest.bundle:
            continue
        backend = next((b for b in DEVICE_BACKENDS[device] if b in info.backends), None)
        if backend is None:
            continue
        adapter, programs = info.backends[backend]
        if ADAPTERS[adapter].program in programs:
            serving.append(info)
        else:
            without_program.append((info, backend, ADAPTERS[adapter].program, programs))
    if serving:
        return (f"{device} is in the {' or '.join(i.name for i in serving)} bundle: "
                f"install {' or '.join(i.package for i in serving)}")
    if without_program:
        info, backend, program, programs = without_program[0]
        return (f"no bundle serves it yet: the {info.name} bundle's {backend} backend ships {', '.join(programs)}, "
                f"not {program}")
    return "no bundle has it"


def _missing(device: str, manifest: Manifest | None, what: str) -> str:
    """`<what>: this bundle (B) has no <device> backend (has: ...); <where to get it>`, one line."""
    bundle = f" ({manifest.bundle})" if manifest is not None else ""
    return f"{what}: this bundle{bundle} has no {device} backend (has: {_held(manifest)}); {elsewhere(device, manifest)}"


def _pick_device(facts: ModelFacts, flags: ServeFlags, manifest: Manifest | None, want: str, renv: RouteEnv) -> str:
    name = Path(facts.path).name
    if facts.onebp:
        if want not in ("auto", "ds4"):
            raise _Refused(
                "1bp-device",
                f"{name} is a 1BP package; only the ds4 backend serves it (use --device ds4 or auto, not {want})",
            )
        if _backend_for("ds4", manifest) is None:
            raise _Refused("1bp-device", _missing("ds4", manifest, f"{name} is a 1BP package, only ds4 serves it"))
        if _backend_for("ds4", manifest, renv, flags) is None:
            raise _unstartable("ds4", manifest, renv, flags, f"{name} is a 1BP package, only ds4 serves it")
        return "ds4"

    if facts.hadamard is not None:
        if facts.hadamard != 32:
            raise _Refused(
                "hadamard-block",
                f"{name} has onebit.hadamard_q4_0={facts.hadamard}; only 32 is supported by the lean ROCm build",
            )
        if want not in ("auto", "rocm"):
            raise _Refused(
                "hadamard-device",
                f"{name} is Hadamard-rotated (onebit.hadamard_q4_0=32): only the lean ROCm build (--device rocm) "
                f"rotates the activations to match, so --device {want} would give wrong output; use --device rocm or auto",
            )
        if manifest is not None:
            b = manifest.backends.get("rocm")
            if b is None or HADAMARD_FEATURE not in b.features:
                raise _Refused(
                    "hadamard-device",
                    f"{name} is Hadamard-rotated (onebit.hadamard_q4_0=32) and needs the lean ROCm build with feature "
                    f"{HADAMARD_FEATURE}, which this bundle ({manifest.bundle}) does not have",
                )
            if _backend_for("rocm", manifest, renv, flags) is None:
                raise _unstartable("rocm", manifest, renv, flags, f"{name} is Hadamard-rotated and needs the lean ROCm build")
        return "rocm"

    if want == "ds4":
        raise _Refused("ds4-needs-1bp", f"--device ds4 serves 1BP packages only; {name} is a GGUF file")

    if flags.prefill_device is not None:
        if flags.prefill_device != "hrx":
            raise _Refused("prefill-device", f"--prefill-device {flags.prefill_device} is not supported; only hrx is")
        if want not in ("auto", "vulkan"):
            raise _Refused("prefill-device", f"--prefill-device hrx decodes on vulkan; it cannot be used with --device {want}")
        if _backend_for("hrx", manifest) is None:
            raise _Refused("prefill-device", _missing("hrx", manifest, "--prefill-device hrx needs the hrx backend"))
        if _backend_for("hrx", manifest, renv, flags) is None:
            raise _unstartable("hrx", manifest, renv, flags, "--prefill-device hrx")
        if manifest is not None:
            devs = manifest.backends["hrx"].devices
            if "HRX0" not in devs or "Vulkan0" not in devs:
                raise _Refused("prefill-device", "--prefill-device hrx needs the hrx build that carries both HRX0 and Vulkan0; "
                               f"this bundle's hrx backend lists {', '.join(devs)}")
        return "vulkan"

    if want == "auto":
        for dev in AUTO_ORDER:
            if _backend_for(dev, manifest, renv, flags) is not None:
                return dev
        held = [dev for dev in AUTO_ORDER if _backend_for(dev, manifest) is not None]
        if held:  # the bundle has backends for it, none can start here
            raise _unstartable(held, manifest, renv, flags, f"no backend in this bundle can serve {name} on this host")
        raise _Refused("no-device", f"no backend in this bundle can serve {name} (has: {_held(manifest)})")

    if _backend_for(want, manifest) is None:
        standin = STANDINS.get(want)
        if standin and manifest is not None and _backend_for(standin[0], manifest) is not None:
            if _backend_for(standin[0], manifest, renv, flags) is None:
                raise _unstartable(standin[0], manifest, renv, flags, f"--device {want}")
            return standin[0]
        raise _Refused("device-missing", _missing(want, manifest, f"--device {want}"))
    if _backend_for(want, manifest, renv, flags) is None:
        raise _unstartable(want, manifest, renv, flags, f"--device {want}")
    return want


def _adapter_of(backend: str, manifest: Manifest | None) -> Adapter:
    if manifest is not None and backend in manifest.backends:
        return ADAPTERS[manifest.backends[backend].adapter]
    return ADAPTERS[default_adapter(backend)]


def _resolve_binary(backend: str, adapter: Adapter, flags: ServeFlags, manifest: Manifest | None, renv: RouteEnv) -> str:
    """The adapter's program for this backend. --llama-server, $ONEBIT_LLAMA_SERVER* and PATH name llama-servers,
    so only the llama-server adapter looks at them; no backend ever runs a binary listed under another name."""
    if adapter.name == "llama-server":
        if flags.llama_server:
            return flags.llama_server
        named = _env_llama_server(backend, renv)
        if named:
            return named
    if manifest is not None and backend in manifest.backends:
        b = manifest.backends[backend]
        p = b.binary(manifest.prefix, adapter.program)
        if p is not None:
            return str(p)
        if adapter.name != "llama-server":
            listed = ", ".join(sorted(b.binaries)) or "none"
            raise _Refused(
                "no-program",
                f"the {backend} backend of this bundle lists no {adapter.program} program for its {adapter.name} adapter "
                f"(it ships: {listed}); nothing to launch for --device {backend}",
            )
    if adapter.name == "llama-server" and renv.path_llama_server:
        return renv.path_llama_server
    if adapter.name != "llama-server":
        raise _Refused("no-program", f"no {adapter.program} for backend {backend}: this needs a bundle manifest that lists it")
    raise _Refused(
        "no-binary",
        f"no llama-server for backend {backend}: not in the manifest, $ONEBIT_LLAMA_SERVER unset and none on PATH",
    )


def _manifest_device(device: str, backend: str, manifest: Manifest | None) -> str | None:
    """The device name a child uses: the route's llama-server name if the backend lists it, else the backend's first
    non-CPU device; None means CPU."""
    if device == "cpu":
        return None
    want = DEVICE_FLAG.get(device)
    if manifest is not None and backend in manifest.backends:
        devs = [d for d in manifest.backends[backend].devices if d != "CPU"]
        if want not in devs:
            return devs[0] if devs else None
    return want


# serve options that are the child's business (the proxy's own options are checked where the proxy is planned)
_CHILD_FLAGS = ("ctx_size", "flash_attn", "alias", "parallel", "dflash", "mtp", "mtp_max", "mtp_p_min", "mmproj",
                "moe_slots", "prefill_device")


def _last_host(argv: Sequence[str], default: str) -> str:
    """The address a program given `--host X` (last one wins) listens on."""
    host = default
    for i, a in enumerate(argv):
        if a == "--host" and i + 1 < len(argv):
            host = argv[i + 1]
        elif a.startswith("--host="):
            host = a.split("=", 1)[1]
    return host


def _foreign_child(facts, flags, manifest, renv, adapter, *, role, backend, device, host, port, slots) -> Child:
    """A child whose program is not llama-server: its adapter builds the command line."""
    binary = _resolve_binary(backend, adapter, flags, manifest, renv)  # no program at all says more than an option
    given = {k: getattr(flags, k) for k in _CHILD_FLAGS}
    bad = unsupported(adapter, given)
    if bad:
        raise _Refused("adapter-option", f"{', '.join(bad)}: {adapter.program} (the {backend} backend) has no such option; "
                       f"drop {'it' if len(bad) == 1 else 'them'} or choose another --device")
    if flags.long_model or flags.adaptive:
        which = "--long-model" if flags.long_model else "--adaptive"
        raise _Refused("adapter-option", f"{which} needs llama-server children; the {backend} backend runs {adapter.program}")
    role_flag = next((t.split("=", 1)[0] for t in flags.extra if t.split("=", 1)[0] in EMBEDDING_FLAGS), None)
    if role_flag and not adapter.embeddings:
        raise _Refused("adapter-option", f"{role_flag}: {adapter.program} (the {backend} backend) serves chat only; "
                       "an embedding or reranking model needs a llama-server backend (--device auto)")
    # a program that runs in its own root gets the model's absolute path (the user's relative one names their cwd)
    model = str(Path(facts.path).absolute()) if adapter.runs_in_root else facts.path
    decision = Decision(model=model, host=host, port=port, device=_manifest_device(device, backend, manifest),
                        ctx_size=flags.ctx_size, parallel=flags.parallel if slots is None else slots, extra=flags.extra)
    try:
        cmd = adapter.build(decision)
    except AdapterError as e:
        raise _Refused("adapter-device", f"--device {device}: {e}") from None
    env: dict[str, str] = {}
    if manifest is not None:
        env.update(manifest.backends[backend].env)
    env.update(cmd.env)
    env = {k: v for k, v in env.items() if k not in renv.env}
    return Child(role=role, backend=backend, device=device, binary=binary, argv=(binary, *cmd.argv_tail), env=env,
                 host=host, port=port, recipes=(), slots=slots, adapter=adapter.name, notes=cmd.notes,
                 bind=cmd.bind or _last_host(cmd.argv_tail, host), drop_model=adapter.drops_model,
                 cwd=_root_of(binary, backend, manifest) if adapter.runs_in_root else None)


def _root_of(binary: str, backend: str, manifest) -> str:
    """The backend's root in the installed prefix (the manifest's `root`), else the folder above the program's bin/."""
    b = manifest.backends.get(backend) if manifest is not None else None
    if b is not None and getattr(b, "root", None):
        return str(manifest.prefix / b.root)
    return str(Path(binary).parent.parent)


# --- one llama-server child: small steps, each adding its options (and environment) to the command line ------------


def _child_backend(flags: ServeFlags, device: str, manifest: Manifest | None, renv: RouteEnv) -> str:
    # --prefill-device hrx: one process of the hrx build holds both devices (decode on its Vulkan0, prefill on HRX0)
    backend = "hrx" if flags.prefill_device == "hrx" else _backend_for(device, manifest, renv, flags)
    assert backend is not None
    return backend


def _base_args(args: _Args, facts: ModelFacts, device: str, backend: str, manifest: Manifest | None, host: str,
               port: int) -> None:
    """Model, address, device and offload: the route's own defaults."""
    args.set(["-m", facts.path])
    args.set(["--host", host])
    args.set(["--port", str(port)])
    if device == "cpu":
        args.set(["-ngl", "0"])
    else:
        dev_flag = _manifest_device(device, backend, manifest)
        if dev_flag:
            args.set(["--device", dev_flag])
        args.set(["-ngl", "99"])
    args.set(["--jinja"])


def _user_args(args: _Args, flags: ServeFlags, proxied_alias: str | None, slots: int | None) -> None:
    """The serve options that are llama-server options under another spelling (the user's: they win)."""
    if flags.ctx_size is not None:
        args.set(["-c", str(flags.ctx_size)], "user")
    if flags.flash_attn is not None:
        args.set(["-fa", flags.flash_attn], "user")
    if flags.alias is not None:
        args.set(["--alias", flags.alias], "user")
    elif proxied_alias is not None:
        args.set(["--alias", proxied_alias])
    if flags.parallel is not None:
        args.set(["-np", str(flags.parallel)], "user")
    if slots is not None and flags.parallel is None:
        args.set(["-np", str(slots)])


def _drafter_args(args: _Args, flags: ServeFlags, draft: ModelFacts | None, device: str) -> str:
    """--dflash or --mtp as llama-server's speculative decoding options; returns the drafter ("none" without)."""
    ngld = "0" if device == "cpu" else "99"
    if flags.dflash:
        bs = draft.dflash_block_size if draft is not None else None
        n_max = bs - 1 if bs and bs > 1 else DEFAULT_DFLASH_N_MAX
        args.set(["--spec-type", "draft-dflash"])
        args.set(["-md", flags.dflash])
        args.set(["-ngld", ngld])
        args.set(["--spec-draft-n-max", str(n_max)])
        args.set(["--spec-draft-p-min", "0"])
        return "dflash"
    if flags.mtp:
        args.set(["--spec-type", "draft-mtp"])
        args.set(["-md", flags.mtp])
        args.set(["-ngld", ngld])
        if flags.mtp_max is not None:
            args.set(["--spec-draft-n-max", str(flags.mtp_max)], "user")
        if flags.mtp_p_min is not None:
            args.set(["--spec-draft-p-min", _num(flags.mtp_p_min)], "user")
        return "mtp"
    return "none"


def _mmproj_args(args: _Args, flags: ServeFlags) -> None:
    if flags.mmproj:
        args.set(["--mmproj", flags.mmproj])
        args.set(["-b", "4096"])
        args.set(["-ub", "4096"])


def _moe_slots(args: _Args, env: dict[str, str], flags: ServeFlags, facts: ModelFacts, device: str) -> None:
    if flags.moe_slots is None:
        return
    name = Path(facts.path).name
    if device != "vulkan":
        raise _Refused("moe-slots-device", f"--moe-slots works on vulkan only; this route runs {name} on {device}")
    if not facts.moe:
        raise _Refused("moe-slots-dense", f"--moe-slots needs an MoE model; {name} has no experts")
    args.set(["-ot", "exps=CPU"])
    env["ONEBIT_MOE_FILE"] = facts.path
    env["ONEBIT_MOE_SLOTS"] = str(flags.moe_slots)


def _prefill_env(env: dict[str, str], flags: ServeFlags) -> None:
    if flags.prefill_device == "hrx":
        env["ONEBIT_PREFILL_DEVICE"] = "HRX0"
        env["ONEBIT_PREFILL_MIN_TOKENS"] = str(flags.prefill_min_tokens)


def _apply_recipes(args: _Args, env: dict[str, str], recipes: Sequence[Recipe], rfacts: RecipeFacts,
                   user_keys: set[str], renv: RouteEnv) -> tuple[str, ...]:
    """Serve recipes that match: their options (unless the user gave that option) and environment; their names."""
    applied = []
    for r in recipes:
        if not r.matches(rfacts):
            continue
        used = False
        for key, toks in split_options(r.args):
            if key not in user_keys and args.set(toks, "recipe"):
                used = True
        for k, v in r.env.items():
            if k not in renv.env:
                env[k] = v
                used = True
        if used:
            applied.append(r.name)
    return tuple(applied)


def _route_child(
    facts: ModelFacts,
    flags: ServeFlags,
    manifest: Manifest | None,
    renv: RouteEnv,
    recipes: Sequence[Recipe],
    *,
    role: str,
    host: str,
    port: int,
    want_device: str,
    draft: ModelFacts | None,
    drafters: bool,
    proxied_alias: str | None = None,
    slots: int | None = None,
) -> Child:
    device = _pick_device(facts, flags, manifest, want_device, renv)
    backend = _child_backend(flags, device, manifest, renv)
    adapter = _adapter_of(backend, manifest)
    passed = _passed_over(want_device, device, backend, manifest, renv, flags)
    if adapter.name != "llama-server":
        child = _foreign_child(facts, flags, manifest, renv, adapter, role=role, backend=backend, device=device,
                               host=host, port=port, slots=slots)
        return dataclasses.replace(child, notes=(*passed, *child.notes)) if passed else child
    args = _Args()
    env: dict[str, str] = dict(manifest.backends[backend].env) if manifest is not None else {}
    _base_args(args, facts, device, backend, manifest, host, port)
    if facts.rotated:
        env["GGML_W4A4_TENSORS"] = "all"
    _user_args(args, flags, proxied_alias, slots)
    drafter = _drafter_args(args, flags, draft, device) if drafters else "none"
    if drafters:
        _mmproj_args(args, flags)
    _moe_slots(args, env, flags, facts, device)
    _prefill_env(env, flags)
    user_keys = {key for key, _ in split_options(flags.extra)}
    rfacts = RecipeFacts(device=device, architecture=facts.arch, moe=facts.moe, drafter=drafter, rotated=facts.rotated)
    applied = _apply_recipes(args, env, recipes, rfacts, user_keys, renv)
    for key in user_keys:
        args.drop(key)
    binary = _resolve_binary(backend, adapter, flags, manifest, renv)
    argv = (binary, *args.flat(), *flags.extra)
    standin = STANDINS.get(want_device)
    notes = (*passed, *((standin[1],) if standin and device == standin[0] and want_device != device else ()))
    return Child(role=role, backend=backend, device=device, binary=binary, argv=argv,
                 env={k: v for k, v in env.items() if k not in renv.env}, host=host, port=port, recipes=applied,
                 slots=slots, bind=_last_host(argv[1:], host), notes=notes)


@dataclass(frozen=True)
class Capabilities:
    """What a bundle can serve, for `1bit serve --help` (route still decides every launch)."""

    devices: tuple[str, ...]  # --device values this bundle serves, "auto" first
    llama_server: bool  # a llama-server backend: drafters, --mmproj, --flash-attn, --long-model
    moe_slots: bool  # --moe-slots: the vulkan device
    prefill_hrx: bool  # --prefill-device hrx: the hrx build with HRX0 and Vulkan0
    adaptive: bool  # --adaptive: vulkan and rocm
    laya: bool  # --laya: the bundle ships the Laya checkpoint (or $ONEBIT_LAYA_MODEL names one)


def capabilities(manifest: Manifest, laya: bool) -> Capabilities:
    """Pure: what `manifest` can serve. A device counts when its backend lists its adapter's program (the npu backend
    ships the driver, not a program that serves a model: no --device npu)."""
    def serves(device: str) -> bool:
        backend = _backend_for(device, manifest)
        if backend is None:
            return False
        b = manifest.backends[backend]
        return ADAPTERS[b.adapter].program in b.binaries

    devices = tuple(d for d in DEVICES[1:] if serves(d))
    hrx = manifest.backends.get("hrx")
    return Capabilities(
        devices=("auto", *devices),
        llama_server=any(b.adapter == "llama-server" for b in manifest.backends.values()),
        moe_slots="vulkan" in devices,
        prefill_hrx=hrx is not None and {"HRX0", "Vulkan0"} <= set(hrx.devices),
        adaptive={"vulkan", "rocm"} <= set(devices),
        laya=laya,
    )


def _num(x: float) -> str:
    return f"{x:g}"


def route(
    facts: ModelFacts,
    flags: ServeFlags,
    manifest: Manifest | None,
    renv: RouteEnv,
    recipes: Sequence[Recipe] = (),
    *,
    draft: ModelFacts | None = None,
    long_facts: ModelFacts | None = None,
    laya_policy: Policy | None = None,
) -> LaunchPlan | Refusal:
    """Decide how to serve: one exec'd server, or several behind the proxy; or refuse with a message."""
    try:
        plan = _route(facts, flags, manifest, renv, recipes, draft, long_facts, laya_policy)
    except _Refused as r:
        return r.refusal
    return _remote_refusal(plan, flags) or plan


# GGUF architectures of embedding models (llama.cpp's encoder-only ones): Laya routes chat, not embeddings
EMBEDDING_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert",
                             "modern-bert", "t5encoder"})
EMBEDDING_FLAGS = frozenset({"--embedding", "--embeddings", "--pooling", "--reranking", "--rerank"})


def laya_refusal(flags: ServeFlags, facts: ModelFacts | None) -> Refusal | None:
    """--laya's refusals, checked before any file is read (facts None) and again once the model is inspected."""
    if not (flags.laya or flags.laya_model):
        return None
    if flags.adaptive:
        return Refusal("--laya and --adaptive cannot be combined: both pick the child for each request", "laya-adaptive")
    if flags.prefill_device:
        return Refusal(f"--laya and --prefill-device {flags.prefill_device} cannot be combined: Laya picks the device "
                       "per conversation, the prefill split fixes it", "laya-prefill")
    if flags.long_model:
        return Refusal("--laya and --long-model cannot be combined: Laya already routes long documents by class",
                       "laya-long-model")
    embedding_flag = next((t.split("=", 1)[0] for t in flags.extra if t.split("=", 1)[0] in EMBEDDING_FLAGS), None)
    if embedding_flag:
        return Refusal(f"--laya cannot route an embedding server ({embedding_flag}): it routes chat by request class",
                       "laya-embedding")
    if facts is not None and facts.arch in EMBEDDING_ARCHS:
        return Refusal(f"--laya cannot route {Path(facts.path).name}: it is an embedding model ({facts.arch})",
                       "laya-embedding")
    return None


def _laya_children(facts, flags, manifest, renv, recipes, draft, policy: Policy) -> LaunchPlan:
    """One llama-server (or adapter) child per device the policy uses, behind the proxy's Laya router."""

    def servable(dev: str, here: bool = True) -> bool:  # here: its backend can also start on this host
        return dev in DEVICE_BACKENDS and _backend_for(dev, manifest, renv if here else None, flags) is not None

    default = flags.device if flags.device != "auto" else policy.default
    if servable(default, here=False) and not servable(default):
        raise _unstartable(default, manifest, renv, flags, f"the Laya default device {default}")
    if not servable(default):
        raise _Refused("laya-device", f"the Laya default device {default} is not in this bundle (has: {_held(manifest)}); "
                       "pass --device DEVICE or a --route-policy whose default it serves")
    children_for: dict[str, tuple[str, str | None]] = {}  # role -> (device, drafter)

    def role_of(dev: str, drafter: str | None) -> str:
        role = dev if drafter is None else f"{dev}+{drafter}"
        children_for.setdefault(role, (dev, drafter))
        return role

    default_role = role_of(default, None)
    classes = {}
    for cls, r in policy.classes.items():
        classes[cls] = role_of(r.device, r.drafter) if servable(r.device) else default_role
    if len(renv.free_ports) < len(children_for):
        raise ValueError(f"route needs {len(children_for)} free ports in RouteEnv.free_ports for this Laya policy")
    alias = flags.alias or Path(facts.path).stem
    children = []
    for i, (role, (dev, drafter)) in enumerate(children_for.items()):
        f = flags
        if drafter == "dflash":
            if not flags.dflash:
                raise _Refused("laya-drafter", f"the Laya policy gives {role} the dflash drafter; pass --dflash DRAFT")
            f = dataclasses.replace(flags, mtp=None, mtp_max=None, mtp_p_min=None)
        elif drafter == "mtp":
            if not flags.mtp:
                raise _Refused("laya-drafter", f"the Laya policy gives {role} the mtp drafter; pass --mtp HEAD")
            f = dataclasses.replace(flags, dflash=None)
        children.append(_route_child(facts, f, manifest, renv, recipes, role=role, host="127.0.0.1",
                                     port=renv.free_ports[i], want_device=dev, draft=draft, drafters=True,
                                     proxied_alias=alias))
    spec = LayaSpec(model_dir=flags.laya_model or "", policy=policy.path, min_confidence=policy.min_confidence,
                    default=default_role, classes=classes)
    port = flags.port if flags.port is not None else DEFAULT_PORT
    proxy = ProxySpec(host=flags.host, port=port, policy="laya", alias=alias, laya=spec)
    return LaunchPlan(mode="proxy", children=tuple(children), proxy=proxy, model=facts)


def _route(facts, flags, manifest, renv, recipes, draft, long_facts, laya_policy) -> LaunchPlan:
    refused = laya_refusal(flags, facts)
    if refused is not None:
        raise _Refused(refused.rule, refused.message)
    if flags.device not in DEVICES:
        raise _Refused("device-unknown", f"--device {flags.device}: unknown device (choose from {', '.join(DEVICES)})")
    if flags.mtp and flags.dflash:
        raise _Refused("mtp-dflash", "--mtp and --dflash cannot be combined: llama-server runs one drafter at a time")
    if (flags.mtp_max is not None or flags.mtp_p_min is not None) and not flags.mtp:
        raise _Refused("mtp-options", "--mtp-max and --mtp-p-min need --mtp HEAD")
    if flags.long_model and flags.adaptive:
        raise _Refused("long-adaptive", "--long-model and --adaptive cannot be combined")
    if flags.dflash and draft is not None and draft.onebp:
        raise _Refused("dflash-1bp", f"--dflash {flags.dflash}: a drafter must be a GGUF file, not a 1BP package")

    if flags.laya or flags.laya_model:
        if flags.device not in DEVICES:
            raise _Refused("device-unknown", f"--device {flags.device}: unknown device (choose from {', '.join(DEVICES)})")
        if laya_policy is None:
            raise ValueError("caller must load the Laya policy for --laya")
        return _laya_children(facts, flags, manifest, renv, recipes, draft, laya_policy)

    public_port = flags.port if flags.port is not None else DEFAULT_PORT
    common = dict(flags=flags, manifest=manifest, renv=renv, recipes=recipes)

    if flags.long_model or flags.adaptive:
        if len(renv.free_ports) < 2:
            raise ValueError("route needs two free ports in RouteEnv.free_ports for a proxied route")
        alias = flags.alias or Path(facts.path).stem
        if flags.adaptive:
            if flags.device != "auto":
                raise _Refused("adaptive-device", f"--adaptive runs vulkan first and rocm for the overflow; drop --device {flags.device}")
            for need in ("vulkan", "rocm"):
                if _backend_for(need, manifest) is None:
                    raise _Refused("adaptive-backends", f"--adaptive needs the vulkan and rocm backends; this bundle has: {_held(manifest)}")
            first = _route_child(facts, **common, role="vulkan", host="127.0.0.1", port=renv.free_ports[0],
                                 want_device="vulkan", draft=draft, drafters=True, proxied_alias=alias,
                                 slots=flags.adaptive_at)
            second = _route_child(facts, **common, role="rocm", host="127.0.0.1", port=renv.free_ports[1],
                                  want_device="rocm", draft=draft, drafters=True, proxied_alias=alias)
            proxy = ProxySpec(host=flags.host, port=public_port, policy="adaptive", alias=alias, adaptive_at=flags.adaptive_at)
        else:
            assert long_facts is not None, "caller must inspect --long-model"
            first = _route_child(facts, **common, role="default", host="127.0.0.1", port=renv.free_ports[0],
                                 want_device=flags.device, draft=draft, drafters=True, proxied_alias=alias)
            second = _route_child(long_facts, **common, role="long", host="127.0.0.1", port=renv.free_ports[1],
                                  want_device=flags.device, draft=None, drafters=False, proxied_alias=alias)
            proxy = ProxySpec(host=flags.host, port=public_port, policy="long", alias=alias, long_from=flags.long_from)
        return LaunchPlan(mode="proxy", children=(first, second), proxy=proxy, model=facts)

    child = _route_child(facts, **common, role="main", host=flags.host, port=public_port,
                         want_device=flags.device, draft=draft, drafters=True)
    if flags.alias is not None and ADAPTERS[child.adapter].alias_by_proxy:
        # the program cannot serve under an alias (zinc reads a request's "model" as a model to load): the proxy
        # answers on the public address, rewrites "model" and drops it before the child
        if not renv.free_ports:
            raise ValueError("route needs a free port in RouteEnv.free_ports for a proxied route")
        child = _route_child(facts, **common, role="main", host="127.0.0.1", port=renv.free_ports[0],
                             want_device=flags.device, draft=draft, drafters=True)
        proxy = ProxySpec(host=flags.host, port=public_port, policy="single", alias=flags.alias)
        return LaunchPlan(mode="proxy", children=(child,), proxy=proxy, model=facts)
    return LaunchPlan(mode="exec", children=(child,), proxy=None, model=facts)


def _remote_refusal(plan: LaunchPlan, flags: ServeFlags) -> Refusal | None:
    """A child or the proxy that would listen beyond loopback needs --allow-remote, whatever --host said: zinc has
    no --host and always listens on 0.0.0.0."""
    if flags.allow_remote:
        return None
    for c in plan.children:
        why = bind_refusal(c.bind or c.host, False)
        if why is None:
            continue
        if c.bind != c.host and c.adapter != "llama-server":
            why = (f"--device {c.device}: {Path(c.binary).name} has no --host option and listens on {c.bind or '(all)'}"
                   f":{c.port} (every interface, no authentication); add --allow-remote to run it anyway")
        return Refusal(message=why, rule="remote-bind")
    if plan.proxy is not None:
        why = bind_refusal(plan.proxy.host, False)
        if why is not None:
            return Refusal(message=why, rule="remote-bind")
    return None
