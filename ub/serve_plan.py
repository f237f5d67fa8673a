"""What ``ub serve`` starts for a run, resolved and checked before anything starts (every
refusal happens here), and the example request it prints once the server answers
(:mod:`ub.serve` starts and stops the server)."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.numbers import PORTS, NumberError, parse_int


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
        api_key: the key every request must bring (``None``: none; only on loopback). It
            reaches the server through its environment (``VLLM_API_KEY``), never its command
            line, and no repr or printed line shows it.
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
    api_key: str | None = field(default=None, repr=False)

    @property
    def base_name(self) -> str:
        return f"{self.run}/base"

    @property
    def url(self) -> str:
        """The server's base URL as a client on this machine reaches it."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def workdir(self) -> Path | None:
        """Where the server runs: the checkpoints' folder, so that each LoRA module is given
        (and ``GET /v1/models`` shows it, as its ``root``) by its folder's name, not this
        machine's absolute path."""
        return next(iter(self.modules.values())).parent if self.modules else None

    def server_args(self) -> list[str]:
        """vLLM server options (the engine's own come from the engine settings)."""
        args = ["--host", self.host, "--port", str(self.port),
                "--served-model-name", self.base_name, "--no-use-tqdm-on-load"]
        if self.modules:
            args += ["--lora-modules", *(f"{name}={path.name}"  # (in self.workdir)
                                         for name, path in self.modules.items())]
        return args

    def command(self) -> list[str]:
        engine = json.dumps(self.engine.to_dict())
        return [sys.executable, "-m", "ub.serve", engine, *self.server_args()]


# --------------------------------------------------------------------------------------------
# Planning: every refusal happens here, before anything starts
# --------------------------------------------------------------------------------------------


def plan_server(run_dir: Path, checkpoint: str | None = None, *, host: str = "127.0.0.1",
                port: int = 8000, api_key: str | None = None) -> ServerPlan:
    """Resolve and check what ``ub serve`` would start for the run at ``run_dir``.

    Args:
        run_dir: the run's directory.
        checkpoint: a checkpoint number, ``"latest"`` (``None``) or ``"all"``.
        host: the address to listen on.
        port: the port to listen on (it must be free).
        api_key: the key every request must bring; required unless ``host`` is loopback.
    """
    from ub.learner.checkpoint import is_checkpoint
    from ub.run.folder.layout import RunPaths, checkpoint_name
    from ub.run.steps.play import run_engine_config
    from ub.run.steps.rounds import Run, resolve_run_config

    paths = RunPaths(Path(run_dir).absolute())
    config = resolve_run_config(paths, None)[0]
    updates = _checkpoint_updates(paths.root / "checkpoints", is_checkpoint)
    if not updates:
        raise UbError(f"run {paths.name} has no finished checkpoint yet (none in "
                      f"{paths.root / 'checkpoints'}): train it first "
                      f"(`{paths.resume_command}`)")
    wanted = _choose(checkpoint, updates, paths.name)
    _check_access(host, port, api_key)
    run = Run.of(paths, config)
    engine = run_engine_config(run).replace(sleep_mode=False)  # (a server: awake)
    modules = {f"{paths.name}/{checkpoint_name(u)}": paths.checkpoint(u) for u in wanted}
    _check_adapters(engine, modules)
    envs = tuple(ServedEnv(e.env_id, e.num_players, e.template) for e in config.envs)
    return ServerPlan(paths.name, engine, modules, host, port, envs,
                      config.sampling.max_tokens, config.eval.temperature,
                      tuple(config.sampling.stop), api_key)


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
        update = parse_int(text.removeprefix("ckpt-"))
    except NumberError:
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


def _check_access(host: str, port: int, api_key: str | None) -> None:
    """Refuse a port that is taken, and an address beyond this machine without an API key."""
    address = _check_port(host, port)
    if api_key or ipaddress.ip_address(address.split("%")[0]).is_loopback:
        return
    raise UbError(f"--host {host} listens beyond this machine ({address}), and the server has "
                  "no API key: anyone who reaches the port could use the model. Give one "
                  "(export VLLM_API_KEY=..., or --api-key), or serve on 127.0.0.1 "
                  "(docs/serving.md)")


def _check_port(host: str, port: int) -> str:
    """Refuse a port that is taken (or a host this machine cannot listen on) before the minute
    a server start takes; return the address it resolves to. vLLM's server sets SO_REUSEADDR
    too, so a port in TIME_WAIT is free."""
    if not PORTS[0] <= port <= PORTS[1]:
        raise UbError(f"--port must be in {PORTS[0]}..{PORTS[1]}, got {port}")
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
    return str(address[0])


def _check_adapters(engine: Any, modules: dict[str, Path]) -> None:
    """Each checkpoint is as ub wrote it (every file its manifest lists, at its sha256, and no
    other: vLLM would load a pickled ``adapter_model.bin`` put beside or instead of the
    safetensors, and unpickling runs code) and loads in vLLM with these settings (a bad
    adapter would stop the server in the middle of its start, with a traceback)."""
    from ub.inference.validation import validate_adapter_dir, validate_model_dir
    from ub.learner.checkpoint import foreign_files, read_manifest, verify_files

    model_config = validate_model_dir(engine.model)
    for path in modules.values():
        manifest = read_manifest(path)
        foreign = foreign_files(path, manifest)
        if foreign:
            raise UbError(f"checkpoint {path} holds {', '.join(foreign)}, which ub did not write "
                          "there: ub serves a checkpoint only as ub wrote it (safetensors; a "
                          "pickled adapter_model.bin would run code as it loads). Move those "
                          "files out, or serve another checkpoint")
        verify_files(path, manifest)
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
    key = ' -H "Authorization: Bearer $VLLM_API_KEY"' if plan.api_key else ""
    return (f"curl {plan.url}/v1/completions -H 'Content-Type: application/json'{key} "
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
    if plan.api_key:
        lines.append("  every request brings the API key: -H \"Authorization: Bearer KEY\""
                     + ("" if os.environ.get("VLLM_API_KEY") == plan.api_key else
                        " (the example reads it from $VLLM_API_KEY: export it there)"))
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
