"""toolchain: a toolchain input assembled from pinned wheels (the CUDA toolkit from NVIDIA's wheels of one CUDA release,
zig from the ziglang wheel) or pinned Debian packages (the Vulkan SDK), and what a variant ships from it.

The toolchain step downloads each wheel by name and version, checks its sha256 (fetch.fetch_wheel_file), and unpacks
each wheel's `root` folder into ONE root in the cache with the layout a toolkit has: bin/, include/, lib/ (+ lib64 ->
lib, and the unversioned .so links a linker looks for). A CUDA root also gets lib/stubs/libcuda.so, a link-time stand-in
for the driver that NVIDIA's installers carry and no wheel does (see `driver_stub`). `onebit-toolchain.json` in the root
records every wheel (name, version, sha256, license) and the sha256 of each library a variant may ship.

`ship` copies a variant's redistributable runtime libraries (cudart, cuBLAS, cuBLASLt) unmodified into its subtree's
lib/, with the wheels' license files in share/licenses/<package>/ and share/onebit/redistributables.json naming them
(name, version, wheel sha256, license, each file's sha256): what the SBOM reads.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..io import archives
from ..errors import FetchError, StageError

ASSEMBLY = "wheels-assembly-3"  # part of the root's name: a change of the layout below never reuses an old root
METADATA = "onebit-toolchain.json"  # in an assembled root: the wheels it holds
REDISTRIBUTABLES = "share/onebit/redistributables.json"  # in a variant's subtree: what it ships from a toolchain
DRIVER_STUB = "lib/stubs/libcuda.so"
DRIVER_SONAME = "libcuda.so.1"

Log = Callable[[str], None]


def _noop(_: str) -> None:
    pass


# ---- pure ----------------------------------------------------------------------------------------------------------
MAX_WHEEL_MEMBER = 4 << 30  # bytes of one unpacked wheel member
MAX_WHEEL_UNPACKED = 16 << 30  # bytes unpacked from one wheel


def unpack_target(name: str, root: str) -> str | None:
    """Pure: where a wheel member lands in the toolchain root (relative), or None when it is outside `root`.
    Raises ValueError for a member that would escape the root."""
    prefix = root.rstrip("/") + "/"
    if not name.startswith(prefix) or name.endswith("/"):
        return None
    rel = name[len(prefix):]
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "" in parts or "\\" in rel:
        raise ValueError(f"member {name!r} escapes the toolchain root")
    return rel


def driver_entry_points(preprocessed: str) -> list[str]:
    """Pure: every driver API function a preprocessed cuda.h declares (`CUresult cuXxx(`), sorted."""
    return sorted(set(re.findall(r"^\s*(?:extern\s+)?CUresult\s+(cu\w+)\s*\(", preprocessed, re.M)))


def stub_source(names: Sequence[str]) -> str:
    """Pure: C source of the link stub: each entry point returns CUDA_ERROR_STUB_LIBRARY (34), as NVIDIA's stub does."""
    lines = ["/* link-time stand-in for the NVIDIA driver's libcuda.so.1, generated from the pinned cuda.h; never shipped */"]
    lines += [f"int {n}(void) {{ return 34; }}" for n in names]
    return "\n".join(lines) + "\n"


def license_of(metadata: str) -> str:
    """Pure: a wheel METADATA's license (License-Expression, else License), or NOASSERTION."""
    fields = {}
    for line in metadata.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(": ")
        if sep and key not in fields:
            fields[key] = value.strip()
    return fields.get("License-Expression") or fields.get("License") or "NOASSERTION"


