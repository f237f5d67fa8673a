"""Writing a learner checkpoint atomically (the folder format: :mod:`ub.learner.checkpoint`),
with PEFT's adapter files in one canonical, machine-independent form."""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ub.data.atomic import fsync_dir, publishable
from ub.errors import UbError
from ub.faults import fault_point
from ub.learner.checkpoint import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    FORMAT,
    MANIFEST,
    METRICS,
    MODEL_CARD,
    OPTIMIZER_STATE,
    RNG_STATE,
    VERSION,
    CheckpointState,
    foreign_files,
    module_file,
    read_manifest,
    sha256_file,
)


def write_checkpoint(out_dir: str | os.PathLike[str], state: CheckpointState,
                     write_adapter: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Write a checkpoint folder atomically and return its path.

    :param out_dir: the checkpoint folder to create.
    :param state: optimizer, RNG and bookkeeping (see :class:`CheckpointState`).
    :param write_adapter: writes ``adapter_model.safetensors`` and ``adapter_config.json``
        into the folder it is given (e.g. a PEFT model's ``save_pretrained``).
    :param overwrite: replace an existing checkpoint (or empty folder) at ``out_dir``
        (:func:`check_replaceable`); otherwise an existing ``out_dir`` is an error.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not overwrite:
        raise UbError(f"checkpoint folder {out} already exists: pick a new path (checkpoints "
                      "are never modified in place)")
    if overwrite:
        check_replaceable(out)
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
        for name, tensors in state.modules.items():  # the algorithm's own modules
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                      str(tmp / module_file(name)), metadata={"format": "pt"})
        (tmp / METRICS).write_text(_dumps(state.metrics))
        publishable(tmp)  # (the umask's permissions, as the run's other files have)
        files = {}
        for path in sorted(tmp.iterdir()):
            if path.is_file():
                _fsync_file(path)
                files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "update": state.update,
            "base_model": state.base_model,
            "lora": state.lora.to_dict(),
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
            check_replaceable(out)  # (still: nothing else came there meanwhile)
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


def check_replaceable(out: str | os.PathLike[str]) -> None:
    """What ``--overwrite`` (``overwrite=True``) may replace at ``out``: nothing, a folder ub
    wrote as a checkpoint, or an empty folder. ub knows its own checkpoint by its manifest,
    which lists every file ub wrote there: the folder must hold those files, at their sizes,
    and nothing else (a copied manifest alone does not make a project a checkpoint). Anything
    else (a folder of other files, a run, a file, a link) is refused, naming what it holds,
    before any work is done."""

    out = Path(out).expanduser().absolute()
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink():
        what = f"a symbolic link to {os.readlink(out)}"
    elif not out.is_dir():
        what = "a file"
    elif (out / MANIFEST).is_file():
        try:
            manifest = read_manifest(out)
        except UbError as exc:
            manifest, what = None, f"a folder whose {MANIFEST} does not read ({exc})"
        if manifest is not None:
            listed = manifest.get("files", {})
            unlisted = foreign_files(out, manifest)
            resized = sorted(name for name, info in listed.items() if (out / name).is_file()
                             and (out / name).stat().st_size != info.get("bytes"))
            if not unlisted and not resized:
                return
            what = ("a folder holding, beside a ub checkpoint's manifest, what that manifest "
                    "does not list: " + _some(unlisted) if unlisted else
                    "a folder whose files differ from the sizes its ub manifest lists: "
                    + _some(resized))
    elif (out / "ub-run.json").exists():
        what = "a ub run"
    else:
        held = sorted(p.name for p in out.iterdir())
        if not held:
            return
        what = "a folder holding " + _some(held)
    raise UbError(f"--overwrite replaces only a ub checkpoint folder (or an empty folder), and "
                  f"{out} is {what}: pick another --out, or move it aside yourself")


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def canonicalize_adapter_config(path: Path, base_model_name: str | None = None) -> str | None:
    """Rewrite a PEFT ``adapter_config.json`` in one canonical form: PEFT keeps
    ``target_modules`` as a set and writes it in hash order, which differs from process to
    process, so identical adapters (a run and its resumed twin) had different config bytes.
    ``base_model_name`` replaces ``base_model_name_or_path`` (PEFT writes where the base was
    loaded from, a machine-specific path): the portable name of
    :func:`ub.learner.base_identity.model_identity`, so the bytes are the same on every machine
    too."""
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
