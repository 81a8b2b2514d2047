"""Fuzz `1bit-build validate` with mutated pins.yaml, recipes and bundles: every outcome is `ok` or errors that name
file:line, never an exception. ONEBIT_FUZZ_YAML=N sets the number of mutations (default 200)."""
from __future__ import annotations

import os
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from builders.cli import main

ROOT = Path(__file__).resolve().parent.parent
COUNT = int(os.environ.get("ONEBIT_FUZZ_YAML", "200"))
WHERE = re.compile(r"\S+\.yaml:\d+")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _at_line(text: str, rng: random.Random, insert: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    return "".join(lines[:i] + [insert] + lines[i:])


def _in_value(text: str, rng: random.Random, new: str) -> str:
    """Replace the value of a random `key: value` line."""
    lines = _lines(text)
    cands = [i for i, ln in enumerate(lines) if re.match(r"^\s*-?\s*[\w.-]+: \S", ln)]
    if not cands:
        return text + new
    i = rng.choice(cands)
    key = lines[i].split(":", 1)[0]
    lines[i] = f"{key}: {new}\n"
    return "".join(lines)


def _control(text: str, rng: random.Random) -> str:
    ch = chr(rng.choice([0, 1, 7, 8, 0x0B, 0x0C, 0x1B, 0x1F, 0x7F, 0xFFFE]))
    i = rng.randrange(len(text) + 1)
    return text[:i] + ch + text[i:]


def _dup_line(text: str, rng: random.Random) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    return "".join(lines[: i + 1] + [lines[i]] + lines[i + 1:])


def _del_line(text: str, rng: random.Random) -> str:
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "".join(lines)


def _indent(text: str, rng: random.Random) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    lines[i] = rng.choice([" ", "   ", "\t", ""]) + lines[i].lstrip(" ") if rng.random() < 0.5 else " " + lines[i]
    return "".join(lines)


def _flip(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text))
    return text[:i] + rng.choice(":-[]{}&*!|>'\"#%@`,? \n") + text[i + 1:]


def _truncate(text: str, rng: random.Random) -> str:
    return text[: rng.randrange(len(text))]


def _deep(text: str, rng: random.Random) -> str:
    n = rng.choice([100, 1000, 20000])
    return _in_value(text, rng, "[" * n + "]" * n if rng.random() < 0.5 else "{a: " * n + "1" + "}" * n)


def _laughs(text: str, rng: random.Random) -> str:
    bomb = "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for i in range(1, 9):
        bomb += f"lol{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n"
    return bomb + text


def _alias(text: str, rng: random.Random) -> str:
    return rng.choice([_in_value(text, rng, "*nowhere"), "x: &a {k: v}\n" + _in_value(text, rng, "*a"),
                       _at_line(text, rng, "<<: *a\n"), "anchor: &a 1\n" + _in_value(text, rng, "*a")])


WRONG_VALUES = ["42", "-1", "3.5", "true", "null", "~", "[]", "{}", "[1, 2]", "{a: 1}", "2020-13-45", "2020-01-01",
                "!!binary aGVsbG8=", "!!binary xx@@", "!!python/object:os.system x", "!foo bar", "0x1F", "1e999",
                ".nan", "'unterminated", "\"\\xZZ\"", "|", ">-", "? [a, b]", "'../../etc'", "/abs/path", "*", "&",
                "\"\\u0000\"", "\"\\x07\"", "é" * 5, "\U0001F600", "a" * 5000]


def _wrong(text: str, rng: random.Random) -> str:
    return _in_value(text, rng, rng.choice(WRONG_VALUES))


def _unknown_key(text: str, rng: random.Random) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    indent = re.match(r"^\s*", lines[i]).group()
    return "".join(lines[: i + 1] + [f"{indent}zzz_unknown: 1\n"] + lines[i + 1:])


def _complex_key(text: str, rng: random.Random) -> str:
    return _at_line(text, rng, rng.choice(["? [a, b]\n: c\n", "{x: 1}: 2\n", "[1]: 2\n", "1: int key\n", "null: v\n",
                                           "? |\n  block\n: v\n"]))


