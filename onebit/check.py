"""`1bit check`: the installed bundle checks itself.

For every backend of the installed manifest:
  - route self-test (pure): the route rules run against this manifest, and each device the backend serves must land
    on the backend's own program (the one its adapter names, inside its own subtree), with a command line its adapter
    owns; 1BP packages must go to ds4 and --prefill-device hrx to the hrx build;
  - device probe: the backend's program is asked which devices it sees, through its adapter
    (`llama-server --list-devices` for the llama.cpp builds, `zinc --check`);
then ONE table: backend, binary, devices claimed, devices seen, unproven, route self-test.

Three outcomes per backend, kept apart:
  - proven: its program ran and saw every device it claims (a program that ran has the CPU);
  - unproven (its own column, does NOT fail the check): nothing can say which device the backend uses, or this host
    has no such device at all (no /dev/kfd for ROCm0/HRX0, no /dev/accel for the NPU, no /dev/nvidiactl for CUDA0:
    `HARDWARE`), so a GPU build checked on a build machine is never "ok" and never failed for the GPU it lacks. ds4-server
    has no device listing at its pins (antirez/ds4 ds4_server.c: only -h/--help prints and exits; the device is
    opened by ds4_engine_open after a model is loaded, ds4.c), so it is run with --help to prove it runs, and a GPU it
    claims stays unproven; the npu backend ships the driver and XRT's plugin, not a program that serves a model.
    A GPU backend whose host libraries (the manifest's `host_libraries`: the ROCm runtime) this host's loader would
    not find is not run; on a host without the GPU's node it is unproven with the missing SONAMEs and what provides
    them (onebit.hostlibs), on one with the node it fails with the same words;
  - failed (exit status 1): a claimed device that its program does not see, a program that is missing, not
    executable or cannot run, or a route self-test that fails.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from .adapters import ADAPTERS
from .hostlibs import Found, look_up, missing, missing_text
from .inspect import ModelFacts
from .manifest import Manifest
from .devices import DEVICE_BACKENDS
from .launch_plan import LaunchPlan, Refusal
from .route import route
from .serve_flags import RouteEnv, ServeFlags

PROBE_TIMEOUT = 120
SELF_TEST_MODEL = "/nonexistent/onebit-self-test/model.gguf"  # route never opens it
SELF_TEST_1BP = "/nonexistent/onebit-self-test/model.1bp"


@dataclass(frozen=True)
class Probe:
    seen: tuple[str, ...] | None  # None: the program cannot list devices (it ran, or there is nothing to run)
    error: str | None = None  # the program could not be asked (missing, not executable, failed)
    ran: bool = False  # the program ran (so it has the CPU)
    why_unproven: str = ""  # why nothing can say which device it uses
    # why the program cannot start on this host: host libraries of its manifest entry that the loader would not find
    # (then it is not run), or the library the loader named when it ran ("libhipblas.so.3 missing")
    cannot_load: str | None = None


@dataclass(frozen=True)
class Row:
    backend: str
    binary: str
    claimed: tuple[str, ...]
    seen: str
    self_test: str
    ok: bool
    unproven: str = ""  # claimed devices nothing could prove, and why ("" when all are proven or failed)


# --- which devices this host can have at all --------------------------------------------------------------------------
# A device of these kinds exists only where its kernel driver made its node: amdgpu's KFD (/dev/kfd) for HIP and HRX
# (both open the GPU through the HSA runtime), amdxdna's accel node for the NPU, NVIDIA's control node for CUDA.
# Vulkan0 is not listed: Mesa's lavapipe gives every host a Vulkan device, so a missing Vulkan0 is always a failure.
HARDWARE: dict[str, tuple[str, str]] = {
    "ROCm": ("/dev/kfd", "no AMD GPU driver"),
    "HRX": ("/dev/kfd", "no AMD GPU driver"),
    "NPU": ("/dev/accel", "no NPU driver"),
    "CUDA": ("/dev/nvidiactl", "no NVIDIA driver"),
}
_LOADER = re.compile(r"error while loading shared libraries: ([^:\s]+)")


def host_nodes() -> frozenset[str]:
    """The HARDWARE nodes present on this host."""
    return frozenset(node for node, _ in HARDWARE.values() if os.path.exists(node))


def absent_hardware(device: str, nodes: Collection[str]) -> str | None:
    """Pure: why this host cannot have `device` ("no /dev/kfd on this host: no AMD GPU driver"), or None."""
    kind = re.sub(r"\d+$", "", device)
    if kind not in HARDWARE:
        return None
    node, what = HARDWARE[kind]
    return None if node in nodes else f"no {node} on this host: {what}"


# --- route self-tests (pure) -----------------------------------------------------------------------------------------


def _routes_to(manifest: Manifest, backend: str) -> list[str]:
    """The serve devices that route sends to this backend (first backend present for the device wins)."""
    out = []
    for dev, backends in DEVICE_BACKENDS.items():
        present = [b for b in backends if manifest.has(b)]
        if present and present[0] == backend:
            out.append(dev)
    return out


def _expect(manifest: Manifest, backend: str, plan: LaunchPlan | Refusal, what: str) -> str | None:
    """None when the plan runs this backend's own program the way its adapter says; else what is wrong."""
    if isinstance(plan, Refusal):
        return f"{what} refused: {plan.message}"
    b = manifest.backends[backend]
    adapter = ADAPTERS[b.adapter]
    child = plan.children[0]
    if child.backend != backend:
        return f"{what} ran backend {child.backend}"
    want = b.binary(manifest.prefix, adapter.program)
    if want is None or child.binary != str(want):
        return f"{what} ran {child.binary}, not this backend's {adapter.program}"
    if b.root and not Path(child.binary).resolve().is_relative_to((manifest.prefix / b.root).resolve()):
        return f"{what} ran {child.binary}, outside the backend's root {b.root}"
    if child.adapter != adapter.name:
        return f"{what} used the {child.adapter} adapter, not {adapter.name}"
    if adapter.name == "llama-server":
        argv = list(child.argv)
        if "--device" in argv and argv[argv.index("--device") + 1] not in b.devices:
            return f"{what} asked for --device {argv[argv.index('--device') + 1]}, which {backend} does not list"
    elif "--jinja" in child.argv or "-ngl" in child.argv:
        return f"{what} gave {adapter.program} llama-server options"
    return None


