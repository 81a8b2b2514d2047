"""roots: pinned build roots, a Debian system of pinned packages that a build step enters instead of the host.

A root is a pinned input like a source (`roots/<name>.yaml`, schemas/root.schema.json): the suites it is resolved
from, the packages it asks for, and the resolved closure, every .deb by pool path, sha256 and size, with the
timestamp at which Debian's snapshot archive still serves a pool path the archive has since dropped.

- `resolve_file` (the `1bit-build roots resolve NAME` command, and the pin bot) reads the suites' Packages indexes from
  the Debian archive (builders.roots.debs.mirrors) and writes the closure (debian_resolve) into the file, aside and swapped.
- `assemble` (the `root` step, the toolchain step's sibling) fetches and verifies every .deb through builders.roots.debs,
  unpacks each data member into ONE tree in the cache named by the closure's hash and ASSEMBLY (shared by every
  variant that names the root), locked against a concurrent assembly, written aside and swapped into place. dpkg's
  maintainer scripts never run; what of their work a build needs is done here: the usr-merge top-level links, a
  passwd/group with root and nobody, the alternatives a compile needs (ALTERNATIVES), and ld.so.cache from the root's
  own ldconfig run inside the root. `onebit-root.json` records every package, the root's glibc and the assembly.
- Entering it is builders/roots/root.py's job (one `Root` value for the host and every build root).
"""
from __future__ import annotations

import datetime as _dt
import json
import lzma
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..errors import OnebitError
from ..project.root_pins import (ASSEMBLY, GENERATED, Change, ResolvedDeb, RootPin, describe, diff, glibc_of,  # noqa: F401
                                 load_roots, moved_text, render, root_key)

METADATA = "onebit-root.json"
SNAPSHOT_ENV = "ONEBIT_DEBIAN_SNAPSHOT"  # Debian's snapshot archive, `<base>/<timestamp>/pool/...`
ARCH = "amd64"
# Debian's usr-merge: the top-level directories are links into usr/ (what base-files and the usrmerge scripts make)
TOP_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
# What update-alternatives would have made, in the order Debian's priorities choose: link -> candidates (the first
# the root has wins). Only what a compile or a build script calls by its generic name.
ALTERNATIVES: dict[str, tuple[str, ...]] = {
    "usr/bin/cc": ("usr/bin/gcc", "usr/bin/clang"),
    "usr/bin/c++": ("usr/bin/g++", "usr/bin/clang++"),
    "usr/bin/c89": ("usr/bin/c89-gcc",),
    "usr/bin/c99": ("usr/bin/c99-gcc",),
    "usr/bin/awk": ("usr/bin/mawk", "usr/bin/gawk"),
    "usr/bin/nawk": ("usr/bin/mawk", "usr/bin/gawk"),
    "usr/bin/which": ("usr/bin/which.debianutils",),
    "usr/bin/sh": ("usr/bin/dash", "usr/bin/bash"),
    "usr/bin/pager": ("usr/bin/less", "usr/bin/more"),
    "usr/bin/rename": ("usr/bin/file-rename",),
}
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"

Log = Callable[[str], None]


def _noop(_: str) -> None:
    pass


# ---- resolving (the pin) ---------------------------------------------------------------------------------------------
def index_url(mirror: str, suite: str, component: str) -> str:
    return f"{mirror.rstrip('/')}/dists/{suite}/{component}/binary-{ARCH}/Packages.xz"


def parse_packages(text: str) -> list[dict[str, str]]:
    """Pure: the stanzas of a Packages index, only the fields the resolver reads (python-debian's deb822)."""
    from debian import deb822

    from .debian_resolve import FIELDS

    return [dict(p) for p in deb822.Packages.iter_paragraphs(text.splitlines(keepends=True), use_apt_pkg=False,
                                                            fields=list(FIELDS))]


def read_index(suite: str, component: str, archives: Sequence[str], *, session=None, log: Log = _noop) -> str:
    """One suite's Packages index (its text), from the first archive that serves it (debs.from_archives)."""
    from . import debs

    def attempt(base: str) -> str:
        url = index_url(base, suite, component)
        log(f"read {suite}/{component} Packages from {base}")
        if url.startswith("file:"):
            raw = Path(url.removeprefix("file://").removeprefix("file:")).read_bytes()
        else:
            from ..io.http import make_session

            resp = (session or make_session()).get(url, timeout=(15, 300))
            if resp.status_code != 200:
                raise debs.Unserved(f"HTTP {resp.status_code}")
            raw = resp.content
        return lzma.decompress(raw).decode("utf-8", errors="replace")

    # any error of one archive (requests' among them): the next archive may serve it
    return debs.from_archives(archives, attempt, passes=(Exception,),
                              what=f"no Debian archive served dists/{suite}/{component}/binary-{ARCH}/Packages.xz",
                              hint="set ONEBIT_DEBIAN_MIRROR to a Debian archive that carries the suite")


