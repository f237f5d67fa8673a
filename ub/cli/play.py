"""``ub play``: play games and write a Parquet shard."""

from __future__ import annotations

import argparse
from pathlib import Path

from ub.cli.args import (
    game_count,
    non_negative_float,
    positive_int,
    round_number,
    whole_number,
)
from ub.data.atomic import check_can_create
from ub.errors import UbError


def add_parser(sub) -> None:
    play = sub.add_parser("play", help="play games and write a Parquet shard")
    play.add_argument("--env", required=True, help="TextArena env id, e.g. TicTacToe-v0-train")
    play.add_argument("--games", type=game_count, default=16, help="number of games")
    play.add_argument("--players", default="model,random",
                      help="actors by seat, comma-separated: model, model:ADAPTER (a "
                      "checkpoint folder), random, expert, perfect (games with a solver), "
                      "hosted:MODEL@BASE_URL, or package.module:Class (a seat of one's own; "
                      "docs/pool.md)")
    play.add_argument("--out", required=True, help="data folder (steps/ and games/ go inside)")
    play.add_argument("--model", help="model directory (default: the base model the "
                      "adapters record, else the tiny CPU model)")
    play.add_argument("--template", default="plain", help="prompt template (plain, qwen3-zs, chat)")
    play.add_argument("--seed", type=whole_number, default=0, help="seed of games and sampling")
    play.add_argument("--round", type=round_number(), default=0,
                      help="round number stored with the data")
    play.add_argument("--run", default="play", help="run name stored with the data")
    play.add_argument("--temperature", type=non_negative_float, default=1.0)
    play.add_argument("--max-tokens", type=positive_int, default=32,
                      help="most tokens per model decision")
    play.add_argument("--max-model-len", type=positive_int, default=2048)
    play.add_argument("--max-lora-rank", type=positive_int, default=16)
    play.add_argument("--concurrency", type=positive_int, default=128,
                      help="most games in flight at once")
    play.add_argument("--legal-moves", choices=("free", "mask"), default="free",
                      help="mask: the model samples only legal moves (docs/training.md)")
    play.add_argument("--rules", metavar="PATH", help="the game's rules of one's own, "
                      "package.module:Class (importing it registers its env with TextArena; "
                      "docs/games.md)")
    play.set_defaults(func=cmd_play)


def cmd_play(args: argparse.Namespace) -> int:
    from ub.actors.spec import parse_actor
    from ub.data.shards import next_free_shard, write_shard
    from ub.games.specs import GameSpec, check_env, check_legal_moves
    from ub.rollout import assign_games, play_games

    actors = [parse_actor(name) for name in args.players.split(",") if name.strip()]
    if not actors:
        raise UbError("--players needs at least one actor, e.g. --players model,random")
    spec = GameSpec.from_dict({"env_id": args.env, "num_players": len(actors),
                               "template": args.template, "legal_moves": args.legal_moves,
                               "rules": args.rules})
    for actor in actors:
        actor.check_game(spec.env_id)
        actor.check_ready()  # (a hosted endpoint answers, its key is set)
    out = Path(args.out)
    check_can_create(out)  # (created by the first shard write: a refusal leaves nothing)
    check_env(spec)  # fail in a second, before the engine starts
    check_legal_moves(spec)

    engine = None
    if any(a.needs_engine for a in actors):
        from ub.learner.checkpoint import read_adapter

        for actor in actors:  # safetensors that load, before vLLM meets them
            if actor.adapter is not None:
                read_adapter(actor.adapter)
        engine = _engine_from_args(args, [a.adapter for a in actors if a.adapter is not None])
        for actor in actors:  # validate adapters (paths, rank) before playing anything
            engine.lora_request(actor.adapter)

    assignments = assign_games(spec, actors, args.games, args.seed, round_=args.round)
    sid = next_free_shard(out, args.round)
    rollout = play_games(
        assignments, engine=engine, run=args.run, round_=args.round, shard=sid.shard,
        base_seed=args.seed, concurrency=args.concurrency,
    )
    extra = {"env_id": spec.env_id, "players": [a.name for a in actors], "seed": args.seed}
    if engine is not None:
        extra["model"] = str(engine.config.model)
    _, games_path = write_shard(out, sid, args.run, rollout.steps, rollout.games, extra)
    _print_play_summary(rollout, actors, games_path)
    return 0


