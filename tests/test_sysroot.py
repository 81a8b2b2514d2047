"""The portability sysroot: the flags each compiler family takes (tables over builders/roots/sysroot.py), the link stand-ins
capped at the floor (builders/roots/linkstub.py), and real builds against the pinned Debian 12 packages, read with the
project's ELF reader: what they need stays at or below the floor (GLIBC_2.34, GLIBCXX_3.4.29, CXXABI_1.3.13)."""
from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from builders.project import config
from builders.io import elf
from builders.roots import linkstub, sysroot
from builders.inputs import toolchain
from builders.inputs.host import pinned_root
from builders.roots.sysroot import HostLibs, Sysroot
from conftest import missing_host_tool

ROOT = Path(__file__).resolve().parent.parent
SR = Sysroot("/c/t")
S = "/c/t/debian"
LIBS = ("-L/c/t/floor", f"-L{S}/usr/lib/x86_64-linux-gnu", f"-L{S}/lib/x86_64-linux-gnu")
CXX_INC = ("-isystem", f"{S}/usr/include/c++/11", "-isystem", f"{S}/usr/include/x86_64-linux-gnu/c++/11",
           "-isystem", f"{S}/usr/include/c++/11/backward")
GCC_LINK = (f"--sysroot={S}", f"-B{S}/usr/lib/x86_64-linux-gnu/", *LIBS)
TRAITS = ("-D__is_nothrow_convertible=__onebit__is_nothrow_convertible", "-D__is_convertible=__onebit__is_convertible",
          "-D__remove_cv=__onebit__remove_cv", "-D__remove_reference=__onebit__remove_reference",
          "-D__remove_cvref=__onebit__remove_cvref")  # gcc 11's helper names, which g++ 13 and nvcc take as built-ins


# ---- pure: the flags ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, compile_, link", [
    ("gcc", (f"--sysroot={S}",), GCC_LINK),
    ("g++", (f"--sysroot={S}", "-nostdinc++", *TRAITS, *CXX_INC), GCC_LINK),
    ("clang", (f"--sysroot={S}", f"--gcc-toolchain={S}/usr"), (f"--sysroot={S}", f"--gcc-toolchain={S}/usr", *LIBS)),
    ("clang++", (f"--sysroot={S}", f"--gcc-toolchain={S}/usr"), (f"--sysroot={S}", f"--gcc-toolchain={S}/usr", *LIBS)),
    ("hipcc", (f"--sysroot={S}", f"--gcc-toolchain={S}/usr"), (f"--sysroot={S}", f"--gcc-toolchain={S}/usr", *LIBS)),
    ("nvcc", (f"-Xcompiler=--sysroot={S}", "-Xcompiler=-nostdinc++", *TRAITS, *CXX_INC),
     (f"-Xcompiler=--sysroot={S}", f"-Xcompiler=-B{S}/usr/lib/x86_64-linux-gnu/", *LIBS)),
    ("zig", ("-Dtarget=x86_64-linux-gnu.2.34",), ()),
    ("rustc-linker", (), tuple(f"-Clink-arg={a}" for a in GCC_LINK)),
])
def test_flags_of_each_family(family, compile_, link):
    f = sysroot.flags(family, SR)
    assert (f.compile, f.link) == (compile_, link)
    assert f.both == compile_ + tuple(a for a in link if a not in compile_)


def test_host_libraries_are_linked_by_name_never_through_the_roots_multiarch_dir():
    hl = HostLibs("/w/hostlibs", ("/usr/lib/x86_64-linux-gnu",))
    link = sysroot.flags("hipcc", SR, host_libs=hl).link
    assert link[-3:] == ("-L/w/hostlibs", "-Wl,-rpath-link,/usr/lib/x86_64-linux-gnu", "-Wl,--allow-shlib-undefined")
    assert "-L/usr/lib/x86_64-linux-gnu" not in link  # the root's libc.so would win over the sysroot's
    assert link.index("-L/c/t/floor") < link.index("-L/w/hostlibs")
    with pytest.raises(ValueError, match="nvcc"):
        sysroot.flags("nvcc", SR, host_libs=hl)
    with pytest.raises(ValueError, match="unknown compiler family 'icc'"):
        sysroot.flags("icc", SR)


