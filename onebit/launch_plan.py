"""launch_plan: what route decides, as data: a LaunchPlan (its children, the proxy in front of them and how it routes)
or a Refusal (one line and the rule that made it), both printable as JSON (`1bit serve --dry-run`).

This is the contract between route (which decides) and launch (which runs what was decided); `Refused` carries a
Refusal out of the deciding code to route(), which returns it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

from .inspect import ModelFacts


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


class Refused(Exception):
    """A refusal raised where it is found; route() returns its Refusal."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.refusal = Refusal(message=message, rule=rule)