def self_test(manifest: Manifest, backend: str) -> tuple[bool, str]:
    """(passed, text) for one backend."""
    b = manifest.backends[backend]
    adapter = ADAPTERS[b.adapter]
    renv = RouteEnv(env={}, path_llama_server=None, free_ports=())
    gguf = ModelFacts(path=SELF_TEST_MODEL, kind="gguf", arch="llama")
    onebp = ModelFacts(path=SELF_TEST_1BP, kind="1bp")
    tried = []
    for dev in _routes_to(manifest, backend):
        facts = onebp if dev == "ds4" else gguf
        # allow_remote: this checks which program runs, not where it listens (zinc always listens on 0.0.0.0)
        plan = route(facts, ServeFlags(model=facts.path, device=dev, allow_remote=True), manifest, renv)
        if adapter.program not in b.binaries and isinstance(plan, Refusal) and plan.rule == "no-program":
            return True, f"--device {dev} refused: no {adapter.program} in this backend"
        wrong = _expect(manifest, backend, plan, f"--device {dev}")
        if wrong:
            return False, wrong
        tried.append(dev)
    if adapter.name == "ds4" and "ds4" in tried:
        wrong = _expect(manifest, backend, route(onebp, ServeFlags(model=onebp.path), manifest, renv), "a 1BP package")
        if wrong:
            return False, wrong
        tried.append("1bp")
    if backend == "hrx" and {"HRX0", "Vulkan0"} <= set(b.devices):
        plan = route(gguf, ServeFlags(model=gguf.path, prefill_device="hrx"), manifest, renv)
        wrong = _expect(manifest, backend, plan, "--prefill-device hrx")
        if wrong:
            return False, wrong
        tried.append("prefill hrx")
    if not tried:
        return True, "not routed (another backend serves its devices)"
    return True, "ok: " + ", ".join(tried)


