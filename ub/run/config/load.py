"""The training run's configuration: typed, loaded from a preset or YAML, validated up front.

A config is plain YAML. ``ub train CONFIG`` takes a preset name (``ub/presets/NAME.yaml``) or a
path; ``--set key.sub=value`` overrides single fields (the value is parsed as YAML, so
``--set rollout.games_per_round=64`` is an int). Every field is checked before any work starts:
a bad value names its field and what is allowed, in one line.

The schema is :class:`ub.run.config.schema.TrainConfig`: the run's own sections, and those
declared in the packages that use them, which the library takes as they are (``batch`` is
:class:`ub.batch.BatchConfig`, ``opponents`` :class:`ub.pool.OpponentConfig`, ...; ``learner``
becomes :class:`ub.learner.LearnerConfig` with the base model). ``docs/config.md`` lists every
key and ``ub config show`` prints a resolved config with each key's meaning
(:mod:`ub.run.config.docs`). This module adds the checks across sections and against what the
settings feed. The games a config plays are :func:`game_specs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ub.errors import UbError
from ub.games.specs import EnvStartError, GameSpec, check_env, check_legal_moves
from ub.inference.types import SamplingConfig
from ub.numbers import first_non_finite
from ub.run.config.schema import (  # re-exported: the schema's names are imported from here too
    MAX_GAMES,
    ClusterSection,
    EngineSection,
    EnvSection,
    EvalEnvSection,
    EvalSection,
    ModelSection,
    PipelineSection,
    RolloutSection,
    TrackingSection,
    TrainConfig,
    WorkerResources,
)
from ub.settings import apply_overrides, format_errors, load_yaml

__all__ = ["MAX_GAMES", "ClusterSection", "EngineSection", "EnvSection", "EvalSection",
           "ModelSection", "PipelineSection", "RolloutSection", "SamplingConfig",
           "TrackingSection", "TrainConfig", "WorkerResources",
           "config_run_name", "game_specs", "load_config", "preset_names",
           "read_config_data", "read_text", "validate_config"]

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"


def read_text(path: Path, what: str) -> str:
    """A config file's text, or one line saying why it cannot be read (not UTF-8, unreadable)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UbError(f"{what} {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                      f"offset {exc.start}): save it as UTF-8") from None
    except OSError as exc:
        raise UbError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _format_error(exc: ValidationError, source: str) -> str:
    return f"invalid config {source}: " + format_errors(exc, model=TrainConfig)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def _is_config_file(name_or_path: str) -> bool:
    """A YAML path rather than a preset name (the one place that decides it)."""
    path = Path(name_or_path).expanduser()
    return path.suffix in (".yaml", ".yml") or path.exists()


def config_run_name(name_or_path: str) -> str:
    """The run a config starts by default: a preset's own name (``qwen3-1.7b-simpletak``: its
    dots are part of the name, not a suffix), or a YAML file's name without its extension."""
    if _is_config_file(name_or_path):
        return Path(name_or_path).stem
    return name_or_path


