"""The host's ROCm, checked by name (onebit/hostlibs.py): a backend's `host_libraries` looked up as the dynamic loader
would (LD_LIBRARY_PATH, /etc/ld.so.cache in its three layouts, the default directories) without loading anything;
`1bit check` and `1bit serve` say in one line which SONAMEs are missing and what provides them, and name a different
major that is installed. Then the stand-ins for the user's ROCm (scripts/rocm_stubs.py), generated from the pinned
strix-sid root's real libraries: the same SONAMEs, version nodes and exported symbols; a program linked against the
real libraries starts with them and exits 127 without them, and `1bit check` / `1bit serve` pass with them."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serve_fixtures import models, write_manifest  # noqa: F401  (models is a fixture)

from onebit import hostlibs
from onebit.check import check
from onebit.errors import ManifestError
from onebit.hostlibs import CacheEntry, CacheError, Found, HostLibrary
from onebit.inspect import inspect_model
from onebit.manifest import load_manifest
from onebit.launch_plan import LaunchPlan, Refusal
from onebit.route import route
from onebit.serve_flags import RouteEnv, ServeFlags

SRC = Path(__file__).resolve().parent.parent
ONEBIT = [sys.executable, "-m", "onebit.cli"]
KFD = "/dev/kfd"
HIP = HostLibrary("libamdhip64.so.7", "ROCm 7.x HIP runtime (Debian: libamdhip64-7; AMD's rocm-hip-runtime 7.x; or a "
                  "TheRock 7.x tree on the loader path)", "rocm7")
HIPBLAS = HostLibrary("libhipblas.so.3", "ROCm 7.x hipBLAS (Debian: libhipblas3; AMD's hipblas 7.x; or a TheRock 7.x "
                      "tree on the loader path)", "rocm7")
ROCBLAS = HostLibrary("librocblas.so.5", "ROCm 7.x rocBLAS (Debian: librocblas5; AMD's rocblas 7.x; or a TheRock 7.x "
                      "tree on the loader path)", "rocm7")
ROCM7 = (HIP, HIPBLAS, ROCBLAS)


def cc() -> str:
    found = shutil.which("cc")
    assert found, "the tests need a C compiler (nox -s tests installs g++)"
    return found


def make_lib(directory: Path, soname: str, file: str | None = None, body: str = "int onebit_test_lib(void) { return 0; }\n"
             ) -> Path:
    """A real shared object carrying `soname` (file name `file`, default the SONAME itself)."""
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / f".{soname}.c"
    src.write_text(body)
    out = directory / (file or soname)
    subprocess.run([cc(), "-shared", "-fPIC", "-o", out, src, f"-Wl,-soname,{soname}"], check=True)
    src.unlink()
    return out


def with_host_libraries(path: Path, libs: dict[str, tuple[HostLibrary, ...]]) -> Path:
    """Add `host_libraries` to backends of a written manifest, in the shape the build side writes."""
    data = json.loads(path.read_text())
    for backend, entries in libs.items():
        data["backends"][backend]["host_libraries"] = [
            {"soname": h.soname, "provided_by": h.provided_by, "set": h.set} for h in entries]
    path.write_text(json.dumps(data, indent=2))
    return path


def host_has_rocm7() -> bool:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    return any(f.path for f in hostlibs.look_up([h.soname for h in ROCM7], env).values())


needs_no_rocm = pytest.mark.skipif(host_has_rocm7(), reason="this host has ROCm 7 installed: nothing is missing")


# --- names (pure) ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("soname,names,others", [
    ("libhipblas.so.3", ["libhipblas.so.2", "libhipblas.so.2.4.60400", "libhipblas.so"], ("libhipblas.so.2",)),
    ("libhipblas.so.3", ["libhipblas.so.3", "libhipblas.so.3.2"], ()),
    ("libhipblas.so.3", ["libhipblas.so.10", "libhipblas.so.4", "libhipblas.so.0"],
     ("libhipblas.so.0", "libhipblas.so.4", "libhipblas.so.10")),
    ("libhipblas.so.3", ["libhipblaslt.so.1", "libhipblas-common.so.2"], ()),  # other libraries, not other majors
    ("libamdhip64.so.7", ["libamdhip64.so.6.3.60300"], ("libamdhip64.so.6",)),  # no SONAME link: still installed
    ("libfoo.so", ["libfoo.so.1"], ()),  # an unversioned SONAME has no major
])
def test_other_majors(soname, names, others):
    assert hostlibs.other_majors(soname, names) == others


@pytest.mark.parametrize("value,dirs", [
    (None, ()),
    ("", ()),
    ("/opt/rocm/lib", ("/opt/rocm/lib",)),
    ("/a:/b;/c", ("/a", "/b", "/c")),
    ("/a::/b", ("/a", "/here", "/b")),  # an empty entry is the working directory
    ("$ORIGIN/../lib:/a:/x/${LIB}", ("/a",)),  # a dynamic string token depends on the loading program
])
def test_library_path_dirs(value, dirs):
    assert hostlibs.library_path_dirs(value, cwd="/here") == dirs


def _header(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(20)


@pytest.mark.parametrize("change,machine,ok", [
    ({}, "x86_64", True),
    ({4: 1}, "x86_64", False),  # ELFCLASS32: an i386 library in /usr/lib is skipped by the x86-64 loader
    ({5: 2}, "x86_64", False),  # big-endian
    ({18: 183, 19: 0}, "x86_64", False),  # an aarch64 object
    ({18: 183, 19: 0}, "aarch64", True),
    ({0: 0}, "x86_64", False),  # not ELF
])
def test_is_loadable_elf(change, machine, ok):
    header = bytearray(_header(sys.executable))
    if header[18] != 62:
        pytest.skip("this host is not x86-64")
    for at, byte in change.items():
        header[at] = byte
    assert hostlibs.is_loadable_elf(bytes(header), machine) is ok
    assert hostlibs.is_loadable_elf(bytes(header[:10]), machine) is False


# --- /etc/ld.so.cache: the real ldconfig writes each layout ----------------------------------------------------------


@pytest.fixture(scope="module")
def libdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostlibs") / "lib"
    make_lib(d, "libhipblas.so.2", "libhipblas.so.2.4.60400")
    os.symlink("libhipblas.so.2.4.60400", d / "libhipblas.so.2")
    make_lib(d, "libamdhip64.so.6", "libamdhip64.so.6.3.60300")
    os.symlink("libamdhip64.so.6.3.60300", d / "libamdhip64.so.6")
    return d


def _ldconfig(libdir: Path, fmt: str) -> Path:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    conf = libdir.parent / "ld.so.conf"
    conf.write_text(f"{libdir}\n")
    out = libdir.parent / f"ld.so.cache.{fmt}"
    r = subprocess.run([ldconfig, "-X", "-c", fmt, "-C", out, "-f", conf], capture_output=True, text=True)
    assert r.returncode == 0 and out.is_file(), r.stderr
    return out


def _ldconfig_p(cache: Path) -> list[tuple[str, str]]:
    """What ldconfig itself reads from a cache: (name, path), in its order."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p", "-C", cache], capture_output=True, text=True, check=True).stdout
    return [(m[1], m[2]) for m in re.finditer(r"^\s+(\S+) \([^)]*\) => (\S+)$", out, re.MULTILINE)]


