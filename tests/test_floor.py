"""The floor (floor.yaml, builders/project/floor.py) and the stage gate that reads every shipped ELF file (issue 28).

Tables over the pure decisions; floor.yaml checked by `1bit-build validate`; the gate driven through the real build
of the mini project (tests/mini_project.py) with files compiled here by gcc that exceed the floor: a C++ library
binding a gcc 12-only libstdc++ symbol, a program calling glibc 2.36's arc4random, a library linking OpenMP's
libgomp.so.1, or an undeclared host set's libz.so.1 or libvulkan.so.1. Each ends in one error line, no traceback."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml
from conftest import missing_host_tool
from mini_project import add_twin, git, make_mini
from test_plan import facts

from builders.project import config, floor as floors
from builders.io import elf
from builders.cli import main
from builders.io.elf import ElfFacts
from builders.plan import make_plan
from builders.plan_types import Layout

ROOT = Path(__file__).resolve().parent.parent
PROJECT = config.load_project(ROOT)
FLOOR = PROJECT.floor
VENV_BIN = str(Path(sys.executable).parent)


# ---- the floor's data ------------------------------------------------------------------------------------------------
def test_the_floor_is_manylinux_2_34_with_auditwheels_ceilings():
    assert FLOOR.policy == "manylinux_2_34" and FLOOR.glibc == "2.34"
    assert {f: floors.ceiling(f, FLOOR.versions) for f in ("GLIBC", "GLIBCXX", "CXXABI", "GCC")} == {
        "GLIBC": "GLIBC_2.34", "GLIBCXX": "GLIBCXX_3.4.29", "CXXABI": "CXXABI_1.3.13", "GCC": "GCC_7.0.0"}


def test_the_base_is_on_auditwheels_manylinux_2_34_allow_list():
    """Read from auditwheel's bundled policy file itself (not through the API the floor uses): every base library but
    the ELF interpreter, which auditwheel always skips, is on manylinux_2_34's lib_whitelist."""
    policies = json.loads(resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text())
    whitelist = set(next(p for p in policies if p["name"] == "manylinux_2_34")["lib_whitelist"])
    assert set(FLOOR.base) == {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
                               "libresolv.so.2", "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1"}
    assert set(FLOOR.base) - {floors.INTERPRETER} <= whitelist
    assert "libgomp.so.1" not in whitelist and "libgomp.so.1" not in FLOOR.base


def test_host_sets_name_each_soname_with_what_provides_it():
    sonames = {name: [h.soname for h in libs] for name, libs in FLOOR.sets.items()}
    assert sonames["vulkan"] == ["libvulkan.so.1"] and sonames["cuda"] == ["libcuda.so.1"]
    assert {"libamdhip64.so.7", "libhipblas.so.3", "librocblas.so.5"} <= set(sonames["rocm7"])
    assert "libxrt_coreutil.so.2" in sonames["xrt"]
    hip = next(h for h in FLOOR.sets["rocm7"] if h.soname == "libamdhip64.so.7")
    assert "libamdhip64-7" in hip.provided_by and "TheRock" in hip.provided_by
    assert "libvulkan1" in FLOOR.sets["vulkan"][0].provided_by and "vulkan-loader" in FLOOR.sets["vulkan"][0].provided_by


def test_every_recipe_declares_the_host_sets_its_programs_link():
    declared = {v.id: v.host_libraries for r in PROJECT.recipes.values() for v in map(r.variant, r.variant_names())}
    assert declared == {"cpu": (), "serve": ("zlib",), "tokenizers": (), "laya": (), "ds4-cpu": (), "vulkan": ("vulkan",),
                        "zinc": ("vulkan",), "lean-vulkan": ("vulkan",), "hrx": ("vulkan",), "cuda": ("cuda",),
                        "ds4-cuda": ("cuda",), "ds4-rocm": ("rocm7",), "lean-rocm": ("rocm7",), "xdna": ("xrt",)}