def _engine_from_args(args: argparse.Namespace, adapters: list[str] | None = None):
    from ub.inference.types import EngineConfig, SamplingConfig
    from ub.run.processes.worker import process_worker
    from ub.vllm_environment import configure_vllm_environment

    configure_vllm_environment()
    model = args.model
    if model is None and adapters:
        model = _adapters_base(adapters)
        if not Path(model).is_dir():  # a hub id: `ub play` runs local model folders only
            raise UbError(f"the adapters were trained on {model}: download it and pass its "
                          "folder as --model")
    if model is None:
        from ub.model.tiny import build_tiny_model

        model = str(build_tiny_model())
    elif not Path(model).exists():
        raise UbError(
            f"model directory {model} does not exist (build the default with `ub model tiny`)"
        )
    _check_context(model, args.max_model_len, args.max_tokens)
    config = EngineConfig(model=model, max_model_len=args.max_model_len,
                          max_lora_rank=args.max_lora_rank)
    sampling = SamplingConfig(temperature=args.temperature, max_tokens=args.max_tokens)
    return process_worker().engine(config, sampling)


def _adapters_base(adapters: list[str]) -> str:
    """The base model the adapters were trained on, found on this machine (a tiny build by its
    recorded key, built here if need be; a hub id; a folder), when no --model is given."""
    from ub.learner.base_identity import checkpoint_base, resolve_checkpoint_base
    from ub.model.identity import portable_name

    names = {portable_name(checkpoint_base(a)): a for a in adapters}
    if len(names) > 1:
        raise UbError(f"the adapters were trained on different base models ({', '.join(names)})"
                      ": play them in separate commands, or pass --model")
    return resolve_checkpoint_base(next(iter(names.values())))


def _check_context(model: str, max_model_len: int, max_tokens: int) -> None:
    """Refuse a context the model cannot hold before vLLM starts (it refuses with a long
    traceback), and completions that leave no room for a prompt."""
    from ub.inference.validation import context_problem, validate_model_dir

    problem = context_problem(validate_model_dir(model), max_model_len)
    if problem:
        raise UbError(f"--max-model-len {problem} ({model})")
    if max_tokens >= max_model_len:
        raise UbError(f"--max-tokens {max_tokens} must be below --max-model-len "
                      f"{max_model_len} (the context holds the prompt and the completion)")


def _rate(flags: list[bool]) -> str:
    return f"{sum(flags) / len(flags):.1%}" if flags else "-"


def _print_play_summary(rollout, actors, games_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from ub.display import shown

    steps = rollout.steps.to_pylist()
    games = rollout.games.to_pylist()
    stats = rollout.stats
    table = Table(title=shown(f"{stats.games} games of {games[0]['env_id'] if games else '?'}"))
    for col in ("actor", "games", "win", "draw", "loss", "invalid moves", "format ok"):
        table.add_column(col, justify="left" if col == "actor" else "right")
    for name in dict.fromkeys(a.name for a in actors):
        results = [g["results"][s] for g in games if g["results"]
                   for s, a in enumerate(g["actors"]) if a == name]
        mine = [s for s in steps if s["actor"] == name]
        played = sum(1 for g in games for a in g["actors"] if a == name)
        table.add_row(
            shown(name), str(played), str(results.count("win")), str(results.count("draw")),
            str(results.count("loss")), _rate([s["invalid_move"] for s in mine]),
            _rate([s["format_ok"] for s in mine]),
        )
    console = Console()
    console.print(table)
    console.print(
        f"{stats.decisions} decisions ({stats.model_decisions} by the model), "
        f"{stats.errored_games} errored games, {stats.generated_tokens} tokens generated, "
        f"{stats.tokens_per_second:.0f} tokens/s, {stats.games_per_second:.1f} games/s "
        f"in {stats.seconds:.1f} s"
    )
    console.print(f"wrote {games_path.parent.parent.parent}  (query it: ub sql "
                  f"{games_path.parent.parent.parent} \"SELECT ...\")")
