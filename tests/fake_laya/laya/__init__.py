"""FAKE `laya` package for tests only (never shipped): the shape of NandhaKishorM/laya's `laya.load(dir).predict()`.

It records how it was loaded and asked (FAKE_CALLS) so tests can check what onebit.laya.LayaClassifier sends."""

FAKE_CALLS = []


class _Agent:
    def __init__(self, path, device):
        self.path, self.device = path, device

    def predict(self, state, questions):
        FAKE_CALLS.append(("predict", state, questions))
        (qid,) = questions
        text = state["body"].lower()
        choice = "code" if "rust" in text else "short"
        return {"answers": {qid: {"type": "choice", "choice": choice, "confidence": 0.44,
                                  "probabilities": {"code": 0.7, "prose": 0.1, "short": 0.2}}}}


def load(path, device=None):
    FAKE_CALLS.append(("load", path, device))
    return _Agent(path, device)
