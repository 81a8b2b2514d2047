"""FakeClassifier: a deterministic stand-in for the Laya checkpoint, for tests only (never shipped).

It answers by keyword and records every state it was asked about, so tests can count classifier calls."""

from __future__ import annotations

from typing import ClassVar


class FakeClassifier:
    """code if the text mentions code, prose if it asks for an essay or story, else short; the confidence is fixed
    per class, or taken from a `conf=0.NN` marker in the text."""

    CONFIDENCE: ClassVar[dict[str, float]] = {"code": 0.44, "prose": 0.31, "short": 0.9}

    def __init__(self) -> None:
        self.asked: list[str] = []

    def classify(self, state: str) -> tuple[str, float]:
        self.asked.append(state)
        low = state.lower()
        if any(w in low for w in ("function", "python", "rust", "code", "bug")):
            cls = "code"
        elif any(w in low for w in ("essay", "story", "letter")):
            cls = "prose"
        else:
            cls = "short"
        conf = self.CONFIDENCE[cls]
        if "conf=" in low:
            conf = float(low.split("conf=", 1)[1].split()[0])
        return cls, conf
