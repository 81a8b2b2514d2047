"""Laya routing: sort each conversation into code, prose, short or long_doc, and let a measured policy pick the device.

The rules (issue #11 §3, as the engine does it):
  - a request of LONG_DOC_CHARS (1,024) characters or more is `long_doc`, decided without asking the classifier;
  - otherwise the classifier answers code, prose or short with a confidence; below the policy's `min_confidence`
    (0.16) the request takes the default device;
  - the policy file maps each class to a device (and, where measured, a drafter); the shipped policy sends every class
    to Vulkan (onebit/data/laya-policy.json);
  - the class is decided once per conversation, from its opening messages, and later turns reuse it;
  - every reply carries `X-1bit-Route: <class> <confidence> <device>` and each new decision is logged.

The decisions are pure functions (`gate`, `decide`, `opening`, `conversation_key`). The classifier is an interface:
LayaClassifier loads the pinned checkpoint from its install location after checking every pinned file's sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from .digest import file_sha256
from .errors import ServeError

CLASSES = ("code", "prose", "short")
LONG_DOC = "long_doc"
ALL_CLASSES = (*CLASSES, LONG_DOC)
LONG_DOC_CHARS = 1024
DRAFTERS = ("dflash", "mtp")
ROUTE_HEADER = "X-1bit-Route"
LAYA_MODEL_ENV = "ONEBIT_LAYA_MODEL"
CHECKPOINT_RELPATH = Path("share") / "laya" / "checkpoint"
PYTHON_RELPATH = Path("lib") / "laya" / "python"


class LayaError(ServeError):
    """The Laya policy or checkpoint cannot be used; one line says what and where."""


# --- the policy ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassRoute:
    device: str
    drafter: str | None = None  # "dflash" | "mtp" where a per-class drafter was measured; None: serve's own flags
    why: str = ""


@dataclass(frozen=True)
class Policy:
    min_confidence: float
    default: str
    classes: Mapping[str, ClassRoute]
    path: str = ""

    def route_for(self, cls: str, confidence: float) -> ClassRoute | None:
        """The class's route, or None when the request takes the default (confidence below the floor)."""
        if cls != LONG_DOC and confidence < self.min_confidence:
            return None
        return self.classes[cls]


def default_policy_path() -> Path:
    return Path(str(resources.files("onebit").joinpath("data/laya-policy.json")))


def parse_policy(data: object, where: str, devices: tuple[str, ...]) -> Policy:
    def bad(msg: str) -> LayaError:
        return LayaError(f"{where}: {msg}")

    if not isinstance(data, dict):
        raise bad("a Laya policy is a JSON object")
    unknown = set(data) - {"schema_version", "min_confidence", "default", "classes", "measured"}
    if unknown:
        raise bad(f"unknown key {min(unknown)!r} (keys: schema_version, min_confidence, default, classes, measured)")
    if data.get("schema_version") != 1:
        raise bad("schema_version must be 1")
    mc = data.get("min_confidence")
    if not isinstance(mc, (int, float)) or isinstance(mc, bool) or not 0 <= mc <= 1:
        raise bad("min_confidence must be a number between 0 and 1")
    default = data.get("default")
    if default not in devices:
        raise bad(f"default {default!r} is not a serve device ({', '.join(devices)})")
    classes = data.get("classes")
    if not isinstance(classes, dict) or set(classes) != set(ALL_CLASSES):
        raise bad(f"classes must name exactly {', '.join(ALL_CLASSES)}")
    routes = {}
    for cls in ALL_CLASSES:
        c = classes[cls]
        if not isinstance(c, dict) or set(c) - {"device", "drafter", "why"}:
            raise bad(f"classes.{cls} must be an object with device, and optionally drafter and why")
        if c.get("device") not in devices:
            raise bad(f"classes.{cls}.device {c.get('device')!r} is not a serve device ({', '.join(devices)})")
        if c.get("drafter") not in (None, *DRAFTERS):
            raise bad(f"classes.{cls}.drafter must be one of {', '.join(DRAFTERS)} or absent")
        routes[cls] = ClassRoute(device=c["device"], drafter=c.get("drafter"), why=str(c.get("why", "")))
    return Policy(min_confidence=float(mc), default=default, classes=routes, path=where)


