"""A run's base model: resolved from ``model.base``, checked before any work, and the tiny
build it trains on recorded in its ``ub-run.json`` so a later recipe change cannot swap it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.run.config.load import TrainConfig
from ub.run.folder.layout import RunPaths, mark_run_format, read_json, write_json_atomic


def resolve_base_model(config: TrainConfig) -> str:
    """``tiny`` -> the locally built tiny model (built on first use, then cached); a folder ->
    its absolute path; a hub id stays the id, and is fetched here, in the process that starts
    the run, before any engine or learner (:func:`ub.model.hub.local_model`: each Ray
    worker's process makes sure of its own copy, which on this machine it finds)."""
    if config.model.base == "tiny":
        from ub.model.tiny import build_tiny_model

        return str(build_tiny_model(seed=config.model.tiny_seed))
    path = Path(config.model.base).expanduser()
    if path.exists():
        return str(path.absolute())
    from ub.model.hub import local_model

    local_model(config.model.base)
    return config.model.base


def recorded_base_model(paths: RunPaths) -> dict[str, Any] | None:
    """The tiny build a run trains on (:func:`ub.model.identity.tiny_identity`), as recorded in
    its ``ub-run.json`` when it started; for a run from before that record, what its latest
    checkpoint names. ``None``: nothing recorded (a new run, or not a tiny base model)."""
    from ub.learner.base_identity import identity_source
    from ub.learner.checkpoint import latest_checkpoint
    from ub.learner.checkpoint import read_manifest as read_checkpoint_manifest

    marker = paths.root / "ub-run.json"
    if marker.exists():
        recorded = read_json(marker).get("base_model")
        if isinstance(recorded, dict):
            return recorded
    latest = latest_checkpoint(paths.root / "checkpoints")
    if latest is None:
        return None
    source = identity_source(read_checkpoint_manifest(latest).get("base_model") or {})
    return source if source.get("kind") == "tiny" else None


def check_recorded_base(paths: RunPaths, config: TrainConfig) -> None:
    """Refuse to go on with a run on another tiny build than the one it started on.

    ``model.base: tiny`` means the tiny build of *this* ub's recipe: after a recipe change (a
    new recipe version, other textarena) it names other weights, and the run's checkpoints
    would continue on a base model they were not trained on. The run is refused rather than
    its old build rebuilt: an older recipe's code is not in this ub (`ub play`/`ub learn` with
    one of its checkpoints use the build it names when this machine has or can build it)."""
    if config.model.base != "tiny":
        return
    recorded = recorded_base_model(paths)
    if recorded is None or recorded.get("kind") != "tiny":
        return
    from ub.model.identity import (
        current_tiny_identity,
        describe_difference,
        describe_tiny,
        same_tiny_build,
    )

    now = current_tiny_identity(config.model.tiny_seed)
    if not same_tiny_build(recorded, now):
        raise UbError(
            f"run {paths.name} was trained on {describe_tiny(recorded)}, but model.base 'tiny' "
            f"is now {describe_tiny(now)} ({describe_difference(recorded, now)}): its "
            "checkpoints would go on with another base model. Resume or evaluate it with the "
            "ub and textarena versions that built it, or start a new run (--run NAME)")


def record_base_model(paths: RunPaths, config: TrainConfig) -> None:
    """Write the tiny build a run trains on into its ``ub-run.json`` (once, at its start; a
    run from before the record gets it on its first resume, after
    :func:`check_recorded_base`), so a later recipe change cannot silently swap it."""
    if config.model.base != "tiny":
        return
    from ub.model.identity import current_tiny_identity

    marker = paths.root / "ub-run.json"
    mark_run_format(paths.root)
    data = read_json(marker)
    if "base_model" not in data:
        write_json_atomic(marker, {**data,
                                   "base_model": current_tiny_identity(config.model.tiny_seed)})


def check_base_model(base: str) -> None:
    """Refuse a ``model.base`` that can never load, before any work: ``tiny``, a model folder
    (with ``config.json``) or a Hugging Face id (``ORG/NAME``, fetched on first use unless
    ``HF_HUB_OFFLINE`` is set, then it must be in the local cache)."""
    if base == "tiny":
        return
    path = Path(base).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UbError(f"model.base {base} has no config.json: give a transformers model "
                          "folder (save_pretrained), 'tiny', or a Hugging Face id")
        return
    if path.exists() or base.startswith(("/", ".", "~")):
        raise UbError(f"model.base {base} is not a model folder (it does not exist or is a "
                      "file)")
    from ub.model.hub import HUB_ID

    if not HUB_ID.match(base):
        raise UbError(f"model.base {base!r} is not 'tiny', a model folder, or a Hugging Face "
                      "id like Qwen/Qwen3-1.7B-Base")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(base, "config.json"), str):
            raise UbError(f"model.base {base} is not in the Hugging Face cache and "
                          "HF_HUB_OFFLINE is set: download it first (hf download "
                          f"{base}) or unset HF_HUB_OFFLINE")


def base_model_config(config: TrainConfig) -> dict[str, Any] | None:
    """The base model's ``config.json`` where this machine has it without building or
    downloading anything: a model folder, the tiny build once made (before: the recipe's
    context only), a hub id in the Hugging Face cache; else ``None``."""
    import json

    base = config.model.base
    if base == "tiny":
        from ub.model.tiny.cache import cache_key, is_complete, tiny_model_path
        from ub.model.tiny.config import DEFAULT_CONFIG

        seed = config.model.tiny_seed
        path = tiny_model_path(seed)
        if not is_complete(path, cache_key(seed)):
            return {"max_position_embeddings": DEFAULT_CONFIG.max_position_embeddings}
        base = str(path)
    path = Path(base).expanduser()
    if path.is_dir():
        from ub.inference.validation import validate_model_dir

        return validate_model_dir(str(path))
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(base, "config.json")
    if not isinstance(cached, str):
        return None
    try:
        data = json.loads(Path(cached).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_fits_base_model(config: TrainConfig) -> None:
    """Refuse, before any work, the settings the base model bounds: the engine's context (vLLM
    refuses one longer than the model's at its start, after the run has begun) and the batch's
    pad id (the learner's embedding looks it up)."""
    from ub.inference.validation import context_problem, token_id_problem

    model_config = base_model_config(config)
    for key, problem in (
            ("engine.max_model_len", context_problem(model_config, config.engine.max_model_len)),
            ("batch.pad_token_id", token_id_problem(model_config, config.batch.pad_token_id))):
        if problem:
            raise UbError(f"{key} {problem} (model.base {config.model.base})")