# ---- assembly --------------------------------------------------------------------------------------------------------
def _unpack(wheel: Path, package: str, root: str, into: Path, owners: dict[str, str]) -> dict:
    """Unpack one wheel's `root` folder into `into` with the project's one unpacker (builders/io/archives.py), keeping
    exec bits; its license files under licenses/<package>/. A file another wheel already put there must hold the
    same bytes. Returns the wheel's entry for onebit-toolchain.json."""
    try:
        metadata = archives.read(wheel, lambda name: name.endswith(".dist-info/METADATA"), limit=16 << 20)
    except archives.ArchiveError as exc:
        raise FetchError(f"{wheel.name}: {exc.what}", hint=exc.hint) from None
    if metadata is None:
        raise FetchError(f"{wheel.name} has no .dist-info/METADATA; it is not a wheel")
    licenses: list[str] = []

    def place(m: archives.Member) -> str | None:
        """Where a member lands: below `root`, or a license file; a wheel installs regular files only."""
        try:
            rel = unpack_target(m.name, root)
        except ValueError as exc:
            raise FetchError(f"{wheel.name}: {exc}") from None
        if rel is None and "/licenses/" in m.name and ".dist-info/" in m.name and not m.name.endswith("/"):
            # keep the path below licenses/: a wheel may carry several files of one name (ziglang: LICENSE x7)
            sub = m.name.split(".dist-info/", 1)[1].split("licenses/", 1)[1]
            if ".." in sub.split("/"):
                raise FetchError(f"{wheel.name}: license member {m.name!r} escapes the toolchain root")
            rel = f"licenses/{package}/{sub}"
            licenses.append(rel)
        if rel is not None and m.kind not in (archives.FILE, archives.DIR):
            raise FetchError(f"{wheel.name}: member {m.name!r} is a link or special file; refusing to unpack it",
                             hint="the wheel is corrupt or not what was pinned: delete it from the download cache")
        return rel

    budget = archives.Budget(bytes=MAX_WHEEL_UNPACKED, file=MAX_WHEEL_MEMBER)
    try:
        got = archives.unpack(wheel, into, place=place, links="refuse", existing="same", budget=budget)
    except archives.Clash as exc:
        raise FetchError(f"{wheel.name} and {owners.get(exc.rel, 'another wheel')} both carry {exc.rel}, with "
                         f"different bytes", hint="the pinned wheels are not of one CUDA release; pin matching versions"
                         ) from None
    except archives.ArchiveError as exc:
        raise FetchError(f"{wheel.name}: {exc.what.removeprefix(wheel.name + ': ')}", hint=exc.hint) from None
    for rel in got.files:
        owners.setdefault(rel, wheel.name)
    return {"package": package, "license": license_of(metadata.decode(errors="replace")),
            "license_files": sorted(licenses)}


def _links(root: Path) -> None:
    """The links a linker and CMake's FindCUDAToolkit look for: lib/libX.so -> libX.so.N, and lib64 -> lib."""
    lib = root / "lib"
    if not lib.is_dir():
        return
    for so in sorted(lib.glob("*.so.*")):
        plain = lib / (so.name.split(".so.")[0] + ".so")
        if not plain.exists() and not plain.is_symlink():
            plain.symlink_to(so.name)
    if not (root / "lib64").exists():
        (root / "lib64").symlink_to("lib")


def driver_stub(root: Path, cc: str | None = None) -> Path | None:
    """lib/stubs/libcuda.so for a root with include/cuda.h: the driver API's entry points as functions of a shared
    library whose soname is libcuda.so.1, so ggml-cuda links CUDA::cuda_driver (VMM) on a host without a driver, as
    against NVIDIA's own stub. Only its soname reaches the output (DT_NEEDED libcuda.so.1); the driver resolves it."""
    header = root / "include" / "cuda.h"
    if not header.is_file():
        return None
    cc = cc or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FetchError("the CUDA driver link stub needs a C compiler; none (cc) is on PATH",
                         hint="install the C/C++ toolchain the cuda recipe needs anyway (g++)")
    pre = subprocess.run([cc, "-E", "-P", "-x", "c", "-D__CUDA_API_VERSION_INTERNAL", "-I", str(root / "include"), "-"],
                         input="#include <cuda.h>\n", capture_output=True, text=True)
    names = driver_entry_points(pre.stdout)
    if pre.returncode != 0 or not names:
        raise FetchError(f"cannot read the driver API from {header}: {pre.stderr.strip()[-300:] or 'no entry points'}")
    out = root / DRIVER_STUB
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onebit-stub-") as tmp:
        src = Path(tmp) / "libcuda_stub.c"
        src.write_text(stub_source(names))
        proc = subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", "-O0", f"-Wl,-soname,{DRIVER_SONAME}", "-o", str(out),
                               str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"compiling the CUDA driver link stub failed: {proc.stderr.strip()[-300:]}")
    return out


