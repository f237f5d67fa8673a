"""Learner checkpoints: one folder per update, written atomically, no pickle anywhere.

Layout of a checkpoint folder::

    adapter_model.safetensors  PEFT LoRA weights  } a PEFT adapter: peft and vLLM load the
    adapter_config.json        PEFT LoRA config   } folder itself as a LoRA adapter
    optimizer.safetensors      AdamW state: exp_avg/<param>, exp_avg_sq/<param>, step/<param>
    rng.safetensors            torch RNG states: torch_cpu (and torch_cuda on a GPU)
    metrics.json               the metrics of the update that produced the checkpoint
    ub_checkpoint.json         the manifest, written last: update index, base model identity
                               (portable name + config fingerprint + source: a tiny build's
                               key and recipe inputs, see :func:`model_identity`), LoRA
                               settings, optimizer settings,
                               the Python RNG state, the learner config, and the size and
                               sha256 of every other file

Only safetensors and JSON are ever read back (project rule: nothing from a run directory is
unpickled). A checkpoint is built in a hidden temporary sibling folder, every file is fsynced,
then the folder is renamed into place and the parent fsynced: a crash at any point leaves either
the complete new checkpoint or nothing (plus, at worst, a hidden ``.NAME.tmp-*`` folder that
:func:`latest_checkpoint` ignores), so the previous checkpoint stays the latest.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ub.data.atomic import fsync_dir
from ub.errors import UbError
from ub.faults import fault_point
from ub.model.lora import LoraSettings

FORMAT = "ub-learner-checkpoint"
VERSION = 1

MANIFEST = "ub_checkpoint.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CARD = "README.md"  # written by PEFT's save_pretrained
OPTIMIZER_STATE = "optimizer.safetensors"
RNG_STATE = "rng.safetensors"
METRICS = "metrics.json"
# Files a complete checkpoint must have (the manifest lists them with sizes and hashes).
REQUIRED_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG, OPTIMIZER_STATE, RNG_STATE, METRICS)

# config.json keys that do not change what the model computes: left out of the fingerprint so
# that re-saving a model with another transformers version or dtype keeps its identity.
_VOLATILE_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "torch_dtype",
                                   "dtype", "use_cache", "_attn_implementation",
                                   "attn_implementation"})


# --------------------------------------------------------------------------------------------
# Base model identity
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# What a checkpoint holds
# --------------------------------------------------------------------------------------------


@dataclass
class CheckpointState:
    """Everything in a checkpoint except the PEFT adapter files (written by PEFT itself).

    :param update: updates done so far (0 = the starting adapter, before any update).
    :param base_model: :func:`model_identity` of the base model.
    :param lora: the LoRA settings the adapter was trained with.
    :param optimizer: AdamW state tensors, ``exp_avg/<param>``, ``exp_avg_sq/<param>``,
        ``step/<param>`` (none before the first update).
    :param optimizer_settings: the AdamW hyper-parameters used (for the record).
    :param rng: torch RNG states (``torch_cpu``, ``torch_cuda``), uint8 tensors.
    :param python_rng: the learner's ``random.Random`` state, as JSON lists.
    :param learner_config: :meth:`LearnerConfig.to_dict` of the learner that wrote it.
    :param metrics: the update's metrics (JSON-able).
    """

    update: int
    base_model: dict[str, Any]
    lora: LoraSettings
    optimizer: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer_settings: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, torch.Tensor] = field(default_factory=dict)
    python_rng: list[Any] = field(default_factory=list)
    learner_config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_checkpoint(out_dir: str | os.PathLike[str], state: CheckpointState,
                     write_adapter: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Write a checkpoint folder atomically and return its path.

    :param out_dir: the checkpoint folder to create.
    :param state: optimizer, RNG and bookkeeping (see :class:`CheckpointState`).
    :param write_adapter: writes ``adapter_model.safetensors`` and ``adapter_config.json``
        into the folder it is given (e.g. a PEFT model's ``save_pretrained``).
    :param overwrite: replace an existing checkpoint at ``out_dir``; otherwise an existing
        ``out_dir`` is an error.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not overwrite:
        raise UbError(f"checkpoint folder {out} already exists: pick a new path (checkpoints "
                      "are never modified in place)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UbError(f"cannot create the checkpoint parent folder {out.parent}: "
                      f"{e.strerror or e}") from e
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        write_adapter(tmp)
        for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
            if not (tmp / name).is_file():
                raise UbError(f"the adapter writer did not write {name}")
        loaded_from = canonicalize_adapter_config(tmp / ADAPTER_CONFIG,
                                                  state.base_model.get("path"))
        _portable_model_card(tmp / MODEL_CARD, loaded_from, state.base_model.get("path"))
        # safetensors stores contiguous tensors only; clone so views and sliced RNG states work.
        save_file({k: v.detach().cpu().contiguous() for k, v in state.optimizer.items()},
                  str(tmp / OPTIMIZER_STATE), metadata={"format": "pt"})
        save_file({k: v.detach().cpu().contiguous() for k, v in state.rng.items()},
                  str(tmp / RNG_STATE), metadata={"format": "pt"})
        (tmp / METRICS).write_text(_dumps(state.metrics))
        files = {}
        for path in sorted(tmp.iterdir()):
            if path.is_file():
                _fsync_file(path)
                files[path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "update": state.update,
            "base_model": state.base_model,
            "lora": _lora_dict(state.lora),
            "optimizer": state.optimizer_settings,
            "python_rng": state.python_rng,
            "learner_config": state.learner_config,
            "files": files,
        }
        # The manifest last: a folder without it is never taken for a checkpoint.
        (tmp / MANIFEST).write_text(_dumps(manifest))
        _fsync_file(tmp / MANIFEST)
        fsync_dir(tmp)
        fault_point("checkpoint.before-rename")
        if out.exists():  # overwrite: move the old one aside, swap in the new, drop the old
            old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError | SafetensorError):  # disk full, permissions, ...
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise UbError(f"cannot write checkpoint {out}: {reason}") from e
        raise
    return out


def canonicalize_adapter_config(path: Path, base_model_name: str | None = None) -> str | None:
    """Rewrite a PEFT ``adapter_config.json`` in one canonical form: PEFT keeps
    ``target_modules`` as a set and writes it in hash order, which differs from process to
    process, so identical adapters (a run and its resumed twin) had different config bytes.
    ``base_model_name`` replaces ``base_model_name_or_path`` (PEFT writes where the base was
    loaded from, a machine-specific path): the portable name of :func:`model_identity`, so the
    bytes are the same on every machine too."""
    config = json.loads(path.read_text())
    written = config.get("base_model_name_or_path")
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    if base_model_name:
        config["base_model_name_or_path"] = base_model_name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return written if isinstance(written, str) else None


def _portable_model_card(card: Path, loaded_from: str | None, name: str | None) -> None:
    """PEFT's model card (``README.md``) names the base model as PEFT saw it (this machine's
    path, in ``base_model:`` and a tag): the same portable name as the config instead."""
    if not (card.is_file() and loaded_from and name) or loaded_from == name:
        return
    text = card.read_text()
    if loaded_from in text:
        card.write_text(text.replace(loaded_from, name))


def _dumps(data: Any) -> str:
    return json.dumps(_json_safe(data), indent=1, sort_keys=True, allow_nan=False) + "\n"


def _json_safe(value: Any) -> Any:
    """JSON-able copy: non-finite floats become null, tuples lists, tensors numbers."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _json_safe(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str | int | bool) or value is None:
        return value
    if hasattr(value, "item"):  # numpy scalars
        return _json_safe(value.item())
    return str(value)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _lora_dict(lora: LoraSettings) -> dict[str, Any]:
    return {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout,
            "target_modules": list(lora.target_modules)}


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of checkpoint ``path``, with clear errors for anything that is not one."""
    ckpt = Path(path).expanduser()
    if not ckpt.exists():
        raise UbError(f"checkpoint {ckpt} does not exist: check the path")
    if not ckpt.is_dir():
        raise UbError(f"checkpoint {ckpt} is not a folder")
    manifest_file = ckpt / MANIFEST
    if not manifest_file.is_file():
        if (ckpt / ADAPTER_CONFIG).is_file():
            raise UbError(f"{ckpt} is a PEFT adapter, not a ub checkpoint (no {MANIFEST}): "
                          "to start from it, set learner.init_adapter and pass no checkpoint")
        raise UbError(f"checkpoint {ckpt} is missing {MANIFEST}: not a ub checkpoint, or an "
                      "unfinished one")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UbError(f"checkpoint {ckpt}: cannot read {MANIFEST}: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UbError(f"checkpoint {ckpt}: {MANIFEST} is not a ub learner checkpoint manifest")
    if manifest.get("version", 0) > VERSION:
        raise UbError(f"checkpoint {ckpt} has format version {manifest.get('version')}, newer "
                      f"than this ub ({VERSION}): upgrade ub")
    return manifest


def verify_files(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Check that every file the manifest lists is there, with its size and sha256."""
    ckpt = Path(path).expanduser()
    listed = manifest.get("files", {})
    for name in REQUIRED_FILES:
        if name not in listed:
            raise UbError(f"checkpoint {ckpt}: {MANIFEST} does not list {name}: the checkpoint "
                          "is damaged")
    for name, info in sorted(listed.items()):
        file = ckpt / name
        if not file.is_file():
            raise UbError(f"checkpoint {ckpt} is missing {name}: the checkpoint is incomplete; "
                          "resume from an earlier checkpoint")
        if file.stat().st_size != info.get("bytes") or _sha256(file) != info.get("sha256"):
            raise UbError(f"checkpoint {ckpt}: {name} does not match the size/sha256 recorded "
                          f"in {MANIFEST}: the file is damaged or was modified")


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointState:
    """Read and verify checkpoint ``path`` (not the adapter weights: see :func:`read_adapter`)."""
    from ub.learner.config import lora_from_dict

    ckpt = Path(path).expanduser()
    manifest = read_manifest(ckpt)
    verify_files(ckpt, manifest)
    return CheckpointState(
        update=int(manifest["update"]),
        base_model=dict(manifest["base_model"]),
        lora=lora_from_dict(manifest["lora"]),
        optimizer=_load_safetensors(ckpt / OPTIMIZER_STATE, ckpt),
        optimizer_settings=dict(manifest.get("optimizer", {})),
        rng=_load_safetensors(ckpt / RNG_STATE, ckpt),
        python_rng=list(manifest.get("python_rng", [])),
        learner_config=dict(manifest.get("learner_config", {})),
        metrics=read_metrics(ckpt),
    )


