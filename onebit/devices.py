"""devices: which backend of a bundle serves each `--device`, and which device a model goes to.

The device table (DEVICES, the backends that serve each, llama-server's name for it, the stand-ins), the backend that
serves a device in a manifest and whether its programs can start on this host (`backend_for`, `cannot_start`), the
device a child runs on (`pick_device`: 1BP packages to ds4, Hadamard-rotated models to the lean ROCm build,
--prefill-device hrx, --device auto's order), the refusal texts when none can (`unstartable`, `elsewhere`: which
other bundle to install), the notes for backends passed over, and what a bundle can serve at all (`capabilities`).
Pure functions: the manifest and the host's libraries are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .adapters import ADAPTERS
from .bundles import BUNDLES
from .hostlibs import missing, missing_text
from .inspect import ModelFacts
from .launch_plan import Refused
from .manifest import Manifest
from .serve_flags import RouteEnv, ServeFlags, named_llama_server

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


def backend_for(device: str, manifest: Manifest | None, renv: RouteEnv | None = None,
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
    if b.adapter == "llama-server" and named_llama_server(backend, flags, renv):
        return None
    lacking = missing(b.host_libraries, renv.host_libs)
    return missing_text(lacking, renv.host_libs) if lacking else None


def unstartable(devices: str | Sequence[str], manifest: Manifest | None, renv: RouteEnv, flags: ServeFlags,
                what: str) -> Refused:
    """The refusal for devices whose every backend in this bundle lacks host libraries here, in one line."""
    devices = (devices,) if isinstance(devices, str) else devices
    why = [f"the {b} backend cannot run on this host: {cannot_start(b, manifest, renv, flags)}"
           for d in devices for b in DEVICE_BACKENDS[d] if manifest is not None and manifest.has(b)]
    return Refused("host-libraries", f"{what}: {' | '.join(why)}")


def passed_over(want: str, device: str, backend: str, manifest: Manifest | None, renv: RouteEnv,
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


def held(manifest: Manifest | None) -> str:
    """The backends this bundle holds, for a refusal's "(has: ...)"."""
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
    return f"{what}: this bundle{bundle} has no {device} backend (has: {held(manifest)}); {elsewhere(device, manifest)}"


def pick_device(facts: ModelFacts, flags: ServeFlags, manifest: Manifest | None, want: str, renv: RouteEnv) -> str:
    """The device a child serving `facts` runs on when `want` was asked for; Refused when none can serve it here."""
    name = Path(facts.path).name
    if facts.onebp:
        if want not in ("auto", "ds4"):
            raise Refused(
                "1bp-device",
                f"{name} is a 1BP package; only the ds4 backend serves it (use --device ds4 or auto, not {want})",
            )
        if backend_for("ds4", manifest) is None:
            raise Refused("1bp-device", _missing("ds4", manifest, f"{name} is a 1BP package, only ds4 serves it"))
        if backend_for("ds4", manifest, renv, flags) is None:
            raise unstartable("ds4", manifest, renv, flags, f"{name} is a 1BP package, only ds4 serves it")
        return "ds4"

    if facts.hadamard is not None:
        if facts.hadamard != 32:
            raise Refused(
                "hadamard-block",
                f"{name} has onebit.hadamard_q4_0={facts.hadamard}; only 32 is supported by the lean ROCm build",
            )
        if want not in ("auto", "rocm"):
            raise Refused(
                "hadamard-device",
                f"{name} is Hadamard-rotated (onebit.hadamard_q4_0=32): only the lean ROCm build (--device rocm) "
                f"rotates the activations to match, so --device {want} would give wrong output; use --device rocm or auto",
            )
        if manifest is not None:
            b = manifest.backends.get("rocm")
            if b is None or HADAMARD_FEATURE not in b.features:
                raise Refused(
                    "hadamard-device",
                    f"{name} is Hadamard-rotated (onebit.hadamard_q4_0=32) and needs the lean ROCm build with feature "
                    f"{HADAMARD_FEATURE}, which this bundle ({manifest.bundle}) does not have",
                )
            if backend_for("rocm", manifest, renv, flags) is None:
                raise unstartable("rocm", manifest, renv, flags, f"{name} is Hadamard-rotated and needs the lean ROCm build")
        return "rocm"

    if want == "ds4":
        raise Refused("ds4-needs-1bp", f"--device ds4 serves 1BP packages only; {name} is a GGUF file")

    if flags.prefill_device is not None:
        if flags.prefill_device != "hrx":
            raise Refused("prefill-device", f"--prefill-device {flags.prefill_device} is not supported; only hrx is")
        if want not in ("auto", "vulkan"):
            raise Refused("prefill-device", f"--prefill-device hrx decodes on vulkan; it cannot be used with --device {want}")
        if backend_for("hrx", manifest) is None:
            raise Refused("prefill-device", _missing("hrx", manifest, "--prefill-device hrx needs the hrx backend"))
        if backend_for("hrx", manifest, renv, flags) is None:
            raise unstartable("hrx", manifest, renv, flags, "--prefill-device hrx")
        if manifest is not None:
            devs = manifest.backends["hrx"].devices
            if "HRX0" not in devs or "Vulkan0" not in devs:
                raise Refused("prefill-device", "--prefill-device hrx needs the hrx build that carries both HRX0 and Vulkan0; "
                               f"this bundle's hrx backend lists {', '.join(devs)}")
        return "vulkan"

    if want == "auto":
        for dev in AUTO_ORDER:
            if backend_for(dev, manifest, renv, flags) is not None:
                return dev
        present = [dev for dev in AUTO_ORDER if backend_for(dev, manifest) is not None]
        if present:  # the bundle has backends for it, none can start here
            raise unstartable(present, manifest, renv, flags, f"no backend in this bundle can serve {name} on this host")
        raise Refused("no-device", f"no backend in this bundle can serve {name} (has: {held(manifest)})")

    if backend_for(want, manifest) is None:
        standin = STANDINS.get(want)
        if standin and manifest is not None and backend_for(standin[0], manifest) is not None:
            if backend_for(standin[0], manifest, renv, flags) is None:
                raise unstartable(standin[0], manifest, renv, flags, f"--device {want}")
            return standin[0]
        raise Refused("device-missing", _missing(want, manifest, f"--device {want}"))
    if backend_for(want, manifest, renv, flags) is None:
        raise unstartable(want, manifest, renv, flags, f"--device {want}")
    return want


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
        backend = backend_for(device, manifest)
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