@pytest.mark.parametrize("fmt,magic", [("old", b"ld.so-1.7.0"), ("compat", b"ld.so-1.7.0"),
                                       ("new", b"glibc-ld.so.cache1.1")])
def test_parse_every_layout_as_ldconfig_reads_it(libdir, fmt, magic):
    cache = _ldconfig(libdir, fmt)
    data = cache.read_bytes()
    assert data.startswith(magic)
    entries = hostlibs.parse_ld_so_cache(data)
    assert [(e.name, e.path) for e in entries] == _ldconfig_p(cache)
    names = hostlibs.cache_names(entries)
    assert names["libhipblas.so.2"] == f"{libdir}/libhipblas.so.2"
    assert names["libamdhip64.so.6"] == f"{libdir}/libamdhip64.so.6"
    assert "libhipblas.so.3" not in names


def test_parse_this_hosts_cache():
    path = Path("/etc/ld.so.cache")
    if not path.is_file():
        pytest.skip("this host has no ld.so.cache")
    assert [(e.name, e.path) for e in hostlibs.parse_ld_so_cache(path.read_bytes())] == _ldconfig_p(path)


@pytest.mark.parametrize("data,error", [
    (b"", "not an ld.so.cache"),
    (b"\x7fELF" + b"\0" * 60, "not an ld.so.cache"),
    (b"ld.so-1.7.0\0", "truncated"),
    (b"ld.so-1.7.0\0" + (1000).to_bytes(4, "little"), "1000 entries do not fit"),
    (b"glibc-ld.so.cache1.1" + (5).to_bytes(4, "little") + b"\0" * 24, "5 entries do not fit"),
    (b"glibc-ld.so.cache1.1" + (0).to_bytes(4, "little") * 2 + b"\3" + b"\0" * 19, "big-endian"),
    # one old entry whose name lies past the end
    (b"ld.so-1.7.0\0" + (1).to_bytes(4, "little") + (0x303).to_bytes(4, "little") + (999).to_bytes(4, "little") * 2,
     "outside the cache"),
])
def test_a_bad_cache_is_an_error(data, error):
    with pytest.raises(CacheError, match=error):
        hostlibs.parse_ld_so_cache(data)