def load_policy(path: str | os.PathLike | None, devices: tuple[str, ...]) -> Policy:
    p = Path(path) if path else default_policy_path()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LayaError(f"no Laya policy at {p}; pass --route-policy FILE or leave it out for the shipped one") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LayaError(f"cannot read Laya policy {p}: {e}") from None
    except json.JSONDecodeError as e:
        raise LayaError(f"{p}:{e.lineno}: Laya policy is not valid JSON: {e.msg}") from None
    return parse_policy(data, str(p), devices)


# --- the pure rules --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteDecision:
    cls: str
    confidence: float
    device: str  # the role (device, or device+drafter) of the child that serves it

    def header(self) -> str:
        return f"{self.cls} {self.confidence:.2f} {self.device}"


class Classifier(Protocol):
    def classify(self, state: str) -> tuple[str, float]:
        """One of CLASSES, and Laya's calibrated confidence in [0, 1]."""


def gate(state: str) -> bool:
    """True when the request is a long document: decided by size, without the classifier."""
    return len(state) >= LONG_DOC_CHARS


def decide(state: str, classifier: Classifier, policy: Policy, roles: Mapping[str, str], default_role: str) -> RouteDecision:
    """Classify one conversation opening and pick its role. `roles` maps each class to the child serving it."""
    if gate(state):
        cls, conf = LONG_DOC, 1.0
    else:
        cls, conf = classifier.classify(state)
        if cls not in CLASSES:
            raise LayaError(f"the classifier answered {cls!r}, not one of {', '.join(CLASSES)}")
    chosen = policy.route_for(cls, conf)
    return RouteDecision(cls=cls, confidence=conf, device=roles[cls] if chosen is not None else default_role)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def opening(body: Mapping) -> list[tuple[str, str]] | None:
    """The conversation's opening: its messages up to and including the first user message (chat), or the prompt
    (completions). None when the body is neither."""
    msgs = body.get("messages")
    if isinstance(msgs, list):
        out = []
        for m in msgs:
            if not isinstance(m, dict):
                continue
            role = str(m.get("role", ""))
            out.append((role, _content_text(m.get("content"))))
            if role == "user":
                break
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [("prompt", prompt)]
    return None


def state_of(open_msgs: list[tuple[str, str]]) -> str:
    """The text Laya is asked about: the opening's user (or prompt) text, system text included."""
    return "\n".join(text for _, text in open_msgs if text)


def conversation_key(open_msgs: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(open_msgs, ensure_ascii=False).encode()).hexdigest()


# --- the real classifier ---------------------------------------------------------------------------------------------

_QUESTION = {
    "request_class": {
        "type": "choice",
        "instructions": "What kind of reply does this request need?",
        "criteria": {
            "code": "writing, fixing or explaining source code, programs, scripts or shell commands",
            "prose": "a written answer of several paragraphs: an essay, a story, an explanation or a letter",
            "short": "a short factual answer, a greeting, a yes or no, a number or one sentence",
        },
    }
}


def pinned_files() -> dict[str, str]:
    """The checkpoint files and sha256 of pins.yaml `laya.companions.huggingface`, as shipped with serve."""
    text = resources.files("onebit").joinpath("data/laya-checkpoint.json").read_text(encoding="utf-8")
    return dict(json.loads(text)["files"])


def default_model_dir(prefix: Path, env: Mapping[str, str]) -> Path:
    if env.get(LAYA_MODEL_ENV):
        return Path(env[LAYA_MODEL_ENV])
    return prefix / CHECKPOINT_RELPATH