def test_the_manifest_records_each_backends_host_libraries_and_packages_the_floors_glibc():
    plan = make_plan(PROJECT, "strix", facts(), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")))
    entry = plan.step("stage:ds4-rocm").data.manifest_entry
    assert entry["host_libraries"][0] == {"soname": "libamdhip64.so.7", "set": "rocm7",
                                          "provided_by": FLOOR.sets["rocm7"][0].provided_by}
    assert [h["soname"] for h in entry["host_libraries"]] == [h.soname for h in FLOOR.sets["rocm7"]]
    assert [h["set"] for h in plan.step("stage:vulkan").data.manifest_entry["host_libraries"]] == ["vulkan"]
    assert "host_libraries" not in plan.step("stage:cpu").data.manifest_entry  # the base only: nothing to check
    assert {s.data.glibc_floor for s in plan.steps if s.action == "package"} == {"2.34"}


def test_the_llama_cpp_builds_use_ggmls_thread_pool_not_openmp():
    """libgomp.so.1 is neither shipped nor allowed: cpu, vulkan and cuda configure ggml without OpenMP."""
    for bundle, variant in (("cpu", "cpu"), ("vulkan", "vulkan"), ("nvidia", "cuda")):
        plan = make_plan(PROJECT, bundle, facts(), Layout(ROOT, Path("/c"), Path("/w"), Path("/o")))
        configure = plan.step(f"build:{variant}").commands[0].argv
        assert "-DGGML_OPENMP=OFF" in configure, (variant, configure)


# ---- the pure decisions ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version, above", [
    ("GLIBC_2.2.5", False), ("GLIBC_2.34", False), ("GLIBC_2.35", True), ("GLIBC_2.42", True),
    ("GLIBC_PRIVATE", True), ("GLIBCXX_3.4.29", False), ("GLIBCXX_3.4.30", True), ("GLIBCXX_3.4.32", True),
    ("CXXABI_1.3.13", False), ("CXXABI_1.3.14", True), ("CXXABI_FLOAT128", False), ("GCC_7.0.0", False),
    ("GCC_12.0.0", True), ("GCC_3.0", False),
    ("hip_4.2", False), ("VERS_1.0", False), ("LLVM_22", False),  # a library's own versions: not the floor's
])
def test_which_symbol_versions_lie_above_the_floor(version, above):
    assert floors.above_floor(version, FLOOR.versions) is above


def needs(*pairs, needed=(), **kw) -> ElfFacts:
    return ElfFacts(needed=tuple(needed), version_needs=tuple(pairs), type=kw.pop("type", "ET_DYN"),
                    machine=kw.pop("machine", "EM_X86_64"), **kw)


@pytest.mark.parametrize("facts_, declared, expected", [
    (needs(("libc.so.6", "GLIBC_2.34"), needed=["libc.so.6"]), (), []),
    # the highest version above the floor of each family, one problem each
    (needs(("libstdc++.so.6", "GLIBCXX_3.4.30"), ("libstdc++.so.6", "GLIBCXX_3.4.32"), ("libc.so.6", "GLIBC_2.38"),
           ("libc.so.6", "GLIBC_2.42"), needed=["libstdc++.so.6", "libc.so.6"]), (),
     [("version", "libc.so.6", "GLIBC_2.42"), ("version", "libstdc++.so.6", "GLIBCXX_3.4.32")]),
    (needs(("libc.so.6", "GLIBC_PRIVATE"), needed=["libc.so.6"]), (), [("version", "libc.so.6", "GLIBC_PRIVATE")]),
    # shipped beside it, in the base, in a declared set: allowed
    (needs(needed=["libllama.so.0", "libm.so.6", "libvulkan.so.1"]), ("vulkan",), []),
    # in a set the recipe does not declare, or in none
    (needs(needed=["libvulkan.so.1"]), (), [("link", "libvulkan.so.1", "vulkan")]),
    (needs(needed=["libhipblas.so.3"]), ("vulkan",), [("link", "libhipblas.so.3", "rocm7")]),
    (needs(needed=["libgomp.so.1", "libz.so.1"]), ("vulkan", "cuda", "rocm7", "xrt"),
     [("link", "libgomp.so.1", ""), ("link", "libz.so.1", "zlib")]),
    # a kernel module: its vermagic, never its symbols; a GPU code object: not the host loader's
    (needs(("x", "GLIBC_2.99"), type="ET_REL", vermagic="7.2.13+deb14-amd64 SMP preempt mod_unload"), (), []),
    (needs(type="ET_REL"), (), [("module", "", "")]),
    (needs(("libc.so.6", "GLIBC_2.99"), machine="EM_AMDGPU"), (), []),
    (ElfFacts(error="bad section header"), (), [("unreadable", "bad section header", "")]),
])
def test_file_problems(facts_, declared, expected):
    found = floors.file_problems("lib/x.ko" if facts_.type == "ET_REL" else "lib/x.so", facts_,
                                 {"libllama.so.0"}, FLOOR, declared)
    assert [(p.kind, p.library, p.version or p.host_set) for p in found] == expected