@pytest.mark.parametrize("entries,machine,want", [
    ([CacheEntry("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", 0x0303)], "x86_64",
     {"libz.so.1": "/lib/x86_64-linux-gnu/libz.so.1"}),
    ([CacheEntry("libz.so.1", "/lib/i386-linux-gnu/libz.so.1", 0x0003)], "x86_64", {}),  # i386: not this ABI
    ([CacheEntry("libz.so.1", "/usr/lib32/libz.so.1", 0x0003),
      CacheEntry("libz.so.1", "/usr/lib64/libz.so.1", 0x0303)], "x86_64", {"libz.so.1": "/usr/lib64/libz.so.1"}),
    ([CacheEntry("libz.so.1", "/lib/aarch64-linux-gnu/libz.so.1", 0x0A03)], "aarch64",
     {"libz.so.1": "/lib/aarch64-linux-gnu/libz.so.1"}),
    # a glibc-hwcaps entry and the plain one: the plain one, which every CPU loads
    ([CacheEntry("libz.so.1", "/lib/glibc-hwcaps/x86-64-v3/libz.so.1", 0x0303, 1 << 62),
      CacheEntry("libz.so.1", "/lib/libz.so.1", 0x0303)], "x86_64", {"libz.so.1": "/lib/libz.so.1"}),
])
def test_cache_names(entries, machine, want):
    assert hostlibs.cache_names(entries, machine) == want


# --- the decision (pure) ---------------------------------------------------------------------------------------------

PATH_DIR = ("/opt/rocm/lib", {"libhipblas.so.3": True, "libhipblas.so.3.2": True})
OLD_DEFAULT = ("/usr/lib/x86_64-linux-gnu", {"libhipblas.so.2": True, "libhipblas.so.2.4": True})
I386 = ("/usr/lib", {"libhipblas.so.3": False})  # a 32-bit one: the loader skips it


@pytest.mark.parametrize("path_dirs,cache,defaults,found", [
    ([PATH_DIR], {}, [], Found("libhipblas.so.3", "/opt/rocm/lib/libhipblas.so.3")),
    # LD_LIBRARY_PATH before the cache, the cache before the default directories
    ([PATH_DIR], {"libhipblas.so.3": "/cache/libhipblas.so.3"}, [], Found("libhipblas.so.3", "/opt/rocm/lib/libhipblas.so.3")),
    ([], {"libhipblas.so.3": "/cache/libhipblas.so.3"}, [("/lib", {"libhipblas.so.3": True})],
     Found("libhipblas.so.3", "/cache/libhipblas.so.3")),
    ([], {}, [("/lib64/", {"libhipblas.so.3": True})], Found("libhipblas.so.3", "/lib64/libhipblas.so.3")),
    ([], {}, [I386], Found("libhipblas.so.3", None)),
    ([], {}, [OLD_DEFAULT], Found("libhipblas.so.3", None, ("libhipblas.so.2",))),
    ([], {"libhipblas.so.2": "/x/libhipblas.so.2", "libhipblas.so.4": "/x/libhipblas.so.4"}, [],
     Found("libhipblas.so.3", None, ("libhipblas.so.2", "libhipblas.so.4"))),
    ([PATH_DIR], {}, [OLD_DEFAULT], Found("libhipblas.so.3", "/opt/rocm/lib/libhipblas.so.3", ("libhipblas.so.2",))),
])
def test_decide(path_dirs, cache, defaults, found):
    assert hostlibs.decide("libhipblas.so.3", path_dirs, cache, defaults) == found


NONE = {h.soname: Found(h.soname, None) for h in ROCM7}
ALL = {h.soname: Found(h.soname, f"/opt/rocm/lib/{h.soname}") for h in ROCM7}
ROCM6 = {"libamdhip64.so.7": Found("libamdhip64.so.7", None, ("libamdhip64.so.6",)),
         "libhipblas.so.3": Found("libhipblas.so.3", None, ("libhipblas.so.2",)),
         "librocblas.so.5": Found("librocblas.so.5", None, ("librocblas.so.4",))}


@pytest.mark.parametrize("needs,found,text", [
    ((HIPBLAS,), {"libhipblas.so.3": Found("libhipblas.so.3", None, ("libhipblas.so.2",))},
     f"libhipblas.so.3 missing (libhipblas.so.2 (ROCm 6) is installed, another major); provided by {HIPBLAS.provided_by}"),
    ((HIPBLAS,), {"libhipblas.so.3": Found("libhipblas.so.3", None, ("libhipblas.so.10",))},
     f"libhipblas.so.3 missing (libhipblas.so.10 is installed, another major); provided by {HIPBLAS.provided_by}"),
    (ROCM7, NONE, "libamdhip64.so.7, libhipblas.so.3, librocblas.so.5 missing; provided by "
     f"{HIP.provided_by} / {HIPBLAS.provided_by} / {ROCBLAS.provided_by}"),
    (ROCM7, ROCM6, "libamdhip64.so.7, libhipblas.so.3, librocblas.so.5 missing (libamdhip64.so.6 (ROCm 6), "
     "libhipblas.so.2 (ROCm 6), librocblas.so.4 (ROCm 6) are installed, another major); provided by "
     f"{HIP.provided_by} / {HIPBLAS.provided_by} / {ROCBLAS.provided_by}"),
    ((HIP, HostLibrary("libhsa-runtime64.so.1", HIP.provided_by, "rocm7")),
     {"libamdhip64.so.7": Found("libamdhip64.so.7", None), "libhsa-runtime64.so.1": Found("libhsa-runtime64.so.1", None)},
     f"libamdhip64.so.7, libhsa-runtime64.so.1 missing; provided by {HIP.provided_by}"),  # one provider named once
])
def test_missing_text(needs, found, text):
    lacking = hostlibs.missing(needs, found)
    assert hostlibs.missing_text(lacking, found) == text
    assert "\n" not in text


