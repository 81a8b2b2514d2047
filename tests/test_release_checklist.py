"""The hardware checklist gate: which lines run, with the manifest's binaries, the model from ONEBIT_CHECK_MODEL, and a
timeout on every command (a server that never answers fails the gate instead of holding the job)."""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from builders.ship import manifest as manifests
from builders.release import checklist
from builders.release.checklist import Item, plan_items

ROOT = Path(__file__).resolve().parent.parent
COMMIT = "a" * 40


def which(known):
    return lambda cmd: f"/usr/bin/{cmd}" if cmd in known else None


# the lean recipe ships two llama-servers: the manifest names both, in their own subtrees
LEAN = {"llama-server": ["libexec/onebit/lean-rocm/bin/llama-server", "libexec/onebit/lean-vulkan/bin/llama-server"]}


@pytest.mark.parametrize("line, model, expect", [
    ("nox -s build-strix -- --only lean", None, [(None, "the build itself (this job built it)")]),
    # the old fixed path is resolved through the manifest: one command per backend of the recipe
    ("<prefix>/bin/llama-server --list-devices   # expect ROCm0", None,
     [(("/p/libexec/onebit/lean-rocm/bin/llama-server", "--list-devices"), ""),
      (("/p/libexec/onebit/lean-vulkan/bin/llama-server", "--list-devices"), "")]),
    ("<bin:llama-server> --version", None,
     [(("/p/libexec/onebit/lean-rocm/bin/llama-server", "--version"), ""),
      (("/p/libexec/onebit/lean-vulkan/bin/llama-server", "--version"), "")]),
    ("<bin:zinc> --check", None, [(None, "the manifest names no zinc for this recipe")]),
    # a link the prefix really has is left alone
    ("<prefix>/bin/llama-server-hrx --list-devices", None, [(("/p/bin/llama-server-hrx", "--list-devices"), "")]),
    ("1bit serve -m <hadamard-rotated q4_0 gguf> --dry-run", None, [(None, "needs a model: set ONEBIT_CHECK_MODEL")]),
    ("1bit serve -m <hadamard-rotated q4_0 gguf> --dry-run", "/m/q.gguf",
     [(("1bit", "serve", "-m", "/m/q.gguf", "--dry-run"), "")]),
    ("1bit serve -m <model.1bp> --device ds4-rocm --dry-run", "/m/q.gguf",
     [(None, "needs a .1bp package; ONEBIT_CHECK_MODEL is q.gguf")]),
    ("compare perplexity of the rotated file on ROCm0", "/m/q.gguf", [(None, "manual step (no program 'compare' on PATH)")]),
    ("{tool:xrt-smi} examine | grep -i npu", None, [(("/opt/xrt/bin/xrt-smi", "examine"), "")]),
    ("{tool:hipcc} --version", None, [(None, "the toolchain's hipcc is not on this runner")]),
    ("readelf -d <prefix>/lib/x.so | sort", None, [(None, "manual step (a pipe into something other than grep)")]),
    ('echo "unterminated', None, [(None, "not a command")]),
])
def test_plan_items(line, model, expect):
    items = plan_items([line], "/p", model, binaries=LEAN, tools={"xrt-smi": "/opt/xrt/bin/xrt-smi"},
                       which=which({"1bit", "readelf", "echo"}))
    assert [(i.argv, i.why) for i in items] == expect


def test_plan_items_shapes():
    [cd_a, cd_b] = plan_items(["cd <prefix>/libexec/onebit/zinc && bin/zinc --check && bin/zinc --help"], "/p", None,
                              which=which(set()))
    assert (cd_a.cwd, cd_a.argv, cd_b.cwd, cd_b.argv) == ("/p/libexec/onebit/zinc", ("bin/zinc", "--check"),
                                                          "/p/libexec/onebit/zinc", ("bin/zinc", "--help"))
    [grep] = plan_items(["readelf -d <prefix>/lib/x.so | grep RUNPATH"], "/p", None, which=which({"readelf"}))
    assert grep.argv == ("readelf", "-d", "/p/lib/x.so") and grep.grep == ("RUNPATH",)
    serve, dry = plan_items(["1bit serve -m <m> --device hrx", "1bit serve -m <m> --dry-run"], "/p", "/m.gguf",
                            which=which({"1bit"}))
    assert (serve.serve, serve.timeout, dry.serve, dry.timeout) == (True, checklist.SERVE_TIMEOUT, False, checklist.TIMEOUT)


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _prefix(tmp_path: Path, backends: dict) -> Path:
    prefix = tmp_path / "prefix"
    entries = []
    for name, (recipe, adapter, devices, script) in backends.items():
        root = f"libexec/onebit/{name}"
        _exe(prefix / root / "bin" / "llama-server", script)
        entries.append((name, {"recipe": recipe, "package": f"onebit-{name}", "version": "2026.48", "build_number": 0,
                               "root": root, "adapter": adapter, "binaries": {"llama-server": f"{root}/bin/llama-server"},
                               "devices": devices, "source": {"pin": "p", "url": "u", "commit": COMMIT}, "features": []}))
    doc = manifests.make_manifest("strix", "2026.48", 0, "linux-64", entries)
    (prefix / "share/onebit").mkdir(parents=True)
    (prefix / "share/onebit/manifest.json").write_text(manifests.dumps(doc))
    return prefix


LISTS_VULKAN = ("#!/bin/sh\n[ \"$1\" = --list-devices ] && "
                "printf 'Available devices:\\n  Vulkan0: RADV (1 MiB, 1 MiB free)\\n'\nexit 0\n")