def read_config_data(name_or_path: str) -> tuple[dict[str, Any], str]:
    """The raw mapping of a preset name or YAML path, and a label saying which it was."""
    path = Path(name_or_path).expanduser()
    if _is_config_file(name_or_path):
        if not path.is_file():
            raise UbError(f"config file {path} does not exist; presets: "
                          f"{', '.join(preset_names())}")
        label = str(path)
    else:
        path = PRESETS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            import difflib

            near = difflib.get_close_matches(name_or_path, preset_names(), n=1)
            raise UbError(f"unknown preset {name_or_path!r}"
                          + (f"; did you mean {near[0]!r}?" if near else "")
                          + f" Presets: {', '.join(preset_names())} (or give a YAML file path)")
        label = f"preset {name_or_path}"
    try:
        data = load_yaml(read_text(path, "config")) or {}
    except yaml.YAMLError as exc:
        raise UbError(f"{label} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise UbError(f"{label} must be a YAML mapping of settings, got {type(data).__name__}")
    return data, label


def validate_config(data: dict[str, Any], source: str = "") -> TrainConfig:
    """A :class:`TrainConfig` from a mapping, with every section checked (batch, learner,
    opponents and rating by their own validators) and every setting against what it feeds (the
    games, the engine, the data's columns), or one :class:`UbError` line."""
    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise UbError(_format_error(exc, source or "(from mapping)")) from None
    # The typed fields refuse nan and inf themselves; this finds them in free-form ones
    # (algorithm_params, a transform's parameters) before a learner or a query gets them.
    found = first_non_finite(data)
    if found:
        raise UbError(f"invalid config {source}: {found[0]}: expected a finite number, got "
                      f"{found[1]}")
    _check_sections(config, source)
    return config


def _check_sections(config: TrainConfig, source: str) -> None:
    from ub.data.schema import int_column_range
    from ub.inference.validation import ENGINE_SEEDS

    def fail(field: str, message: str) -> UbError:
        return UbError(f"invalid config {source}: {field}: {message}")

    if config.seed not in ENGINE_SEEDS:
        raise fail("seed", f"got {config.seed}; it is also vLLM's engine seed, which takes "
                   f"{ENGINE_SEEDS.start} to {ENGINE_SEEDS.stop - 1}: choose one in that range")
    last_round = int_column_range("games", "round")[1]
    if config.rounds > last_round:
        raise fail("rounds", f"got {config.rounds}; the data's round column holds round "
                   f"numbers up to {last_round}")
    for i, env in enumerate(config.envs):
        try:
            check_env(env.game())  # (a reset: TextArena checks the player count there)
        except EnvStartError as exc:
            raise fail(f"envs.{i}.num_players", f"{exc}: give a player count the game has"
                       ) from None
        except UbError as exc:
            raise fail(f"envs.{i}", str(exc)) from None
    for entry in config.eval.envs or []:
        try:
            check_env(game_specs(config, [entry])[0])
        except EnvStartError as exc:
            raise fail("eval.envs", f"{exc} (an env not trained on is evaluated with two seats, "
                       "the checkpoint and an opponent)") from None
        except UbError as exc:
            raise fail("eval.envs", str(exc)) from None
    for field, spec in [*((f"envs.{i}.legal_moves", e) for i, e in enumerate(config.envs)),
                        *(("eval.legal_moves", s) for s in game_specs(
                            config, config.eval.envs or [e.env_id for e in config.envs]))]:
        try:
            check_legal_moves(spec)
        except UbError as exc:
            raise fail(field, str(exc)) from None
    branch = config.rollout.branch
    if branch.on:
        from ub.branching import check_copyable
        from ub.games.positions import position_function

        for i, env in enumerate(config.envs):
            try:
                check_copyable(env.game())
            except UbError as exc:
                raise fail(f"envs.{i}", str(exc)) from None
            if branch.select == "spread" and position_function(env.env_id, env.position) is None:
                raise fail("rollout.branch.select", f"spread reads the returns seen in each "
                           f"position, and {env.env_id} has no position keys: give its "
                           "envs[].position a function (docs/data.md) or select random or "
                           "surprisal")
    from ub.actors.spec import parse_actor

    for name in config.eval.opponents:  # (the opponents section checks its own names)
        try:
            parse_actor(name)
        except UbError as exc:
            raise fail("eval.opponents", str(exc)) from None
    train_envs = [e.env_id for e in config.envs]
    seated = [("opponents", config.opponents.fixed_names(), train_envs),
              ("eval.opponents", config.eval.opponents, config.eval.env_ids or train_envs)]
    for field, names, env_ids in seated:
        for env_id in env_ids:
            try:
                for name in names:
                    parse_actor(name).check_game(env_id)
            except UbError as exc:
                raise fail(field, str(exc)) from None
    if config.learner.temperature is None and config.sampling.temperature == 0:
        # (what learner_config() would give the learner, which scores at a temperature > 0)
        raise fail("learner.temperature", "null takes sampling.temperature, 0 (greedy), but the "
                   "learner scores tokens at a temperature > 0: give learner.temperature")
    from ub.learner.algorithms import sampling_refusal

    refusal = sampling_refusal(config.learner.algorithm,
                               [t.config_name() for t in config.batch.transforms.sampling])
    if refusal:
        raise fail("batch.sampling", refusal)
    if config.eval.exploitability.enabled:
        try:
            check_exploitability(config)
        except UbError as exc:
            raise fail("eval.exploitability.enabled", str(exc)) from None
    lora = config.learner.lora
    if lora.rank > config.engine.max_lora_rank:
        raise fail("learner.lora.rank", f"{lora.rank} exceeds engine.max_lora_rank "
                   f"{config.engine.max_lora_rank}: raise engine.max_lora_rank")


def game_specs(config: TrainConfig, env_ids: Sequence[str | EvalEnvSection] | None = None
               ) -> list[GameSpec]:
    """The games as ``config`` plays them: its training envs, or ``env_ids`` (an evaluation's
    ids or ``eval.envs`` entries) as :meth:`TrainConfig.eval_env` says: a training env as it
    trains, another with two seats (the checkpoint and an opponent) and the training envs'
    prompt format, unless its entry gives its own."""
    if env_ids is None:
        return [e.game() for e in config.envs]
    return [config.eval_env(i).game() for i in env_ids]


def solved_specs(config: TrainConfig, envs: Sequence[str] | None = None) -> list[GameSpec]:
    """The eval envs (or ``envs``) whose game has an exploitability solver
    (:mod:`ub.games.game_tree`), as the run evaluates them."""
    from ub.games.game_tree import has_tree_rules

    ids = list(envs or config.eval.env_ids or [e.env_id for e in config.envs])
    return [s for s in game_specs(config, ids) if has_tree_rules(s.env_id)]


def check_exploitability(config: TrainConfig, envs: Sequence[str] | None = None) -> None:
    """Refuse an exploitability measurement that cannot be made: no eval env (or none of
    ``envs``) whose game has a solver, or a template with text before the move."""
    from ub.games.game_tree import SOLVED_GAMES
    from ub.games.templates import get_template

    specs = solved_specs(config, envs)
    if not specs:
        ids = list(envs or config.eval.env_ids or [e.env_id for e in config.envs])
        raise UbError(f"no exploitability solver for {', '.join(ids)}: ub has one for "
                      f"{', '.join(SOLVED_GAMES)}")
    for spec in specs:
        if get_template(spec.template).free_text:
            raise UbError(f"exploitability of {spec.env_id} needs a template whose completion "
                          f"is the move; {spec.template!r} lets text come before it (plain)")


def load_config(name_or_path: str, overrides: list[str] | None = None) -> TrainConfig:
    """Load a preset or YAML file, apply ``--set`` overrides, validate."""
    data, label = read_config_data(name_or_path)
    return validate_config(apply_overrides(data, overrides or []), label)