def test_problem_lines_and_hints():
    above = floors.Problem("libexec/onebit/cpu/lib/libllama-common.so", "version", "libstdc++.so.6", "GLIBCXX_3.4.30",
                           symbol="std::condition_variable::wait(std::unique_lock<std::mutex>&)")
    assert above.line(FLOOR, ()) == (
        "libexec/onebit/cpu/lib/libllama-common.so needs GLIBCXX_3.4.30 of libstdc++.so.6 "
        "(std::condition_variable::wait(std::unique_lock<std::mutex>&)), above the floor manylinux_2_34 (GLIBCXX_3.4.29)")
    assert "pinned sysroot" in above.hint()
    undeclared = floors.Problem("bin/zinc", "link", "libvulkan.so.1", host_set="vulkan")
    assert "host set 'vulkan', which the recipe does not declare" in undeclared.line(FLOOR, ())
    assert undeclared.hint() == "declare it in the recipe: stage.host_libraries: [vulkan]"
    unknown = floors.Problem("lib/libggml-cpu.so", "link", "libgomp.so.1")
    assert unknown.line(FLOOR, ("vulkan",)).startswith("lib/libggml-cpu.so links libgomp.so.1, which is neither shipped")
    assert "$ORIGIN" in unknown.hint() and "floor.yaml" in unknown.hint()
    private = floors.Problem("bin/x", "version", "libc.so.6", "GLIBC_PRIVATE")
    assert "internal ABI" in private.line(FLOOR, ())
    assert all("\n" not in p.line(FLOOR, ()) for p in (above, undeclared, unknown, private))


def test_a_kernel_module_is_read_for_its_vermagic(tmp_path):
    """Real relocatable objects compiled by gcc: one with a .modinfo vermagic (as kbuild writes it), one without."""
    (tmp_path / "m.c").write_text('__attribute__((section(".modinfo"), used)) static const char v[] = '
                                  '"license=GPL\\0vermagic=6.14.0-1-amd64 SMP preempt mod_unload modversions";\n'
                                  "int init_module(void) { return 0; }\n")
    (tmp_path / "n.c").write_text("int init_module(void) { return 0; }\n")
    tree = tmp_path / "prefix"
    (tree / "lib" / "modules").mkdir(parents=True)
    for name in ("m", "n"):
        subprocess.run(["gcc", "-c", "-o", tree / "lib" / "modules" / f"{name}.ko", tmp_path / f"{name}.c"], check=True)
    from builders.ship.stage import floor_problems

    assert elf.read(tree / "lib/modules/m.ko").vermagic == "6.14.0-1-amd64 SMP preempt mod_unload modversions"
    problems, modules = floor_problems(tree, FLOOR, ())
    assert modules == [("lib/modules/m.ko", "6.14.0-1-amd64 SMP preempt mod_unload modversions")]
    assert [(p.file, p.kind) for p in problems] == [("lib/modules/n.ko", "module")]