@pytest.mark.parametrize("found,lacking", [(NONE, ROCM7), (ALL, ()), ({**ALL, **{"libhipblas.so.3": NONE["libhipblas.so.3"]}},
                                                                      (HIPBLAS,)), ({}, ())])
def test_missing(found, lacking):
    assert tuple(hostlibs.missing(ROCM7, found)) == lacking


def test_look_up_reads_a_root_as_the_loader_would(tmp_path, libdir):
    """The thin part, over a directory standing for `/`: its ld.so.cache (written by the real ldconfig), its default
    directories, and LD_LIBRARY_PATH; a 32-bit file of the right name is skipped."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    shutil.copy(_ldconfig(libdir, "new"), root / "etc" / "ld.so.cache")  # libhipblas.so.2, libamdhip64.so.6
    rocblas = make_lib(root / "usr" / "lib64", "librocblas.so.5")
    i386 = bytearray(rocblas.read_bytes())
    i386[4] = 1
    (root / "usr" / "lib").mkdir()
    (root / "usr" / "lib" / "libhipblas.so.3").write_bytes(bytes(i386))
    extra = make_lib(tmp_path / "opt", "libamdhip64.so.7").parent
    sonames = [h.soname for h in ROCM7]
    got = hostlibs.look_up(sonames, {"LD_LIBRARY_PATH": f"$ORIGIN:{extra}"}, root=root)
    assert got == {
        "libamdhip64.so.7": Found("libamdhip64.so.7", f"{extra}/libamdhip64.so.7", ("libamdhip64.so.6",)),
        "libhipblas.so.3": Found("libhipblas.so.3", None, ("libhipblas.so.2",)),
        "librocblas.so.5": Found("librocblas.so.5", "/usr/lib64/librocblas.so.5"),
    }
    assert hostlibs.look_up(sonames, {}, root=root)["libamdhip64.so.7"].path is None
    assert hostlibs.look_up([], {}, root=root) == {}


# --- the manifest ----------------------------------------------------------------------------------------------------


def test_manifest_reads_host_libraries(tmp_path):
    path = with_host_libraries(write_manifest(tmp_path, ["ds4-rocm", "cpu"], layout="per-backend"),
                               {"ds4-rocm": ROCM7, "cpu": ()})
    m = load_manifest(path)
    assert m.backends["ds4-rocm"].host_libraries == ROCM7
    assert m.backends["cpu"].host_libraries == ()
    assert m.host_sonames() == ("libamdhip64.so.7", "libhipblas.so.3", "librocblas.so.5")


@pytest.mark.parametrize("entry,where", [
    ({"soname": "libhipblas.so.3", "provided_by": "x"}, "'set' is a required property"),
    ({"soname": "/usr/lib/libhipblas.so.3", "provided_by": "x", "set": "rocm7"}, "does not match"),
    ({"soname": "libhipblas.so.3", "provided_by": "", "set": "rocm7"}, "should be non-empty"),
    ({"soname": "libhipblas.so.3", "provided_by": "x", "set": "rocm7", "extra": 1}, "Additional properties"),
    ({"soname": "libhipblas.so.3", "provided_by": 7, "set": "rocm7"}, "is not of type 'string'"),
])
def test_manifest_refuses_a_bad_entry_in_one_line(tmp_path, entry, where):
    path = write_manifest(tmp_path, ["ds4-rocm"], layout="per-backend")
    data = json.loads(path.read_text())
    data["backends"]["ds4-rocm"]["host_libraries"] = [entry]
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=re.escape(where)) as e:
        load_manifest(path)
    assert "backends/ds4-rocm/host_libraries" in str(e.value) and "\n" not in str(e.value)


def test_manifest_refuses_a_soname_listed_twice(tmp_path):
    path = with_host_libraries(write_manifest(tmp_path, ["ds4-rocm"], layout="per-backend"), {"ds4-rocm": (HIP, HIP)})
    with pytest.raises(ManifestError, match="host_libraries: libamdhip64.so.7 listed twice"):
        load_manifest(path)


# --- route: tables over the pure function ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rocm_bundles(tmp_path_factory):
    def make(name, backends, libs):
        p = tmp_path_factory.mktemp(name)
        return load_manifest(with_host_libraries(write_manifest(p, backends, bundle=name, layout="per-backend"), libs))

    return {
        "lean": make("lean", ["rocm", "cpu"], {"rocm": ROCM7}),
        "rocm-only": make("rocm-only", ["rocm"], {"rocm": ROCM7}),
        "ds4": make("ds4", ["ds4-rocm", "ds4-cpu", "cpu"], {"ds4-rocm": (HIP, HIPBLAS)}),
        "ds4-rocm-only": make("ds4-rocm-only", ["ds4-rocm", "cpu"], {"ds4-rocm": (HIP, HIPBLAS)}),
        "adaptive": make("adaptive", ["vulkan", "rocm", "cpu"], {"rocm": ROCM7}),
        "gpu-only": make("gpu-only", ["hrx", "rocm"], {"hrx": (HIP,), "rocm": ROCM7}),
    }


def _route(models, bundles, bundle, model="dense", host=NONE, **flags):
    facts = inspect_model(models[model])
    renv = RouteEnv(env={}, free_ports=(41001, 41002), host_libs=host)
    return route(facts, ServeFlags(model=str(models[model]), **flags), bundles[bundle], renv)


MISSING = f"libamdhip64.so.7, libhipblas.so.3, librocblas.so.5 missing; provided by {HIP.provided_by} / " \
          f"{HIPBLAS.provided_by} / {ROCBLAS.provided_by}"
DS4_MISSING = f"libamdhip64.so.7, libhipblas.so.3 missing; provided by {HIP.provided_by} / {HIPBLAS.provided_by}"


# (bundle, model, flags, host libraries found, the refusal's rule and message | the backend that serves and its notes)
ROUTES = [
    ("lean", "dense", {"device": "rocm"}, NONE, ("host-libraries", f"--device rocm: the rocm backend cannot run on this host: {MISSING}")),
    ("lean", "dense", {"device": "rocm"}, ROCM6, ("host-libraries", "--device rocm: the rocm backend cannot run on this host: "
     "libamdhip64.so.7, libhipblas.so.3, librocblas.so.5 missing (libamdhip64.so.6 (ROCm 6), libhipblas.so.2 (ROCm 6), "
     f"librocblas.so.4 (ROCm 6) are installed, another major); provided by {HIP.provided_by} / {HIPBLAS.provided_by} / "
     f"{ROCBLAS.provided_by}")),
    ("lean", "dense", {"device": "rocm"}, ALL, ("rocm", ())),
    ("lean", "dense", {"device": "rocm"}, None, ("rocm", ())),  # not looked up: taken as able to start
    ("lean", "dense", {}, NONE, ("cpu", (f"rocm cannot run on this host ({MISSING}); cpu serves instead",))),
    ("lean", "dense", {}, ALL, ("rocm", ())),
    ("lean", "rot", {}, NONE, ("host-libraries", "rot.gguf is Hadamard-rotated and needs the lean ROCm build: "
                                f"the rocm backend cannot run on this host: {MISSING}")),
    ("rocm-only", "dense", {}, NONE, ("host-libraries", "no backend in this bundle can serve dense.gguf on this host: "
                                      f"the rocm backend cannot run on this host: {MISSING}")),
    ("gpu-only", "dense", {}, NONE, ("host-libraries", "no backend in this bundle can serve dense.gguf on this host: "
                                     f"the hrx backend cannot run on this host: libamdhip64.so.7 missing; provided by "
                                     f"{HIP.provided_by} | the rocm backend cannot run on this host: {MISSING}")),
    ("gpu-only", "dense", {}, {**NONE, "libamdhip64.so.7": ALL["libamdhip64.so.7"]},
     ("hrx", ())),  # hrx needs only HIP, which is found: auto takes it
    ("adaptive", "moe", {"adaptive": True}, NONE, ("host-libraries", "--device rocm: the rocm backend cannot run on this host: "
                                                   f"{MISSING}")),
    # --device ds4: the ds4 variants in their order; one that cannot start here is passed over, with a note
    ("ds4", "pkg", {"device": "ds4"}, NONE, ("ds4-cpu", (f"ds4-rocm cannot run on this host ({DS4_MISSING}); ds4-cpu "
                                                         "serves instead",))),
    ("ds4", "pkg", {}, NONE, ("ds4-cpu", (f"ds4-rocm cannot run on this host ({DS4_MISSING}); ds4-cpu serves instead",))),
    ("ds4", "pkg", {"device": "ds4"}, ALL, ("ds4-rocm", ())),
    ("ds4-rocm-only", "pkg", {}, NONE, ("host-libraries", "model.1bp is a 1BP package, only ds4 serves it: the ds4-rocm "
                                        f"backend cannot run on this host: {DS4_MISSING}")),
    ("ds4-rocm-only", "dense", {}, NONE, ("cpu", ())),  # another device's backend is not named
    # a llama-server the user names is not the bundle's program: its libraries are its own business
    ("lean", "dense", {"device": "rocm", "llama_server": "/opt/mine/llama-server"}, NONE, ("rocm", ())),
]


@pytest.mark.parametrize("bundle,model,flags,host,want", ROUTES)
def test_route_with_host_libraries(models, rocm_bundles, bundle, model, flags, host, want):
    plan = _route(models, rocm_bundles, bundle, model, host, **flags)
    if isinstance(plan, Refusal):
        assert (plan.rule, plan.message) == want
        assert "\n" not in plan.message
        return
    assert isinstance(plan, LaunchPlan), plan
    c = plan.children[-1]
    ds4_notes = tuple(n for n in c.notes if "cannot run on this host" in n)
    assert (c.backend, ds4_notes) == want


# --- `1bit check` ----------------------------------------------------------------------------------------------------

# (host libraries found, the host's nodes, the row: devices seen, unproven, ok)
CHECK_ROWS = [
    (NONE, (), ("none", f"ROCm0: cannot run here ({DS4_MISSING}); no /dev/kfd on this host: no AMD GPU driver", True)),
    (NONE, (KFD,), (f"FAIL: ds4-server cannot start here: {DS4_MISSING}", "", False)),
    (ROCM6, (), ("none", "ROCm0: cannot run here (libamdhip64.so.7, libhipblas.so.3 missing (libamdhip64.so.6 (ROCm 6), "
                 f"libhipblas.so.2 (ROCm 6) are installed, another major); provided by {HIP.provided_by} / "
                 f"{HIPBLAS.provided_by}); no /dev/kfd on this host: no AMD GPU driver", True)),
    (ALL, (), ("none", "ROCm0: ds4-server cannot say which device it uses", True)),  # ran (--help)
]


@pytest.mark.parametrize("found,nodes,want", CHECK_ROWS)
def test_check_row(tmp_path, found, nodes, want):
    from test_check import stub_bundle

    path = with_host_libraries(stub_bundle(tmp_path, ["ds4-rocm"], {"ds4-rocm": ""}), {"ds4-rocm": (HIP, HIPBLAS)})
    env = {k: v for k, v in os.environ.items() if k != "ONEBIT_STUB_DEVICES"}
    (r,) = check(load_manifest(path), env=env, nodes=nodes, host_libs=found)
    assert (r.seen, r.unproven, r.ok) == want


def _prefix(tmp_path: Path, backends=("ds4-rocm", "ds4-cpu", "rocm", "cpu")) -> Path:
    """An installed prefix of recording stubs whose ROCm backends list the ROCm 7 host libraries."""
    from test_check import stub_bundle

    prefix = tmp_path / "prefix"
    path = stub_bundle(prefix, list(backends), {b: "" for b in backends})
    libs = {b: ROCM7 if b == "rocm" else (HIP, HIPBLAS) for b in backends if b in ("rocm", "ds4-rocm")}
    return with_host_libraries(path, libs)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_") and k != "LD_LIBRARY_PATH"}
    env.update(PYTHONPATH=str(SRC), COLUMNS="2000", **extra)  # one table line per row
    return env


def _rows(out: str) -> dict[str, str]:
    """`1bit check`'s rows (plain aligned rows off a terminal): backend -> its line."""
    rows = {}
    lines = out.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("backend ")), len(lines))
    for line in lines[start + 2:]:
        if line.strip() and not line.startswith("1bit check:"):
            rows[line.split()[0]] = line
    return rows


