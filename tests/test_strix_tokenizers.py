"""tokenizers: rustc and cargo 1.98.1 come from the pinned root (hf_tokenizers/rust-toolchain.toml's channel), and the
crates step, where the crates registry is unreachable (as on this project's machines), fails in one line naming it.
What else blocks the recipe here: its source, 1bit-MONSTER/engine, is on GitHub only and in no mirror."""
from __future__ import annotations

import re

import pytest
from strix_root import strix_root

from builders import sandbox
from builders.companions import cargo_vendor_failure

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


def test_the_crates_step_fails_in_one_line_naming_the_registry(root, tmp_path):
    """The engine's crate depends on tokenizers with its `onig` feature (recipes/tokenizers.yaml); a crate with the same
    kind of registry dependency, vendored by the root's cargo with the network allowed, meets the registry."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lib.rs").write_text("")
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "probe"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                         '[dependencies]\nonig = "6"\n')
    sb = sandbox.Sandbox(env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CARGO_HOME": "/tmp/cargo-home"},
                         cwd=str(tmp_path), root=str(root.path), rw=(str(tmp_path),), network=True, timeout=600)
    proc = sandbox.run(sb, ["cargo", "vendor", "--locked", "--versioned-dirs", "vendor"])
    assert proc.returncode != 0, "the crates registry answered: this host reaches it, the refusal is not testable"
    line = cargo_vendor_failure("Cargo.toml", proc.stderr)
    assert "\n" not in line
    assert re.fullmatch(r"the crates registry \(cargo's `crates-io` source, [A-Za-z0-9.-]+\) is unreachable from this "
                        r"host: cargo vendor --locked for Cargo.toml needs it", line), (line, proc.stderr)
