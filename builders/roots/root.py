"""root: where a command runs. The host is the trivial root; a build root is an assembled Debian tree (roots/assemble.py).

One value for both, the way sbuild's Chroot base treats the host as one more chroot and Nix has one builder with a
sandboxed subclass. Every build kind's commands, the recipe tests, the offload check, the device probe and tool
detection go through a `Root`; nothing else asks "is there a build root?":

  wrap(cmd, ro, rw, net)   pure: the Command as it runs here. Its environment is exactly what it declares plus the
                           root's base (PATH, HOME, LANG: `environment`), nothing inherited from the caller; the
                           network is cut unless `net` (the host: its net-cut prefix, sandbox.probe_net_cut; a build
                           root: bwrap's own network namespace); `ro`/`rw` are bound into a build root (the host
                           sees its own file system). The wrapped Command keeps the plain one as `inside`.
  run(argv, ...)           run one command here and capture its output (builders/io/runner.py: timeout, process-group
                           kill).
  which(name)              where a program is, as seen from here (None: absent).
  version(exe)             the version a program answers here (`--version`, else `version`).

The sysroot that compiled variants build against (docs/portability.md) enters through this value too: a build root
and the host both hand their compilers the same pinned sysroot.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..io import runner
from ..plan_types import Command

HOST = "host"
PATH_INSIDE = "/usr/local/bin:/usr/bin:/usr/sbin"  # a build root's own PATH, behind a command's toolchain folders
BIN_INSIDE = ("usr/bin", "usr/sbin")
LOCALE = "C.UTF-8"
# what of the caller's environment the host root keeps as its base (everything else a command gets, it declares)
HOST_BASE = ("PATH", "HOME", "TMPDIR", "CCACHE_DIR", "CCACHE_DISABLE", "XDG_CACHE_HOME", "RUSTUP_HOME", "CARGO_HOME",
             "SOURCE_DATE_EPOCH")
# more variables the user asks the host root to keep (names separated by spaces or commas), as cibuildwheel's
# CIBW_ENVIRONMENT_PASS_LINUX: a site's own compiler settings, a test's tool stand-ins
PASS_ENV = "ONEBIT_PASS_ENV"
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


def parse_version(text: str) -> str | None:
    m = _VERSION.search(text or "")
    return m.group(1) if m else None


@dataclass(frozen=True)
class Root:
    name: str = HOST  # "host", or the build root's name (roots/<name>.yaml)
    dir: str | None = None  # the assembled root in the cache; None: the host's own file system
    key: str = ""  # the build root's content key ("" for the host)
    base: Mapping[str, str] = field(default_factory=dict)  # the host's base environment (HOST_BASE of the caller's)
    net_cut: tuple[str, ...] = ()  # the host's argv prefix that cuts the network; () where it cannot
    why_not: str | None = None  # why this host cannot enter the build root (sandbox.why_unavailable); None: it can
    sysroot_dir: str | None = None  # the assembled sysroot its compilers build against (floor.yaml's toolchain)
    sysroot_cxx: str = "11"  # the libstdc++ headers' version in it

    # ---- what it is --------------------------------------------------------------------------------------------
    @property
    def is_host(self) -> bool:
        return self.dir is None

    @property
    def cuts_network(self) -> bool:
        """Whether a command that asks for no network really gets none here."""
        return bool(self.net_cut) if self.is_host else self.why_not is None

    def describe(self) -> str:
        return "the host" if self.is_host else f"build root {self.name}"

    def sysroot(self):
        """The pinned sysroot this root's compilers build against (builders/roots/sysroot.py), or None."""
        from .sysroot import Sysroot

        return Sysroot(self.sysroot_dir, self.sysroot_cxx) if self.sysroot_dir else None

    def host_libs(self, sonames, links_dir: str, override_libs: str | None = None):
        """What a link in this root takes of the libraries it does not ship (the user's ROCm, XRT: `sonames`), or
        None (the host's own libraries need nothing). In a build root: a folder of their link names, pointing at the
        root's multiarch copies (never `-L` that directory: its libc.so would win over the sysroot's), or, with an
        override toolkit (TheRock), that toolkit's lib/, which holds no C library."""
        from .sysroot import MULTIARCH, HostLibs

        if self.is_host or not sonames:
            return None
        if override_libs:
            return HostLibs(links=override_libs, rpath_link=(override_libs,))
        return HostLibs(links=links_dir, rpath_link=(f"/usr/lib/{MULTIARCH}",))

    def host_lib_links(self, sonames, links_dir: str) -> tuple[tuple[str, str], ...]:
        """Pure: the link names of `host_libs`' folder (libhipblas.so -> /usr/lib/<multiarch>/libhipblas.so.3)."""
        from .sysroot import MULTIARCH

        return tuple((f"{links_dir}/{s.split('.so', 1)[0]}.so", f"/usr/lib/{MULTIARCH}/{s}") for s in sorted(sonames))

    def environment(self, cmd: Command) -> dict[str, str]:
        """Pure: the whole environment `cmd` runs with here: the root's base, LANG, its PATH behind the command's own
        folders, and what the command declares (less what it unsets)."""
        base = {"LANG": LOCALE, **({k: v for k, v in self.base.items() if k != "PATH"} if self.is_host else {})}
        system = self.base.get("PATH", os.defpath) if self.is_host else PATH_INSIDE
        env = {**{k: v for k, v in base.items() if k not in cmd.unset}, **dict(cmd.env)}
        env["PATH"] = ":".join([*cmd.path, *([env["PATH"]] if "PATH" in dict(cmd.env) else []), system])
        return env

    # ---- entering it (pure) ------------------------------------------------------------------------------------
    def wrap(self, cmd: Command, *, ro: Sequence[str] = (), rw: Sequence[str] = (), net: bool = False,
             mkdirs: Sequence[str] = ()) -> Command:
        """Pure: `cmd` as it runs in this root (see the module's docstring); `mkdirs`: bind sources the executor makes
        before it runs (a build root's build dir and compiler cache)."""
        inner = cmd.inside or cmd
        env = self.environment(inner)
        if self.is_host:
            prefix = () if net else tuple(self.net_cut)
            return Command(argv=prefix + tuple(inner.argv), cwd=inner.cwd, env=tuple(sorted(env.items())),
                           unset=inner.unset, path=inner.path, clear=True, inside=inner, files=inner.files,
                           links=inner.links)
        from . import sandbox
        from .assemble import TOP_LINKS

        sb = sandbox.Sandbox(env=env, cwd=inner.cwd, root=self.dir, ro=tuple(dict.fromkeys(ro)),
                             rw=tuple(dict.fromkeys(rw)), network=net)
        return Command(argv=tuple(sandbox.argv(sb, inner.argv, links=TOP_LINKS)), cwd=inner.cwd,
                       mkdirs=tuple(mkdirs), inside=inner, files=inner.files, links=inner.links)

    def wrap_all(self, commands: Sequence[Command], **kw) -> tuple[Command, ...]:
        return tuple(self.wrap(c, **kw) for c in commands)

    # ---- effects -------------------------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            ro: Sequence[str] = (), rw: Sequence[str] = (), net: bool = False, timeout: float = 120,
            path: Sequence[str] = (), inherit: bool = False) -> subprocess.CompletedProcess:
        """Run one command here, capturing its text output; on timeout its process group is killed and
        runner.TimedOut (a subprocess.TimeoutExpired) raised. `inherit` (the host only): the caller's environment less
        LD_LIBRARY_PATH instead of the declared one (a device probe sees the user's Vulkan/ROCm settings)."""
        cmd = self.wrap(Command(tuple(argv), cwd=cwd, env=tuple(sorted((env or {}).items())), path=tuple(path)),
                        ro=ro, rw=rw, net=net)
        run_env = cmd.environ(os.environ) if not inherit or not self.is_host else {
            **{k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}, **(env or {})}
        argv = list(cmd.argv) if not (inherit and self.is_host) else list(argv)
        return runner.run(argv, cwd=cwd, env=run_env, timeout=timeout)

    def which(self, name: str) -> str | None:
        """Where program `name` (or an absolute path) is, as seen from here; None: absent."""
        if self.is_host:
            if name.startswith("/"):
                return name if os.path.isfile(name) else None
            return shutil.which(name, path=self.base.get("PATH", os.defpath))
        assert self.dir is not None
        if name.startswith("/"):
            return name if (Path(self.dir) / name.lstrip("/")).is_file() else None
        return next((f"/{d}/{name}" for d in BIN_INSIDE if (Path(self.dir) / d / name).is_file()), None)

    def host_path(self, inside: str) -> Path:
        """Where a path of this root is on the host's file system."""
        return Path(inside) if self.is_host else Path(self.dir) / inside.lstrip("/")

    def version(self, exe: str) -> str | None:
        """The version `exe` answers here: `exe --version`, else `exe version` (zig); None when it cannot run."""
        if not self.is_host and self.why_not is not None:
            return None
        for arg in ("--version", "version"):
            try:
                proc = self.run([exe, arg], timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                return None
            found = parse_version(proc.stdout + "\n" + proc.stderr)
            if found:
                return found
        return None


def host(environ: Mapping[str, str] | None = None, *, net_cut: Sequence[str] | None = None) -> Root:
    """The host as a root: its base environment is HOST_BASE of the caller's and what $ONEBIT_PASS_ENV names, its
    network cut as the sandbox module probes it."""
    from . import sandbox

    environ = os.environ if environ is None else environ
    extra = re.split(r"[\s,]+", environ.get(PASS_ENV, "").strip())
    base = {k: environ[k] for k in (*HOST_BASE, *extra) if k and environ.get(k)}
    base.setdefault("HOME", str(Path.home()))
    return Root(base=base, net_cut=tuple(sandbox.probe_net_cut() if net_cut is None else net_cut))


def build_root(name: str, directory: str, key: str = "", *, why_not: str | None = None) -> Root:
    return Root(name=name, dir=str(directory), key=key, why_not=why_not)


def replace(root: Root, **changes) -> Root:
    return dataclasses.replace(root, **changes)
