"""Install the `onebit` package into a bundle prefix with its vendored wheels for every supported CPython, and a
relocatable `bin/1bit` launcher that picks the set of the Python it runs on.

Run by the serve recipe's build commands: python -m builders.ship.serve_install SOURCE_DIR PREFIX WHEELS_DIR
WHEELS_DIR holds one folder of wheels per CPython minor (cp311/, cp312/, ...), as the fetch step wrote them.

    lib/onebit/python/           onebit/ and the pure-Python wheels (one copy for every Python)
    lib/onebit/python-cp3XY/     the compiled wheels (numpy, aiohttp, ...) for CPython 3.XY
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.metadata import Metadata
from packaging.utils import canonicalize_name, parse_wheel_filename

from ..errors import BuildError
from ..inputs.fetch import target_args

LAUNCHER = '''#!/usr/bin/env python3
"""1bit: the 1bit engine's entry point (`1bit serve`, `1bit check`, `1bit version`), installed by onebit-build.
Runs on any CPython of PYTHONS: it puts the vendored wheels of the running one on sys.path."""
import os
import sys

PYTHONS = {pythons}
prefix = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
here = "%d.%d" % sys.version_info[:2]
if here not in PYTHONS or sys.implementation.name != "cpython":
    for wanted in ["python" + v for v in reversed(PYTHONS)]:  # the newest supported one on PATH
        for d in os.environ.get("PATH", "").split(os.pathsep):
            candidate = os.path.join(d, wanted)
            if d and os.access(candidate, os.X_OK):
                os.execv(candidate, [candidate, os.path.realpath(__file__)] + sys.argv[1:])
    sys.stderr.write("1bit: this bundle runs on CPython %s; this is %s %s and no python%s is on PATH. "
                     "Install one (e.g. python3.12) or run it as `python%s %s`\\n"
                     % (", ".join(PYTHONS), sys.implementation.name, here, "/python".join(PYTHONS), PYTHONS[-1],
                        os.path.realpath(__file__)))
    sys.exit(2)
lib = os.path.join(prefix, "lib", "onebit")
sys.path[:0] = [os.path.join(lib, "python-cp" + here.replace(".", "")), os.path.join(lib, "python")]
from onebit.cli import main  # noqa: E402

sys.exit(main())
'''


def drop_script_records(site: Path) -> None:
    """The removed console scripts stay listed in their wheels' RECORD, with a hash of a file that held the build's
    interpreter path: drop those lines, so the shipped tree names only what it ships and two builds give one byte."""
    for record in sorted(site.glob("*.dist-info/RECORD")):
        lines = record.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("../../bin/")]
        if kept != lines:
            record.write_text("".join(kept))


def python_of(tag_dir: str) -> str:
    """'cp312' -> '3.12'."""
    digits = tag_dir.removeprefix("cp")
    return f"{digits[0]}.{digits[1:]}"


def is_pure(wheel: Path) -> bool:
    """A wheel every Python 3 installs alike (py3-none-any)."""
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return all(t.abi == "none" and t.platform == "any" for t in tags)


def split_sets(sets: dict[str, list[Path]]) -> tuple[list[Path], dict[str, list[Path]]]:
    """Pure: per-Python wheel sets -> (the pure wheels, the same in every set; each set's compiled wheels).
    A pure wheel missing from a set, or differing in version between sets, is an error naming it."""
    pure_names = {tag: sorted(w.name for w in ws if is_pure(w)) for tag, ws in sets.items()}
    first = next(iter(pure_names.values()), [])
    for tag, names in pure_names.items():
        if names != first:
            diff = sorted(set(names) ^ set(first))
            raise BuildError(f"the pure-Python wheels differ between the Python sets ({tag}: {', '.join(diff)})",
                             hint="pin every wheel of the closure by exact version in the serve recipe")
    some = next(iter(sets.values()), [])
    return [w for w in some if is_pure(w)], {tag: [w for w in ws if not is_pure(w)] for tag, ws in sets.items()}


def _environment(python: str) -> dict[str, str]:
    """PEP 508 marker values of CPython `python` on x86_64 Linux."""
    env = dict(default_environment())
    env.update(python_version=python, python_full_version=f"{python}.0", implementation_name="cpython",
               platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix")
    return env


def unmet(dists: dict[str, tuple[str, list[str]]], python: str) -> list[str]:
    """Pure: each requirement of an installed distribution that no installed distribution satisfies on CPython
    `python` (what `pip check` says, for an interpreter other than the running one). dists: name -> (version,
    Requires-Dist lines)."""
    from packaging.requirements import Requirement

    env = _environment(python)
    problems = []
    for name, (version, requires) in sorted(dists.items()):
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            have = dists.get(canonicalize_name(req.name))
            if have is None:
                problems.append(f"{name} {version} needs {req} (not vendored)")
            elif not req.specifier.contains(have[0], prereleases=True):
                problems.append(f"{name} {version} needs {req}, vendored {have[0]}")
    return problems


def installed(*sites: Path) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for site in sites:
        for meta in sorted(site.glob("*.dist-info/METADATA")):
            md = Metadata.from_email(meta.read_bytes(), validate=False)
            out[canonicalize_name(md.name)] = (str(md.version), [str(r) for r in (md.requires_dist or [])])
    return out


def _pip_install(wheels: list[Path], target: Path, python: str | None) -> None:
    if not wheels:
        target.mkdir(parents=True, exist_ok=True)
        return
    # by requirement from --find-links, not by file name: a wheel installed from a path records it (direct_url.json)
    requirements = [f"{name}=={version}" for name, version, _, _ in map(parse_wheel_filename, (w.name for w in wheels))]
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
            "--disable-pip-version-check", "--only-binary", ":all:", "--find-links", str(wheels[0].parent),
            "--target", str(target)]
    if python:
        argv += target_args(python)
    proc = subprocess.run(argv + requirements, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"pip could not install the vendored wheels into {target.name}: {proc.stderr.strip()[-600:]}")
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts of vendored wheels point at the build's python
    drop_script_records(target)


def install(source: Path, prefix: Path, wheels_dir: Path) -> list[str]:
    """Returns the CPython minors the prefix now runs on."""
    sets = {d.name: sorted(d.glob("*.whl")) for d in sorted(wheels_dir.iterdir()) if d.is_dir() and d.name.startswith("cp")}
    if not sets:
        raise BuildError(f"{wheels_dir} holds no wheel set (cp3XY/)", hint="run `1bit-build fetch BUNDLE`")
    pure, compiled = split_sets(sets)
    lib = prefix / "lib" / "onebit"
    common = lib / "python"
    for d in [common, *(lib / f"python-{tag}" for tag in sets)]:
        shutil.rmtree(d, ignore_errors=True)
    _pip_install(pure, common, None)
    pythons = []
    for tag, wheels in compiled.items():
        python = python_of(tag)
        site = lib / f"python-{tag}"
        _pip_install(wheels, site, python)
        problems = unmet(installed(common, site), python)
        if problems:
            raise BuildError(f"the vendored wheels for CPython {python} are not a closed set:\n    " + "\n    ".join(problems),
                             hint="add the missing requirement, by exact version, to the serve recipe's source.wheels")
        pythons.append(python)
    shutil.copytree(source, common / source.name, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    launcher = prefix / "bin" / "1bit"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(LAUNCHER.replace("{pythons}", repr(tuple(pythons))))
    os.chmod(launcher, 0o755)
    return pythons


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m builders.ship.serve_install SOURCE_DIR PREFIX WHEELS_DIR")
    try:
        print("1bit runs on CPython " + ", ".join(install(Path(sys.argv[1]).resolve(), Path(sys.argv[2]), Path(sys.argv[3]))))
    except BuildError as exc:
        sys.exit(f"serve_install: {exc}")
