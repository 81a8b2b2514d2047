"""Run nox from a virtual environment of this checkout, on any Linux with Python >= 3.11: the README's two commands.

    python3 scripts/nox.py -s build-cpu
    python3 scripts/nox.py -s tests

A stock Debian 12, Debian 13 or Ubuntu 24.04 has python3 without pip, and PEP 668 marks it externally managed, so
`python3 -m pip install nox` cannot work there. This script needs only the interpreter that runs it (standard library
only: nothing of the project is importable yet):

1. it makes `.onebit/nox-venv` (gitignored) with `python3 -m venv`, beside its target and renamed into place, and
   installs nox into it with that environment's pip, which honours the host's pip configuration and environment
   (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS, a proxy, a CA bundle); a later run reuses it while it was made by the same
   interpreter and still imports nox;
2. where the interpreter cannot make a virtual environment with pip (Debian and Ubuntu ship `ensurepip` in a separate
   package, python3.X-venv) and this is the distribution's own python3 run as root, it installs python3.X-venv with
   /usr/bin/apt-get first; as another user, or with an interpreter apt does not own, it prints one line naming what
   to install and exits 2. A python3 that already makes virtual environments with pip (a pyenv or python.org build,
   for example) gets nothing from apt;
3. it runs `python -m nox ARGS...` from that environment in the checkout's root (exec: nox's exit status is this
   command's).

A file named nox.py at the root of the checkout would shadow the nox package for anyone running `python3 -m nox` there,
hence scripts/.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".onebit" / "nox-venv"
MARKER = "onebit-nox.json"
NOX = "nox>=2024.10"  # pyproject.toml's test extra asks the same
APT_GET = "/usr/bin/apt-get"
MIN_PYTHON = (3, 11)


def say(msg: str) -> None:
    print(f"scripts/nox.py: {msg}", file=sys.stderr, flush=True)


def identity() -> dict[str, str]:
    """What made the environment: a different interpreter (another python3 first on PATH, a distribution upgrade)
    makes a new one."""
    return {"python": os.path.realpath(sys.executable), "version": sys.version.split()[0]}


def venv_package() -> str:
    """The distribution package that brings ensurepip for this interpreter (Debian and Ubuntu: python3.X-venv)."""
    return f"python3.{sys.version_info.minor}-venv"


def apt_owns_interpreter() -> bool:
    """Only the distribution's own interpreter (/usr/bin/python3.X) gets its venv module from apt."""
    return os.path.realpath(sys.executable).startswith("/usr/bin/") and os.access(APT_GET, os.X_OK)


def usable(venv: Path) -> bool:
    py = venv / "bin" / "python"
    try:
        recorded = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if recorded != identity() or not py.exists():
        return False
    return subprocess.run([py, "-c", "import nox"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def make_venv(dest: Path) -> subprocess.CompletedProcess:
    shutil.rmtree(dest, ignore_errors=True)
    return subprocess.run([sys.executable, "-m", "venv", str(dest)], capture_output=True, text=True)


def install_venv_package() -> None:
    pkg = venv_package()
    say(f"this python3 cannot make a virtual environment with pip: installing {pkg} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([APT_GET, "update", "-q"], [APT_GET, "install", "-y", "-q", "--no-install-recommends", pkg]):
        if subprocess.run(argv, env=env).returncode != 0:
            say(f"`{' '.join(argv)}` failed: install {pkg} and run this command again")
            sys.exit(2)


def build(dest: Path) -> None:
    """Make the environment at `dest` (a fresh folder beside the target) with nox installed."""
    made = make_venv(dest)
    if made.returncode != 0:
        if os.geteuid() == 0 and apt_owns_interpreter():
            install_venv_package()
            made = make_venv(dest)
        if made.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            if apt_owns_interpreter():
                say(f"{sys.executable} cannot make a virtual environment with pip: as root, "
                    f"apt-get install {venv_package()}, then run this command again")
            else:
                say(f"{sys.executable} cannot make a virtual environment with pip (its venv or ensurepip module is "
                    f"missing): use a Python >= 3.11 that has them")
            sys.exit(2)
    py = dest / "bin" / "python"
    if subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", NOX]).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        say(f"pip could not install {NOX} into the virtual environment (its own message is above)")
        sys.exit(2)
    (dest / MARKER).write_text(json.dumps(identity()))


def ensure() -> Path:
    VENV.parent.mkdir(parents=True, exist_ok=True)
    # the lock file as builders/io/lock.py opens every lock (that module is not importable yet): never through a link,
    # never truncated, a regular file or one line
    path = VENV.parent / "nox-venv.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        say(f"cannot open the lock {path}: {exc.strerror} (a link or a special file there? remove it)")
        sys.exit(2)
    import stat

    if not stat.S_ISREG(os.fstat(fd).st_mode):
        say(f"the lock {path} is not a regular file: remove it")
        sys.exit(2)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two first runs at once make one environment
        if not usable(VENV):
            aside = VENV.with_name(f"nox-venv.new-{os.getpid()}")
            build(aside)
            old = VENV.with_name(f"nox-venv.old-{os.getpid()}")
            if VENV.exists():
                VENV.rename(old)
            aside.rename(VENV)  # the environment runs only through bin/python -m, so its folder may move
            shutil.rmtree(old, ignore_errors=True)
    return VENV / "bin" / "python"


def main(args: list[str]) -> None:
    if sys.version_info < MIN_PYTHON:
        say(f"{sys.executable} is Python {sys.version.split()[0]}; the project needs >= 3.11: run this script with one")
        sys.exit(2)
    py = ensure()
    os.chdir(ROOT)
    os.execv(py, [str(py), "-m", "nox", *args])


if __name__ == "__main__":
    main(sys.argv[1:])
