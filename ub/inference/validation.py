"""Model and adapter checks: cheap, before vLLM sees anything (a bad adapter inside vLLM fails
mid-step and can break the engine). Each refusal names the path and the fix."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.inference.types import VLLM_LORA_RANKS

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")

ENGINE_SEEDS = range(2**32)
"""The engine seeds vLLM starts with: it seeds NumPy's global RNG with its seed, which takes
0 to 2**32 - 1 (any other value fails the engine's start, after a run has begun)."""


def context_problem(model_config: dict[str, Any] | None, max_model_len: int) -> str | None:
    """Why a model (its ``config.json``) cannot hold a context of ``max_model_len`` tokens, or
    ``None`` (also when its config does not say)."""
    limit = (model_config or {}).get("max_position_embeddings")
    if isinstance(limit, int) and max_model_len > limit:
        return (f"{max_model_len} exceeds the model's context of {limit} tokens "
                f"(max_position_embeddings in its config.json): use at most {limit}")
    return None


def token_id_problem(model_config: dict[str, Any] | None, token_id: int) -> str | None:
    """Why ``token_id`` is not an id of a model's vocabulary (which its embedding looks up),
    or ``None`` (also when its config does not say)."""
    vocab = (model_config or {}).get("vocab_size")
    if isinstance(vocab, int) and not 0 <= token_id < vocab:
        return (f"{token_id} is not a token id of the model (its vocabulary has ids 0 to "
                f"{vocab - 1}): use one of them")
    return None


def _looks_like_local_path(model: str) -> bool:
    # A hub id is "name" or "org/name"; anything else (or anything that exists) is a path.
    return Path(model).expanduser().exists() or not _HUB_ID.match(model)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UbError(f"cannot read the {what} {path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise UbError(f"the {what} {path} is not valid JSON ({e.msg}, line {e.lineno})") from e
    if not isinstance(data, dict):
        raise UbError(f"the {what} {path} is not a JSON object")
    return data


def validate_model_dir(model: str) -> dict[str, Any] | None:
    """Check a local model directory; return its config.json (``None`` for a hub id)."""
    if not _looks_like_local_path(model):
        return None
    path = Path(model).expanduser()
    if not path.exists():
        raise UbError(f"model directory {path} does not exist: check engine.model")
    if not path.is_dir():
        raise UbError(f"model {path} is not a directory: engine.model must be a model folder")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UbError(
            f"model directory {path} has no config.json: save the model with save_pretrained"
        )
    config = _read_json(config_file, "model config")
    if not any(next(path.glob(pattern), None) for pattern in ("*.safetensors", "*.bin", "*.pt")):
        raise UbError(
            f"model directory {path} has no weights (*.safetensors): save the model with "
            "save_pretrained"
        )
    return config


LORA_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")
_HIDDEN_INPUT_MODULES = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def validate_adapter_dir(
    adapter: str | os.PathLike[str],
    max_lora_rank: int,
    model_config: dict[str, Any] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Check that ``adapter`` is a PEFT LoRA directory this engine can serve; return its path.

    Raises :class:`UbError` naming the path and the fix when the directory is missing, is not a
    PEFT LoRA adapter, has a rank above ``max_lora_rank``, (when ``model_config`` is given and
    the weights are safetensors) was trained for a model of another shape, or (when
    ``model_dir`` is a tiny build) was trained on another tiny build.
    """
    path = Path(adapter).expanduser()
    if not path.exists():
        raise UbError(f"LoRA adapter {path} does not exist: check the checkpoint path")
    if not path.is_dir():
        raise UbError(f"LoRA adapter {path} is not a directory: pass a PEFT adapter folder")
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise UbError(
            f"{path} is not a PEFT adapter directory (no adapter_config.json): "
            "save the adapter with peft's save_pretrained"
        )
    weights = next((path / n for n in LORA_WEIGHT_FILES if (path / n).is_file()), None)
    if weights is None:
        raise UbError(
            f"{path} is not a PEFT adapter directory (no adapter_model.safetensors): "
            "save the adapter with peft's save_pretrained"
        )
    config = _read_json(config_file, "adapter config")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise UbError(f"adapter {path} is a {peft_type} adapter: only LoRA adapters are served")
    ranks = [config.get("r", 8), *(config.get("rank_pattern") or {}).values()]
    rank = max(int(r) for r in ranks)
    if rank > max_lora_rank:
        raise UbError(
            f"LoRA adapter {path}: adapter rank {rank} exceeds the engine's max_lora_rank "
            f"{max_lora_rank}: raise engine.max_lora_rank to {_next_lora_rank(rank)}"
        )
    if model_config is not None and weights.suffix == ".safetensors":
        _check_adapter_shapes(path, weights, config, model_config)
    if model_dir is not None:
        _check_adapter_build(path, config, model_dir)
    return path


def _check_adapter_build(path: Path, config: dict[str, Any], model_dir: str | os.PathLike[str]
                         ) -> None:
    """Two tiny builds (recipe versions) have one shape: an adapter of the other one would load
    and play nonsense. Compare the build key the adapter records with the engine's."""
    from ub.model.identity import (
        describe_difference,
        describe_tiny,
        identity_from_name,
        same_tiny_build,
        tiny_identity,
    )

    engine_build = tiny_identity(model_dir)
    if engine_build is None:
        return
    manifest = path / "ub_checkpoint.json"  # (ub.learner.checkpoint.MANIFEST; no torch import)
    recorded: Any = None
    if manifest.is_file():
        recorded = (_read_json(manifest, "checkpoint manifest").get("base_model") or {})
        recorded = recorded.get("source") or identity_from_name(str(recorded.get("path") or ""))
    elif config.get("base_model_name_or_path"):
        recorded = identity_from_name(str(config["base_model_name_or_path"]))
    if isinstance(recorded, dict) and recorded.get("kind") == "tiny" and not same_tiny_build(
            recorded, engine_build):
        raise UbError(
            f"adapter {path} was trained on {describe_tiny(recorded)}, but the engine's model "
            f"{model_dir} is {describe_tiny(engine_build)} "
            f"({describe_difference(recorded, engine_build)}): serve it on its own build (ub "
            "resolves it from the adapter when no model is given), or use an adapter of this "
            "one")


def _next_lora_rank(rank: int) -> int:
    return next((r for r in VLLM_LORA_RANKS if r >= rank), VLLM_LORA_RANKS[-1])


def _check_adapter_shapes(
    path: Path, weights: Path, config: dict[str, Any], model_config: dict[str, Any]
) -> None:
    """Compare the adapter's tensor shapes (read from the safetensors header only) to the model."""
    from safetensors import safe_open

    hidden = model_config.get("hidden_size")
    layers = model_config.get("num_hidden_layers")
    base = config.get("base_model_name_or_path") or "another model"
    try:
        with safe_open(str(weights), framework="pt") as f:
            names = f.keys()  # the handle is not iterable itself
            shapes = {name: f.get_slice(name).get_shape() for name in names}
    except Exception as e:  # a truncated or foreign file: say so rather than crash vLLM later
        raise UbError(f"cannot read the LoRA weights {weights}: {e}") from e
    for name, shape in shapes.items():
        match = _LAYER_INDEX.search(name)
        if layers is not None and match and int(match.group(1)) >= layers:
            raise UbError(
                f"adapter {path} was trained for {base} (it has layer {match.group(1)}; the "
                f"engine's model has {layers} layers): use an adapter trained on engine.model"
            )
        is_input_a = "lora_A" in name and any(f".{m}." in name for m in _HIDDEN_INPUT_MODULES)
        if hidden is not None and is_input_a and len(shape) == 2 and shape[1] != hidden:
            raise UbError(
                f"adapter {path} was trained for {base} (hidden size {shape[1]}; the engine's "
                f"model has {hidden}): use an adapter trained on engine.model"
            )



def adapter_fingerprint(adapter_dir: str) -> tuple[int, int] | None:
    """``(mtime_ns, size)`` of an adapter's weights file (``None`` if it has none): a
    checkpoint rewritten in place gets a new fingerprint."""
    for name in LORA_WEIGHT_FILES:
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(adapter_dir, name))
            return (st.st_mtime_ns, st.st_size)
    return None