# ---- floor.yaml, checked by `1bit-build validate` --------------------------------------------------------------------
@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the real project's declarative files, floor.yaml among them, to break."""
    for name in ("pins.yaml", "floor.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("recipes", "bundles", "roots"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    (tmp_path / "onebit").mkdir()  # the serve recipe's local source
    return tmp_path


def last_line_of(path: Path, needle: str) -> int:
    return max(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize("file, old, new, expected", [
    ("floor.yaml", "policy: manylinux_2_34", "policy: manylinux_2_99",
     "unknown manylinux policy 'manylinux_2_99'; auditwheel knows manylinux_2_"),
    ("floor.yaml", "policy: manylinux_2_34", "policy: manylinux2014", "'manylinux2014' does not match"),
    ("floor.yaml", "  - libgcc_s.so.1\n", "  - libgcc_s.so.1\n  - libgomp.so.1\n",
     "libgomp.so.1 is not on manylinux_2_34's allow-list of host libraries"),
    ("floor.yaml", "  - libgcc_s.so.1\n", "  - libgcc_s.so.1\n  - libm.so.6\n", "libm.so.6 is listed twice"),
    ("floor.yaml", '      libcuda.so.1: "the', '      libvulkan.so.1: "the', "libvulkan.so.1 is already in host set 'vulkan'"),
    ("floor.yaml", "  vulkan:\n    summary:", "  vulkan:\n    sumary:", "unknown key(s) 'sumary'"),
    ("recipes/ds4-rocm.yaml", "  host_libraries: [rocm7]", "  host_libraries: [rocm6]",
     "unknown host-library set 'rocm6'; floor.yaml declares: cuda, rocm7, vulkan, xrt, zlib"),
    ("recipes/vulkan.yaml", "  host_libraries: [vulkan]", "  host_libraries: [Vulkan]", "'Vulkan' does not match"),
])
def test_validate_reports_a_broken_floor_with_file_and_line(project, capsys, file, old, new, expected):
    path = project / file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    assert main(["--root", str(project), "validate"]) == 2
    out = " ".join(capsys.readouterr().err.split())
    assert expected in out, out
    assert f"{file}:{last_line_of(path, new.strip().splitlines()[-1])}:" in out, out
    assert "Traceback" not in out


def test_a_project_without_floor_yaml_gets_the_projects_floor(project):
    (project / "floor.yaml").unlink()
    assert config.load_project(project).floor == FLOOR


# ---- the gate, driven through the real stage of the mini project -----------------------------------------------------
CV_CPP = """\
#include <condition_variable>
#include <mutex>
std::mutex m;
std::condition_variable cv;
bool ready = false;
extern "C" void wait_ready() { std::unique_lock<std::mutex> l(m); cv.wait(l, [] { return ready; }); }
"""
ARC4_MAIN_C = """\
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void greet(void);
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) { printf("hello version (%s)\\n", HELLO_COMMIT); return 0; }
    if (argc > 1 && strcmp(argv[1], "--random") == 0) { printf("%u\\n", arc4random()); return 0; }
    greet();
    return 0;
}
"""
OMP_C = "void scale(float *x, int n) {\n#pragma omp parallel for\n    for (int i = 0; i < n; i++) x[i] *= 2;\n}\n"
GZ_C = '#include <zlib.h>\nconst char *gz_version(void) { return zlibVersion(); }\n'
VK_C = "void *vkGetInstanceProcAddr(void *instance, const char *name);\nvoid *vk_entry(void) { return vkGetInstanceProcAddr(0, \"vkCreateInstance\"); }\n"
LIBVULKAN = Path("/usr/lib/x86_64-linux-gnu/libvulkan.so.1")


def upstream_release(mini, files: dict[str, str], cmake: str = "", languages: str = "C") -> None:
    """Upstream tags v1.1 with these files added (and lines added to CMakeLists.txt); the pin follows it."""
    text = (mini.upstream / "CMakeLists.txt").read_text().replace("project(hello C)", f"project(hello {languages})")
    (mini.upstream / "CMakeLists.txt").write_text(text + cmake)
    for name, body in files.items():
        (mini.upstream / name).write_text(body)
    git(mini.upstream, "add", ".")
    git(mini.upstream, "commit", "-qm", "hello 1.1")
    git(mini.upstream, "tag", "v1.1")
    mini.set_pin(commit=git(mini.upstream, "rev-parse", "HEAD"), tag="v1.1")


def keep(mini, *globs: str, **stage) -> None:
    recipe = mini.recipe()
    recipe["stage"]["keep"] = list(globs)
    recipe["stage"].update(stage)
    mini.write_recipe(recipe)


def cli_build(mini, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT),
           "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "builders.cli", "--root", str(mini.root), "--cache", str(tmp_path / "cache"),
                           "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "build", "mini"],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)


def gate_error(proc: subprocess.CompletedProcess, tmp_path: Path) -> str:
    """The build failed at the stage in one error line (the hint on the next), no traceback, nothing published."""
    err = proc.stdout + proc.stderr
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err[-3000:]
    assert not (tmp_path / "out").exists()
    hint = err.splitlines()[err.splitlines().index(lines[0]) + 1]
    return lines[0] + "\n" + hint


@pytest.fixture
def mini(tmp_path):
    """The mini project with the project's floor less its sysroot: it builds with this host's own C library and
    libstdc++, as a project without a pinned sysroot would, so what the host's toolchain gives is what the gate sees."""
    m = make_mini(tmp_path / "mini")
    floor = (ROOT / "floor.yaml").read_text()
    (m.root / "floor.yaml").write_text(floor[:floor.index("\ntoolchain:")] + "\n")
    return m


def test_the_same_library_built_against_the_pinned_sysroot_meets_the_floor(tmp_path):
    """With floor.yaml's sysroot (the project's own floor), gcc 12's C++ library that the gate refuses above passes
    it: built against gcc 11's headers and the link stand-ins, it needs GLIBCXX_3.4.29 at most."""
    mini = make_mini(tmp_path / "mini")
    upstream_release(mini, {"cv.cpp": CV_CPP}, "add_library(cv SHARED cv.cpp)\ninstall(TARGETS cv)\n", "C CXX")
    keep(mini, "bin/hello", "lib/*.so*")
    proc = cli_build(mini, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    [lib] = (tmp_path / "work").glob("stage/hello/opt/onebit/**/libcv.so")
    needs = {v for _, v in elf.read(lib).version_needs}  # whatever it needs is within the floor
    assert not [v for v in needs if floors.above_floor(v, config.load_project(mini.root).floor.versions)], needs
    assert any(v.startswith("GLIBCXX_3.4") for v in needs)  # it is C++ and links libstdc++ all the same


def test_a_library_needing_gcc_12s_libstdcxx_fails_the_stage(mini, tmp_path):
    upstream_release(mini, {"cv.cpp": CV_CPP}, "add_library(cv SHARED cv.cpp)\ninstall(TARGETS cv)\n", "C CXX")
    keep(mini, "bin/hello", "lib/*.so*")
    error = gate_error(cli_build(mini, tmp_path), tmp_path)
    assert ("lib/libcv.so needs GLIBCXX_3.4.30 of libstdc++.so.6 (std::condition_variable::wait(std::unique_lock<std::mutex>&)), "
            "above the floor manylinux_2_34 (GLIBCXX_3.4.29)") in error
    assert "hello.yaml" in error and "hint: build against the pinned sysroot" in error


def test_a_program_calling_glibc_2_36s_arc4random_fails_the_stage(mini, tmp_path):
    upstream_release(mini, {"main.c": ARC4_MAIN_C})
    error = gate_error(cli_build(mini, tmp_path), tmp_path)
    assert "bin/hello needs GLIBC_2.36 of libc.so.6 (arc4random), above the floor manylinux_2_34 (GLIBC_2.34)" in error


def test_a_library_linking_libgomp_fails_the_stage(mini, tmp_path):
    """OpenMP's runtime, as libggml-cpu.so linked it: a compiler runtime neither shipped nor in any host set."""
    upstream_release(mini, {"omp.c": OMP_C}, "find_package(OpenMP REQUIRED)\nadd_library(omp SHARED omp.c)\n"
                                             "target_link_libraries(omp PRIVATE OpenMP::OpenMP_C)\ninstall(TARGETS omp)\n")
    keep(mini, "bin/hello", "lib/*.so*")
    error = gate_error(cli_build(mini, tmp_path), tmp_path)
    assert ("lib/libomp.so links libgomp.so.1, which is neither shipped in the package nor a host library the floor "
            "manylinux_2_34 allows (base, or a declared host set: none)") in error
    assert "hint: ship the library in the package" in error


def test_a_library_linking_an_undeclared_libz_fails_the_stage(mini, tmp_path):
    upstream_release(mini, {"gz.c": GZ_C}, "add_library(gz SHARED gz.c)\ntarget_link_libraries(gz PRIVATE z)\n"
                                           "install(TARGETS gz)\n")
    keep(mini, "bin/hello", "lib/*.so*")
    error = gate_error(cli_build(mini, tmp_path), tmp_path)
    assert "lib/libgz.so links libz.so.1, a library of host set 'zlib', which the recipe does not declare" in error
    assert "hint: declare it in the recipe: stage.host_libraries: [zlib]" in error


def test_a_host_set_library_passes_only_where_the_recipe_declares_the_set(mini, tmp_path):
    """libvk.so links the host's Vulkan loader; it ships in a part that is not a backend (hello2), so the bundle's
    manifest stays what the manifest schema knows."""
    if not LIBVULKAN.is_file():
        missing_host_tool("this host has no Vulkan loader (Debian's libvulkan1) to link")
    upstream_release(mini, {"vk.c": VK_C}, f"add_library(vk SHARED vk.c)\ntarget_link_libraries(vk PRIVATE {LIBVULKAN})\n"
                                           "install(TARGETS vk)\n")
    add_twin(mini, "hello2", backend=None)
    twin = yaml.safe_load((mini.root / "recipes" / "hello2.yaml").read_text())
    twin["stage"].update(keep=["lib/libvk.so"], binaries={"vk": "lib/libvk.so"})
    twin["tests"] = []
    (mini.root / "recipes" / "hello2.yaml").write_text(yaml.safe_dump(twin, sort_keys=False))
    error = gate_error(cli_build(mini, tmp_path), tmp_path)
    assert ("libexec/hello2/lib/libvk.so links libvulkan.so.1, a library of host set 'vulkan', which the recipe does "
            "not declare") in error
    assert "hint: declare it in the recipe: stage.host_libraries: [vulkan]" in error  # printed as text, not markup
    twin["stage"]["host_libraries"] = ["vulkan"]
    (mini.root / "recipes" / "hello2.yaml").write_text(yaml.safe_dump(twin, sort_keys=False))
    proc = cli_build(mini, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_a_c_project_built_on_this_host_meets_the_floor_and_declares_exactly_its_glibc(mini, tmp_path):
    """The mini C library alone needs GLIBC_2.2.5 only; its package still declares the floor's glibc, not its own."""
    recipe = mini.recipe()
    recipe["stage"].update(keep=["lib/libgreet.so*"], binaries={"greet": "lib/libgreet.so"})
    recipe["tests"] = []
    mini.write_recipe(recipe)
    proc = cli_build(mini, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    repodata = json.loads((tmp_path / "out/channel/linux-64/repodata.json").read_text())
    hello = next(p for p in repodata["packages.conda"].values() if p["name"] == "onebit-hello")
    assert [d for d in hello["depends"] if d.startswith("__glibc")] == ["__glibc >=2.34"]


def test_the_mini_project_as_it_is_passes_the_gate(mini, tmp_path):
    proc = cli_build(mini, tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    staged = tmp_path / "work" / "stage" / "hello"
    assert [p for p in staged.rglob("*") if p.is_file() and elf.is_elf(p)], "the stage shipped no ELF file"


def test_the_default_floor_is_the_projects_floor_yaml():
    """builders' default floor (for a project without floor.yaml, packaged with builders) is this file, not a copy."""
    data = yaml.safe_load((ROOT / "floor.yaml").read_text())
    assert data["policy"] == "manylinux_2_34" and set(data["host_sets"]) == {"vulkan", "cuda", "rocm7", "xrt", "zlib"}
    assert floors.DEFAULT_FILE.resolve() == (ROOT / "floor.yaml").resolve()