def assemble(wheels: Sequence[tuple[object, Path]], dest: Path, *, cc: str | None = None, log: Log = _noop) -> None:
    """Unpack (WheelInput, wheel file) pairs into one toolchain root at dest: written aside, swapped into place."""
    from ..io.swap import building, mark

    with building(dest) as tmp:
        owners: dict[str, str] = {}
        entries = []
        for spec, wheel in wheels:
            log(f"unpack {wheel.name}")
            entry = _unpack(wheel, spec.package, spec.root, tmp, owners)
            entry.update(version=spec.version, sha256=spec.sha256, wheel=wheel.name,
                         ship={name: None for name in spec.ship})
            entries.append(entry)
        _links(tmp)
        if driver_stub(tmp, cc):
            log("generated lib/stubs/libcuda.so (link-time only)")
        from ..project.config import file_sha256

        for entry in entries:
            for name in entry["ship"]:
                f = tmp / "lib" / name
                if not f.is_file() or f.is_symlink():
                    raise FetchError(f"{entry['wheel']} carries no lib/{name}, which the recipe ships",
                                     hint="check the wheel's `ship` list against its contents")
                entry["ship"][name] = file_sha256(f)
        (tmp / METADATA).write_text(json.dumps({"assembly": ASSEMBLY, "wheels": entries}, indent=2, sort_keys=True) + "\n")
        mark(tmp, marker_text(wheels=[spec for spec, _ in wheels]))


def marker_text(*, wheels: Sequence = (), debs: Sequence = ()) -> str:
    """Pure: the key a toolchain root's .complete names: every pinned input, one line each, in the recipe's order."""
    return "".join([f"{w.package}=={w.version} sha256:{w.sha256}\n" for w in wheels]
                   + [f"{d.path} sha256:{d.sha256}\n" for d in debs])


def record_problem(wheels: Sequence, debs: Sequence) -> Callable[[object], str | None]:
    """Pure: what is wrong with an onebit-toolchain.json for a root of these inputs (None: it is of this ASSEMBLY and
    names exactly these wheels, or these Debian packages, by version and sha256)."""
    def problem(meta: object) -> str | None:
        if not isinstance(meta, dict):
            return "is not an object"
        if meta.get("assembly") != ASSEMBLY:
            return f"names another assembly ({str(meta.get('assembly'))[:40]})"
        try:
            if debs:
                got = [(e["path"], e["sha256"]) for e in meta["debs"]]
                want = [(d.path, d.sha256) for d in debs]
            else:
                got = [(e["package"], e["version"], e["sha256"]) for e in meta["wheels"]]
                want = [(w.package, w.version, w.sha256) for w in wheels]
        except (KeyError, TypeError):
            return "does not list its inputs"
        return None if got == want else "names other inputs"
    return problem


def untrusted(dest: Path, wheels: Sequence = (), debs: Sequence = ()) -> str | None:
    """None when `dest` is an assembled toolchain root of these inputs: its .complete names them (marker_text) and its
    onebit-toolchain.json parses and names the same ones (swap.why_untrusted); otherwise why not."""
    from ..io.swap import why_untrusted

    return why_untrusted(dest, marker_text(wheels=wheels, debs=debs), record=METADATA,
                         record_problem=record_problem(wheels, debs))


def fetch_and_assemble(wheels: Sequence, downloads: Path, dest: Path, *, offline: bool = False, log: Log = _noop,
                       debs: Sequence = (), floor: tuple[str, Mapping[str, str]] | None = None) -> str:
    """The toolchain step: every pinned input (wheels, or Debian packages) fetched and verified, then assembled into
    dest (skipped when dest is a trusted root of these inputs: `untrusted`). A root there that is not trusted is
    assembled again aside and swapped into place; the answer says why."""
    from ..io.swap import ABSENT

    why = untrusted(dest, wheels, debs)
    if why is None:
        return "cache"
    again = "" if why == ABSENT else f" again: the root there was not trusted ({why})"
    dest.parent.mkdir(parents=True, exist_ok=True)
    if debs:
        from ..roots import debs as debian

        files = [(d, debian.fetch(d, downloads, offline=offline, log=log)) for d in debs]
        assemble_debs(files, dest, log=log, floor=floor)
        return f"{len(files)} Debian package(s) assembled{again}"
    from .fetch import fetch_wheel_file

    files = [(w, fetch_wheel_file(w.package, w.version, w.sha256, downloads, offline=offline, log=log)) for w in wheels]
    assemble(files, dest, log=log)
    return f"{len(files)} wheel(s) assembled{again}"


