"""What the learner trains and what steps it: the adapter's AdamW and, for each module the
algorithm trains besides the adapter (:class:`ub.learner.algorithms.Trained`), one of its own
with the settings the algorithm declares; their state as a checkpoint holds it, and the
snapshot a failed update is rolled back to.

Every trained parameter has a saved name: the adapter's PEFT name, a module's
``NAME.<parameter>``. ``optimizer.safetensors`` holds each one's AdamW state as
``step/<name>``, ``exp_avg/<name>``, ``exp_avg_sq/<name>``; a module's weights (its
``state_dict``, buffers included) go to ``NAME.safetensors``
(:func:`ub.learner.checkpoint.module_file`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ub.errors import UbError
from ub.learner.algorithms import Trained
from ub.learner.checkpoint import module_file

Snapshot = tuple[Any, ...]


class Optimizers:
    """The adapter's AdamW (``settings``: the learner's) and one AdamW per module of
    ``modules`` with trainable parameters.

    The adapter's learning rate has one source: each :meth:`step` is given the schedule's rate
    for that step (:func:`ub.learner.update.scheduled_learning_rate`), and nothing else sets
    it (the AdamW holds 0 until its first step).

    :param adapter: the adapter's parameters by saved name.
    :param settings: the adapter's AdamW settings besides its learning rate (``betas``,
        ``eps``, ``weight_decay``).
    :param modules: what the algorithm trains besides the adapter, by name.
    """

    def __init__(self, adapter: Mapping[str, torch.nn.Parameter], settings: Mapping[str, Any],
                 modules: Mapping[str, Trained]) -> None:
        self.adapter_params = dict(adapter)
        self.adapter = torch.optim.AdamW(list(self.adapter_params.values()), lr=0.0, **settings)
        self.modules: dict[str, Trained] = {}
        self.own: dict[str, torch.optim.AdamW] = {}
        self.set_modules(modules)

    def set_modules(self, modules: Mapping[str, Trained]) -> None:
        """Train ``modules`` (new ones: their optimizers start empty); the adapter's stays."""
        for name in modules:
            module_file(name)  # (a name a checkpoint can hold)
        self.modules = dict(modules)
        self.own = {}
        for name, trained in self.modules.items():
            params = [p for p in trained.module.parameters() if p.requires_grad]
            if params:
                self.own[name] = torch.optim.AdamW(
                    params, lr=trained.learning_rate, betas=trained.betas, eps=trained.eps,
                    weight_decay=trained.weight_decay)

    def configure(self, settings: Mapping[str, Any]) -> None:
        """New AdamW settings for the adapter, besides its learning rate (its state stays)."""
        for group in self.adapter.param_groups:
            group.update(settings)

    def named(self) -> Iterator[tuple[str, torch.nn.Parameter, torch.optim.Optimizer]]:
        """Every trained parameter by its saved name, with the optimizer that steps it."""
        for name, p in self.adapter_params.items():
            yield name, p, self.adapter
        for module, optimizer in self.own.items():
            for name, p in self.modules[module].module.named_parameters():
                if p.requires_grad:
                    yield f"{module}.{name}", p, optimizer

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every trained parameter, the adapter's first (what data-parallel ranks sum)."""
        return [p for _, p, _ in self.named()]

    def step(self, learning_rate: float) -> None:
        """One step of every optimizer, gradients zeroed.

        :param learning_rate: the adapter's rate for this step, the schedule's (the modules'
            AdamWs keep the constant rates their algorithm declared).
        """
        for group in self.adapter.param_groups:
            group["lr"] = learning_rate
        self.adapter.step()
        self.adapter.zero_grad(set_to_none=True)
        for optimizer in self.own.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        for optimizer in (self.adapter, *self.own.values()):
            optimizer.zero_grad(set_to_none=True)

    # -- the modules' weights -----------------------------------------------------------------

    def module_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each module's ``state_dict`` by module name, keys ``NAME.<key>`` (copies, CPU)."""
        return {name: {f"{name}.{key}": t.detach().cpu().clone()
                       for key, t in trained.module.state_dict().items()}
                for name, trained in self.modules.items()}

    def load_modules(self, tensors: Mapping[str, Mapping[str, torch.Tensor]], where: str,
                     trained_by: Any) -> None:
        """Load each module's weights from ``tensors`` (as :meth:`module_tensors` gives them),
        refusing a missing, unexpected or misshapen one (``trained_by``: what wrote them)."""
        for name in sorted(set(tensors) - set(self.modules)):
            raise UbError(f"{where} holds {module_file(name)}, which the algorithm does not "
                          f"train: it was trained by {trained_by!r}; start from its adapter "
                          "instead (learner.init_adapter)")
        for name, trained in self.modules.items():
            if name not in tensors:
                raise UbError(f"{where} has no {module_file(name)} (what the algorithm trains "
                              f"besides the adapter): it was trained by {trained_by!r}; start "
                              "from its adapter instead (learner.init_adapter)")
            state = trained.module.state_dict()
            found = {key.removeprefix(f"{name}."): t for key, t in tensors[name].items()}
            if set(found) != set(state):
                raise UbError(f"{where}: {module_file(name)} holds {sorted(tensors[name])}, the "
                              f"module has {sorted(f'{name}.{k}' for k in state)}")
            for key, t in found.items():
                if tuple(t.shape) != tuple(state[key].shape):
                    raise UbError(f"{where}: {name}.{key} has shape {tuple(t.shape)}, the "
                                  f"module {tuple(state[key].shape)}: it was trained on "
                                  "another base model")
            trained.module.load_state_dict(found)

    # -- the optimizers' state ----------------------------------------------------------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every optimizer's state, ``step/<name>``, ``exp_avg/<name>``, ``exp_avg_sq/<name>``
        (none for a parameter not stepped yet)."""
        tensors: dict[str, torch.Tensor] = {}
        for name, p, optimizer in self.named():
            state = optimizer.state.get(p, {})
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if key in state:
                    tensors[f"{key}/{name}"] = state[key]
        return tensors

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor], where: str) -> None:
        """Restore what :meth:`state_tensors` gave, checking names and shapes."""
        names = set()
        for name, p, optimizer in self.named():
            names.add(name)
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
            optimizer.state[p] = {
                "step": step.clone(),
                "exp_avg": exp_avg.to(p.device, p.dtype).clone(),
                "exp_avg_sq": exp_avg_sq.to(p.device, p.dtype).clone(),
            }
        unknown = {k.split("/", 1)[1] for k in tensors} - names
        if unknown:
            raise UbError(f"{where}: optimizer.safetensors has state for unknown parameters "
                          f"(e.g. {sorted(unknown)[0]})")

    # -- rolling a failed update back ---------------------------------------------------------

    def snapshot(self, adapter: bool) -> Snapshot:
        """What an update changes, to put back if it fails: the modules' weights and
        optimizers always, the adapter's weights and AdamW state only if ``adapter`` (one step
        fails before it changes them, and a copy of a large adapter's AdamW state costs memory
        on the GPU)."""
        weights = ({n: p.detach().clone() for n, p in self.adapter_params.items()},
                   copy.deepcopy(self.adapter.state_dict())) if adapter else None
        modules = (self.module_tensors(),
                   {n: copy.deepcopy(o.state_dict()) for n, o in self.own.items()})
        return weights, modules

    def restore(self, saved: Snapshot) -> None:
        weights, (module_weights, module_optimizers) = saved
        if weights is not None:
            with torch.no_grad():
                for name, tensor in weights[0].items():
                    self.adapter_params[name].copy_(tensor)
            self.adapter.load_state_dict(weights[1])
        self.load_modules(module_weights, "the update's snapshot", "this learner")
        for name, state in module_optimizers.items():
            self.own[name].load_state_dict(state)
        self.zero_grad()
