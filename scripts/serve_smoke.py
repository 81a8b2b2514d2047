"""Serve a completion from an installed bundle: writes a tiny GGUF (tests/tiny_gguf.py), runs `PREFIX/bin/1bit serve`,
waits for /health, asks /v1/chat/completions, prints the answer and `llama-server --version`, stops the server.

    python scripts/serve_smoke.py .onebit/prefix/cpu
    python scripts/serve_smoke.py .onebit/prefix/vulkan --device vulkan   # prints the server's device report too

The server's stderr is kept: with --device it prints the lines that show where the model's layers went.
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tiny_gguf import write_tiny_gguf  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEVICE_LINES = ("offload", "Vulkan0", "CUDA0", "HRX0", "ROCm0", "model buffer", "using device")


def main(prefix: Path, device: str = "auto") -> int:
    manifest = json.loads((prefix / "share" / "onebit" / "manifest.json").read_text())
    backend = "cpu" if device in ("auto", "cpu") else device
    server = prefix / manifest["backends"][backend]["binaries"]["llama-server"]
    version = subprocess.run([server, "--version"], capture_output=True, text=True)
    print((version.stdout + version.stderr).strip())
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny.gguf"
        write_tiny_gguf(model)
        port = free_port()
        log = Path(tmp) / "server.log"
        with open(log, "w") as err:
            proc = subprocess.Popen([prefix / "bin" / "1bit", "serve", "-m", model, "--port", str(port), "--alias", "tiny",
                                     "--device", device, "--ctx-size", "256", "-t", "2", "-lv", "4"],
                                    stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    print(log.read_text()[-3000:], file=sys.stderr)
                    return 1
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    print("the server did not become healthy in 120 s", file=sys.stderr)
                    return 1
                time.sleep(0.3)
            reply = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
                "model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello"}]}).json()
            print(f"served by {reply['model']}: {reply['choices'][0]['message']['content']!r} "
                  f"({reply['usage']['completion_tokens']} tokens)")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        if device != "auto":
            for line in log.read_text(errors="replace").splitlines():
                if any(k in line for k in DEVICE_LINES):
                    print(f"server: {line.strip()}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="serve a chat completion from an installed bundle")
    ap.add_argument("prefix", type=Path)
    ap.add_argument("--device", default="auto", help="passed to `1bit serve --device` (default auto)")
    a = ap.parse_args()
    sys.exit(main(a.prefix.resolve(), a.device))
