"""The learner's own random streams: torch's (LoRA dropout; the CPU's and, on a GPU, its
device's) and a Python ``random.Random`` (the minibatch shuffle, an algorithm's ``rng``). They
are saved in every checkpoint (``rng.safetensors``, the manifest's ``python_rng``) and restored
bit for bit; the learner runs on them, so it neither moves nor is moved by the process's global
streams."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ub.errors import UbError


class RngStreams:
    """The torch RNG states (``torch_cpu``, ``torch_cuda``) and the Python RNG of a learner on
    ``device``, seeded by ``seed``."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.torch: dict[str, torch.Tensor] = {}
        self.python = random.Random(seed)
        self.seed(seed)

    def devices(self) -> list[int]:
        """The GPUs whose RNG streams the learner owns (none on the CPU)."""
        return [self.device.index or 0] if self.device.type == "cuda" else []

    def seed(self, seed: int) -> None:
        """Every stream as a cold start has it."""
        self.torch = {"torch_cpu": torch.Generator().manual_seed(seed).get_state()}
        if self.device.type == "cuda":
            with torch.random.fork_rng(devices=self.devices()), torch.cuda.device(self.device):
                torch.cuda.manual_seed(seed)
                self.torch["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        self.python = random.Random(seed)

    @contextlib.contextmanager
    def own(self) -> Iterator[None]:
        """Run the block on the learner's torch streams, leaving the process's untouched (the
        streams advance only where :meth:`capture` keeps what the block drew)."""
        with torch.random.fork_rng(devices=self.devices()):
            torch.set_rng_state(self.torch["torch_cpu"])
            if "torch_cuda" in self.torch and self.device.type == "cuda":
                torch.cuda.set_rng_state(self.torch["torch_cuda"], self.device)
            yield

    def capture(self) -> dict[str, torch.Tensor]:
        """The process's torch streams now (inside :meth:`own`: where the block left them)."""
        states = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            states["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        return states

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Run the block on torch streams seeded by ``seed``, leaving every other untouched
        (an algorithm building its modules at a cold start)."""
        with torch.random.fork_rng(devices=self.devices()):
            torch.manual_seed(seed)
            yield

    def python_json(self) -> list[Any]:
        """The Python RNG's state as the manifest's JSON holds it."""
        version, internal, gauss_next = self.python.getstate()
        return [version, list(internal), gauss_next]

    def load(self, torch_states: Mapping[str, torch.Tensor], python_state: list[Any],
             where: str) -> None:
        """The streams a checkpoint saved (``rng.safetensors``, ``python_rng``)."""
        self.torch = {k: v.clone() for k, v in torch_states.items()}
        rng = random.Random()
        try:
            version, internal, gauss_next = python_state
            rng.setstate((version, tuple(internal), gauss_next))
        except (TypeError, ValueError) as e:
            raise UbError(f"{where}: the python_rng state in ub_checkpoint.json is damaged"
                          ) from e
        self.python = rng
