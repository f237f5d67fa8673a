"""A misbehaving OpenAI-compatible chat server on loopback, for hosted-opponent tests."""

from __future__ import annotations

import http.server
import json
import sys
import time

STUB_KEY = "sk-test-stub-7f3a9c0d"
"""The API key /keyed/v1 wants (tests export it in the variable their actor's key= names)."""


class Misbehaving(http.server.BaseHTTPRequestHandler):
    """/500/v1: always 500; /garbage/v1: 200 with a non-JSON body; /slow/v1: answers late;
    /ok/v1: a valid reply; /keyed/v1: a valid reply only to ``Authorization: Bearer
    STUB_KEY``, else 401 with the header it got echoed in the body (as a careless server's
    error does), so a test sees that the key was sent, and that an error never shows it."""

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.path.split("/")[1]
        if mode == "500":
            self.send_response(500)
            self.end_headers()
            return
        if mode == "keyed" and self.headers.get("Authorization") != f"Bearer {STUB_KEY}":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(json.dumps({"error": "unauthorized", "got": self.headers.get(
                "Authorization")}).encode())
            return
        if mode == "slow":
            time.sleep(1.5)
        body = b"<html>not json</html>" if mode == "garbage" else json.dumps(
            {"choices": [{"message": {"content": "[4]"}}]}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)


class MisbehavingServer(http.server.ThreadingHTTPServer):
    """Serves :class:`Misbehaving`. Closing it waits for its request threads: a slow answer
    to a client that gave up (the timeout tests) ends with the module, not in a later test's
    captured output; and that client's closed connection is expected, not an error to print."""

    daemon_threads = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Misbehaving)

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)
