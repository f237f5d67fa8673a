"""A SIGKILLed `ub train` (what the OOM killer does: the driving pid only) leaves no process
behind: its temporary Prefect server dies with it instead of running on under pid 1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from processes import descendants


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead, waiting for its (new) parent to reap it


def _serving(pid: int) -> bool:
    argv = _cmdline(pid)
    if "uvicorn" not in argv or "--port" not in argv:
        return False
    try:
        socket.create_connection(("127.0.0.1", int(argv[argv.index("--port") + 1])), 1).close()
    except OSError:
        return False
    return True


def test_sigkill_of_train_leaves_no_process(tmp_path):
    # Its own temporary server, with its database under a --root that does not exist yet
    # (as in a fresh clone's `make demo`: the server must create its home first).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API_URL", "PREFECT_HOME", "UB_FAULT"))}
    train = subprocess.Popen(
        [sys.executable, "-m", "ub.flows.cli", "train", "--run", "doomed", "--root",
         str(tmp_path / "runs"), "--quiet", "--set", "rollout.games_per_round=4"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(_serving(p) for p in descendants(train.pid)):
            assert train.poll() is None, train.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the temporary Prefect server never started"
            time.sleep(0.2)
        family = descendants(train.pid)
        os.kill(train.pid, signal.SIGKILL)  # the driving pid only, as the OOM killer does
        train.wait()
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {p: " ".join(_cmdline(p))[:200] for p in family if _alive(p)}
        assert survivors == {}, f"processes of the killed run survived: {survivors}"
    finally:
        # (whatever survived a failed check: stop it, so the suite goes on cleanly)
        for pid in [train.pid, *descendants(train.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(train.pid, signal.SIGKILL)