def test_gate_uses_the_manifest_runs_1bit_check_and_records_each_item(tmp_path, monkeypatch):
    prefix = _prefix(tmp_path, {"vulkan": ("vulkan", "llama-server", ["Vulkan0"], LISTS_VULKAN)})
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/vulkan.yaml").write_text(
        "hardware_checklist:\n  - nox -s build-strix -- --only vulkan\n"
        "  - <prefix>/bin/llama-server --list-devices | grep Vulkan0   # the old fixed path\n"
        "  - 1bit serve -m <q4_0 model> --device vulkan --dry-run\n  - compare pp512 with the last release\n")
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    doc = checklist.gate(tmp_path, prefix, ["vulkan"], None, say=lambda m: None)
    got = [(i["line"].split("  #")[0], i["result"]) for i in doc["items"]]
    assert got == [("1bit check", "ok"), ("nox -s build-strix -- --only vulkan", "skip"),
                   ("<prefix>/bin/llama-server --list-devices | grep Vulkan0", "ok"),
                   ("1bit serve -m <q4_0 model> --device vulkan --dry-run", "skip"),
                   ("compare pp512 with the last release", "skip")]
    assert doc["items"][2]["argv"] == [str(prefix.resolve() / "libexec/onebit/vulkan/bin/llama-server"), "--list-devices"]
    assert doc["passed"] is True
    # a device the build claims but the runner does not see fails `1bit check`, and so the gate
    blind = "#!/bin/sh\necho 'Available devices:'\n"
    prefix2 = _prefix(tmp_path / "b", {"vulkan": ("vulkan", "llama-server", ["Vulkan0"], blind)})
    doc = checklist.gate(tmp_path, prefix2, ["vulkan"], "/m/q.gguf", say=lambda m: None)
    assert doc["items"][0]["result"] == "fail" and doc["passed"] is False


def test_npu_only_gate_asks_xrt_not_1bit_check(tmp_path, monkeypatch):
    """The xdna part's manifest holds only the NPU runtime, which lists no devices: the gate is its recipe's lines."""
    prefix = _prefix(tmp_path, {"npu": ("xdna", "npu", ["NPU0"], "#!/bin/sh\nexit 1\n")})
    xrt = _exe(tmp_path / "xrt/bin/xrt-smi", "#!/bin/sh\necho \"$@\" >> \"$XRT_LOG\"\necho 'Device(s) Present'\n"
                                             "echo '|[0000:c5:00.1]  |NPU Strix Halo  |'\n")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/xdna.yaml").write_text("hardware_checklist:\n  - '{tool:xrt-smi} examine | grep -i npu'\n")
    monkeypatch.setattr(checklist, "recipe_tools", lambda root, recipes: {"xrt-smi": str(xrt)})
    monkeypatch.setenv("XRT_LOG", str(tmp_path / "xrt.log"))
    doc = checklist.gate(tmp_path, prefix, ["xdna"], None, say=lambda m: None)
    assert [(i["line"], i["result"]) for i in doc["items"]] == [("1bit check", "skip"),
                                                                 ("{tool:xrt-smi} examine | grep -i npu", "ok")]
    assert (tmp_path / "xrt.log").read_text() == "examine\n" and doc["passed"]


def test_every_command_has_a_timeout(tmp_path):
    started = time.monotonic()
    res = checklist.run_command(Item("sleeper", ("sh", "-c", "sleep 60 & sleep 60"), timeout=1), os.environ)
    assert (res.result, res.why) == ("fail", "timed out after 1 s")
    assert time.monotonic() - started < 20  # the whole process group was stopped, children included


SERVER = '''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self.reply(200 if self.path == "/health" and "--healthy" in sys.argv else 503, {})
    def do_POST(self):
        n = int(self.headers["Content-Length"]); req = json.loads(self.rfile.read(n))
        self.reply(200, {"choices": [{"message": {"content": "hello " + req["messages"][0]["content"]}}]})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_a_server_item_is_started_asked_and_stopped(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    res = checklist.run_server(Item("1bit serve -m m", (sys.executable, str(script), "--healthy"), serve=True, timeout=30),
                               os.environ, poll=0.1)
    assert res.result == "ok", res
    assert "hello Say hello." in res.output


def test_a_server_that_never_gets_healthy_fails_within_its_timeout(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    started = time.monotonic()
    res = checklist.run_server(Item("1bit serve -m m", (sys.executable, str(script)), serve=True, timeout=2),
                               os.environ, poll=0.1)
    assert (res.result, res.why) == ("fail", "no healthy server after 2 s")
    assert time.monotonic() - started < 20


def test_cli_refuses_a_prefix_without_a_manifest_in_one_line(tmp_path, capsys):
    assert checklist.main(["--root", str(ROOT), "--prefix", str(tmp_path), "vulkan"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path}: no share/onebit/manifest.json") and err.count("\n") == 1


def test_the_real_recipes_checklists_resolve(tmp_path):
    """Every line of every real recipe's checklist becomes a command or a stated skip: nothing crashes, and no
    <prefix>/bin/llama-server survives (the subtree layout has none there)."""
    import yaml

    lines = []
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        lines += [str(x) for x in (yaml.safe_load(path.read_text()).get("hardware_checklist") or [])]
    items = plan_items(lines, "/p", "/m/q.gguf", binaries={"llama-server": ["libexec/onebit/x/bin/llama-server"]},
                       tools={"xrt-smi": "/x/xrt-smi"}, which=which({"1bit", "readelf", "modinfo", "sudo"}))
    assert items and all(i.argv or i.why for i in items)
    assert not any("/p/bin/llama-server" == a for i in items if i.argv for a in i.argv)
    assert json.dumps([i.argv for i in items])  # plain data, for gate.json
