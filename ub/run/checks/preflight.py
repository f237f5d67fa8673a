"""A run's preflight: everything that would make a run fail is refused before it writes a file.

Every way a run starts goes through :func:`preflight`: ``ub train`` (before Prefect starts, so
in a second), the ``selfplay`` flow when a Prefect deployment or its schedule runs it, and
``ub train --ray``. It resolves the run's config once (:class:`RunStart` carries it to the
flow) and checks, in this order: the run store answers (a store run's working copy catches up
first), the config loads and matches the run's own, the base model can load and bounds the
settings, the run's GPU plan fits (:func:`ub.run.checks.gpu_plan.check_run_fits_gpu`), the Ray
cluster and hosted opponents answer, the benchmarks it scores are the harness's, the committed
rounds' manifests read, no live process holds the run, and its folder can be created. A
refusal is one :class:`~ub.errors.UbError` line and leaves nothing behind: no run folder, no
checkpoint 0, no logs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ub.errors import UbError
from ub.run.config.load import TrainConfig, load_config
from ub.run.folder.layout import RunPaths, read_json
from ub.run.folder.urls import DEFAULT_RUNS_ROOT


@dataclass(frozen=True)
class RunRequest:
    """How a run was asked to start or continue: the ``selfplay`` flow's parameters."""

    name: str
    root: str = DEFAULT_RUNS_ROOT
    config: str | None = None
    """A preset or YAML file that starts the run (or must match it); ``None``: its own."""
    overrides: tuple[str, ...] = ()
    """``key.sub=value`` settings over ``config`` (or over ``new_run_config``)."""
    rounds: int | None = None
    add_rounds: int | None = None
    ray_address: str | None = None
    keep_run_config: bool = False
    """An existing run continues with its own config; ``config`` and ``overrides`` only start
    it (the nightly deployment's setting)."""
    new_run_config: str | None = None
    """Without ``config``: what a run that does not exist yet starts from (``ub train``
    without CONFIG: tiny-cpu); ``None``: such a run is refused."""


@dataclass(frozen=True)
class RunStart:
    """A run that passed its preflight; nothing of it has been written yet."""

    paths: RunPaths
    config: TrainConfig
    """The resolved config: the run trains with exactly this."""
    config_changed: bool
    """It differs from the run's ``config.yaml`` (a new run, more rounds): written at start."""
    notes: tuple[str, ...] = ()
    """What the run's log says at its start (a given config set aside, a check not made, a
    component of one's own whose code changed since the last round)."""
    settings: tuple[str, ...] = ()
    """The settings (``key=value``) in which ``--set`` made the config differ from the preset
    or file it starts from, as ``ub train`` prints them at the start."""


def preflight(request: RunRequest) -> RunStart:
    """Refuse what would fail, then return the run as it will start (see the module)."""
    from ub.data.atomic import check_can_create
    from ub.run.checks.gpu_plan import check_run_fits_gpu
    from ub.run.config.base_model import check_base_model, check_fits_base_model
    from ub.run.folder.lock import check_not_held, removed_if_refused
    from ub.run.folder.store import catch_up
    from ub.run.steps.manifest import changed_sources
    from ub.run.steps.rounds import resolve_run_config

    paths = RunPaths.of(request.root, request.name)
    # A store run's working copy that catch_up made goes again if the run is refused.
    with removed_if_refused(paths):
        catch_up(paths)
        config, notes = requested_config(paths, request)
        resolved, changed = resolve_run_config(
            paths, config, rounds=request.rounds, add_rounds=request.add_rounds,
            ray_address=request.ray_address)
        check_base_model(resolved.model.base)
        check_fits_base_model(resolved)
        gpu_note = check_run_fits_gpu(resolved)
        check_services(resolved)
        check_benchmarks(resolved)
        check_manifests(paths)
        code_notes = changed_sources(paths, resolved)
        check_not_held(paths.lock)
        check_can_create(paths.root.parent)
    return RunStart(paths, resolved, changed,
                    (*notes, *([gpu_note] if gpu_note else []), *code_notes),
                    changed_settings(request, config))


def requested_config(paths: RunPaths, request: RunRequest) -> tuple[TrainConfig | None,
                                                                       tuple[str, ...]]:
    """The config the request gives the run (``None``: the run's own) and a note when the
    given one is set aside; nothing is checked against the run yet. (A store run may exist
    only in the store: the preflight reads this after its catch-up.)"""

    exists = paths.config.exists()
    if request.config is not None and request.keep_run_config and exists:
        return None, (f"run {paths.name} exists: continuing it with its own config "
                      f"({paths.config}); the given config and overrides start a new run "
                      "only",)
    source = request.config or (None if exists else request.new_run_config)
    if source is None:
        if request.overrides:
            raise UbError("--set (overrides) changes a run's settings: it needs CONFIG (the "
                          "run's data must come from one config; start a new --run to change "
                          "them)")
        return None, ()
    return load_config(source, list(request.overrides)), ()


def changed_settings(request: RunRequest, config: TrainConfig | None) -> tuple[str, ...]:
    """What ``request.overrides`` changed in the config it was applied to, as ``key=value``
    (dotted keys, YAML values; one ``--set`` may change several, as ``envs`` does)."""
    if config is None or not request.overrides:
        return ()
    from ub.run.folder.sweep import flat_settings

    source = request.config or request.new_run_config
    assert source is not None  # (overrides without a source were refused)
    before = flat_settings(load_config(source, []).model_dump(mode="json"))
    after = flat_settings(config.model_dump(mode="json"))
    return tuple(f"{key}={value}" for key, value in sorted(after.items())
                 if before.get(key) != value)


def check_benchmarks(config: TrainConfig) -> None:
    """``eval.benchmarks``' tasks are the harness's (or the include folder's), with the
    harness installed: a misspelt task fails here, not at checkpoint 0's scoring. (Whether a
    dataset can be fetched is known only when it loads, before the engine starts then.)"""
    section = config.eval.benchmarks
    if section.tasks:
        from ub.benchmarks import check_task_names

        check_task_names(section.tasks, section.include_path)


def check_services(config: TrainConfig) -> None:
    """The Ray cluster and hosted opponents a run needs answer, before the run writes."""
    if config.cluster.address is not None:
        from ub.run.processes.cluster import check_reachable

        check_reachable(config.cluster.address)
    from ub.actors.spec import parse_actor

    names = [*config.opponents.fixed_names(), *config.eval.opponents]
    for name in dict.fromkeys(names):
        parse_actor(name).check_ready()  # (a hosted endpoint answers, its key is set)


def check_manifests(paths: RunPaths) -> None:
    """Every committed round's manifest reads: a damaged one is refused here, naming the file
    and `ub doctor`, rather than once Prefect and the run's logs have started."""

    paths.next_round()  # (refuses a gap in the rounds)
    for round_ in paths.committed_rounds():
        read_json(paths.manifest(round_))
