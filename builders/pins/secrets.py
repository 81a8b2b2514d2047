"""Secrets the pin bot holds (its token): registered once, and blanked out of every log line, error and PR body."""
from __future__ import annotations

import base64
from typing import Any

MASK = "***"
_SECRETS: set[str] = set()


def register(token: str | None) -> None:
    """Remember a secret and the forms it travels in (as given, and base64 of `x-access-token:<token>`)."""
    if not token or len(token) < 4:
        return
    _SECRETS.add(token)
    _SECRETS.add(base64.b64encode(f"x-access-token:{token}".encode()).decode())


def redact(text: str) -> str:
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_data(value: Any) -> Any:
    """redact() through JSON-like data (dicts, lists, strings)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_data(v) for v in value]
    return value