def read_adapter(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(adapter_config, weights)`` of a PEFT LoRA adapter folder (a checkpoint or not).

    Only ``adapter_model.safetensors`` is accepted: a pickled ``adapter_model.bin`` is refused.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UbError(f"LoRA adapter {folder} does not exist or is not a folder")
    config_file = folder / ADAPTER_CONFIG
    if not config_file.is_file():
        raise UbError(f"LoRA adapter {folder} is missing {ADAPTER_CONFIG}: save it with peft's "
                      "save_pretrained")
    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        extra = (" (it has adapter_model.bin: pickle files are not loaded; re-save it with "
                 "safe_serialization=True)" if (folder / "adapter_model.bin").exists() else "")
        raise UbError(f"LoRA adapter {folder} is missing {ADAPTER_WEIGHTS}{extra}")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UbError(f"LoRA adapter {folder}: cannot read {ADAPTER_CONFIG}: {e}") from e
    return config, _load_safetensors(weights, folder)


def _load_safetensors(file: Path, where: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except Exception as e:
        raise UbError(f"{where}: cannot read {file.name}: {e}") from e


def read_metrics(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``metrics.json`` of a checkpoint."""
    file = Path(path).expanduser() / METRICS
    try:
        return json.loads(file.read_text())
    except OSError as e:
        raise UbError(f"checkpoint {Path(path)} is missing {METRICS}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise UbError(f"checkpoint {Path(path)}: {METRICS} is not valid JSON: {e}") from e


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a finished checkpoint folder (its manifest reads)."""
    try:
        read_manifest(path)
    except UbError:
        return False
    return True


def latest_checkpoint(parent: str | os.PathLike[str]) -> Path | None:
    """The finished checkpoint under ``parent`` with the highest update index (``None``: none).

    Hidden folders (unfinished ``.NAME.tmp-*`` writes) are never considered.
    """
    parent = Path(parent).expanduser()
    if not parent.is_dir():
        return None
    best: tuple[int, str, Path] | None = None
    for child in parent.iterdir():
        if child.name.startswith(".") or not child.is_dir():
            continue
        try:
            update = int(read_manifest(child)["update"])
        except (UbError, KeyError, TypeError, ValueError):
            continue
        if best is None or (update, child.name) > best[:2]:
            best = (update, child.name, child)
    return None if best is None else best[2]


# --------------------------------------------------------------------------------------------
# Compatibility
# --------------------------------------------------------------------------------------------


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
