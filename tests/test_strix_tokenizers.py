"""tokenizers: rustc and cargo 1.98.1 come from the pinned root (hf_tokenizers/rust-toolchain.toml's channel), and the
crates step, where the crates registry is unreachable (as on this project's machines), fails in one line naming it.
What else blocks the recipe here: its source, 1bit-MONSTER/engine, is on GitHub only and in no mirror."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from strix_root import strix_root

from builders.roots import sandbox
from builders.inputs.companions import cargo_vendor_failure, crates_ready, crates_sandbox, vendor_crates
from builders.errors import FetchError

# cargo's stderr as it fails (cargo 1.98.1, `cargo vendor --locked`): registry unreachable, a lockfile mismatch
UNREACHABLE = """error: failed to sync

Caused by:
  failed to load lockfile for /src/hf_tokenizers

Caused by:
  unable to update registry `crates-io`

Caused by:
  download of config.json failed

Caused by:
  [6] Could not resolve hostname (Could not resolve host: index.example)
"""
LOCKED = """error: the lock file /src/hf_tokenizers/Cargo.lock needs to be updated but --locked was passed to prevent this
If you want to try to generate the lock file without accessing the network, remove the --locked flag and use --offline instead.
"""
TABLE = [
    (UNREACHABLE, "the crates registry (cargo's `crates-io` source, index.example) is unreachable from this host: "
                  "cargo vendor --locked for hf_tokenizers/Cargo.toml needs it"),
    (UNREACHABLE.replace("crates-io", "mirror"), "the registry (cargo's `mirror` source, index.example) is unreachable "
                                                 "from this host: cargo vendor --locked for hf_tokenizers/Cargo.toml needs it"),
    (LOCKED, "cargo vendor failed for hf_tokenizers/Cargo.toml: If you want to try to generate the lock file without "
             "accessing the network, remove the --locked flag and use --offline instead."),
    ("", "cargo vendor failed for hf_tokenizers/Cargo.toml: no message"),
]


@pytest.mark.parametrize("stderr,line", TABLE)
def test_cargo_vendor_failure(stderr, line):
    assert cargo_vendor_failure("hf_tokenizers/Cargo.toml", stderr) == line


@pytest.fixture(scope="module")
def root():
    return strix_root()


def test_rust_1_98_1_from_the_root(root, tmp_path):
    proc, _ = root.run(["sh", "-c", "rustc --version && cargo --version"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rustc, cargo = proc.stdout.splitlines()
    assert rustc.startswith("rustc 1.98.1 ") and cargo.startswith("cargo 1.98.1 "), proc.stdout


def _crate(where, deps: str = ""):
    (where / "src").mkdir(parents=True)
    (where / "src" / "lib.rs").write_text("")
    (where / "Cargo.toml").write_text(f'[package]\nname = "probe"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                      f'[dependencies]\n{deps}')
    return where


def test_the_crates_step_fails_in_one_line_naming_the_registry(root, tmp_path):
    """The engine's crate depends on tokenizers with its `onig` feature (recipes/tokenizers.yaml); a crate with the same
    kind of registry dependency, vendored by the crates step itself (the root's cargo, in the sandbox, network on,
    the host's resolver), meets the registry."""
    src = _crate(tmp_path / "src", 'onig = "6"\n')
    with pytest.raises(FetchError) as err:
        vendor_crates(src, "Cargo.toml", tmp_path / "crates", root=str(root.path))
    line = err.value.args[0]
    assert "\n" not in line
    assert re.fullmatch(r"the crates registry \(cargo's `crates-io` source, [A-Za-z0-9.-]+\) is unreachable from this "
                        r"host: cargo vendor --locked for Cargo.toml needs it", line), line
    assert not (tmp_path / "crates").exists() and not list(tmp_path.glob("crates.tmp-*"))  # nothing half-written


def test_a_crate_without_dependencies_vendors_with_the_roots_cargo(root, tmp_path):
    """Nothing to download: the root's cargo 1.98.1 runs in the sandbox and succeeds; the entry is complete (an empty
    vendor tree, its digest recorded, the config cargo printed: none, as it prints none without sources to replace)
    and is reused, where before the fix a crate without dependencies left no vendor directory and its second fetch
    called the cache corrupt."""
    src = _crate(tmp_path / "src")
    (src / "Cargo.lock").write_text('version = 4\n\n[[package]]\nname = "probe"\nversion = "0.1.0"\n')  # --locked
    dest = tmp_path / "crates"
    assert vendor_crates(src, "Cargo.toml", dest, root=str(root.path)) == "vendored"
    assert crates_ready(dest)
    assert (dest / "vendor").is_dir() and not any((dest / "vendor").iterdir())
    assert (dest / "config.toml").read_text() == ""
    assert vendor_crates(src, "Cargo.toml", dest, root=str(root.path)) == "cache"


def test_the_crates_sandbox_holds_no_secret_of_the_host(root, tmp_path, monkeypatch):
    """What cargo sees there: no token variable, no HOME or CARGO_HOME of the host (credentials.toml), a proxy
    variable passed through; the host's resolver configuration and CA bundle over the root's etc, the rest of the
    root's etc as it is."""
    home = tmp_path / "home"
    (home / ".cargo").mkdir(parents=True)
    (home / ".cargo" / "credentials.toml").write_text('[registry]\ntoken = "host-secret"\n')
    environ = {"CARGO_REGISTRY_TOKEN": "host-secret", "GITHUB_TOKEN": "host-secret", "HOME": str(home),
               "CARGO_HOME": str(home / ".cargo"), "https_proxy": "http://proxy.invalid:3128"}
    work = tmp_path / "work"
    work.mkdir()
    sb = crates_sandbox(_crate(tmp_path / "src"), work, str(root.path), environ)
    proc = sandbox.run(sb, ["sh", "-c", f"env; cat {home}/.cargo/credentials.toml $HOME/.cargo/credentials.toml; "
                                        "cat /etc/resolv.conf; cat /etc/debian_version; "
                                        "test -s /etc/ssl/certs/ca-certificates.crt && echo ca-ok; touch /etc/x"])
    assert "host-secret" not in proc.stdout + proc.stderr
    assert "https_proxy=http://proxy.invalid:3128" in proc.stdout
    assert "CARGO_HOME=/tmp/cargo-home" in proc.stdout
    host_resolv = Path("/etc/resolv.conf").resolve()
    if host_resolv.is_file():
        assert host_resolv.read_text().strip() in proc.stdout
    assert (root.path / "etc" / "debian_version").read_text().strip() in proc.stdout
    if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        assert "ca-ok" in proc.stdout
    assert "Read-only file system" in proc.stderr  # /etc stays read-only