def _binary(text: str, rng: random.Random) -> bytes:
    data = bytearray(text.encode())
    i = rng.randrange(len(data))
    data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    return bytes(data)


def _key_type(text: str, rng: random.Random) -> str:
    """A key YAML reads as something other than text: a number, null, a bool, a date."""
    lines = _lines(text)
    cands = [i for i, ln in enumerate(lines) if re.match(r"^\s*[\w.-]+:", ln)]
    i = rng.choice(cands)
    indent = re.match(r"^\s*", lines[i]).group()
    lines[i] = indent + rng.choice(["1", "null", "yes", "ON", "2020-01-01", "3.5", "~"]) + ":" + lines[i].split(":", 1)[1]
    return "".join(lines)


PATH_KEYS = ("into", "local", "manifest", "root", "path", "programs", "patch_dir", "git_dir", "install", "keep",
             "submodules", "run")


def _escape(text: str, rng: random.Random) -> str:
    """A path field (or any value) that climbs out of what it names."""
    lines = _lines(text)
    cands = [i for i, ln in enumerate(lines) if re.match(rf"^\s*-?\s*({'|'.join(PATH_KEYS)}): ", ln)]
    if not cands:
        return _in_value(text, rng, "../../x")
    i = rng.choice(cands)
    key = lines[i].split(":", 1)[0]
    lines[i] = f"{key}: {rng.choice(['../../x', '/etc', '[../../x]', 'a/../../b', '..', '~/x', 'x:../../y'])}\n"
    return "".join(lines)


def _regex(text: str, rng: random.Random) -> str:
    lines = _lines(text)
    cands = [i for i, ln in enumerate(lines) if re.match(r"^\s*-?\s*(expect|tag_pattern): ", ln)]
    bad = rng.choice(["'(unclosed'", "'*x'", "'[z-a]'", "'(?P<'", "'\\'"])
    if not cands:
        return _in_value(text, rng, bad)
    i = rng.choice(cands)
    lines[i] = lines[i].split(":", 1)[0] + ": " + bad + "\n"
    return "".join(lines)


def _placeholder(text: str, rng: random.Random) -> str:
    return _in_value(text, rng, rng.choice(['"{nope}"', '"{tool:nothere}"', '"{source}/{build:x}"', '"{commit7}"']))


MUTATORS = [_control, _dup_line, _del_line, _indent, _flip, _truncate, _deep, _laughs, _alias, _wrong, _wrong, _wrong,
            _unknown_key, _complex_key, _binary, _flip, _dup_line, _key_type, _escape, _escape, _regex, _placeholder]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copy(ROOT / "pins.yaml", root / "pins.yaml")
    shutil.copytree(ROOT / "recipes", root / "recipes")
    shutil.copytree(ROOT / "bundles", root / "bundles")
    shutil.copytree(ROOT / "roots", root / "roots")
    (root / "onebit").mkdir()
    return root


@pytest.fixture
def quick_host(monkeypatch):
    """Host facts probed once per tool: the plan is a pure function of them, so the fuzz spends its time there."""
    from builders.inputs import host
    from builders.roots import sandbox

    real = host.detect_tool
    seen: dict = {}

    def detect(tool, env, toolchains=None, roots=None):
        if tool not in seen:
            seen[tool] = real(tool, env, toolchains, roots)
        return seen[tool]

    monkeypatch.setattr(host, "detect_tool", detect)
    monkeypatch.setattr(sandbox, "probe_net_cut", lambda: ())


def _bundle_of(target: Path) -> str:
    if target.parent.name == "bundles":
        return target.stem
    return "nvidia" if target.stem == "cuda" else "strix"


