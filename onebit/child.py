"""child: one child's command line and environment, on the device route picked for it.

A child runs one backend's program: llama-server's argv is built here, in small steps that each add their options
(and environment); any other program's (zinc, ds4, the NPU runtime) by its adapter (onebit.adapters), after the serve
options it has no equivalent for are refused.

Argument precedence inside one child's command line: what the user gave (serve flags or extra llama-server args)
beats a serve recipe, which beats the route's own defaults. Environment the user already set always wins over
anything serve would set (manifest defaults < route rules < recipes < user).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from .adapters import ADAPTERS, Adapter, AdapterError, Decision, unsupported
from .devices import DEVICE_FLAG, STANDINS, backend_for, passed_over, pick_device
from .inspect import ModelFacts
from .launch_plan import Child, Refused
from .manifest import Manifest, default_adapter
from .recipes import Recipe, RecipeFacts
from .serve_flags import RouteEnv, ServeFlags, canonical, embedding_flag, named_llama_server, split_options

DEFAULT_DFLASH_N_MAX = 16


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
        self.opts[key] = (list(tokens), source)  # a key already there keeps its place on the command line
        return True

    def drop(self, key: str) -> None:
        self.opts.pop(key, None)

    def flat(self) -> list[str]:
        return [t for toks, _ in self.opts.values() for t in toks]

def _adapter_of(backend: str, manifest: Manifest | None) -> Adapter:
    if manifest is not None and backend in manifest.backends:
        return ADAPTERS[manifest.backends[backend].adapter]
    return ADAPTERS[default_adapter(backend)]


def _resolve_binary(backend: str, adapter: Adapter, flags: ServeFlags, manifest: Manifest | None, renv: RouteEnv) -> str:
    """The adapter's program for this backend. --llama-server, $ONEBIT_LLAMA_SERVER* and PATH name llama-servers,
    so only the llama-server adapter looks at them; no backend ever runs a binary listed under another name."""
    if adapter.name == "llama-server":
        named = named_llama_server(backend, flags, renv)
        if named:
            return named
    if manifest is not None and backend in manifest.backends:
        b = manifest.backends[backend]
        p = b.binary(manifest.prefix, adapter.program)
        if p is not None:
            return str(p)
        if adapter.name != "llama-server":
            listed = ", ".join(sorted(b.binaries)) or "none"
            raise Refused(
                "no-program",
                f"the {backend} backend of this bundle lists no {adapter.program} program for its {adapter.name} adapter "
                f"(it ships: {listed}); nothing to launch for --device {backend}",
            )
    if adapter.name == "llama-server" and renv.path_llama_server:
        return renv.path_llama_server
    if adapter.name != "llama-server":
        raise Refused("no-program", f"no {adapter.program} for backend {backend}: this needs a bundle manifest that lists it")
    raise Refused(
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
        raise Refused("adapter-option", f"{', '.join(bad)}: {adapter.program} (the {backend} backend) has no such option; "
                       f"drop {'it' if len(bad) == 1 else 'them'} or choose another --device")
    if flags.long_model or flags.adaptive:
        which = "--long-model" if flags.long_model else "--adaptive"
        raise Refused("adapter-option", f"{which} needs llama-server children; the {backend} backend runs {adapter.program}")
    role_flag = embedding_flag(flags.extra)
    if role_flag and not adapter.embeddings:
        raise Refused("adapter-option", f"{role_flag}: {adapter.program} (the {backend} backend) serves chat only; "
                       "an embedding or reranking model needs a llama-server backend (--device auto)")
    # a program that runs in its own root gets the model's absolute path (the user's relative one names their cwd)
    model = str(Path(facts.path).absolute()) if adapter.runs_in_root else facts.path
    decision = Decision(model=model, host=host, port=port, device=_manifest_device(device, backend, manifest),
                        ctx_size=flags.ctx_size, parallel=flags.parallel if slots is None else slots, extra=flags.extra)
    try:
        cmd = adapter.build(decision)
    except AdapterError as e:
        raise Refused("adapter-device", f"--device {device}: {e}") from None
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
    backend = "hrx" if flags.prefill_device == "hrx" else backend_for(device, manifest, renv, flags)
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


def _num(x: float) -> str:
    return f"{x:g}"


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
        raise Refused("moe-slots-device", f"--moe-slots works on vulkan only; this route runs {name} on {device}")
    if not facts.moe:
        raise Refused("moe-slots-dense", f"--moe-slots needs an MoE model; {name} has no experts")
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


def route_child(
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
    """One child for `role`, listening on host:port: its device (asked for: `want_device`), backend, program, argv and
    environment; `drafters`: it takes --dflash/--mtp and --mmproj (the --long-model child does not)."""
    device = pick_device(facts, flags, manifest, want_device, renv)
    backend = _child_backend(flags, device, manifest, renv)
    adapter = _adapter_of(backend, manifest)
    passed = passed_over(want_device, device, backend, manifest, renv, flags)
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

