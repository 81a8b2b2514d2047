"""gitcmd: the one way this project runs git (the build, the pin bot, the release).

Every fetched repository is untrusted input, so git never runs anything from one or from a writable hook dir:
- `core.hooksPath=/dev/null` (no hook of any repository runs), `core.fsmonitor=false`;
- no system or global config (GIT_CONFIG_NOSYSTEM=1, GIT_CONFIG_GLOBAL=/dev/null): no filter driver, credential
  helper, `core.sshCommand`, `url.*.insteadOf` or alias of this host's users reaches our calls;
- filter drivers off: `core.attributesFile=/dev/null`, and no driver is configured anywhere git reads (the
  repositories' own config is written only by us), so a `.gitattributes` naming one runs nothing;
- protocols: https, http and ssh; `file` (and plain paths) only where the call names a local mirror
  (`allow_file`, by default: an argument of the call is a file:// URL or a directory's path); `ext` and every other protocol never.

`argv(args)` and `env(extra)` are pure; `run(...)` is the thin effect. Callers that run git through another runner (the
plan's commands) wrap their argv with `argv`.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

GIT = "git"
# the settings every call carries, in the order given on the command line
HARDENED = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.attributesFile", "/dev/null"),
    ("protocol.allow", "never"),
    ("protocol.https.allow", "always"),
    ("protocol.http.allow", "always"),
    ("protocol.ssh.allow", "always"),
    ("protocol.ext.allow", "never"),
)
# variables of the caller's environment that would change what git runs or which repository it works on
DROPPED = ("GIT_DIR", "GIT_INDEX_FILE", "GIT_WORK_TREE", "GIT_SSH_COMMAND", "GIT_SSH", "GIT_ASKPASS", "GIT_EXEC_PATH",
           "GIT_CONFIG", "GIT_CONFIG_PARAMETERS", "GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_TEMPLATE_DIR",
           "GIT_PROXY_COMMAND", "GIT_ALLOW_PROTOCOL", "GIT_PROTOCOL_FROM_USER", "GIT_ATTR_SOURCE")


def is_local_url(arg: str) -> bool:
    """A local mirror: a file:// URL or an absolute path of a directory (git's local transport)."""
    return arg.startswith("file://") or (arg.startswith("/") and os.path.isdir(arg))


def argv(args: Sequence[str], *, allow_file: bool | None = None) -> list[str]:
    """`git -c ... <args>` with the hardened settings; `allow_file` None: allowed when an argument is a local mirror."""
    if allow_file is None:
        allow_file = any(is_local_url(str(a)) for a in args)
    out = [GIT]
    for key, value in HARDENED + (("protocol.file.allow", "always" if allow_file else "never"),):
        out += ["-c", f"{key}={value}"]
    return out + [str(a) for a in args]


def env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without what redirects git, plus no system/global config, no prompt, and `extra`."""
    out = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in DROPPED and not k.startswith("GIT_CONFIG_")}
    out.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
                "GIT_NO_REPLACE_OBJECTS": "1", "GIT_OPTIONAL_LOCKS": "0"})
    out.update(extra or {})
    return out


def run(args: Sequence[str], *, cwd=None, input: str | bytes | None = None, text: bool = True, check: bool = False,
        timeout: float | None = None, extra_env: Mapping[str, str] | None = None, allow_file: bool | None = None,
        **kw) -> subprocess.CompletedProcess:
    """subprocess.run of a hardened git call, capturing its output."""
    return subprocess.run(argv(args, allow_file=allow_file), cwd=cwd, input=input, text=text, check=check, timeout=timeout,
                          capture_output=True, env=env(extra_env), **kw)