def test_validate_never_raises_on_mutated_yaml(project, capsys, quick_host):
    """Every mutation ends in `ok` or clean errors naming file:line; and what validates, `plan` takes without a crash
    (what the plan would trip over is the validator's to refuse)."""
    files = [project / "pins.yaml", *sorted((project / "recipes").glob("*.yaml")), *sorted((project / "bundles").glob("*.yaml"))]
    originals = {f: f.read_bytes() for f in files}
    rng = random.Random(1234)
    outcomes: Counter = Counter()
    failures = []
    for n in range(COUNT):
        target = rng.choice(files)
        mut = rng.choice(MUTATORS)
        text = originals[target].decode()
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            out = mut(text, rng) if text else "x"
            text = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
        data = out if isinstance(out, bytes) else out.encode("utf-8", "surrogatepass")
        target.write_bytes(data)
        planned = None
        try:
            rc = main(["--root", str(project), "validate"])
            if rc == 0:
                capsys.readouterr()
                planned = main(["--root", str(project), "--cache", str(project / ".cache"), "plan", _bundle_of(target), "--json"])
        except BaseException as exc:  # noqa: BLE001 - the point of the test
            failures.append(f"#{n} {mut.__name__} on {target.name}: {type(exc).__name__}: {exc}"[:300])
            rc = None
        finally:
            target.write_bytes(originals[target])
        err = capsys.readouterr().err
        if planned is not None:
            outcomes[f"valid, plan exit {planned}"] += 1
            if "Traceback" in err or planned not in (0, 1, 2):
                failures.append(f"#{n} {mut.__name__} on {target.name}: plan exit {planned}: {err[-300:]!r}")
            continue
        if rc == 2:
            outcomes["clean error"] += 1
            if not WHERE.search(err):
                failures.append(f"#{n} {mut.__name__} on {target.name}: no file:line in {err[:300]!r}")
            if "Traceback" in err:
                failures.append(f"#{n} {mut.__name__}: traceback in output")
        elif rc is not None:
            failures.append(f"#{n} {mut.__name__} on {target.name}: exit {rc}: {err[:300]!r}")
    print(f"\nyaml fuzz: {COUNT} mutations: {dict(outcomes)}; {len(failures)} failure(s)")
    assert not failures, "\n".join(failures[:20])
    assert outcomes["clean error"] > COUNT // 2


@pytest.mark.parametrize("name, text, expect", [
    ("nul", "schema_version: 1\nname: \x00cpu\n", "cpu.yaml:2: control character U+0000"),
    ("escape", "schema_version: 1\n\x1b[31m\n", "cpu.yaml:2: control character U+001B"),
    ("deep", "a: " + "[" * 5000 + "]" * 5000 + "\n", "cpu.yaml:1"),
    ("laughs", _laughs("", random.Random(0)), "more than 100000 nodes"),
    ("bad date", "schema_version: 1\nname: 2020-13-45\n", "cpu.yaml:2: cannot read value '2020-13-45'"),
    ("python tag", "name: !!python/object:os.system x\n", "cpu.yaml:1: cannot read this value"),
    ("list key", "? [a, b]\n: c\n", "cpu.yaml:1: a mapping key must be a plain value"),
    ("duplicate", "name: a\nname: b\n", "cpu.yaml:2: duplicate key 'name'"),
])
def test_yaml_faults_are_one_clean_error(project, capsys, name, text, expect):
    target = project / "recipes" / "cpu.yaml"
    original = target.read_bytes()
    try:
        target.write_text(text)
        assert main(["--root", str(project), "validate"]) == 2
    finally:
        target.write_bytes(original)
    err = capsys.readouterr().err
    assert expect in " ".join(err.split()), err
    assert "Traceback" not in err


def test_invalid_utf8_is_one_clean_error(project, capsys):
    target = project / "bundles" / "cpu.yaml"
    original = target.read_bytes()
    try:
        target.write_bytes(b"name: cpu\nsummary: \xff\xfe bad\n")
        assert main(["--root", str(project), "validate"]) == 2
    finally:
        target.write_bytes(original)
    assert "cpu.yaml:2: not UTF-8 text" in " ".join(capsys.readouterr().err.split())
