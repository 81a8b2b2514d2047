"""laya_route: route's --laya part: its refusals, and one child per device the Laya policy uses, behind the proxy's
Laya router (onebit.laya sorts each conversation into a class; the policy maps a class to a device and drafter).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .child import route_child
from .devices import DEVICE_BACKENDS, backend_for, held, unstartable
from .inspect import ModelFacts
from .launch_plan import LaunchPlan, LayaSpec, ProxySpec, Refusal, Refused
from .laya import Policy
from .serve_flags import DEFAULT_PORT, ServeFlags, embedding_flag

# GGUF architectures of embedding models (llama.cpp's encoder-only ones): Laya routes chat, not embeddings
EMBEDDING_ARCHS = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert",
                             "modern-bert", "t5encoder"})


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
    role_flag = embedding_flag(flags.extra)
    if role_flag:
        return Refusal(f"--laya cannot route an embedding server ({role_flag}): it routes chat by request class",
                       "laya-embedding")
    if facts is not None and facts.arch in EMBEDDING_ARCHS:
        return Refusal(f"--laya cannot route {Path(facts.path).name}: it is an embedding model ({facts.arch})",
                       "laya-embedding")
    return None


def laya_children(facts, flags, manifest, renv, recipes, draft, policy: Policy) -> LaunchPlan:
    """One llama-server (or adapter) child per device the policy uses, behind the proxy's Laya router."""

    def servable(dev: str, here: bool = True) -> bool:  # here: its backend can also start on this host
        return dev in DEVICE_BACKENDS and backend_for(dev, manifest, renv if here else None, flags) is not None

    default = flags.device if flags.device != "auto" else policy.default
    if servable(default, here=False) and not servable(default):
        raise unstartable(default, manifest, renv, flags, f"the Laya default device {default}")
    if not servable(default):
        raise Refused("laya-device", f"the Laya default device {default} is not in this bundle (has: {held(manifest)}); "
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
                raise Refused("laya-drafter", f"the Laya policy gives {role} the dflash drafter; pass --dflash DRAFT")
            f = dataclasses.replace(flags, mtp=None, mtp_max=None, mtp_p_min=None)
        elif drafter == "mtp":
            if not flags.mtp:
                raise Refused("laya-drafter", f"the Laya policy gives {role} the mtp drafter; pass --mtp HEAD")
            f = dataclasses.replace(flags, dflash=None)
        children.append(route_child(facts, f, manifest, renv, recipes, role=role, host="127.0.0.1",
                                    port=renv.free_ports[i], want_device=dev, draft=draft, drafters=True,
                                    proxied_alias=alias))
    spec = LayaSpec(model_dir=flags.laya_model or "", policy=policy.path, min_confidence=policy.min_confidence,
                    default=default_role, classes=classes)
    port = flags.port if flags.port is not None else DEFAULT_PORT
    proxy = ProxySpec(host=flags.host, port=port, policy="laya", alias=alias, laya=spec)
    return LaunchPlan(mode="proxy", children=tuple(children), proxy=proxy, model=facts)
