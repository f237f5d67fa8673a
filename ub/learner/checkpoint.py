"""Learner checkpoints: one folder per update, written atomically, no pickle anywhere.

Layout of a checkpoint folder::

    adapter_model.safetensors  PEFT LoRA weights  } a PEFT adapter: peft and vLLM load the
    adapter_config.json        PEFT LoRA config   } folder itself as a LoRA adapter
    optimizer.safetensors      AdamW state: exp_avg/<param>, exp_avg_sq/<param>, step/<param>
    rng.safetensors            torch RNG states: torch_cpu (and torch_cuda on a GPU)
    NAME.safetensors           each module the algorithm trains besides the adapter
                               (``Algorithm.build``; its AdamW state in optimizer.safetensors)
    metrics.json               the metrics of the update that produced the checkpoint
    ub_checkpoint.json         the manifest, written last: update index, base model identity
                               (portable name + config fingerprint + source: a tiny build's
                               key and recipe inputs, see
                               :func:`ub.learner.base_identity.model_identity`), LoRA
                               settings, optimizer settings,
                               the Python RNG state, the learner config, and the size and
                               sha256 of every other file

Only safetensors and JSON are ever read back (project rule: nothing from a run directory is
unpickled). A checkpoint is built in a hidden temporary sibling folder, every file is fsynced,
then the folder is renamed into place and the parent fsynced: a crash at any point leaves either
the complete new checkpoint or nothing (plus, at worst, a hidden ``.NAME.tmp-*`` folder that
:func:`latest_checkpoint` ignores), so the previous checkpoint stays the latest.

This module: the format, what a checkpoint holds, reading one back and finding the latest.
Writing one: :mod:`ub.learner.checkpoint_writer`; the base model it was trained on (identity,
where to load it, compatibility checks): :mod:`ub.learner.base_identity`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ub.errors import UbError
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
MODULE_SUFFIX = ".safetensors"  # an algorithm's module NAME is saved as NAME.safetensors


def module_file(name: str) -> str:
    """The file of an algorithm's module ``name`` in a checkpoint folder."""
    file = name + MODULE_SUFFIX
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name) or file in (
            ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE):
        raise UbError(f"an algorithm's module is named {name!r}: give it a name of letters, "
                      "digits and _ that no file of a checkpoint has (not adapter_model, "
                      "optimizer or rng)")
    return file


def module_files(listed: Mapping[str, Any]) -> dict[str, str]:
    """The algorithm's module files among a manifest's ``files``, by module name."""
    return {name.removesuffix(MODULE_SUFFIX): name for name in sorted(listed)
            if name.endswith(MODULE_SUFFIX) and name not in (ADAPTER_WEIGHTS, OPTIMIZER_STATE,
                                                              RNG_STATE)}


# --------------------------------------------------------------------------------------------
# What a checkpoint holds
# --------------------------------------------------------------------------------------------


@dataclass
class CheckpointState:
    """Everything in a checkpoint except the PEFT adapter files (written by PEFT itself).

    :param update: updates done so far (0 = the starting adapter, before any update).
    :param base_model: :func:`ub.learner.base_identity.model_identity` of the base model.
    :param lora: the LoRA settings the adapter was trained with.
    :param optimizer: AdamW state tensors, ``exp_avg/<param>``, ``exp_avg_sq/<param>``,
        ``step/<param>`` (none before the first update).
    :param optimizer_settings: the AdamW hyper-parameters used (for the record).
    :param rng: torch RNG states (``torch_cpu``, ``torch_cuda``), uint8 tensors.
    :param python_rng: the learner's ``random.Random`` state, as JSON lists.
    :param learner_config: :meth:`LearnerConfig.to_dict` of the learner that wrote it.
    :param metrics: the update's metrics (JSON-able).
    :param modules: the state of each module the algorithm trains besides the adapter, by
        its name (``Algorithm.build``), saved as ``NAME.safetensors``; empty: none.
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
    modules: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


def sha256_file(path: Path) -> str:
    """The sha256 of a file, as the manifest records it."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
        if file.stat().st_size != info.get("bytes") or sha256_file(file) != info.get("sha256"):
            raise UbError(f"checkpoint {ckpt}: {name} does not match the size/sha256 recorded "
                          f"in {MANIFEST}: the file is damaged or was modified")


def foreign_files(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> list[str]:
    """The entries of checkpoint folder ``path`` that ub did not write there: its manifest
    lists every file ub wrote (a folder, a link or another file is someone else's)."""
    listed = manifest.get("files", {})
    return sorted(entry.name for entry in Path(path).expanduser().iterdir()
                  if entry.name != MANIFEST and (entry.name not in listed or entry.is_symlink()
                                                 or not entry.is_file()))


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointState:
    """Read and verify checkpoint ``path`` (not the adapter weights: see :func:`read_adapter`)."""
    ckpt = Path(path).expanduser()
    manifest = read_manifest(ckpt)
    verify_files(ckpt, manifest)
    return CheckpointState(
        update=int(manifest["update"]),
        base_model=dict(manifest["base_model"]),
        lora=LoraSettings.from_dict(manifest["lora"]),
        optimizer=_load_safetensors(ckpt / OPTIMIZER_STATE, ckpt),
        optimizer_settings=dict(manifest.get("optimizer", {})),
        rng=_load_safetensors(ckpt / RNG_STATE, ckpt),
        python_rng=list(manifest.get("python_rng", [])),
        learner_config=dict(manifest.get("learner_config", {})),
        metrics=read_metrics(ckpt),
        modules={name: _load_safetensors(ckpt / file, ckpt)
                 for name, file in module_files(manifest.get("files", {})).items()},
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
