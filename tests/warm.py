"""``ub`` commands as processes of their own, forked from a warm interpreter.

A two-round ``ub train`` of the reliability suite lives ~45 s on two cores, and ~25 s of it is
importing torch, transformers, PEFT, vLLM, Prefect and W&B. The tests that need a command as a
process of its own (to SIGKILL it at a fault point, to resume in a fresh process, to read its
exit status and output) fork it instead from a ``multiprocessing`` forkserver that imported
those (but Prefect, see PRELOAD) once per pytest worker: the same ``ub`` code, arguments,
environment, working folder, exit status and output, in ~20 s. ``start_ub(new_session=True)``
gives it a session of its own, whose leftovers a test can look for (test_prefect_outage).

What a fork cannot show stays ``python -m ub.flows.cli`` (``subprocess``): the console script
(test_cli), a command's own ``PYTHONPATH`` (test_own_components), the process tree a killed or
interrupted command leaves under its parent (test_orphans, test_serve).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

# What ``ub train`` imports that takes time, but Prefect (~5 s with ub's flows): Prefect sets up
# its settings and logging at import from the environment ``ub`` prepares first
# (ub.flows.prefect_env), so the child imports it. Of what these read from the environment at
# import, only torch's thread count differs between tests: the child sets it.
PRELOAD = ("torch", "transformers", "peft", "vllm.entrypoints.llm", "textarena", "duckdb",
           "pyarrow.parquet", "wandb", "ub.flows.cli")

_context: multiprocessing.context.ForkServerContext | None = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([__name__, *PRELOAD])
    return _context


def run_ub(args: Sequence[str], *, env: Mapping[str, str] | None = None,
           timeout: float = 900) -> subprocess.CompletedProcess:
    """``ub ARGS`` as ``subprocess.run([sys.executable, "-m", "ub.flows.cli", *ARGS],
    env=env, capture_output=True, text=True, timeout=timeout)`` would run it; the return code
    is negative for a signal, as subprocess gives it."""
    process = start_ub(args, env=env)
    try:
        out, err = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise subprocess.TimeoutExpired(["ub", *args], timeout, out, err) from None
    return subprocess.CompletedProcess(["ub", *args], process.returncode, out, err)


def start_ub(args: Sequence[str], *, env: Mapping[str, str] | None = None,
             new_session: bool = False) -> WarmProcess:
    """``ub ARGS`` started as ``subprocess.Popen([sys.executable, "-m", "ub.flows.cli",
    *ARGS], env=env, stdout=PIPE, stderr=PIPE, text=True, start_new_session=new_session)``
    would start it."""
    folder = Path(tempfile.mkdtemp(prefix="ub-warm-"))
    process = _forkserver().Process(
        target=_ub, args=(list(args), dict(os.environ if env is None else env), os.getcwd(),
                          str(folder), new_session))
    process.start()
    return WarmProcess(process, folder)


class WarmProcess:
    """A forked ``ub`` command: what the tests use of ``subprocess.Popen``."""

    def __init__(self, process: multiprocessing.process.BaseProcess, folder: Path) -> None:
        self._process, self._folder = process, folder
        self.pid: int = process.pid  # type: ignore[assignment]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"ub (pid {self.pid})", timeout or 0)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the end, then the command's stdout and stderr (its files go)."""
        self.wait(timeout)
        out, err = (Path(self._folder, name).read_text(errors="replace")
                    for name in ("stdout", "stderr"))
        shutil.rmtree(self._folder, ignore_errors=True)
        return out, err

    def send_signal(self, number: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _ub(args: list[str], env: dict[str, str], cwd: str, folder: str, new_session: bool
        ) -> None:
    """The forked child: ``ub.flows.cli.entry`` with ``args``, its output in ``folder``,
    then exit as the interpreter does (join non-daemon threads, run the exit handlers: Prefect
    drains its logs, vLLM shuts down)."""
    if new_session:
        os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(Path(folder, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    import torch

    from ub.flows.cli import main

    assert "prefect" not in sys.modules, "the forkserver imported Prefect (see PRELOAD)"
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = ["ub", *args]
    try:
        code = main(args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