@pytest.mark.parametrize("glibc, arch, target", [
    ("2.34", "x86_64", "x86_64-linux-gnu.2.34"),
    ("2.28", "x86_64", "x86_64-linux-gnu.2.28"),
    ("2.34", "aarch64", "aarch64-linux-gnu.2.34"),
])
def test_glibc_target(glibc, arch, target):
    assert sysroot.glibc_target(glibc, arch) == target


def test_the_projects_floor_caps_the_stand_ins_at_manylinux_2_34():
    floor = config.load_project(ROOT).floor
    assert floor.caps() == {"GLIBC": "2.34", "GLIBCXX": "3.4.29", "CXXABI": "1.3.13", "GCC": "7.0.0"}
    assert floor.glibc == sysroot.DEFAULT_GLIBC


@pytest.mark.parametrize("command, family", [
    ("cc", "gcc"), ("gcc", "gcc"), ("/usr/bin/gcc-16", "gcc"), ("x86_64-linux-gnu-gcc-14", "gcc"),
    ("c++", "g++"), ("g++-12", "g++"), ("x86_64-linux-gnu-g++", "g++"), ("clang", "clang"), ("clang-22", "clang"),
    ("clang++-22", "clang++"), ("/usr/bin/hipcc", "hipcc"), ("/opt/cuda/bin/nvcc", "nvcc"), ("zig", "zig"),
    ("/usr/bin/ccache cc -ffile-prefix-map=/a=/b", "gcc"), ("ccache /usr/bin/hipcc", "hipcc"),
    ("make", None), ("", None), ("icx", None),
])
def test_compiler_family(command, family):
    assert sysroot.compiler_family(command) == family


def test_make_variables_give_each_compiler_both_sets():
    hl = HostLibs("/w/h", ("/usr/lib/x86_64-linux-gnu",))
    out = sysroot.make_variables({"CC": "cc -ffile-prefix-map=/a=/b", "GPU_CC": "/usr/bin/hipcc", "NVCC": "nvcc",
                                  "ROCM_ARCH": "gfx1151", "CXX": "icx", "CUDA_HOME": "/usr/local/cuda",
                                  "programs": "ds4 ds4-server", "NATIVE_CPU_FLAG": "-march=x86-64-v3"}, SR, host_libs=hl)
    assert out["CC"] == " ".join(["cc -ffile-prefix-map=/a=/b", *sysroot.flags("gcc", SR).both])
    assert out["GPU_CC"] == " ".join(["/usr/bin/hipcc", *sysroot.flags("hipcc", SR, host_libs=hl).both])
    assert out["NVCC"] == " ".join(["nvcc", *sysroot.flags("nvcc", SR).both])
    for k in ("ROCM_ARCH", "CXX", "CUDA_HOME", "programs", "NATIVE_CPU_FLAG"):  # no known compiler: as they were
        assert out[k] == {"ROCM_ARCH": "gfx1151", "CXX": "icx", "CUDA_HOME": "/usr/local/cuda", "programs": "ds4 ds4-server",
                          "NATIVE_CPU_FLAG": "-march=x86-64-v3"}[k]
    assert "-L/w/h" not in out["CC"]  # ds4's CC links no ROCm library


def test_cmake_toolchain_for_gcc_and_nvcc():
    text = sysroot.cmake_toolchain(SR, {"C": "gcc", "CXX": "g++", "CUDA": "nvcc"})
    lines = text.splitlines()
    assert f'set(CMAKE_SYSROOT "{S}")' in lines
    assert f'set(CMAKE_CXX_FLAGS_INIT "-nostdinc++ {" ".join(TRAITS)}")' in lines
    inc = f'"{S}/usr/include/c++/11" "{S}/usr/include/x86_64-linux-gnu/c++/11" "{S}/usr/include/c++/11/backward"'
    assert f"set(CMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES {inc})" in lines
    assert f"set(CMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES {inc})" in lines
    assert f'set(CMAKE_CUDA_FLAGS_INIT "-Xcompiler=--sysroot={S} -Xcompiler=-nostdinc++ {" ".join(TRAITS)}")' in lines
    assert not any(line.startswith("set(CMAKE_C_FLAGS_INIT") for line in lines)  # CMAKE_SYSROOT is all C needs
    for kind in ("EXE", "SHARED", "MODULE"):
        assert f'set(CMAKE_{kind}_LINKER_FLAGS_INIT "{" ".join(GCC_LINK)}")' in lines