def _check_cli(manifest: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*ONEBIT, "check", "--manifest", str(manifest)], env=env, capture_output=True, text=True,
                          timeout=120)


@needs_no_rocm
def test_1bit_check_names_the_missing_sonames(tmp_path):
    """The real CLI on this host (no ROCm 7): the ROCm rows name every missing SONAME and its provider, and their
    programs are not run; with the libraries on LD_LIBRARY_PATH they are, and the rows are the usual ones."""
    manifest = _prefix(tmp_path)
    rec = tmp_path / "rec"
    rec.mkdir()
    r = _check_cli(manifest, _env(ONEBIT_STUB_RECORD=str(rec)))
    kfd = Path(KFD).exists()
    assert r.returncode == (1 if kfd else 0), r.stdout + r.stderr
    rows = _rows(r.stdout)
    assert f"ROCm0: cannot run here ({MISSING})" in rows["rocm"] or kfd
    assert f"ROCm0: cannot run here ({DS4_MISSING})" in rows["ds4-rocm"] or kfd
    if not kfd:
        assert "1bit check: 2 backend(s) unproven: ds4-rocm, rocm" in r.stdout
    probes = [json.loads(line)[0] for line in (rec / "probes.jsonl").read_text().splitlines()]
    assert not any("ds4-rocm" in p or "lean-rocm" in p for p in probes), probes  # never started
    assert any("ds4-cpu" in p for p in probes)

    libs = tmp_path / "rocm7"
    for h in ROCM7:
        make_lib(libs, h.soname)
    r = _check_cli(manifest, _env(LD_LIBRARY_PATH=str(libs)))
    assert "cannot run here" not in r.stdout and "missing" not in r.stdout, r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


