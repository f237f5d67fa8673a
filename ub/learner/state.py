"""The learner's state: where it trains from (a checkpoint, an init adapter, a fresh adapter)
and what it saves (adapter, AdamW state, RNG streams, update index), exactly: a resumed run
continues bit for bit.

:class:`LearnerState` is the second layer of :class:`ub.learner.learner.Learner`; checkpoint
files themselves are :mod:`ub.learner.checkpoint`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ub.errors import UbError
from ub.learner.base_identity import check_compatible
from ub.learner.checkpoint import CheckpointState, read_adapter, read_checkpoint
from ub.learner.checkpoint_writer import write_checkpoint
from ub.learner.model import ADAPTER_NAME, LearnerModel
from ub.model.lora import LoraSettings

log = logging.getLogger("ub.learner.learner")


class LearnerState(LearnerModel):
    """A :class:`LearnerModel` with its training state: :meth:`start` loads it, :meth:`save`
    writes it as a checkpoint."""

    def start(self, checkpoint: str | Path | None = None) -> None:
        """Load the state to train from.

        :param checkpoint: a ub checkpoint folder (adapter, optimizer and RNG state, update
            index: training continues exactly); ``None``: a cold start from
            ``config.init_adapter`` or, without one, a fresh adapter, with a new optimizer and
            RNG streams seeded by ``config.seed``.
        :raises UbError: a checkpoint of another base model or LoRA shape, a missing or
            damaged file (named).
        """
        if checkpoint is None:
            self._cold_start()
            return
        where = f"checkpoint {checkpoint}"
        state = read_checkpoint(checkpoint)
        check_compatible(where, state.base_model, state.lora, self.base_identity,
                         self.config.lora)
        if state.base_model.get("path") != self.base_identity["path"]:
            log.warning("%s was trained on %s, same config as %s: loading it", where,
                        state.base_model.get("path"), self.base_identity["path"])
        _, weights = read_adapter(checkpoint)
        self._load_adapter_weights(weights, where)
        self.optimizer = self._new_optimizer()
        self._load_optimizer_state(state.optimizer, where)
        self._torch_rng = {k: v.clone() for k, v in state.rng.items()}
        self.py_rng = _python_rng(state.python_rng, where)
        self.update_index = state.update
        self.source = str(checkpoint)
        self.last_metrics = state.metrics

    def _cold_start(self) -> None:
        config = self.config
        if config.init_adapter is not None:
            adapter_config, weights = read_adapter(config.init_adapter)
            where = f"init adapter {config.init_adapter}"
            check_compatible(where, self.base_identity, _lora_of(adapter_config),
                             self.base_identity, config.lora)
            self._load_adapter_weights(weights, where)
        else:
            # PEFT's default LoRA initialisation (A ~ kaiming uniform, B = 0), from our seed.
            generator = torch.Generator().manual_seed(config.seed)
            with torch.no_grad():
                for name, p in self.params.items():
                    if ".lora_A." in name:
                        w = torch.empty(p.shape, dtype=torch.float32)
                        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
                        p.copy_(w)
                    else:
                        p.zero_()
        self.optimizer = self._new_optimizer()
        self._torch_rng = {"torch_cpu": torch.Generator().manual_seed(config.seed).get_state()}
        if self.device.type == "cuda":
            with torch.random.fork_rng(devices=self._rng_devices()), torch.cuda.device(
                    self.device):
                torch.cuda.manual_seed(config.seed)
                self._torch_rng["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        self.py_rng = random.Random(config.seed)
        self.update_index = 0
        self.source = config.init_adapter
        self.last_metrics = {}

    def save(self, out_dir: str | Path, metrics: Mapping[str, Any] | None = None, *,
             overwrite: bool = False) -> Path:
        """Write the current state as a checkpoint folder (atomically); return its path.

        :param metrics: stored as ``metrics.json`` (default: the last update's metrics).
        :param overwrite: replace an existing folder (otherwise it is an error).
        """
        state = CheckpointState(
            update=self.update_index,
            base_model=self.base_identity,
            lora=self.config.lora,
            optimizer=self._optimizer_tensors(),
            optimizer_settings={"name": "adamw", **self._optimizer_settings()},
            rng=self._torch_rng,
            python_rng=_python_rng_json(self.py_rng),
            # The base model by its portable name, not this machine's path to it: a run's
            # checkpoints are the same bytes wherever it runs or resumes.
            learner_config={**self.config.to_dict(), "base_model": self.base_identity["path"]},
            metrics=dict(self.last_metrics if metrics is None else metrics),
        )

        def write_adapter(folder: Path) -> None:
            self.model.save_pretrained(str(folder), safe_serialization=True)

        return write_checkpoint(out_dir, state, write_adapter, overwrite=overwrite)

    def _load_adapter_weights(self, weights: Mapping[str, torch.Tensor], where: str) -> None:
        """Copy PEFT-format adapter tensors into the LoRA parameters, checking names/shapes."""
        expected = {_file_key(name): name for name in self.params}
        missing = sorted(set(expected) - set(weights))
        extra = sorted(set(weights) - set(expected))
        if missing or extra:
            example = (missing or extra)[0]
            raise UbError(f"{where} does not fit the learner's LoRA modules ({len(missing)} "
                          f"missing, {len(extra)} unexpected tensors, e.g. {example}): it was "
                          "trained with other target modules or on another model")
        for key, name in expected.items():
            if tuple(weights[key].shape) != tuple(self.params[name].shape):
                raise UbError(f"{where}: {key} has shape {tuple(weights[key].shape)}, the "
                              f"learner expects {tuple(self.params[name].shape)}: it was "
                              "trained on another base model or LoRA rank")
        with torch.no_grad():
            for key, name in expected.items():
                self.params[name].copy_(weights[key])

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        assert self.optimizer is not None
        for name, p in self.params.items():
            state = self.optimizer.state.get(p, {})
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if key in state:
                    tensors[f"{key}/{name}"] = state[key]
        return tensors

    def _load_optimizer_state(self, tensors: Mapping[str, torch.Tensor], where: str) -> None:
        assert self.optimizer is not None
        for name, p in self.params.items():
            keys = [f"{k}/{name}" for k in ("step", "exp_avg", "exp_avg_sq")]
            present = [k in tensors for k in keys]
            if not any(present):
                continue  # no update yet: AdamW initialises the state at its first step
            if not all(present):
                raise UbError(f"{where}: optimizer.safetensors has a partial state for {name}: "
                              "the checkpoint is damaged")
            step, exp_avg, exp_avg_sq = (tensors[k] for k in keys)
            if exp_avg.shape != p.shape:
                raise UbError(f"{where}: optimizer state of {name} has shape "
                              f"{tuple(exp_avg.shape)}, the parameter {tuple(p.shape)}")
            # AdamW keeps a float32 CPU step tensor (non-capturable) and moments like the param.
            self.optimizer.state[p] = {
                "step": step.clone(),
                "exp_avg": exp_avg.to(p.device, p.dtype).clone(),
                "exp_avg_sq": exp_avg_sq.to(p.device, p.dtype).clone(),
            }
        unknown = {k.split("/", 1)[1] for k in tensors} - set(self.params)
        if unknown:
            raise UbError(f"{where}: optimizer.safetensors has state for unknown parameters "
                          f"(e.g. {sorted(unknown)[0]})")

    # -- RNG streams ------------------------------------------------------------------------

    def _capture_rng(self) -> dict[str, torch.Tensor]:
        states = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            states["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        return states

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run the block on the learner's torch RNG streams, leaving the process's untouched."""
        with torch.random.fork_rng(devices=self._rng_devices()):
            self._set_rng(self._torch_rng)
            yield

    def _set_rng(self, states: Mapping[str, torch.Tensor]) -> None:
        """Put the process's torch RNG streams at ``states`` (as :meth:`_capture_rng` took)."""
        torch.set_rng_state(states["torch_cpu"])
        if "torch_cuda" in states and self.device.type == "cuda":
            torch.cuda.set_rng_state(states["torch_cuda"], self.device)


def _lora_of(adapter_config: Mapping[str, Any]) -> LoraSettings:
    """The LoRA settings a PEFT adapter_config.json describes.

    Not validated: they describe a file to compare with the learner's settings
    (:func:`~ub.learner.base_identity.check_compatible` names what differs), and PEFT writes
    what the section would refuse (no targets, a regex)."""
    targets = adapter_config.get("target_modules") or []
    if isinstance(targets, str):  # PEFT allows a regex string; compare it verbatim
        targets = [targets]
    return LoraSettings.model_construct(rank=int(adapter_config.get("r", 8)),
                                        alpha=adapter_config.get("lora_alpha", 8),
                                        dropout=float(adapter_config.get("lora_dropout", 0.0)),
                                        target_modules=list(targets))


def _file_key(param_name: str) -> str:
    """A LoRA parameter name as PEFT saves it (without the adapter name)."""
    return param_name.replace(f".{ADAPTER_NAME}.", ".")


def _python_rng_json(rng: random.Random) -> list[Any]:
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def _python_rng(state: list[Any], where: str) -> random.Random:
    rng = random.Random()
    try:
        version, internal, gauss_next = state
        rng.setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError) as e:
        raise UbError(f"{where}: the python_rng state in ub_checkpoint.json is damaged") from e
    return rng
