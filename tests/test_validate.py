"""Validation: every problem at once, each with file, line and YAML path; unknown keys are errors."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from builders.project import config
from builders.cli import main
from builders.errors import OnebitError, ValidationError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the real project's declarative files, to break."""
    for name in ("pins.yaml",):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    shutil.copytree(ROOT / "bundles", tmp_path / "bundles")
    shutil.copytree(ROOT / "roots", tmp_path / "roots")
    (tmp_path / "onebit").mkdir()
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def line_of(path: Path, needle: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_the_real_project_is_valid():
    project = config.load_project(ROOT)
    assert set(project.bundles) == {"cpu", "strix", "nvidia", "vulkan"}
    assert set(project.recipes) == {"vulkan", "hrx", "lean", "xdna", "zinc", "ds4", "ds4-rocm", "cpu", "cuda", "tokenizers", "laya", "serve"}
    assert project.pins["llama.cpp"].commit == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    sdist = project.pins["llama.cpp"].mirrors[0]
    assert (sdist.kind, sdist.spec["package"], sdist.spec["version"]) == ("pypi_sdist", "llama-cpp-python", "0.3.36")


@pytest.mark.parametrize(
    "file, old, new, expected",
    [
        # a typo in a key must never pass silently
        ("recipes/cpu.yaml", "  build_type: Release", "  buld_type: Release", "unknown key(s) 'buld_type'"),
        ("pins.yaml", "    cadence: weekly\n", "    cadance: weekly\n", "unknown key(s) 'cadance'"),
        ("bundles/cpu.yaml", "  - recipe: serve", "  - recipe: serve\n    variant: [x]", "unknown key(s) 'variant'"),
        # wrong values
        ("pins.yaml", "    policy: release\n", "    policy: latest\n", "'latest' is not one of"),
        ("pins.yaml", "    commit: 0c1e57098bba43ac29e6e3b677cdceebdd22334f", "    commit: 0c1e570",
         "'0c1e570' does not match"),
        ("recipes/cpu.yaml", "  kind: cmake", "  kind: meson", "'meson' is not one of"),
        # cross-file references
        ("recipes/cpu.yaml", "  pin: llama.cpp", "  pin: llama-cpp", "unknown pin 'llama-cpp'"),
        ("bundles/cpu.yaml", "  - recipe: cpu", "  - recipe: cpux", "unknown recipe 'cpux'"),
        ("bundles/strix.yaml", "    variants: [vulkan, rocm]", "    variants: [vulkan, hip]", "recipe 'lean' has no variant 'hip'"),
        ("recipes/cpu.yaml", "    - file: 0001-ggml-find-backends-in-exe-lib.patch",
         "    - file: 0002-missing.patch", "patch file recipes/patches/llama.cpp/0002-missing.patch does not exist"),
    ],
)
def test_each_problem_names_file_line_and_path(project, file, old, new, expected):
    path = project / file
    edit(path, old, new)
    with pytest.raises(ValidationError) as err:
        config.load_project(project)
    matching = [p for p in err.value.problems if expected in p]
    assert matching, err.value.problems
    first_changed = line_of(path, new.strip().splitlines()[0].strip())
    assert matching[0].startswith(f"{path}:"), matching[0]
    line = int(matching[0].split(":")[1])
    assert abs(line - first_changed) <= 1, (matching[0], first_changed)


def test_all_problems_are_reported_at_once(project):
    edit(project / "recipes/cpu.yaml", "  build_type: Release", "  buld_type: Release")
    edit(project / "recipes/vulkan.yaml", "  kind: cmake", "  kind: meson")
    edit(project / "pins.yaml", "    cadence: weekly\n", "    cadance: weekly\n")
    with pytest.raises(ValidationError) as err:
        config.load_project(project)
    files = {p.split(":")[0] for p in err.value.problems}
    assert files == {str(project / "recipes/cpu.yaml"), str(project / "recipes/vulkan.yaml"), str(project / "pins.yaml")}


def test_yaml_path_is_shown(project):
    edit(project / "recipes/cpu.yaml", "    GGML_NATIVE: OFF", "    GGML_NATIVE: [OFF]")
    with pytest.raises(ValidationError) as err:
        config.load_project(project)
    assert any("build.options.GGML_NATIVE" in p for p in err.value.problems), err.value.problems


def test_malformed_yaml_names_file_and_line(project):
    path = project / "recipes/zinc.yaml"
    edit(path, "  kind: zig", "  kind: [zig")
    with pytest.raises(ValidationError) as err:
        config.load_project(project)
    (problem,) = [p for p in err.value.problems if "zinc.yaml" in p]
    assert problem.startswith(f"{path}:") and "malformed YAML" in problem


def test_duplicate_key_is_an_error(project):
    edit(project / "recipes/cpu.yaml", "  build_type: Release", "  build_type: Release\n  build_type: Debug")
    with pytest.raises(ValidationError) as err:
        config.load_project(project)
    assert any("duplicate key 'build_type'" in p for p in err.value.problems)


def test_cli_validate_prints_errors_without_traceback(project, capsys):
    edit(project / "recipes/cpu.yaml", "  build_type: Release", "  buld_type: Release")
    assert main(["--root", str(project), "validate"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "buld_type" in err and "recipes/cpu.yaml:" in err


def test_cli_validate_ok(capsys):
    assert main(["--root", str(ROOT), "validate"]) == 0
    assert "13 pins, 12 recipes, 4 bundles" in capsys.readouterr().err


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(OnebitError) as err:
        config.load_project(tmp_path)
    assert "pins.yaml" in str(err.value) and "file not found" in str(err.value)


# ---- what the plan or the build would crash on is refused at validate time, with file:line (issue 16) ------------
REFUSED = [
    # paths that climb out of what they name
    ("recipes/hrx.yaml", "    - {pin: hrx-system, into: third_party/hrx-system}", "    - {pin: hrx-system, into: ../../../../x}",
     "source.extra[0].into: '../../../../x' may not climb out of the checkout"),
    ("recipes/serve.yaml", "  local: onebit", "  local: /etc", "source.local: '/etc' must be relative to the project"),
    ("recipes/serve.yaml", "  local: onebit", "  local: ../onebit", "source.local: '../onebit' may not climb out of the project"),
    ("recipes/tokenizers.yaml", "  crates: {manifest: hf_tokenizers/Cargo.toml}", "  crates: {manifest: ../x/Cargo.toml}",
     "source.crates.manifest: '../x/Cargo.toml' may not climb out of the checkout"),
    ("recipes/cpu.yaml", "  patch_dir: llama.cpp", "  patch_dir: ..", "source.patch_dir: '..' must name a folder of recipes/patches/"),
    ("recipes/tokenizers.yaml", "  submodules: [third_party/tokenizers]", "  submodules: [../xrt]",
     "source.submodules[0]: '../xrt' may not climb out of the checkout"),
    ("recipes/cuda.yaml", "    path: bin/nvcc\n", "    path: ../../bin/nvcc\n",
     "toolchain[5].path: '../../bin/nvcc' may not climb out of the toolchain root"),
    ("recipes/cuda.yaml", "13.0.88, sha256: 56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03, root: nvidia/cu13}",
     "13.0.88, sha256: 56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03, root: ../../nvidia}",
     "toolchain[5].wheels[0].root: '../../nvidia' may not climb out of the wheel"),
    ("recipes/zinc.yaml", 'path: ["{tool:zig:root}"', 'path: ["/usr/bin"', "build.path[0]: '/usr/bin' does not match"),
    ("recipes/zinc.yaml", "  strip: debug", "  strip: all", "stage.strip: 'all' is not one of ['debug']"),
    ("recipes/vulkan.yaml", "sha256: e05374965709159303041b104d4a26022d6ac5eb8296450364d66ae864a20367",
     "sha256: e0537496", "toolchain[5].debs[0].sha256: 'e0537496' does not match"),
    ("recipes/cuda.yaml", "ship: [libcudart.so.13]", "ship: [../../etc/passwd]",
     "toolchain[5].wheels[4].ship[0]: '../../etc/passwd' does not match"),
    ("recipes/tokenizers.yaml", ":include/tokenizers.h\"", ":../../include/tokenizers.h\"",
     "build.options.install: '../../include/tokenizers.h' may not climb out of the prefix"),
    ("recipes/ds4.yaml", "    programs: ds4 ds4-server ds4-bench ds4-eval ds4-agent", "    programs: ds4 /etc/passwd",
     "build.options.programs: '/etc/passwd' must be relative to the build tree"),
    ("recipes/cpu.yaml", "    bin/llama-server-{variant}: bin/llama-server", "    ../../bin/x: bin/llama-server",
     "stage.links.../../bin/x: '../../bin/x' may not climb out of the prefix"),
    ("pins.yaml", "          git_dir: llama_cpp_python-0.3.36/.git/modules/vendor/llama.cpp", "          git_dir: ../../x",
     "pins.llama.cpp.mirrors[0].pypi_sdist.git_dir: '../../x' may not climb out of the sdist"),
    ("pins.yaml", "          rl_agent_config.json:", "          ../../rl_agent_config.json:",
     "'../../rl_agent_config.json' may not climb out of the checkpoint folder"),
    # keys that are not text
    ("pins.yaml", "  ds4-rocm:\n", "  1:\n", "pins[1]: key 1 is read as int, not text; quote it"),
    ("pins.yaml", "  ds4-rocm:\n", "  null:\n", "pins.None: key None is read as null, not text; quote it"),
    ("recipes/cpu.yaml", "    GGML_NATIVE: OFF", "    2020-01-01: OFF", "key datetime.date(2020, 1, 1) is read as date, not text"),
    ("recipes/cpu.yaml", "    GGML_NATIVE: OFF", "    ON: OFF", "build.options[True]: key True is read as bool, not text"),
    # values the plan cannot use
    ("recipes/cpu.yaml", "    GGML_NATIVE: OFF", "    GGML_NATIVE: 2020-01-01", "build.options.GGML_NATIVE: datetime.date(2020, 1, 1) is not of type"),
    ("recipes/cpu.yaml", "    GGML_NATIVE: OFF", "    GGML_NATIVE: 1.5", "build.options.GGML_NATIVE: 1.5 is not of type"),
    # regexes compiled now, not when a build reaches them
    ("recipes/ds4.yaml", '    expect: "--port"', '    expect: "(--port"', "tests[0].expect: not a regular expression: missing ), unterminated subpattern"),
    ("pins.yaml", "    tag_pattern: '^v(\\d+)\\.(\\d+)(-rc\\d+)?$'", "    tag_pattern: '^v(\\d+'",
     "tag_pattern: not a regular expression"),
    # placeholders the plan could not fill in: file AND line
    ("recipes/cpu.yaml", "    GGML_NATIVE: OFF", "    GGML_NATIVE: \"{nope}\"", "build.options.GGML_NATIVE: unknown placeholder {nope} (variant cpu)"),
    ("recipes/xdna.yaml", '    run: ["{tool:xrt-smi}", examine]', '    run: ["{tool:xrt-smy}", examine]',
     "tests[0].run[0]: unknown placeholder {tool:xrt-smy} (variant xdna)"),
    # names the manifest would refuse at the bundle's last step
    ("recipes/zinc.yaml", "  backend: zinc", "  backend: zinc2", "provides.backend: backend 'zinc2' is not one the manifest knows"),
]


@pytest.mark.parametrize("file, old, new, expected", REFUSED, ids=[r[3][:40] for r in REFUSED])
def test_what_would_crash_is_refused_with_file_and_line(project, capsys, file, old, new, expected):
    path = project / file
    edit(path, old, new)
    for argv in (["validate"], ["plan", "strix", "--json"]):
        assert main(["--root", str(project), *argv]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        matching = [line.strip() for line in err.splitlines() if expected in line]
        assert matching, err
        line = line_of(path, new.strip().splitlines()[-1].strip())
        assert matching[0].startswith(f"{path}:{line}:"), (matching[0], line)
