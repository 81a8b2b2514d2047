"""The hardware checklist gate: which lines run unattended, with <prefix> and <model> filled in."""
from __future__ import annotations

import os
import stat

from builders.release.checklist import Item, main, plan_items


def which(known):
    return lambda cmd: f"/usr/bin/{cmd}" if cmd in known else None


def test_plan_items():
    lines = ["1bit check", "nox -s build-strix -- --only hrx", "<prefix>/bin/llama-server --list-devices   # expect HRX0",
             "1bit serve -m <qwen3 moe q4_0> --device hrx", "sudo insmod <prefix>/lib/m.ko && xrt-smi examine",
             "compare perplexity of the rotated file", "xrt-smi validate"]
    items = plan_items(lines, "/p", "/m.gguf", which=which({"1bit", "sudo", "xrt-smi"}))
    assert [i.argv for i in items] == [
        ("1bit", "check"), None, ("/p/bin/llama-server", "--list-devices"),
        ("1bit", "serve", "-m", "/m.gguf", "--device", "hrx"), None, None, ("xrt-smi", "validate")]
    assert items[1].why.startswith("the build itself") and items[5].why == "manual step"
    no_model = plan_items(["1bit serve -m <model> --dry-run"], "/p", None, which=which({"1bit"}))
    assert no_model == [Item("1bit serve -m <model> --dry-run", None, "needs a model: pass --model")]


def test_gate_runs_and_fails(tmp_path, capsys):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    log = tmp_path / "log"
    onebit = prefix / "bin/1bit"
    onebit.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$1" != fail ]\n')
    onebit.chmod(onebit.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/x.yaml").write_text("hardware_checklist:\n  - nox -s build-strix -- --only x\n"
                                              "  - 1bit serve -m <model> --dry-run\n")
    assert main(["--root", str(tmp_path), "--prefix", str(prefix), "--model", "/m", "x"]) == 0
    assert log.read_text() == "check\nserve -m /m --dry-run\n"
    (tmp_path / "recipes/x.yaml").write_text("hardware_checklist:\n  - 1bit fail\n")
    assert main(["--root", str(tmp_path), "--prefix", str(prefix), "x"]) == 1
    assert "FAIL  1bit fail" in capsys.readouterr().out
    assert os.environ.get("PATH")  # the gate did not change ours