def resolve_closure(root: RootPin, indexes: Sequence[tuple[str, str | Sequence[Mapping[str, str]]]]) -> list[ResolvedDeb]:
    """Pure: the root's closure from the suites' Packages texts (or parsed stanzas; debian_resolve), as pin entries."""
    from . import debian_resolve as dr

    try:
        chosen = dr.resolve(dr.index(indexes), [dr.Request.parse(p) for p in root.packages], essential=root.essential)
    except dr.ResolveError as exc:
        raise OnebitError(f"root {root.name}: {exc}", where=root.where,
                          hint="name the package with the suite that has it (`name/experimental`), or drop it") from None
    out = []
    for c in chosen:
        p = c.pkg
        if not (p.filename and p.sha256):
            raise OnebitError(f"root {root.name}: {p.name} {p.version} ({p.suite}) has no Filename or SHA256 in its "
                              "Packages index", where=root.where)
        out.append(ResolvedDeb(package=p.name, version=p.version, suite=p.suite, path=p.filename, sha256=p.sha256,
                               size=p.size))
    return out


def snapshot_stamp(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def resolve_file(root: RootPin, *, archives: Sequence[str] | None = None, now: _dt.datetime | None = None,
                 write: bool = True, session=None, log: Log = _noop) -> tuple[list[ResolvedDeb], list[Change]]:
    """Resolve the root against the archive's indexes now; write the file (aside, then renamed) unless `write` is
    False. Returns the closure and what changed."""
    from . import debs
    from ..io.swap import write_text_atomic

    archives = debs.mirrors() if archives is None else list(archives)
    indexes = [(suite, read_index(suite, component, archives, session=session, log=log)) for suite, component in root.suites]
    resolved = resolve_closure(root, indexes)
    changes = diff(root.resolved, resolved)
    if write:
        write_text_atomic(root.path, moved_text(root.path.read_text(encoding="utf-8"), root.snapshot, resolved,
                                                bool(changes), snapshot_stamp(now)))
    return resolved, changes


# ---- assembly ----------------------------------------------------------------------------------------------------------
def archives_for(root: RootPin, env: Mapping[str, str] | None = None) -> list[str]:
    """Where its packages are downloaded from: the Debian archives (debs.mirrors), then the snapshot archive at the
    root's timestamp when $ONEBIT_DEBIAN_SNAPSHOT names one (a pool path the archive has dropped)."""
    from . import debs

    env = os.environ if env is None else env
    out = debs.mirrors(env)
    snap = env.get(SNAPSHOT_ENV, "").strip().rstrip("/")
    if snap and root.snapshot:
        out.append(f"{snap}/{root.snapshot}")
    return out


def deb_input(d: ResolvedDeb):
    """The package as builders.roots.debs fetches it (with its size where config.DebInput carries one)."""
    from ..project.config import DebInput

    fields = {"path": d.path, "sha256": d.sha256}
    if "size" in getattr(DebInput, "__dataclass_fields__", {}):
        fields["size"] = d.size
    return DebInput(**fields)


def alternatives(present: Callable[[str], bool]) -> dict[str, str]:
    """Pure given `present` (whether a root-relative path exists): link -> relative target for each alternative the
    root lacks and has a candidate for."""
    out = {}
    for link, candidates in ALTERNATIVES.items():
        if present(link):
            continue
        target = next((c for c in candidates if present(c)), None)
        if target:
            out[link] = os.path.relpath(target, os.path.dirname(link))
    return out


def _lexists(root: Path) -> Callable[[str], bool]:
    def present(rel: str) -> bool:
        # resolve within the root: a top-level link (bin -> usr/bin) is followed inside it, never on the host
        parts = rel.split("/")
        here = root
        for i, part in enumerate(parts):
            here = here / part
            if here.is_symlink() and i < len(parts) - 1:
                target = os.readlink(here)
                if target.startswith("/"):
                    return False
                here = (here.parent / target)
        return os.path.lexists(here)
    return present


def _ldconfig(tree: Path, log: Log) -> None:
    """ld.so.cache from the root's own ldconfig, run inside the root (it reads the root's ld.so.conf and libraries,
    and the root's etc is all the /etc it sees: no host ld.so.conf.d entry reaches the cache; -X: it creates no
    soname links, the packages carry theirs)."""
    from . import sandbox

    if not (tree / "usr" / "sbin" / "ldconfig").is_file():
        log("no ldconfig in the root (libc-bin is not in it): no ld.so.cache")
        return
    why = sandbox.why_unavailable()
    if why:
        raise OnebitError(f"cannot enter the build root to run its ldconfig: {why}")
    out = tree.parent / f".{tree.name}.ldconfig"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    try:
        proc = sandbox.run(sandbox.Sandbox(root=str(tree), rw=(str(out),), timeout=300),
                           ["/usr/sbin/ldconfig", "-X", "-C", f"{out}/ld.so.cache"])
        if proc.returncode != 0 or not (out / "ld.so.cache").is_file():
            raise OnebitError(f"the root's ldconfig failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
        shutil.copyfile(out / "ld.so.cache", tree / "etc" / "ld.so.cache")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def assemble_tree(files: Sequence[tuple[ResolvedDeb, Path]], tree: Path, *, name: str, snapshot: str | None,
                  log: Log = _noop) -> dict:
    """Unpack the verified .debs into `tree` (an empty directory) and do what a build needs of dpkg's scripts.
    Returns the metadata written to onebit-root.json."""
    from . import debs

    for link, target in TOP_LINKS.items():
        (tree / "usr" / target.removeprefix("usr/")).mkdir(parents=True, exist_ok=True)
        (tree / link).symlink_to(target)
    for spec, deb in files:
        log(f"unpack {deb.name}")
        debs.unpack(deb, tree)  # absolute links re-rooted as relative links inside the tree
    (tree / "etc").mkdir(exist_ok=True)
    for fname, text in (("passwd", PASSWD), ("group", GROUP)):
        f = tree / "etc" / fname
        if not f.exists():
            f.write_text(text)
    links = alternatives(_lexists(tree))
    for link, target in sorted(links.items()):
        (tree / link).symlink_to(target)
    _ldconfig(tree, log)
    resolved = [s for s, _ in files]
    meta = {"assembly": ASSEMBLY, "name": name, "key": root_key(resolved), "snapshot": snapshot,
            "glibc": glibc_of(resolved), "alternatives": dict(sorted(links.items())),
            "packages": [s.to_yaml() for s in sorted(resolved, key=lambda s: s.package)]}
    (tree / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def record_problem(key: str) -> Callable[[object], str | None]:
    """Pure: what is wrong with an onebit-root.json for a root of `key` (None: it names that key and this ASSEMBLY)."""
    def problem(meta: object) -> str | None:
        if not isinstance(meta, dict):
            return "is not an object"
        if meta.get("assembly") != ASSEMBLY:
            return f"names another assembly ({str(meta.get('assembly'))[:40]})"
        if meta.get("key") != key:
            return f"names another key ({str(meta.get('key'))[:40]})"
        return None
    return problem


def untrusted(dest: Path, key: str) -> str | None:
    """None when `dest` is an assembled root of `key`: its .complete names the key and its onebit-root.json parses and
    names the same key and assembly (swap.why_untrusted); otherwise why not (swap.ABSENT when nothing is there)."""
    from ..io.swap import why_untrusted

    return why_untrusted(dest, key, record=METADATA, record_problem=record_problem(key))


def assemble(root: RootPin, downloads: Path, dest: Path, *, offline: bool = False, log: Log = _noop,
             archives: Sequence[str] | None = None) -> str:
    """The root step: every package fetched and verified, then assembled once into `dest` (skipped when it is a
    trusted root of this key: `untrusted`); locked, so a concurrent run waits and then finds it assembled. A root
    that is there but not trusted (a forged or stale marker, a missing or other record) is assembled again aside and
    swapped into place; the answer says why the old one was not trusted."""
    from . import debs
    from ..io.lock import hold
    from ..io.swap import ABSENT, building, mark

    if not root.resolved:
        raise OnebitError(f"root {root.name} has no resolved packages", where=str(root.path),
                          hint=f"run `1bit-build roots resolve {root.name}`")
    key = root.key
    if untrusted(dest, key) is None:
        return "cache"
    with hold(dest, "build root", say=log):
        why = untrusted(dest, key)
        if why is None:
            return "cache (assembled meanwhile)"
        archives = archives_for(root) if archives is None else list(archives)
        files = [(d, debs.fetch(deb_input(d), downloads, offline=offline, archives=archives, log=log))
                 for d in root.resolved]
        with building(dest) as tmp:
            meta = assemble_tree(files, tmp, name=root.name, snapshot=root.snapshot, log=log)
            mark(tmp, meta["key"])
    done = f"{len(files)} Debian package(s) assembled"
    return done if why == ABSENT else f"{done} again: the root there was not trusted ({why})"


def metadata(dest: Path) -> dict | None:
    """onebit-root.json of an assembled root (bounded, never through a link), or None."""
    from ..io.readfile import UnreadableFile, read_json
    from ..io.swap import MAX_RECORD

    try:
        meta = read_json(Path(dest) / METADATA, MAX_RECORD)
    except UnreadableFile:
        return None
    return meta if isinstance(meta, dict) else None
