"""The one error type `1bit serve` shows to users: one clear line, no traceback."""

from __future__ import annotations


class ServeError(Exception):
    """A user-facing error: the message says what, where, and what to do next."""

    exit_code = 2


class ModelError(ServeError):
    """The model file cannot be read or is not a GGUF/1BP file."""


class ManifestError(ServeError):
    """The bundle manifest is missing or invalid."""


class RecipeError(ServeError):
    """The serve recipes file is invalid."""
