"""Serve a completion from an installed bundle: writes a tiny GGUF (tests/tiny_gguf.py), runs `PREFIX/bin/1bit serve`,
waits for /health, asks /v1/chat/completions, prints the answer and `llama-server --version`, stops the server.

    python scripts/serve_smoke.py .onebit/prefix/cpu
"""
from __future__ import annotations

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


def main(prefix: Path) -> int:
    manifest = json.loads((prefix / "share" / "onebit" / "manifest.json").read_text())
    server = prefix / manifest["backends"]["cpu"]["binaries"]["llama-server"]
    version = subprocess.run([server, "--version"], capture_output=True, text=True)
    print((version.stdout + version.stderr).strip())
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny.gguf"
        write_tiny_gguf(model)
        port = free_port()
        proc = subprocess.Popen([prefix / "bin" / "1bit", "serve", "-m", model, "--port", str(port), "--alias", "tiny",
                                 "--ctx-size", "256", "-t", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    print(proc.stderr.read(), file=sys.stderr)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