def test_cmake_toolchain_for_clang_and_hip():
    hl = HostLibs("/w/h", ("/usr/lib/x86_64-linux-gnu",))
    lines = sysroot.cmake_toolchain(SR, {"C": "clang", "CXX": "clang++", "HIP": "clang++"}, host_libs=hl).splitlines()
    assert f'set(CMAKE_HIP_FLAGS_INIT "--gcc-toolchain={S}/usr")' in lines
    assert f'set(CMAKE_CXX_FLAGS_INIT "--gcc-toolchain={S}/usr")' in lines
    assert not any("STANDARD_INCLUDE_DIRECTORIES" in line or "nostdinc" in line for line in lines)
    link = " ".join(sysroot.flags("clang++", SR, host_libs=hl).link)
    assert f'set(CMAKE_SHARED_LINKER_FLAGS_INIT "{link}")' in lines
    with pytest.raises(ValueError, match="FORTRAN=gcc"):
        sysroot.cmake_toolchain(SR, {"FORTRAN": "gcc"})


# ---- pure: the link stand-ins ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version, key", [
    ("GLIBCXX_3.4.29", ("GLIBCXX", (3, 4, 29))), ("GLIBC_2.2.5", ("GLIBC", (2, 2, 5))), ("GCC_7.0.0", ("GCC", (7, 0, 0))),
    ("CXXABI_1.3", ("CXXABI", (1, 3))), ("CXXABI_TM_1", None), ("CXXABI_FLOAT128", None), ("GLIBC_PRIVATE", None),
])
def test_version_key(version, key):
    assert linkstub.version_key(version) == key


CAPS = {"GLIBCXX": "3.4.29", "CXXABI": "1.3.13"}


@pytest.mark.parametrize("version, ok", [
    ("GLIBCXX_3.4.29", True), ("GLIBCXX_3.4.30", False), ("GLIBCXX_3.4", True), ("CXXABI_1.3.13", True),
    ("CXXABI_1.3.15", False), ("CXXABI_TM_1", True), ("GCC_12.0.0", True), (None, True),
])
def test_allowed(version, ok):
    assert linkstub.allowed(version, CAPS) is ok


def test_capped_drops_newer_versions_and_moves_the_default_back():
    """libstdc++ 12's condition_variable::wait: @@GLIBCXX_3.4.30 (dropped) and @GLIBCXX_3.4.11 (the default again)."""
    wait = "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE"
    syms = [linkstub.Symbol(wait, "GLIBCXX_3.4.30", True), linkstub.Symbol(wait, "GLIBCXX_3.4.11", False),
            linkstub.Symbol("_ZSt8to_charsPcS_d", "GLIBCXX_3.4.29", True),
            linkstub.Symbol("__cxa_call_terminate", "CXXABI_1.3.15", True),
            linkstub.Symbol("_ZSt4cout", "GLIBCXX_3.4", True, "object", size=272, align=32),
            linkstub.Symbol("_ZNSs4_Rep11_S_terminalE", "GLIBCXX_3.4", False, "object", size=1)]
    out = linkstub.capped(syms, CAPS)
    assert [(s.name, s.version, s.default) for s in out] == [
        ("_ZNSs4_Rep11_S_terminalE", "GLIBCXX_3.4", False),  # a hidden version with no default stays hidden
        (wait, "GLIBCXX_3.4.11", True), ("_ZSt4cout", "GLIBCXX_3.4", True), ("_ZSt8to_charsPcS_d", "GLIBCXX_3.4.29", True)]


