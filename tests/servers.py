"""The servers tests start: Prefect's in-process test server, and any command that serves on a
port (a real `prefect server start`, vLLM's OpenAI server), started, awaited and stopped alike."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def prefect_test_server() -> Iterator[str]:
    """Prefect's test server (its own temporary database) for the block; yields its API URL,
    which subprocesses (``ub train`` as a user runs it) take as ``PREFECT_API_URL``. The
    startup timeout is generous: on two busy cores the server took over a minute in CI."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@contextmanager
def serving(command: Sequence[str], url: str, log: Path, *, timeout: float,
            env: Mapping[str, str] | None = None, **popen) -> Iterator[subprocess.Popen]:
    """Run ``command`` until ``url`` answers 200, for the block; then stop it (SIGTERM, then
    SIGKILL after 30 s). A server that exits or does not answer in ``timeout`` seconds fails
    the test with the end of its ``log``."""
    with log.open("w") as out:
        process = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT,
                                   env=None if env is None else dict(env), **popen)

        def answers() -> bool:
            assert process.poll() is None, (
                f"{command[0]} ... exited {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_for(answers, timeout, f"{url} answers")
            yield process
        finally:
            stop(process)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL if it still runs 30 s later."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def wait_for(check: Callable[[], object], timeout: float, what: str, poll: float = 1.0):
    """Poll ``check`` until it returns something truthy. A request that times out counts as
    "not yet": a server shares two cores with the flow run it reports on (vLLM, the learner)
    and can stall past a request's timeout (CI saw one at 10 s); the deadline still bounds it."""
    deadline = time.monotonic() + timeout
    stalled = None
    while True:
        try:
            found = check()
        except httpx.TimeoutException as error:
            found, stalled = None, error
        if found:
            return found
        assert time.monotonic() < deadline, (
            f"{what} within {timeout:.0f} s" + (f" (last request: {stalled!r})" if stalled else ""))
        time.sleep(poll)
