"""A Hugging Face hub on loopback that serves one model folder as ``ORG/NAME`` at one revision:
the calls ``huggingface_hub.snapshot_download`` makes (repo info, file tree, file HEAD and GET),
for tests of fetching a hub model on a machine without network."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"


def serve_model(folder: Path, repo_id: str, requests: list[str]):
    """A handler class serving ``folder``'s files as ``repo_id``; each request path is
    appended to ``requests``."""
    files = {p.name: p for p in sorted(folder.iterdir()) if p.is_file()}

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output clean
            pass

        def _json(self, data) -> None:
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, head: bool) -> None:
            prefix = f"/{repo_id}/resolve/{REVISION}/"
            name = self.path.split("?")[0].removeprefix(prefix)
            if not self.path.startswith(prefix) or name not in files:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = files[name].read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", REVISION)
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def do_HEAD(self):
            requests.append("HEAD " + self.path)
            self._file(head=True)

        def do_GET(self):
            requests.append("GET " + self.path)
            path = self.path.split("?")[0]
            if path == f"/api/models/{repo_id}/revision/main":
                self._json({"id": repo_id, "sha": REVISION,
                            "siblings": [{"rfilename": name} for name in files]})
            elif path == f"/api/models/{repo_id}/tree/{REVISION}":
                self._json([{"type": "file", "path": name, "size": p.stat().st_size,
                             "oid": hashlib.sha1(p.read_bytes()).hexdigest()}
                            for name, p in files.items()])
            else:
                self._file(head=False)

    return Hub


@contextmanager
def stub_hub(folder: Path, repo_id: str) -> Iterator[tuple[str, list[str]]]:
    """(the hub's endpoint URL, the requests it got) while the block runs."""
    requests: list[str] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), serve_model(folder, repo_id,
                                                                            requests))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