# ---- a toolchain from Debian packages (the Vulkan SDK: glslc, headers, SPIR-V headers, the loader to link against) --
DEB_TREE = "debian"  # in the root: every package unpacked as dpkg would under /
MULTIARCH = "usr/lib/x86_64-linux-gnu"
LOADER = f"{MULTIARCH}/ld-linux-x86-64.so.2"


def wrapper(program: str, *, private_loader: bool) -> str:
    """Pure: bin/<name> of a root, running `debian/usr/bin/<name>`; with the packages' own loader and libraries when the
    root carries them (a glslc built for a newer glibc then runs on an older host, and every host runs the same
    bytes). Finds the root from its own location, so the root may move."""
    run = (f'exec "$root/{DEB_TREE}/{LOADER}" --library-path "$root/{DEB_TREE}/{MULTIARCH}" '
           f'"$root/{DEB_TREE}/usr/bin/{program}" "$@"') if private_loader else f'exec "$root/{DEB_TREE}/usr/bin/{program}" "$@"'
    return f'#!/bin/sh\nroot=$(dirname "$(dirname "$(readlink -f "$0")")")\n{run}\n'


def pc_file(text: str) -> str:
    """Pure: a Debian .pc file made relocatable: its prefix becomes the toolchain root (${pcfiledir}/../..) and its
    libdir the root's lib/."""
    out = []
    for line in text.splitlines():
        if line.startswith("prefix="):
            line = "prefix=${pcfiledir}/../.."
        elif line.startswith("libdir="):
            line = "libdir=${prefix}/lib"
        elif line.startswith("includedir="):
            line = "includedir=${prefix}/include"
        out.append(line)
    return "\n".join(out) + "\n"