def test_assembly_and_version_script():
    syms = [linkstub.Symbol("f", "V_1.1", True), linkstub.Symbol("f", "V_1.0", False),
            linkstub.Symbol("obj", "V_1.0", True, "object", size=24, align=8),
            linkstub.Symbol("tls", "V_1.0", True, "tls", size=8, align=8, weak=True), linkstub.Symbol("plain", None, True)]
    text = linkstub.assembly(syms)
    assert ".symver __onebit_stub_0,f@@V_1.1" in text and ".symver __onebit_stub_1,f@V_1.0" in text
    assert "  .zero 24\n.size __onebit_stub_2,24" in text and ".balign 8" in text
    assert ".type __onebit_stub_3,@tls_object" in text and ".weak __onebit_stub_3" in text
    assert ".globl plain\n.type plain,@function\nplain:" in text  # unversioned: defined under its own name
    assert linkstub.version_script(syms) == "V_1.0 { };\nV_1.1 { };\nONEBIT_STUB_LOCAL { local: __onebit_stub_*; };\n"
    with pytest.raises(ValueError, match="unknown kind"):
        linkstub.assembly([linkstub.Symbol("x", None, True, "ifunc")])


# ---- real: the pinned packages, assembled; real compilers, real links ----------------------------------------------------
def _pinned_tool():
    """floor.yaml's sysroot, as every compiled variant of the project carries it (and only those)."""
    project = config.load_project(ROOT)
    carriers = {r.variant(n).id: r.variant(n) for r in project.recipes.values() for n in r.variant_names()}
    tools = {v: t for v, variant in carriers.items() for t in variant.toolchain if t.tool == "sysroot"}
    # every cmake, make and cargo variant, and a script that runs CMake itself ({sysroot:cmake}: hrx)
    assert set(tools) == {v for v, variant in carriers.items() if variant.kind in config.SYSROOT_KINDS} | {"hrx"}
    assert len({(t.debs, t.floor) for t in tools.values()}) == 1  # one input, declared once
    return next(iter(tools.values()))


FLOOR_CAPS = {"GLIBC": "2.34", "GLIBCXX": "3.4.29", "CXXABI": "1.3.13", "GCC": "7.0.0"}  # floor.yaml's


@pytest.fixture(scope="module")
def assembled(tmp_path_factory) -> Path:
    """The sysroot floor.yaml pins, fetched (sha256-checked) and assembled by the toolchain step's own entry point."""
    tool = _pinned_tool()
    cache = tmp_path_factory.mktemp("sysroot-cache")
    root = pinned_root(tool, cache / "toolchains")
    toolchain.fetch_and_assemble((), cache / "downloads", root, debs=tool.debs,
                                 floor=(tool.floor[0], dict(tool.floor[1])))
    return root


def _needs(path: Path) -> dict[str, str]:
    """The highest version of each family (GLIBC, GLIBCXX, CXXABI, GCC) the ELF file needs."""
    best: dict[str, tuple] = {}
    for _, version in elf.read(path).version_needs:
        key = linkstub.version_key(version)
        if key and (key[0] not in best or key[1] > best[key[0]]):
            best[key[0]] = key[1]
    return {k: ".".join(map(str, v)) for k, v in best.items()}


def _within_floor(path: Path) -> list[str]:
    caps = FLOOR_CAPS
    return [f"{path.name}: {k}_{v}" for k, v in _needs(path).items() if not linkstub.allowed(f"{k}_{v}", caps)]


PROGRAM = textwrap.dedent("""\
    #include <charconv>
    #include <condition_variable>
    #include <cstdio>
    #include <mutex>
    #include <string>
    #include <thread>
    #include <vector>
    extern "C" double lib_sqrt(double);
    int main(int argc, char **argv) {
      std::vector<std::string> args(argv, argv + argc);
      std::mutex m; std::condition_variable cv; bool done = false;
      std::thread t([&] { std::lock_guard<std::mutex> g(m); done = true; cv.notify_one(); });
      { std::unique_lock<std::mutex> l(m); cv.wait(l, [&] { return done; }); }
      t.join();
      char buf[32]; auto r = std::to_chars(buf, buf + sizeof buf, lib_sqrt(2.25));
      std::printf("floor %.*s %zu\\n", (int)(r.ptr - buf), buf, args.size());
      return 0;
    }
    """)
