"""The base model a checkpoint was trained on: its recorded identity, where to load it from on
this machine, and the check that a checkpoint fits the learner's base model and LoRA shape."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.learner.checkpoint import ADAPTER_CONFIG, MANIFEST, read_adapter, read_manifest
from ub.model.lora import LoraSettings

# config.json keys that do not change what the model computes: left out of the fingerprint so
# that re-saving a model with another transformers version or dtype keeps its identity.
_VOLATILE_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "torch_dtype",
                                   "dtype", "use_cache", "_attn_implementation",
                                   "attn_implementation"})


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of a model's ``config.json`` content (volatile keys left out)."""
    kept = {k: v for k, v in config.items() if k not in _VOLATILE_CONFIG_KEYS}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_identity(base_model: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"path", "fingerprint", "source"}`` of a local model directory or a hub id.

    ``path`` is the portable name (:func:`ub.model.identity.portable_name`: the hub id,
    ``tiny-KEY12`` for a tiny build, else the folder's absolute path), never where a tiny build
    or a hub model happens to sit on this machine, so checkpoints of one run are the same bytes
    on every machine. ``source`` says how to find that base model again (a tiny build's key and
    recipe inputs: :func:`ub.model.identity.resolve_base`).
    """
    from ub.model.identity import base_identity, portable_name

    path = Path(base_model).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
    else:  # a hub id: its config.json from the local Hugging Face cache
        from transformers.utils import cached_file

        try:
            config_file = Path(cached_file(str(base_model), "config.json"))
        except Exception as e:
            raise UbError(f"cannot find base model {base_model} (not a directory, and no "
                          "config.json for it in the Hugging Face cache): "
                          f"{str(e).splitlines()[0]}") from e
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UbError(f"cannot read the base model config {config_file}: {e}") from e
    source = base_identity(base_model)
    return {"path": portable_name(source), "fingerprint": config_fingerprint(config),
            "source": source}


def identity_source(base_model: Mapping[str, Any]) -> dict[str, Any]:
    """The ``source`` of a recorded :func:`model_identity`; for a checkpoint written before
    sources were recorded, what its ``path`` says (a tiny build's folder name gives its key)."""
    from ub.model.identity import identity_from_name

    source = base_model.get("source")
    if isinstance(source, dict) and source.get("kind"):
        return dict(source)
    return identity_from_name(str(base_model.get("path") or ""))


def checkpoint_base(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The base model identity (a ``source``, see :func:`model_identity`) an adapter folder was
    trained on: from a ub checkpoint's manifest, else from PEFT's ``base_model_name_or_path``
    (an adapter of any origin)."""
    from ub.model.identity import identity_from_name

    folder = Path(path).expanduser()
    if (folder / MANIFEST).is_file() or not (folder / ADAPTER_CONFIG).is_file():
        # (read_manifest names what a folder without either file is, or is missing)
        return identity_source(read_manifest(folder).get("base_model") or {})
    config, _ = read_adapter(folder)
    name = config.get("base_model_name_or_path")
    if not name:
        raise UbError(f"LoRA adapter {folder} does not record its base model "
                      f"(base_model_name_or_path in {ADAPTER_CONFIG}): give the base model "
                      "explicitly")
    return identity_from_name(str(name))


def resolve_checkpoint_base(path: str | os.PathLike[str], *, verbose: bool = True) -> str:
    """Where to load the base model of adapter folder ``path`` from on this machine (a tiny
    build found or rebuilt from its recorded key, a hub id, or a local folder).

    :raises UbError: that base model cannot be found or built here (the message says why).
    """
    from ub.model.identity import resolve_base

    return resolve_base(checkpoint_base(path), verbose=verbose)


def check_compatible(where: str, base_model: Mapping[str, Any], lora: LoraSettings,
                     expected_base: Mapping[str, Any], expected_lora: LoraSettings) -> None:
    """Refuse a checkpoint of another base model or another LoRA shape, naming both.

    Two tiny builds are told apart by their key, not only by their config: a recipe change
    (more pre-training steps, another textarena) keeps the config and changes the weights."""
    from ub.model.identity import describe_difference, describe_tiny, same_tiny_build

    theirs_source, mine_source = identity_source(base_model), identity_source(expected_base)
    if (theirs_source.get("kind") == mine_source.get("kind") == "tiny"
            and not same_tiny_build(theirs_source, mine_source)):
        raise UbError(
            f"{where} was trained on {describe_tiny(theirs_source)}, but the learner's base "
            f"model is {describe_tiny(mine_source)} "
            f"({describe_difference(theirs_source, mine_source)}): resume it with its own base "
            "model (the ub and textarena versions that built it), or start a new run")
    if base_model.get("fingerprint") != expected_base.get("fingerprint"):
        raise UbError(
            f"{where} was trained on base model {base_model.get('path')} (config fingerprint "
            f"{base_model.get('fingerprint')}), but the learner's base model is "
            f"{expected_base.get('path')} (fingerprint {expected_base.get('fingerprint')}): "
            "resume it with its own base model, or start a new run")
    mine = (lora.rank, lora.alpha, tuple(sorted(lora.target_modules)))
    theirs = (expected_lora.rank, expected_lora.alpha,
              tuple(sorted(expected_lora.target_modules)))
    if mine != theirs:
        raise UbError(
            f"{where} has LoRA rank {lora.rank}, alpha {lora.alpha}, targets "
            f"{','.join(sorted(lora.target_modules))}; the learner is configured for rank "
            f"{expected_lora.rank}, alpha {expected_lora.alpha}, targets "
            f"{','.join(sorted(expected_lora.target_modules))}: set learner.lora to match")
