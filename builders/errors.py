"""User-facing errors: what happened, where, and what to do next. The CLI prints them without a traceback."""
from __future__ import annotations


class OnebitError(Exception):
    """A mistake in the input or the environment that the user can fix."""

    def __init__(self, what: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.hint = hint

    def for_bundle(self, bundle: str) -> "OnebitError":
        """The error with BUNDLE in its hint filled in: a step deep down (an offline fetch) says `1bit-build fetch
        BUNDLE`; the executor, which knows the bundle, names it."""
        if self.hint and "BUNDLE" in self.hint:
            self.hint = self.hint.replace("BUNDLE", bundle)
        return self

    def __str__(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ValidationError(OnebitError):
    """One or more schema or consistency problems, all reported at once."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"{len(self.problems)} problem(s) found:\n" + "\n".join(f"  {p}" for p in self.problems))


class FetchError(OnebitError):
    pass


class PatchError(OnebitError):
    pass


class BuildError(OnebitError):
    pass


class ToolchainError(OnebitError):
    pass


class StageError(OnebitError):
    pass
