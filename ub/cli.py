"""The ``ub`` command line.

Every expected failure is a :class:`ub.errors.UbError`: printed as one ``ub: error: ...`` line on
stderr with exit code 2, no traceback. Heavy imports (vLLM, torch) happen inside the commands
that need them, so ``ub --help`` and argument errors are instant.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ub.errors import UbError


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as a UbError (one line) instead of usage + exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UbError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _game_count(text: str) -> int:
    from ub.run.config import MAX_GAMES

    value = _positive_int(text)
    if value > MAX_GAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_GAMES} games per call, got {value} "
                                         "(play more as several calls)")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):  # nan passes every comparison
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _check_can_create(folder: Path) -> None:
    """Fail before any work if ``folder`` could not be created and written, creating nothing
    (the folder appears only when its first file is written)."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a folder" if not existing.is_dir() else "permission denied"
        raise UbError(f"output folder {folder} is not writable ({existing}: {reason})")


def _check_writable(folder: Path) -> None:
    """Fail before any work if ``folder`` cannot take our files."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ub-write-check-"):
            pass
    except OSError as exc:
        raise UbError(f"output folder {folder} is not writable ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------------------------
# ub model tiny


def cmd_model_tiny(args: argparse.Namespace) -> int:
    from ub.model.tiny import build_tiny_model

    if args.for_checkpoint:
        print(_tiny_build_of(args.for_checkpoint, args))
        return 0
    out = Path(args.out) if args.out else None
    if out is not None:
        _check_writable(out.parent if out.parent != Path("") else Path("."))
    path = build_tiny_model(out, seed=args.seed)
    print(path)
    return 0


def _tiny_build_of(checkpoint: str, args: argparse.Namespace) -> str:
    """The folder of the tiny build a checkpoint records (plain PEFT loads its base from it)."""
    from ub.learner.checkpoint import checkpoint_base
    from ub.model.identity import portable_name, resolve_tiny_build

    if args.out or args.seed:
        raise UbError("--for takes the build from the checkpoint: give no --out or --seed")
    identity = checkpoint_base(checkpoint)
    if identity.get("kind") != "tiny":
        raise UbError(f"{checkpoint} was trained on {portable_name(identity)}, not a tiny "
                      "build: load that base model")
    return str(resolve_tiny_build(identity))


# --------------------------------------------------------------------------------------------
# ub play


def cmd_play(args: argparse.Namespace) -> int:
    from ub.actors.spec import parse_actor
    from ub.data.shards import next_free_shard, write_shard
    from ub.games.specs import GameSpec, check_env
    from ub.rollout import assign_games, play_games

    actors = [parse_actor(name) for name in args.players.split(",") if name.strip()]
    if not actors:
        raise UbError("--players needs at least one actor, e.g. --players model,random")
    spec = GameSpec(args.env, num_players=len(actors), template=args.template)
    if any(a.name == "expert" for a in actors):
        from ub.actors.expert import check_expert_supports

        check_expert_supports(spec.env_id)
    for actor in actors:
        if actor.kind == "hosted":
            from ub.actors.hosted import check_hosted

            check_hosted(actor.name)
    out = Path(args.out)
    _check_can_create(out)  # (created by the first shard write: a refusal leaves nothing)
    check_env(spec)  # fail in a second, before the engine starts

    engine = None
    if any(a.kind == "model" for a in actors):
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
    from ub.inference.vllm_engine import (
        EngineConfig,
        SamplingConfig,
        configure_vllm_environment,
        get_engine,
    )

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
    return get_engine(config, sampling)


def _adapters_base(adapters: list[str]) -> str:
    """The base model the adapters were trained on, found on this machine (a tiny build by its
    recorded key, built here if need be; a hub id; a folder), when no --model is given."""
    from ub.learner.checkpoint import checkpoint_base, resolve_checkpoint_base
    from ub.model.identity import portable_name

    names = {portable_name(checkpoint_base(a)): a for a in adapters}
    if len(names) > 1:
        raise UbError(f"the adapters were trained on different base models ({', '.join(names)})"
                      ": play them in separate commands, or pass --model")
    return resolve_checkpoint_base(next(iter(names.values())))


def _check_context(model: str, max_model_len: int, max_tokens: int) -> None:
    """Refuse a context the model cannot hold before vLLM starts (it refuses with a long
    traceback), and completions that leave no room for a prompt."""
    from ub.inference.vllm_engine import validate_model_dir

    limit = (validate_model_dir(model) or {}).get("max_position_embeddings")
    if isinstance(limit, int) and max_model_len > limit:
        raise UbError(f"--max-model-len {max_model_len} exceeds the model's context of {limit} "
                      f"tokens (max_position_embeddings in {model}/config.json): use at most "
                      f"{limit}")
    if max_tokens >= max_model_len:
        raise UbError(f"--max-tokens {max_tokens} must be below --max-model-len "
                      f"{max_model_len} (the context holds the prompt and the completion)")


def _rate(flags: list[bool]) -> str:
    return f"{sum(flags) / len(flags):.1%}" if flags else "-"


def _print_play_summary(rollout, actors, games_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    steps = rollout.steps.to_pylist()
    games = rollout.games.to_pylist()
    stats = rollout.stats
    table = Table(title=f"{stats.games} games of {games[0]['env_id'] if games else '?'}")
    for col in ("actor", "games", "win", "draw", "loss", "invalid moves", "format ok"):
        table.add_column(col, justify="left" if col == "actor" else "right")
    for name in dict.fromkeys(a.name for a in actors):
        results = [g["results"][s] for g in games if g["results"]
                   for s, a in enumerate(g["actors"]) if a == name]
        mine = [s for s in steps if s["actor"] == name]
        played = sum(1 for g in games for a in g["actors"] if a == name)
        table.add_row(
            name, str(played), str(results.count("win")), str(results.count("draw")),
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


# --------------------------------------------------------------------------------------------
# ub sql


def cmd_sql(args: argparse.Namespace) -> int:
    from ub.data.sql import connect, run_sql, table_dataset
    from ub.run.urls import is_url
    from ub.run.views import RunViews, is_run

    if is_url(args.root):
        con, names = _connect_store(args.root)
        root = args.root
    else:
        root = Path(args.root)
        if not root.exists():
            raise UbError(f"{root} does not exist: give the folder `ub play --out` or a run "
                          "wrote")
        extra = {}
        if is_run(root):
            views = RunViews(root)
            extra = views.tables()
            for table in ("steps", "games"):
                extra[f"eval_{table}"] = table_dataset(root / "eval", table)
            for warning in views.warnings:
                print(f"ub: warning: {warning}", file=sys.stderr)
        con = connect(root, extra)
        names = sorted(["steps", "games", *extra])
    try:
        if args.query is not None:
            _print_arrow(run_sql(con, args.query), args.format)
            return 0
        _sql_shell(con, root, names)
    finally:
        con.close()
    return 0


def _connect_store(url: str):
    """DuckDB over a run in a store: the shards read in place, the run's tables built from its
    records (fetched to a temporary folder; they are small)."""
    import tempfile

    from ub.data.schema import TABLES
    from ub.data.sql import connect_tables
    from ub.run.store import RunStore
    from ub.run.views import RunViews

    store = RunStore(url.rstrip("/"))
    if not store.files("games") and not store.files("rounds"):
        raise UbError(f"{url} holds no ub data (no games/ or rounds/): give the URL of a run "
                      "(the runs root followed by the run name)")
    tables = {}
    for table in TABLES:
        tables[table] = store.shard_dataset(table)
        tables[f"eval_{table}"] = store.shard_dataset(table, "eval")
    with tempfile.TemporaryDirectory(prefix="ub-sql-") as records:
        store.pull_records(Path(records))
        views = RunViews(Path(records))
        tables.update(views.tables())
    for warning in views.warnings:
        print(f"ub: warning: {warning}", file=sys.stderr)
    return connect_tables(tables), sorted(tables)


def _sql_shell(con, root: Path | str, views: list[str]) -> None:
    """Read statements (ending with ``;``) from stdin until EOF or ``.quit``."""
    import duckdb

    from ub.data.sql import run_sql

    interactive = sys.stdin.isatty()
    if interactive:
        print(f"ub sql {root} (read-only). Views: {', '.join(views)}. End statements with ';', "
              "quit with .quit or Ctrl-D.")
    buffer = ""
    while True:
        try:
            line = input("ub> " if not buffer else "... ") if interactive else sys.stdin.readline()
        except EOFError:
            break
        if not interactive and line == "":
            break
        if line.strip() in (".quit", ".exit"):
            break
        buffer += line + ("\n" if interactive else "")
        if buffer.strip().endswith(";"):
            try:
                for statement in con.extract_statements(buffer):
                    _print_arrow(run_sql(con, statement.query), "table")
            except (UbError, duckdb.Error) as exc:
                print(f"ub: error: {str(exc).splitlines()[0]}", file=sys.stderr)
            buffer = ""


def _print_arrow(table, fmt: str) -> None:
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(table.column_names)
        for row in table.to_pylist():
            writer.writerow(["" if v is None else v for v in row.values()])
        return
    from rich.console import Console
    from rich.table import Table

    view = Table(show_lines=False)
    for name in table.column_names:
        view.add_column(name)
    for row in table.to_pylist():
        view.add_row(*[_cell(v) for v in row.values()])
    Console().print(view)
    print(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")


def _cell(value: object, width: int = 80) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------------------------
# ub batch


def _yaml_section(path_text: str | None, section: str) -> dict:
    """The ``section:`` mapping of a YAML file (or the whole file if it has no such key)."""
    if not path_text:
        return {}
    import yaml

    from ub.run.config import load_yaml, read_text

    path = Path(path_text)
    try:
        loaded = load_yaml(read_text(path, "config")) or {}
    except yaml.YAMLError as exc:
        raise UbError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, dict):
        raise UbError(f"{path} must hold a mapping of settings")
    value = loaded.get(section, loaded)
    if not isinstance(value, dict):
        raise UbError(f"{path}: `{section}` must be a mapping of settings")
    return dict(value)


def _batch_config(args: argparse.Namespace):
    from ub.batch import BatchConfig

    data = _yaml_section(args.config, "batch")
    for key in ("batch_size", "seed", "max_train_len"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.rounds:
        first, _, last = args.rounds.partition(":")
        try:
            data["first_round"] = int(first) if first else None
            data["last_round"] = int(last) if last else (None if _ else data["first_round"])
        except ValueError:
            raise UbError(
                f"--rounds takes A:B, A: or :B with round numbers, got {args.rounds!r}"
            ) from None
    return BatchConfig.from_dict(data)


def cmd_batch(args: argparse.Namespace) -> int:
    from ub.batch import assemble_batch, explain

    root = Path(args.root)
    if not root.exists():
        raise UbError(f"{root} does not exist: give a data folder or run directory")
    config = _batch_config(args)
    if args.explain:
        print(explain(root, config))
        return 0
    batch = assemble_batch(root, config)
    stats = batch.stats
    print(f"batch: {stats.size} decisions (asked {stats.requested}) from rounds "
          f"{stats.window[0]}..{stats.window[1]} ({stats.shards} shards), per env {stats.per_env}")
    print(f"tokens: {stats.total_tokens} ({stats.prompt_tokens} prompt, "
          f"{stats.completion_tokens} completion), longest {stats.max_len}; truncated "
          f"{stats.truncated} sequences by {stats.truncated_tokens} tokens")
    print(f"reward: mean {stats.reward_mean:.3f} std {stats.reward_std:.3f} "
          f"[{stats.reward_min:.3f}, {stats.reward_max:.3f}]; advantage: mean "
          f"{stats.advantage_mean:.3f} std {stats.advantage_std:.3f} "
          f"[{stats.advantage_min:.3f}, {stats.advantage_max:.3f}]")
    print(f"assembled in {stats.seconds:.2f} s; the query (see --explain for the full plan):")
    print(batch.sql)
    return 0


# --------------------------------------------------------------------------------------------
# ub learn


def cmd_learn(args: argparse.Namespace) -> int:
    import json

    from ub.learner import learn_step

    root = Path(args.shards)
    if not root.exists():
        raise UbError(f"{root} does not exist: give the data folder of the decisions to learn from")
    if args.from_checkpoint and not Path(args.from_checkpoint).exists():
        raise UbError(f"checkpoint {args.from_checkpoint} does not exist")
    batch_config = _batch_config(args)
    learner_config = _learner_config(args)
    out = Path(args.out)
    _check_writable(out.parent)
    metrics = learn_step(root, batch_config, learner_config, args.from_checkpoint, out,
                         overwrite=args.overwrite)
    summary = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    print(json.dumps(summary, indent=2, default=str))
    print(f"checkpoint: {out}")
    return 0


def _learner_config(args: argparse.Namespace):
    """The ``learner:`` section of ``--config`` with the command-line overrides."""
    from ub.learner import LearnerConfig

    data = _yaml_section(args.config, "learner")
    for key in ("algorithm", "learning_rate", "init_adapter", "base_model"):
        if getattr(args, key, None) is not None:
            data[key] = getattr(args, key)
    start = getattr(args, "from_checkpoint", None) or data.get("init_adapter")
    if not data.get("base_model") and start:
        # The base model the checkpoint records (its own tiny build, not whatever `tiny`
        # builds now), found or built on this machine.
        from ub.learner.checkpoint import resolve_checkpoint_base

        data["base_model"] = resolve_checkpoint_base(start)
    if not data.get("base_model"):
        from ub.model.tiny import build_tiny_model

        data["base_model"] = str(build_tiny_model())
    return LearnerConfig.from_dict(data)


# --------------------------------------------------------------------------------------------
# ub sft


def cmd_sft(args: argparse.Namespace) -> int:
    from ub.sft import SftConfig, train_sft

    root = Path(args.shards)
    if not root.exists():
        raise UbError(f"{root} does not exist: give the data folder of the decisions to imitate")
    data = _yaml_section(args.config, "sft")
    for key in ("where", "epochs", "batch_size", "max_train_len", "seed"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    config = SftConfig.from_dict(data)
    learner_config = _learner_config(args)
    out = Path(args.out)
    _check_writable(out.parent)
    summary = train_sft(root, config, learner_config, out, overwrite=args.overwrite)
    print(f"{summary['decisions']} decisions, {summary['steps']} steps, final loss "
          f"{summary['loss']:.4f}")
    print(f"checkpoint: {out}")
    return 0


# --------------------------------------------------------------------------------------------
# ub envs


def cmd_envs(args: argparse.Namespace) -> int:
    from ub.games.legal import SUPPORTED_GAMES
    from ub.games.specs import NETWORK_GAMES, base_game, registered_env_ids

    for env_id in registered_env_ids():
        game = base_game(env_id)
        if args.all or game in SUPPORTED_GAMES:
            notes = []
            if game in SUPPORTED_GAMES:
                notes.append("scripted players")
            if game in NETWORK_GAMES:
                notes.append("needs network: refused")
            print(f"{env_id}" + (f"  ({', '.join(notes)})" if notes else ""))
    return 0


# --------------------------------------------------------------------------------------------
# ub train


def _catch_up(paths) -> None:
    """A run in a store (``--root s3://...``): bring this machine's copy up to date first."""
    if paths.store:
        from ub.run.lock import RunLock
        from ub.run.store import sync

        _check_store(paths)  # (before the lock creates the working copy)
        with RunLock(paths.lock):
            sync(paths)


def _check_store(paths) -> None:
    """A run in a store: its URL opens and lists (known scheme, package installed, endpoint
    reachable) before anything is written locally."""
    if paths.store:
        from ub.run.store import RunStore

        try:
            RunStore(paths.store).files("rounds")
        except OSError as exc:  # (some filesystems connect when they are opened)
            raise UbError(f"run store {paths.store} is unreachable ({exc}): check the URL, "
                          "the credentials and the network") from None


def _check_services(config) -> None:
    """The Ray cluster and hosted opponents a run needs answer, before the run writes."""
    if config.cluster.address is not None:
        from ub.run.cluster import check_reachable

        check_reachable(config.cluster.address)
    from ub.actors.spec import parse_actor
    from ub.pool.sampling import OpponentConfig

    names = [*OpponentConfig.from_dict(config.opponents).fixed_names(), *config.eval.opponents]
    for name in dict.fromkeys(names):
        if parse_actor(name).kind == "hosted":
            from ub.actors.hosted import check_hosted

            check_hosted(name)


def _check_manifests(paths) -> None:
    """Every committed round's manifest reads: a damaged one is refused here, naming the file
    and `ub doctor`, rather than by the flow after Prefect and the logs have started."""
    from ub.run.layout import read_json

    paths.next_round()  # (refuses a gap in the rounds)
    for round_ in paths.committed_rounds():
        read_json(paths.manifest(round_))


def cmd_train(args: argparse.Namespace) -> int:
    from ub.run.config import load_config
    from ub.run.layout import RunPaths
    from ub.run.lock import RunLock
    from ub.run.prefect_env import configure_prefect
    from ub.run.rounds import check_base_model, resolve_run_config

    if args.resume and args.config:
        raise UbError("give a CONFIG to start (or continue) a run, or --resume NAME to continue "
                      "one with its own config, not both")
    name = args.resume or args.run or (Path(args.config).stem if args.config else "tiny-cpu")
    paths = RunPaths.of(args.root, name)
    _catch_up(paths)
    config, source = None, None
    if not args.resume and (args.config or not paths.config.exists()):
        source = args.config or "tiny-cpu"
        config = load_config(source, args.set)
    elif args.set:
        raise UbError("--set changes a run's settings: it needs CONFIG (the run's data must "
                      "come from one config; start a new --run to change them)")
    # Everything that can be refused is refused here, in a second, before Prefect starts.
    resolved = resolve_run_config(paths, config, rounds=args.rounds, ray_address=args.ray)[0]
    check_base_model(resolved.model.base)
    _check_services(resolved)
    _check_manifests(paths)
    if paths.root.exists():
        RunLock(paths.lock).acquire().release()
    _check_can_create(paths.root.parent)

    configure_prefect((paths.root.parent if paths.store else Path(args.root)) / ".prefect")
    from ub.run.prefect_env import start_tied_server

    start_tied_server()  # dies with this process, even by SIGKILL
    from flows.selfplay import selfplay

    selfplay(run_name=name, config=source, root=str(args.root), rounds=args.rounds,
             overrides=list(args.set), quiet=args.quiet, ray_address=args.ray)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ub.data.shards import next_free_shard
    from ub.learner.checkpoint import latest_checkpoint
    from ub.run.layout import RunPaths, checkpoint_name
    from ub.run.lock import RunLock
    from ub.run.progress import baseline_cell, eval_cell
    from ub.run.rounds import (
        Run,
        actor_spec,
        evaluate_checkpoint,
        resolve_base_model,
        resolve_run_config,
    )
    from ub.run.store import fetch_checkpoint

    paths = RunPaths.of(args.root, args.run)
    _catch_up(paths)
    config, _ = resolve_run_config(paths, None)
    if args.checkpoint is None:
        latest = latest_checkpoint(paths.root / "checkpoints")
        if latest is None:
            raise UbError(f"run {args.run} has no checkpoint yet")
        update = int(latest.name.rsplit("-", 1)[1])
    else:
        update = args.checkpoint
        fetch_checkpoint(paths, paths.checkpoint(update))
        if not paths.checkpoint(update).exists():
            raise UbError(f"run {args.run} has no checkpoint {update} "
                          f"({paths.checkpoint(update)})")
    opponents = _names(args.opponents)
    envs = _names(args.envs)
    if args.games is not None and args.games % 2:
        raise UbError(f"--games must be even so both seats get the same number, got "
                      f"{args.games}")
    # Everything that can be refused is refused before the lock and the engine: an eval that
    # starts writes a shard.
    from ub.games.specs import check_env_id
    from ub.learner.checkpoint import read_adapter

    for env_id in envs or []:
        check_env_id(env_id)
    read_adapter(paths.checkpoint(update))  # safetensors that load, before vLLM meets them
    run = Run(paths, config, resolve_base_model(config))
    # Unknown names list the valid ones, before the engine starts.
    for name in opponents or []:
        actor_spec(run, name)
        if name == "expert":
            from ub.actors.expert import check_expert_supports

            for env_id in envs or config.eval.envs or [e.env_id for e in config.envs]:
                check_expert_supports(env_id)
    with RunLock(paths.lock):
        custom = opponents is not None or envs is not None or args.games is not None
        shard = max(1, next_free_shard(paths.eval_data, update).shard) if custom else 0
        result = evaluate_checkpoint(run, update, opponents=opponents, envs=envs,
                                     games=args.games, shard=shard)
    table = Table(title=f"{args.run}: {checkpoint_name(update)}")
    for column in ("env", "opponent", "games", "win rate [95% CI]", "random in its seats",
                   "draws", "losses", "invalid moves", "format ok"):
        table.add_column(column)
    for row in result["rows"]:
        table.add_row(row["env_id"], row["opponent"], str(row["games"]), eval_cell(row),
                      baseline_cell(row), str(row["draws"]), str(row["losses"]),
                      f"{row['invalid_move_rate']:.1%}", f"{row['format_rate']:.1%}")
    Console(highlight=False).print(table)
    print(f"games: {result['shard']}" + (" (stored earlier)" if result["reused"] else ""))
    return 0


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UbError(f"expected a comma-separated list of names, got {text!r}")
    return names


def cmd_serve(args: argparse.Namespace) -> int:
    from ub.serve import plan_server, serve

    return serve(plan_server(_run_dir(args), args.checkpoint, host=args.host, port=args.port))


def cmd_dashboard(args: argparse.Namespace) -> int:
    from ub.dashboard import run_dashboard

    run_dashboard(_run_dir(args), once=args.once, refresh=args.refresh)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ub.report import write_report

    root = _run_dir(args)
    print(write_report(root, Path(args.out) if args.out else root / "report"))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from ub.run.doctor import examine, repair
    from ub.run.lock import RunLock, holder

    root = _run_dir(args)
    if not args.repair:
        live = holder(root / "run.lock")
        if live is not None:
            print(f"note: run {root.name} is in use by pid {live.get('pid', '?')}: checking its "
                  "committed rounds only")
        exam = examine(root, live=live is not None)
        _print_findings(exam)
        return 1 if exam.findings else 0
    with RunLock(root / "run.lock"):  # nothing may write the run while it is repaired
        exam = examine(root)
        _print_findings(exam)
        if not exam.findings:
            return 0
        moved = repair(exam)
    for source, target in moved:
        print(f"quarantined {source.relative_to(root)} -> {target.relative_to(root)}")
    rewritten = [f for f in exam.findings if f.derived and f.path.exists()]
    for finding in rewritten:
        print(f"rewrote {finding.path.relative_to(root)} from the run's data")
    first = exam.first_broken_round
    if first is not None:
        print(f"run {root.name} is back at round {first}: `ub train --resume {root.name} "
              f"--root {root.parent}` replays rounds {first}..{exam.rounds[-1]} as they were "
              "(same seed, same games)")
    return 0


def _print_findings(exam) -> None:
    for finding in exam.findings:
        print(f"problem: {finding.line(exam.root)}")
    verdict = (f"{len(exam.findings)} problem(s); `ub doctor {exam.root} --repair` quarantines "
               "what cannot be trusted" if exam.findings else "ok")
    print(f"{exam.root.name}: {len(exam.rounds)} committed round(s), {verdict}")
    print(exam.format_line)


def _run_dir(args: argparse.Namespace) -> Path:
    """A run given by name (under --root) or as a path."""
    from ub.run.layout import RunPaths, check_run_name
    from ub.run.urls import is_url

    candidate = Path(args.run)
    if candidate.is_dir():
        return candidate
    if is_url(args.root):  # a run in a store: this machine's working copy of it
        root = RunPaths.of(args.root, args.run).root
        if not root.is_dir():
            raise UbError(f"this machine has no copy of run {args.run!r} of {args.root}: "
                          f"`ub sql {args.root.rstrip('/')}/{args.run}` reads it in place")
        return root
    root = Path(args.root) / check_run_name(args.run)
    if not root.is_dir():
        raise UbError(f"no run {args.run!r} under {args.root} (and no folder {args.run})")
    return root


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ub", description="Self-play RL for language models on TextArena games.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    model = sub.add_parser("model", help="build models")
    model_sub = model.add_subparsers(dest="model_command", required=True, parser_class=_Parser)
    tiny = model_sub.add_parser("tiny", help="build (or find cached) the tiny CPU default model")
    tiny.add_argument("--seed", type=int, default=0, help="build seed (default 0)")
    tiny.add_argument("--out", help="build into this folder instead of the cache")
    tiny.add_argument("--for", dest="for_checkpoint", metavar="CKPT",
                      help="the tiny build checkpoint CKPT was trained on (found or built)")
    tiny.set_defaults(func=cmd_model_tiny)

    play = sub.add_parser("play", help="play games and write a Parquet shard")
    play.add_argument("--env", required=True, help="TextArena env id, e.g. TicTacToe-v0-train")
    play.add_argument("--games", type=_game_count, default=16, help="number of games")
    play.add_argument("--players", default="model,random",
                      help="actors by seat, comma-separated: model, model:ADAPTER, random")
    play.add_argument("--out", required=True, help="data folder (steps/ and games/ go inside)")
    play.add_argument("--model", help="model directory (default: the base model the "
                      "adapters record, else the tiny CPU model)")
    play.add_argument("--template", default="plain", help="prompt template (plain, qwen3-zs, chat)")
    play.add_argument("--seed", type=int, default=0, help="seed of games and sampling")
    play.add_argument("--round", type=_non_negative_int, default=0,
                      help="round number stored with the data")
    play.add_argument("--run", default="play", help="run name stored with the data")
    play.add_argument("--temperature", type=_non_negative_float, default=1.0)
    play.add_argument("--max-tokens", type=_positive_int, default=32,
                      help="most tokens per model decision")
    play.add_argument("--max-model-len", type=_positive_int, default=2048)
    play.add_argument("--max-lora-rank", type=_positive_int, default=16)
    play.add_argument("--concurrency", type=_positive_int, default=128,
                      help="most games in flight at once")
    play.set_defaults(func=cmd_play)

    sql = sub.add_parser("sql", help="read-only SQL over a data folder or run (docs/sql.md)")
    sql.add_argument("root", help="a data folder, a run directory or a run's store URL "
                     "(s3://bucket/runs/NAME)")
    sql.add_argument("query", nargs="?", help="the SQL query (none: an interactive shell)")
    sql.add_argument("--format", choices=("table", "csv"), default="table")
    sql.set_defaults(func=cmd_sql)

    batch = sub.add_parser("batch", help="show the training batch a config would assemble")
    batch.add_argument("root", help="a data folder or run directory")
    batch.add_argument("--config", help="YAML file of batch settings (or with a `batch:` key)")
    batch.add_argument("--batch-size", type=_positive_int)
    batch.add_argument("--rounds", help="window of rounds, A:B inclusive (A: or :B open)")
    batch.add_argument("--seed", type=int)
    batch.add_argument("--max-train-len", type=_positive_int)
    batch.add_argument("--explain", action="store_true", help="print the plan and SQL only")
    batch.set_defaults(func=cmd_batch)

    learn = sub.add_parser("learn", help="one learner update: shards -> new LoRA checkpoint")
    learn.add_argument("--shards", required=True, help="data folder with the decisions")
    learn.add_argument("--from", dest="from_checkpoint", help="checkpoint to continue from "
                       "(default: a cold start from --init-adapter or a fresh adapter)")
    learn.add_argument("--out", required=True, help="checkpoint folder to write")
    learn.add_argument("--config", help="YAML with `batch:` and `learner:` sections")
    learn.add_argument("--base-model", help="base model directory (default: the one --from or "
                       "--init-adapter records, else the tiny model)")
    learn.add_argument("--init-adapter", help="PEFT adapter to start a cold start from")
    learn.add_argument("--algorithm", help="reinforce (default) or ppo")
    learn.add_argument("--learning-rate", type=_non_negative_float)
    learn.add_argument("--batch-size", type=_positive_int)
    learn.add_argument("--rounds", help="window of rounds, A:B inclusive")
    learn.add_argument("--seed", type=int)
    learn.add_argument("--max-train-len", type=_positive_int)
    learn.add_argument("--overwrite", action="store_true", help="redo an existing --out")
    learn.set_defaults(func=cmd_learn)

    train = sub.add_parser("train", help="train by self-play: a resumable Prefect run")
    train.add_argument("config", nargs="?", help="a preset (tiny-cpu, qwen3-1.7b-simpletak, "
                       "spiral-kuhn) or a YAML file (default: tiny-cpu, or the run's own)")
    train.add_argument("--run", help="run name (default: the config's name)")
    train.add_argument("--resume", metavar="NAME", help="continue run NAME with its own config")
    train.add_argument("--root", default="runs", help="folder of runs, or an fsspec URL such "
                       "as s3://bucket/runs (docs/scaling.md; default: runs)")
    train.add_argument("--rounds", type=_positive_int, help="total rounds (extends a finished run)")
    train.add_argument("--ray", metavar="ADDRESS",
                       help="run rollouts and the learner on this Ray cluster (auto, HOST:PORT, "
                       "ray://HOST:10001; 'local': in this process); overrides cluster.address")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting, e.g. --set rollout.games_per_round=64")
    train.add_argument("--quiet", action="store_true", help="no progress output")
    train.set_defaults(func=cmd_train)

    sft = sub.add_parser("sft", help="warm start: fine-tune an adapter on SQL-selected moves")
    sft.add_argument("--shards", required=True, help="data folder with the decisions")
    sft.add_argument("--out", required=True, help="checkpoint folder to write")
    sft.add_argument("--where", help="DuckDB condition over s (steps) and g (games); default: "
                     "the winners' legal moves")
    sft.add_argument("--config", help="YAML with `sft:` and `learner:` sections")
    sft.add_argument("--epochs", type=_positive_int)
    sft.add_argument("--batch-size", type=_positive_int)
    sft.add_argument("--max-train-len", type=_positive_int)
    sft.add_argument("--seed", type=int)
    sft.add_argument("--learning-rate", type=_non_negative_float)
    sft.add_argument("--base-model", help="base model directory (default: the one "
                     "--init-adapter records, else the tiny model)")
    sft.add_argument("--init-adapter", help="PEFT adapter to start from")
    sft.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    sft.set_defaults(func=cmd_sft)

    evaluate = sub.add_parser("eval", help="evaluate a run's checkpoint against fixed opponents")
    evaluate.add_argument("run", help="run name")
    evaluate.add_argument("--root", default="runs",
                          help="folder of runs, or an fsspec URL (default: runs)")
    evaluate.add_argument("--checkpoint", type=int, help="checkpoint update (default: latest)")
    evaluate.add_argument("--opponents", help="comma-separated actors (default: the run's)")
    evaluate.add_argument("--envs", help="comma-separated env ids (default: the run's)")
    evaluate.add_argument("--games", type=_game_count, help="games per (env, opponent)")
    evaluate.set_defaults(func=cmd_eval)

    serve = sub.add_parser("serve", help="serve a run's checkpoints with vLLM's OpenAI-compatible "
                           "server (docs/serving.md)")
    serve.add_argument("run", help="run name (under --root) or run directory")
    serve.add_argument("--root", default="runs", help="folder of runs (default: runs)")
    serve.add_argument("--checkpoint", default="latest",
                       help="checkpoint number, latest (default) or all")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")
    serve.add_argument("--port", type=_positive_int, default=8000, help="port (default 8000)")
    serve.set_defaults(func=cmd_serve)

    dashboard = sub.add_parser("dashboard", help="live terminal view of a run (q quits)")
    dashboard.add_argument("run", help="run name (under --root) or run directory")
    dashboard.add_argument("--root", default="runs", help="folder of runs (default: runs)")
    dashboard.add_argument("--once", action="store_true", help="print one frame and exit")
    dashboard.add_argument("--refresh", type=_non_negative_float, default=2.0,
                           help="seconds between refreshes (default 2)")
    dashboard.set_defaults(func=cmd_dashboard)

    report = sub.add_parser("report", help="plots of a run: PNGs and one HTML page")
    report.add_argument("run", help="run name (under --root) or run directory")
    report.add_argument("--root", default="runs", help="folder of runs (default: runs)")
    report.add_argument("--out", help="output folder (default: RUN/report)")
    report.set_defaults(func=cmd_report)

    doctor = sub.add_parser("doctor", help="check a run's integrity (--repair: quarantine "
                            "what is broken so it can resume)")
    doctor.add_argument("run", help="run name (under --root) or run directory")
    doctor.add_argument("--root", default="runs", help="folder of runs (default: runs)")
    doctor.add_argument("--repair", action="store_true",
                        help="move untrustworthy files to RUN/quarantine/ (nothing is deleted)")
    doctor.set_defaults(func=cmd_doctor)

    envs = sub.add_parser("envs", help="list TextArena env ids ub can play")
    envs.add_argument("--all", action="store_true", help="every registered id, not just scripted")
    envs.set_defaults(func=cmd_envs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ub`` command."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UbError as exc:
        print(f"ub: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # Every ub write is atomic: what failed left nothing behind, so rerunning resumes.
        print(f"ub: error: {exc.strerror} writing {exc.filename or 'a file'}: free space, "
              "then run the same command again", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ub: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ub sql ... | head`
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