# --- device probes ---------------------------------------------------------------------------------------------------

Runner = Callable[..., subprocess.CompletedProcess]


def probe(manifest: Manifest, backend: str, run: Runner = subprocess.run, env: Mapping[str, str] | None = None,
          host_libs: Mapping[str, Found] | None = None) -> Probe:
    """Ask the backend's program which devices it sees. `host_libs`: where this host's loader finds the SONAMEs the
    manifest says the backend needs from the host (hostlibs.look_up); a program lacking one is not run."""
    b = manifest.backends[backend]
    adapter = ADAPTERS[b.adapter]
    path = b.binary(manifest.prefix, adapter.program)
    if path is None:
        if not adapter.proven:  # by design nothing to run yet (the npu backend ships the driver): not a failure
            ships = ", ".join(sorted(b.binaries)) or "nothing"
            return Probe(seen=None, why_unproven=f"no {adapter.program} to ask (the backend ships {ships})")
        return Probe(seen=None, error=f"no {adapter.program} in the manifest")
    if not path.is_file():
        return Probe(seen=None, error=f"{path} is missing")
    if not os.access(path, os.X_OK):
        return Probe(seen=None, error=f"{path} is not executable")
    if adapter.probe is None:
        return Probe(seen=None, why_unproven=f"{adapter.program} has no way to run a probe")
    lacking = missing(b.host_libraries, host_libs or {})
    if lacking:  # the loader would stop it with exit 127 before it ran: say which libraries, and what provides them
        text = missing_text(lacking, host_libs or {})
        return Probe(seen=None, error=f"{path.name} cannot start here: {text}", cannot_load=text)
    full_env = dict(os.environ if env is None else env)
    for k, v in b.env.items():
        full_env.setdefault(k, v)
    try:
        r = run(adapter.probe(str(path)), capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=full_env,
                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Probe(seen=None, error=f"{path.name} did not answer within {PROBE_TIMEOUT} s")
    except OSError as e:
        return Probe(seen=None, error=f"cannot run {path}: {e.strerror or e}")
    seen = adapter.parse_devices(r.stdout or "", r.stderr or "") if adapter.parse_devices else None
    if r.returncode != 0 and not seen:
        last = ((r.stderr or r.stdout or "").strip().splitlines() or [""])[-1]
        lib = _LOADER.search(r.stderr or "")
        if lib:  # the loader's line starts with the program's whole path: name the library instead
            last = f"error while loading shared libraries: {lib.group(1)}"
        return Probe(seen=None, error=f"{path.name} exited {r.returncode}: {last[:120]}",
                     cannot_load=f"{lib.group(1)} missing" if lib else None)
    if seen is None:
        return Probe(seen=None, ran=True, why_unproven=f"{adapter.program} cannot say which device it uses")
    return Probe(seen=seen, ran=True)


def _absent(devices: Collection[str], nodes: Collection[str]) -> dict[str, str]:
    return {d: why for d in devices if (why := absent_hardware(d, nodes))}


def row(manifest: Manifest, backend: str, p: Probe, test: tuple[bool, str], nodes: Collection[str] | None = None) -> Row:
    """One table row. `nodes`: the HARDWARE nodes of this host (host_nodes()); a claimed device the program does not
    see, on a host without its node, is unproven instead of failed, and so is a program that cannot even load its
    GPU runtime there (host libraries its manifest entry lists that this host lacks, or the dynamic loader's "error
    while loading shared libraries"); on a host with the node, or for a backend without a GPU, that fails."""
    b = manifest.backends[backend]
    adapter = ADAPTERS[b.adapter]
    nodes = host_nodes() if nodes is None else nodes
    rel = b.binaries.get(adapter.program, f"(no {adapter.program})")
    claimed = tuple(b.devices)
    ok, unproven = test[0], ""
    # llama-server never lists the CPU (common_print_available_devices skips it): a program that ran has it
    seen = (*(p.seen or ()), *(["CPU"] if p.ran and "CPU" in claimed else []))
    gpus = [d for d in claimed if d != "CPU"]
    absent = _absent(gpus, nodes)
    if p.error and p.cannot_load and gpus and len(absent) == len(gpus):
        cell = "none"
        unproven = f"{', '.join(gpus)}: cannot run here ({p.cannot_load}); {next(iter(absent.values()))}"
    elif p.error:
        cell, ok = f"FAIL: {p.error}", False
    elif p.seen is None:
        open_ = [d for d in claimed if d not in seen]
        cell = ", ".join(seen) or "none"
        if open_:
            unproven = f"{', '.join(open_)}: {p.why_unproven}"
    else:
        missing = [d for d in claimed if d not in seen]
        cell = ", ".join(seen) or "none"
        lacking = [d for d in missing if d in absent]
        failed = [d for d in missing if d not in absent]
        if lacking:
            unproven = "; ".join(f"{d}: {absent[d]}" for d in lacking)
        if failed:
            cell, ok = f"{cell} — FAIL: missing {', '.join(failed)}", False
    return Row(backend=backend, binary=rel, claimed=claimed, seen=cell,
               self_test=("" if test[0] else "FAIL: ") + test[1], ok=ok, unproven=unproven)


def check(manifest: Manifest, run: Runner = subprocess.run, env: Mapping[str, str] | None = None,
          nodes: Collection[str] | None = None, host_libs: Mapping[str, Found] | None = None) -> list[Row]:
    """Every backend's row. The host libraries are looked up as the programs' loader would, with `env`'s
    LD_LIBRARY_PATH (the environment the probes run in), unless `host_libs` says where they are."""
    nodes = host_nodes() if nodes is None else nodes
    if host_libs is None:
        host_libs = look_up(manifest.host_sonames(), env)
    return [row(manifest, name, probe(manifest, name, run, env, host_libs), self_test(manifest, name), nodes)
            for name in sorted(manifest.backends)]


COLUMNS = ("backend", "binary", "devices claimed", "devices seen", "unproven", "route self-test")


def _cells(r: Row) -> tuple[str, ...]:
    return (r.backend, r.binary, ", ".join(r.claimed), r.seen, r.unproven, r.self_test)


def render_plain(manifest: Manifest, rows: list[Row], file=None) -> None:
    """The same table without rich (a bundle whose serve package does not vendor it)."""
    import sys

    out = file or sys.stdout
    cells = [COLUMNS, *(_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    print(f"1bit check: {manifest.bundle} {manifest.version} ({manifest.prefix})", file=out)
    for i, c in enumerate(cells):
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)


def to_json(manifest: Manifest, rows: list[Row]) -> dict:
    """Pure: the check as data (`1bit check --json`): the bundle and one object per row, COLUMNS' fields by name."""
    return {"bundle": manifest.bundle, "version": manifest.version, "prefix": str(manifest.prefix),
            "backends": [{"backend": r.backend, "binary": r.binary, "claimed": list(r.claimed), "seen": r.seen,
                          "unproven": r.unproven, "self_test": r.self_test, "ok": r.ok} for r in rows]}


def render(manifest: Manifest, rows: list[Row], file=None) -> None:
    """A boxed table on a terminal; plain aligned rows anywhere else (a log, nox's output, a pipe, a file): a table
    wrapped at a log's 80 columns falls apart into a column of fragments."""
    import sys

    out = file or sys.stdout
    if not (hasattr(out, "isatty") and out.isatty()):
        render_plain(manifest, rows, out)
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        render_plain(manifest, rows, file)
        return

    t = Table(title=f"1bit check: {manifest.bundle} {manifest.version} ({manifest.prefix})", title_justify="left")
    for col in COLUMNS:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*_cells(r), style="bold red" if not r.ok else ("yellow" if r.unproven else None))
    console = Console(file=file, width=None if file is None else 200, soft_wrap=False)
    console.print(t)