@needs_no_rocm
def test_1bit_check_names_a_different_major(tmp_path):
    manifest = _prefix(tmp_path, ("ds4-rocm", "cpu"))
    rocm6 = tmp_path / "rocm6"
    make_lib(rocm6, "libamdhip64.so.6")
    make_lib(rocm6, "libhipblas.so.2")
    make_lib(rocm6, "libhipblas.so.3", "libhipblas.so.3.2")  # the real file without its SONAME link: not found
    r = _check_cli(manifest, _env(LD_LIBRARY_PATH=str(rocm6)))
    assert ("libamdhip64.so.7, libhipblas.so.3 missing (libamdhip64.so.6 (ROCm 6), libhipblas.so.2 (ROCm 6) are "
            "installed, another major)") in r.stdout, r.stdout


@needs_no_rocm
def test_1bit_serve_refuses_in_one_line(tmp_path, models):
    """`1bit serve --device rocm` (the real CLI): the refusal is the first stderr line and the refusal file's line
    (Lemonade's onebit backend reads it), exit 3; --dry-run prints it as JSON. With the libraries on
    LD_LIBRARY_PATH the same command plans the rocm backend; --device auto passes it over with a note."""
    manifest = _prefix(tmp_path)
    refusal = tmp_path / "refusal.txt"
    argv = [*ONEBIT, "serve", "-m", str(models["dense"]), "--device", "rocm", "--manifest", str(manifest)]
    r = subprocess.run(argv, env=_env(ONEBIT_SERVE_REFUSAL_FILE=str(refusal)), capture_output=True, text=True, timeout=60)
    line = f"1bit serve: refused: --device rocm: the rocm backend cannot run on this host: {MISSING}"
    assert (r.returncode, r.stderr) == (3, line + "\n")
    assert refusal.read_text() == line + "\n"

    r = subprocess.run([*argv, "--dry-run"], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert json.loads(r.stdout) == {"ok": False, "refused": "host-libraries", "message": line.split("refused: ", 1)[1]}

    libs = tmp_path / "rocm7"
    for h in ROCM7:
        make_lib(libs, h.soname)
    r = subprocess.run([*argv, "--dry-run"], env=_env(LD_LIBRARY_PATH=str(libs)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["children"][0]["backend"] == "rocm"

    auto = [*ONEBIT, "serve", "-m", str(models["pkg"]), "--manifest", str(manifest), "--dry-run"]
    r = subprocess.run(auto, env=_env(), capture_output=True, text=True, timeout=60)
    child = json.loads(r.stdout)["children"][0]
    assert (r.returncode, child["backend"]) == (0, "ds4-cpu")
    assert child["notes"][0] == f"ds4-rocm cannot run on this host ({DS4_MISSING}); ds4-cpu serves instead"


# --- the stand-ins for the user's ROCm, from the pinned root's real libraries ---------------------------------------


@pytest.fixture(scope="module")
def rocm_root() -> Path:
    from strix_root import strix_root

    return strix_root().path


@pytest.fixture(scope="module")
def stubs_module():
    """scripts/rocm_stubs.py, loaded by its path: scripts/ on sys.path would make `import nox` its nox.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rocm_stubs", SRC / "scripts" / "rocm_stubs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["rocm_stubs"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stubs(rocm_root, stubs_module, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stubs") / "rocm7"
    r = subprocess.run([sys.executable, str(SRC / "scripts" / "rocm_stubs.py"), str(out), "--root", str(rocm_root)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def test_stubs_carry_the_real_sonames_versions_and_symbols(rocm_root, stubs, stubs_module):
    """Every stub exports exactly what the real library of the root exports: each symbol's name, kind, binding,
    version node (default or hidden) and, for data, size; the same version nodes with the same parents; the same
    SONAME; and the real NEEDED entries among the stubbed libraries and the C/C++ runtime."""
    rs = stubs_module
    record = json.loads((stubs / "stubs.json").read_text())
    assert sorted(record["libraries"]) == sorted(rs.ROCM7)
    for soname in rs.ROCM7:
        real = rs.read_library(rs.find_in_root(rocm_root, soname))
        stub = rs.read_library(stubs / soname)

        def exported(lib):
            return {(s.name, s.kind, s.weak, s.version, s.default, 0 if s.kind == "func" else s.size) for s in lib.symbols}

        assert stub.soname == real.soname == soname
        assert stub.versions == real.versions, soname
        assert exported(stub) == exported(real), soname
        assert stub.needed == tuple(n for n in real.needed if n in rs.ROCM7 or n in rs.BASE), soname
    assert stubs_module.read_library(stubs / "libamdhip64.so.7").versions[0] == ("hip_4.2", None)
    assert record["libraries"]["libhsa-runtime64.so.1"]["left_to_the_host"] == [
        "libelf.so.1", "libdrm.so.2", "libdrm_amdgpu.so.1", "libnuma.so.1"]


PROGRAM = r"""
#include <stdio.h>
int hipGetDeviceCount(int *count);
const char *hipGetErrorString(int error);
int hipblasCreate(void **handle);
int main(int argc, char **argv) {
    int n = -1;
    int e = hipGetDeviceCount(&n);
    void *h = 0;
    printf("hipGetDeviceCount: %d (%s), %d devices; hipblasCreate: %d\n", e, hipGetErrorString(e), n, hipblasCreate(&h));
    return n == 0 ? 0 : 1;
}
"""


@pytest.fixture(scope="module")
def rocm_program(rocm_root, tmp_path_factory) -> Path:
    """A tiny program linked against the root's REAL libamdhip64.so.7 and libhipblas.so.3 (by their files, so they
    are its NEEDED; never -L the root's multiarch directory, whose libc would win), as ds4-server links them: it
    needs the versioned hipGetDeviceCount of HIP's version nodes."""
    d = tmp_path_factory.mktemp("program")
    (d / "main.c").write_text(PROGRAM)
    lib = rocm_root / "usr" / "lib" / "x86_64-linux-gnu"
    out = d / "ds4-server"
    subprocess.run([cc(), "-o", out, d / "main.c", lib / "libamdhip64.so.7", lib / "libhipblas.so.3",
                    f"-Wl,-rpath-link,{lib}", "-Wl,--allow-shlib-undefined"], check=True)
    return out


def test_a_program_linked_against_the_real_rocm_starts_with_the_stubs(rocm_program, stubs):
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with open(rocm_program, "rb") as f:
        elf = ELFFile(f)
        needs = {(v.name, a.name) for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection)
                 for v, auxs in s.iter_versions() for a in auxs}
    assert any(lib == "libamdhip64.so.7" and ver.startswith("hip_") for lib, ver in needs), needs

    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if not host_has_rocm7():
        r = subprocess.run([rocm_program], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 127, r
        assert re.search(r"error while loading shared libraries: lib(amdhip64\.so\.7|hipblas\.so\.3)", r.stderr)
    r = subprocess.run([rocm_program], env={**env, "LD_LIBRARY_PATH": str(stubs)}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("hipGetDeviceCount: 100 (no ROCm device (a stand-in HIP runtime)), 0 devices; "
                        "hipblasCreate: 1\n")


@needs_no_rocm
def test_1bit_check_and_serve_pass_with_the_stubs(tmp_path, rocm_program, stubs, models):
    """The real program as the ds4-rocm backend's ds4-server of an installed prefix: without the ROCm runtime
    `1bit check` names the missing SONAMEs and runs nothing, `1bit serve --device ds4` refuses in one line; with the
    stand-ins on LD_LIBRARY_PATH check runs it (--help: it starts, the GPU stays unproven) and serve plans it."""
    manifest = _prefix(tmp_path, ("ds4-rocm", "cpu"))
    shutil.copy(rocm_program, manifest.parent.parent.parent / "libexec/onebit/ds4-rocm/bin/ds4-server")
    kfd = Path(KFD).exists()

    r = _check_cli(manifest, _env())
    assert f"cannot run here ({DS4_MISSING})" in r.stdout or (kfd and f"cannot start here: {DS4_MISSING}" in r.stdout)
    assert r.returncode == (1 if kfd else 0)
    serve = [*ONEBIT, "serve", "-m", str(models["pkg"]), "--device", "ds4", "--manifest", str(manifest), "--dry-run"]
    r = subprocess.run(serve, env=_env(), capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr.splitlines()) == (3, [
        "1bit serve: refused: model.1bp is a 1BP package, only ds4 serves it: the ds4-rocm backend cannot run on this "
        f"host: {DS4_MISSING}"])

    r = _check_cli(manifest, _env(LD_LIBRARY_PATH=str(stubs)))
    assert r.returncode == 0, r.stdout + r.stderr
    row = _rows(r.stdout)["ds4-rocm"]
    assert "ROCm0: ds4-server cannot say which device it uses" in row and "FAIL" not in row, row
    r = subprocess.run(serve, env=_env(LD_LIBRARY_PATH=str(stubs)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["children"][0]["backend"] == "ds4-rocm"
