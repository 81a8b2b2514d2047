"""http_fixtures: the handler the tests' local HTTP servers share: it logs nothing and answers a body in one call."""
from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    def answer(self, status: int, data: bytes, headers: dict | None = None) -> None:
        """Reply status with data as the body (Content-Length set), after headers in their order."""
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass
