"""A misbehaving OpenAI-compatible chat server on loopback, for hosted-opponent tests."""

from __future__ import annotations

import http.server
import json
import sys
import time


class Misbehaving(http.server.BaseHTTPRequestHandler):
    """/500/v1: always 500; /garbage/v1: 200 with a non-JSON body; /slow/v1: answers late;
    /ok/v1: a valid reply that checks the bearer token."""

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
        if mode == "slow":
            time.sleep(1.5)
        body = b"<html>not json</html>" if mode == "garbage" else json.dumps(
            {"choices": [{"message": {"content": "[4]"}}],
             "auth": self.headers.get("Authorization")}).encode()
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