LIBRARY = "#include <math.h>\ndouble lib_sqrt(double x) { return sqrt(x); }\n"


def test_the_assembly_adds_link_standins_capped_at_the_floor(assembled):
    sr = Sysroot(str(assembled))
    assert Path(sr.path, "usr/include/c++/11/vector").is_file()
    assert sorted(p.name for p in Path(sr.path, "usr/lib/gcc/x86_64-linux-gnu").iterdir()) == ["11"]  # clang's only GCC
    assert (Path(sr.floor) / "libstdc++.so").read_text().splitlines()[-1] == \
        f"INPUT({sysroot.NONSHARED[0]} {sysroot.STDCXX_STANDIN})"  # a link script: the archive, then the stand-in
    soname, syms = linkstub.read(Path(sr.floor) / sysroot.STDCXX_STANDIN)
    assert soname == "libstdc++.so.6"
    assert all(linkstub.allowed(s.version, FLOOR_CAPS) for s in syms)
    wait = [s for s in syms if s.name == "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE"]
    assert [(s.version, s.default) for s in wait] == [("GLIBCXX_3.4.11", True)]
    _, real = linkstub.read(Path(sr.path) / "usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    assert ("GLIBCXX_3.4.30", True) in [(s.version, s.default) for s in real if s.name == wait[0].name]
    soname, syms = linkstub.read(Path(sr.floor) / "libgcc_s.so")
    assert soname == "libgcc_s.so.1" and max(linkstub.version_key(s.version) for s in syms) == ("GCC", (7, 0, 0))


def test_gxx_builds_against_the_floor_and_the_program_runs(assembled, tmp_path):
    """The host's g++ with the g++ family's flags: every crt file and C library comes from the sysroot (not the host's
    multiarch dir, which Debian's gcc searches first), and what is built needs GLIBCXX_3.4.29 at most, where the same
    link against the real libstdc++ needs 3.4.30 (condition_variable::wait)."""
    gxx = shutil.which("g++")
    if gxx is None:
        missing_host_tool("g++ is not installed")
    sr = Sysroot(str(assembled))
    cc, cxx = sysroot.flags("gcc", sr), sysroot.flags("g++", sr)
    (tmp_path / "lib.c").write_text(LIBRARY)
    (tmp_path / "main.cpp").write_text(PROGRAM)
    subprocess.run(["gcc", *cc.both, "-O2", "-shared", "-fPIC", "-o", "liblib.so", "lib.c", "-lm"], cwd=tmp_path, check=True)
    trace = subprocess.run([gxx, *cxx.both, "-O2", "-pthread", "-o", "prog", "main.cpp", "-L.", "-llib",
                            "-Wl,-rpath,$ORIGIN", "-Wl,-t"], cwd=tmp_path, check=True, capture_output=True, text=True)
    used = [line for line in trace.stdout.splitlines() if re.search(r"(crt1|crti|libc|libm|libstdc\+\+)\.", line)]
    assert used and all(line.startswith(str(assembled)) for line in used), used
    assert _within_floor(tmp_path / "prog") == [] and _within_floor(tmp_path / "liblib.so") == []
    assert _needs(tmp_path / "prog")["GLIBCXX"] == "3.4.29"
    assert subprocess.run([str(tmp_path / "prog"), "x"], capture_output=True, text=True, check=True).stdout == "floor 1.5 2\n"
    # without the stand-ins (the sysroot's real libstdc++ first): the default version the link binds is 3.4.30
    real = [a for a in cxx.both if a != f"-L{sr.floor}"] + [f"-L{sr.path}/usr/lib/gcc/x86_64-linux-gnu/11"]
    subprocess.run([gxx, *real, "-O2", "-pthread", "-o", "prog-real", "main.cpp", "-L.", "-llib"], cwd=tmp_path, check=True)
    assert _needs(tmp_path / "prog-real")["GLIBCXX"] == "3.4.30"


NEWER_GXX = textwrap.dedent("""\
    // what g++ 14 emits where an exception leaves a noexcept function, called here by hand so any g++ makes the call
    #include <cstdio>
    #include <cstdlib>
    #include <exception>
    extern "C" void __cxa_call_terminate(void *) noexcept;
    extern "C" int lib_call(int argc) { if (argc > 1) __cxa_call_terminate(nullptr); return 0; }
    int main(int argc, char **) {
      std::set_terminate([] { std::puts("terminate"); std::exit(3); });
      return lib_call(argc);
    }
    """)


def test_what_a_newer_gxx_calls_is_linked_from_the_floor(assembled, tmp_path):
    """__cxa_call_terminate (CXXABI_1.3.15, g++ 14's) is not in the floor's libstdc++: the link script puts the floor's
    archive first, so a program and a shared library link it statically, hidden (never exported, never needed from the
    host's libstdc++), and it ends in the program's terminate handler as gcc 14's own does."""
    gxx = shutil.which("g++")
    if gxx is None:
        missing_host_tool("g++ is not installed")
    sr = Sysroot(str(assembled))
    cxx = sysroot.flags("g++", sr)
    (tmp_path / "main.cpp").write_text(NEWER_GXX)
    for out, extra in (("prog", ()), ("libcall.so", ("-shared", "-fPIC"))):
        subprocess.run([gxx, *cxx.both, *extra, "-O2", "-o", out, "main.cpp"], cwd=tmp_path, check=True)
        assert _within_floor(tmp_path / out) == [], out
        dynamic = subprocess.run(["nm", "-D", "--defined-only", out], cwd=tmp_path, capture_output=True, text=True)
        assert "__cxa_call_terminate" not in dynamic.stdout, out
    assert "CXXABI" in _needs(tmp_path / "prog")  # it does use the floor's libstdc++ (std::set_terminate)
    proc = subprocess.run([str(tmp_path / "prog"), "x"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (3, "terminate\n")
    assert subprocess.run([str(tmp_path / "prog")]).returncode == 0


def test_a_cmake_project_through_the_toolchain_file(assembled, tmp_path):
    """The cmake kind's way: `--toolchain` with the generated file; find_library finds the sysroot's libm, and a shared
    library, a module and a program all stay within the floor."""
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        missing_host_tool("cmake and ninja are needed")
    sr = Sysroot(str(assembled))
    src = tmp_path / "src"
    src.mkdir()
    (src / "lib.c").write_text(LIBRARY)
    (src / "main.cpp").write_text(PROGRAM)
    (src / "CMakeLists.txt").write_text(textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.21)
        project(floor C CXX)
        set(CMAKE_CXX_STANDARD 17)
        find_package(Threads REQUIRED)
        find_library(MATH m REQUIRED)
        message(STATUS "libm: ${MATH}")
        add_library(lib SHARED lib.c)
        target_link_libraries(lib PRIVATE ${MATH})
        add_library(plugin MODULE lib.c)
        add_executable(prog main.cpp)
        target_link_libraries(prog PRIVATE lib Threads::Threads)
        """))
    (tmp_path / "toolchain.cmake").write_text(sysroot.cmake_toolchain(sr, {"C": "gcc", "CXX": "g++"}))
    conf = subprocess.run(["cmake", "-S", src, "-B", tmp_path / "b", "-G", "Ninja", "--toolchain", tmp_path / "toolchain.cmake",
                           "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True)
    assert conf.returncode == 0, conf.stdout + conf.stderr
    assert f"libm: {sr.path}/usr/lib/x86_64-linux-gnu/libm.so" in conf.stdout
    subprocess.run(["cmake", "--build", tmp_path / "b"], check=True, capture_output=True)
    built = [tmp_path / "b" / n for n in ("prog", "liblib.so", "plugin.so")]
    assert [p for p in built if _within_floor(p)] == []
    assert _needs(built[0])["GLIBCXX"] == "3.4.29"  # condition_variable::wait@GLIBCXX_3.4.11, to_chars@3.4.29
    assert subprocess.run([str(built[0])], capture_output=True, text=True, check=True).stdout == "floor 1.5 1\n"