def assemble_debs(debs: Sequence[tuple[object, Path]], dest: Path, *, log: Log = _noop,
                  floor: tuple[str, Mapping[str, str]] | None = None) -> None:
    """Unpack (DebInput, .deb) pairs into dest/debian/ and lay the root out as an SDK is laid out (LunarG's, which
    CMake's FindVulkan reads through $VULKAN_SDK): bin/ (a wrapper per program of usr/bin), include/, lib/ (only the
    libraries a build links against: libvulkan.so, never the packages' libc), lib/pkgconfig/, share/cmake/.
    A tree that is a sysroot (libc6-dev and a libstdc++ -dev: builders/roots/sysroot.py) also gets floor/, the link
    stand-ins of its libstdc++ and libgcc_s capped at the floor (`floor`: its policy and caps, builders/project/floor.py).
    Written aside, swapped into place; `onebit-toolchain.json` names every package."""
    from ..roots import debs as debian, sysroot
    from ..io.swap import building, mark

    with building(dest) as tmp:
        tree = tmp / DEB_TREE
        entries = []
        for spec, deb in debs:
            log(f"unpack {deb.name}")
            debian.unpack(deb, tree)
            entries.append({"path": spec.path, "sha256": spec.sha256})  # debs.fetch checked the file against it
        private = (tree / LOADER).is_file()
        for prog in sorted((tree / "usr" / "bin").glob("*")) if (tree / "usr" / "bin").is_dir() else []:
            if prog.is_file() and os.access(prog, os.X_OK):
                out = tmp / "bin" / prog.name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(wrapper(prog.name, private_loader=private))
                out.chmod(0o755)
        if (tree / "usr" / "include").is_dir():
            (tmp / "include").symlink_to(f"{DEB_TREE}/usr/include")
        if (tree / "usr" / "share" / "cmake").is_dir():
            (tmp / "share").mkdir()
            (tmp / "share" / "cmake").symlink_to(f"../{DEB_TREE}/usr/share/cmake")
        lib = tmp / "lib"
        lib.mkdir()
        for so in sorted((tree / MULTIARCH).glob("libvulkan.so*")):  # what a Vulkan build links against, nothing else
            (lib / so.name).symlink_to(f"../{DEB_TREE}/{MULTIARCH}/{so.name}")
        for pc in sorted((tree / MULTIARCH / "pkgconfig").glob("*.pc")):
            (lib / "pkgconfig").mkdir(exist_ok=True)
            (lib / "pkgconfig" / pc.name).write_text(pc_file(pc.read_text()))
        meta: dict = {"assembly": ASSEMBLY, "debs": entries}
        if floor is not None and sysroot.is_sysroot(tree):  # the portability sysroot: link stand-ins capped at the floor
            policy, caps = floor
            standins = sysroot.floor_standins(tree, tmp / sysroot.FLOOR_DIR, caps)
            log(f"link stand-ins capped at {policy}: {', '.join(sorted(standins))}")
            meta["floor"] = {"policy": policy, "caps": dict(caps), "standins": standins}
        (tmp / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        mark(tmp, marker_text(debs=[spec for spec, _ in debs]))


# ---- what a variant ships ----------------------------------------------------------------------------------------------
def ship(base: Path, runtime: Sequence) -> list[str]:
    """Copy each RuntimeData's libraries, byte for byte, from its toolchain root into base/lib/, its license files into
    base/share/licenses/<package>/, and describe them in base/share/onebit/redistributables.json. Returns what was
    copied (relative to base). Runs after relocation: NVIDIA's EULA allows redistribution of unmodified files only."""
    from ..project.config import file_sha256

    if not runtime:
        return []
    shipped, doc = [], []
    for item in runtime:
        root = Path(item.root)
        meta = _metadata(root)
        wheel = next((w for w in meta.get("wheels", []) if w["package"] == item.package), None) if meta else None
        entry: dict = {"package": item.package, "files": {}}
        if wheel is not None:
            entry.update(version=wheel["version"], wheel_sha256=wheel["sha256"], license=wheel["license"])
            licenses = [root / rel for rel in wheel["license_files"]]
        else:  # an override toolkit (CUDA_HOME): its EULA, as NVIDIA's installers lay it down
            entry.update(version=None, wheel_sha256=None, license="LicenseRef-NVIDIA-Proprietary", toolkit="override")
            licenses = [p for p in (root / "EULA.txt",) if p.is_file()]
        if not licenses:
            raise StageError(f"{root} has no license text for {item.package} ({', '.join(item.libs)}); they cannot ship "
                             "without it", hint="use the pinned wheels (unset the override), or a toolkit with EULA.txt")
        for lic in licenses:
            rel = f"share/licenses/{item.package}/{lic.name}"
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(lic, base / rel)
            shipped.append(rel)
        entry["license_files"] = [f"share/licenses/{item.package}/{lic.name}" for lic in licenses]
        for name in item.libs:
            src = next((p for p in (root / "lib" / name, root / "lib64" / name) if p.exists()), None)
            if src is None:
                raise StageError(f"{item.package}: {name} is not in {root}/lib", hint="check the recipe's `ship` list")
            rel = f"lib/{name}"
            if (base / rel).exists() or (base / rel).is_symlink():
                raise StageError(f"{rel} is both built and shipped from the toolchain",
                                 hint="drop it from the build's install, or from `ship`")
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, base / rel)  # follows a toolkit's symlink to the versioned file
            os.chmod(base / rel, stat.S_IMODE(os.stat(src).st_mode) | 0o644)
            entry["files"][rel] = file_sha256(base / rel)
            expected = (wheel or {}).get("ship", {}).get(name)
            if expected and expected != entry["files"][rel]:
                raise StageError(f"{rel} differs from the one {item.package} carries (sha256 {expected[:12]}...)",
                                 hint=f"the toolchain root {root} was changed after it was assembled; delete it and build again")
            shipped.append(rel)
        doc.append(entry)
    out = base / REDISTRIBUTABLES
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"redistributables": doc}, indent=2, sort_keys=True) + "\n")
    return shipped + [REDISTRIBUTABLES]


def _metadata(root: Path) -> dict | None:
    """onebit-toolchain.json of an assembled root (bounded, never through a link), or None."""
    from ..io.readfile import UnreadableFile, read_json
    from ..io.swap import MAX_RECORD

    try:
        meta = read_json(root / METADATA, MAX_RECORD)
    except UnreadableFile:
        return None
    return meta if isinstance(meta, dict) else None
