"""route: a pure function (model facts, flags, manifest, environment) -> LaunchPlan | Refusal.

Nothing here touches the file system, the network or the process: the caller inspects the model files, loads the
manifest and recipes, looks up llama-server on PATH and picks free ports, and passes all of it in.

This module composes the launch: one exec'd child, or children behind the proxy (--long-model, --adaptive, --laya in
onebit.laya_route, or one program that cannot take the alias), and the bind check over all of them. What it is given
is onebit.serve_flags; the plan it returns, onebit.launch_plan; each child's device, onebit.devices; each child's
command line, onebit.child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .adapters import ADAPTERS
from .child import route_child
from .devices import DEVICES, backend_for, held
from .hosts import bind_refusal
from .inspect import ModelFacts
from .launch_plan import LaunchPlan, ProxySpec, Refusal, Refused
from .laya import Policy
from .laya_route import laya_children, laya_refusal
from .manifest import Manifest
from .recipes import Recipe
from .serve_flags import DEFAULT_PORT, RouteEnv, ServeFlags


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
    except Refused as r:
        return r.refusal
    return _remote_refusal(plan, flags) or plan


def _route(facts, flags, manifest, renv, recipes, draft, long_facts, laya_policy) -> LaunchPlan:
    refused = laya_refusal(flags, facts)
    if refused is not None:
        raise Refused(refused.rule, refused.message)
    if flags.device not in DEVICES:
        raise Refused("device-unknown", f"--device {flags.device}: unknown device (choose from {', '.join(DEVICES)})")
    if flags.mtp and flags.dflash:
        raise Refused("mtp-dflash", "--mtp and --dflash cannot be combined: llama-server runs one drafter at a time")
    if (flags.mtp_max is not None or flags.mtp_p_min is not None) and not flags.mtp:
        raise Refused("mtp-options", "--mtp-max and --mtp-p-min need --mtp HEAD")
    if flags.long_model and flags.adaptive:
        raise Refused("long-adaptive", "--long-model and --adaptive cannot be combined")
    if flags.dflash and draft is not None and draft.onebp:
        raise Refused("dflash-1bp", f"--dflash {flags.dflash}: a drafter must be a GGUF file, not a 1BP package")

    if flags.laya or flags.laya_model:
        if laya_policy is None:
            raise ValueError("caller must load the Laya policy for --laya")
        return laya_children(facts, flags, manifest, renv, recipes, draft, laya_policy)

    public_port = flags.port if flags.port is not None else DEFAULT_PORT
    common = dict(flags=flags, manifest=manifest, renv=renv, recipes=recipes)

    if flags.long_model or flags.adaptive:
        if len(renv.free_ports) < 2:
            raise ValueError("route needs two free ports in RouteEnv.free_ports for a proxied route")
        alias = flags.alias or Path(facts.path).stem
        if flags.adaptive:
            if flags.device != "auto":
                raise Refused("adaptive-device", f"--adaptive runs vulkan first and rocm for the overflow; drop --device {flags.device}")
            for need in ("vulkan", "rocm"):
                if backend_for(need, manifest) is None:
                    raise Refused("adaptive-backends", f"--adaptive needs the vulkan and rocm backends; this bundle has: {held(manifest)}")
            first = route_child(facts, **common, role="vulkan", host="127.0.0.1", port=renv.free_ports[0],
                                want_device="vulkan", draft=draft, drafters=True, proxied_alias=alias,
                                slots=flags.adaptive_at)
            second = route_child(facts, **common, role="rocm", host="127.0.0.1", port=renv.free_ports[1],
                                 want_device="rocm", draft=draft, drafters=True, proxied_alias=alias)
            proxy = ProxySpec(host=flags.host, port=public_port, policy="adaptive", alias=alias, adaptive_at=flags.adaptive_at)
        else:
            assert long_facts is not None, "caller must inspect --long-model"
            first = route_child(facts, **common, role="default", host="127.0.0.1", port=renv.free_ports[0],
                                want_device=flags.device, draft=draft, drafters=True, proxied_alias=alias)
            second = route_child(long_facts, **common, role="long", host="127.0.0.1", port=renv.free_ports[1],
                                 want_device=flags.device, draft=None, drafters=False, proxied_alias=alias)
            proxy = ProxySpec(host=flags.host, port=public_port, policy="long", alias=alias, long_from=flags.long_from)
        return LaunchPlan(mode="proxy", children=(first, second), proxy=proxy, model=facts)

    child = route_child(facts, **common, role="main", host=flags.host, port=public_port,
                        want_device=flags.device, draft=draft, drafters=True)
    if flags.alias is not None and ADAPTERS[child.adapter].alias_by_proxy:
        # the program cannot serve under an alias (zinc reads a request's "model" as a model to load): the proxy
        # answers on the public address, rewrites "model" and drops it before the child
        if not renv.free_ports:
            raise ValueError("route needs a free port in RouteEnv.free_ports for a proxied route")
        child = route_child(facts, **common, role="main", host="127.0.0.1", port=renv.free_ports[0],
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