def verify_checkpoint(model_dir: Path, files: Mapping[str, str]) -> None:
    """Every pinned file present with its pinned sha256, or LayaError naming the first that is not."""
    if not model_dir.is_dir():
        raise LayaError(f"no Laya checkpoint at {model_dir}: install the bundle's laya package, or pass --laya-model DIR "
                        f"(or set ${LAYA_MODEL_ENV})")
    for rel, want in sorted(files.items()):
        p = model_dir / rel
        if not p.is_file():
            raise LayaError(f"Laya checkpoint {model_dir} lacks {rel} (pinned in pins.yaml laya.companions); "
                            "fetch the pinned revision again")
        got = file_sha256(p)
        if got != want:
            raise LayaError(f"{p}: sha256 {got[:12]}… is not the pinned {want[:12]}… (pins.yaml laya.companions); "
                            "fetch the pinned revision again")


class LayaClassifier:
    """The pinned Laya checkpoint, through the `laya` package the bundle installs (lib/laya/python).

    `laya.load(dir).predict(state, questions)["answers"][qid]` answers a `choice` question with `choice` and a
    calibrated `confidence` (NandhaKishorM/laya examples/02_choice_question.py)."""

    def __init__(self, model_dir: Path, *, files: Mapping[str, str] | None = None, python_path: Path | None = None):
        verify_checkpoint(model_dir, pinned_files() if files is None else files)
        if python_path is not None and python_path.is_dir() and str(python_path) not in sys.path:
            sys.path.insert(0, str(python_path))
        os.environ.setdefault("USE_TF", "0")
        try:
            import laya  # type: ignore[import-not-found]
        except ImportError as e:
            raise LayaError(f"the Laya checkpoint at {model_dir} is there but the laya package cannot be imported ({e}); "
                            f"install the bundle's laya package ({PYTHON_RELPATH})") from None
        try:
            self._agent = laya.load(str(model_dir), device="cpu")
        except Exception as e:  # noqa: BLE001 - whatever the loader raises becomes one line
            raise LayaError(f"cannot load the Laya checkpoint at {model_dir}: {e}") from None

    def classify(self, state: str) -> tuple[str, float]:
        a = self._agent.predict({"body": state}, _QUESTION)["answers"]["request_class"]
        return str(a["choice"]), float(a["confidence"])


# --- the proxy side: one decision per conversation, header on every reply ----------------------------------------------


class Router:
    """Per-conversation Laya decisions for the proxy. `pick` is awaited by the proxy hook for generation requests."""

    def __init__(self, classifier: Classifier, policy: Policy, roles: Mapping[str, str], default_role: str,
                 log: Callable[[str], None] | None = None) -> None:
        self.classifier = classifier
        self.policy = policy
        self.roles = dict(roles)
        self.default_role = default_role
        self.cache: dict[str, RouteDecision] = {}
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = asyncio.Lock()

    def decide_sync(self, body: Mapping) -> RouteDecision | None:
        open_msgs = opening(body)
        if open_msgs is None:
            return None
        key = conversation_key(open_msgs)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        d = decide(state_of(open_msgs), self.classifier, self.policy, self.roles, self.default_role)
        self.cache[key] = d
        self.log(f"1bit serve: laya: {d.header()}")
        return d

    async def pick(self, body: Mapping | None) -> RouteDecision | None:
        if body is None:
            return None
        async with self._lock:  # the classifier is one model: one decision at a time, off the event loop
            try:
                return await asyncio.to_thread(self.decide_sync, body)
            except Exception as e:  # noqa: BLE001 - a failed decision serves the request on the default device
                self.log(f"1bit serve: laya: no decision ({e}); this request takes the default device")
                return RouteDecision(cls="unclassified", confidence=0.0, device=self.default_role)


def classify_main(model_dir: Path, state: str, policy: Policy, classifier: Classifier | None = None) -> str:
    """`1bit route --classify`: the line `<class> <confidence> <device>` for one request."""
    if not gate(state) and classifier is None:
        classifier = LayaClassifier(model_dir, python_path=None)
    roles = {c: r.device for c, r in policy.classes.items()}
    return decide(state, classifier, policy, roles, policy.default).header()  # type: ignore[arg-type]
