"""A run's preflight (:mod:`ub.run.checks.preflight`), which ``ub train``, the ``selfplay`` flow
(so a deployment and its schedule) and ``ub train --ray`` all make: each refusal is one line
and leaves the disk as it found it; a run that passes gets its config resolved once. (A
deployment run refused by it on a real Prefect server: tests/test_prefect_server.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_plan import QWEN3_1_7B

from ub.errors import UbError
from ub.run.checks import gpu_plan
from ub.run.checks.preflight import RunRequest, RunStart, preflight
from ub.run.config.load import load_config
from ub.run.folder.layout import RunPaths
from ub.run.folder.lock import RunLock
from ub.run.steps.rounds import open_run


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def refused(tmp_path: Path, request: RunRequest) -> str:
    """The line ``request``'s preflight refuses it with; nothing under ``tmp_path`` changed."""
    before = files_under(tmp_path)
    with pytest.raises(UbError) as refusal:
        preflight(request)
    assert files_under(tmp_path) == before
    [line] = str(refusal.value).splitlines()
    return line


@pytest.fixture()
def existing(tmp_path: Path, tiny_model) -> RunPaths:
    """A tiny-cpu run that has started (its config and ub-run.json), under ``tmp_path/runs``."""
    paths = RunPaths.of(tmp_path / "runs", "exp")
    open_run(paths, load_config("tiny-cpu"))
    return paths


def test_a_new_run_passes_with_its_config_resolved_and_nothing_written(tmp_path, tiny_model):
    root = tmp_path / "runs"
    start = preflight(RunRequest("new", str(root), "tiny-cpu", ("seed=3",), rounds=2))
    assert isinstance(start, RunStart) and start.paths == RunPaths.of(root, "new")
    assert (start.config.seed, start.config.rounds, start.config_changed) == (3, 2, True)
    assert start.notes == ()  # (a CPU run: no GPU plan to check, nothing to say)
    assert start.settings == ("seed=3",)  # (what `ub train` prints at the start)
    assert not root.exists()


def test_the_settings_printed_at_the_start_are_what_set_changed(tmp_path, tiny_model):
    """One `--set` may change several settings (a list of envs), and one that sets a value to
    what the preset has already changes nothing."""
    preset = load_config("tiny-cpu", [])
    start = preflight(RunRequest("new", str(tmp_path), "tiny-cpu", (
        f"rollout.games_per_round={preset.rollout.games_per_round}", "learner.learning_rate=5e-4",
        "envs=[{env_id: TicTacToe-v0-train, legal_moves: free}, {env_id: Nim-v0-train, "
        "legal_moves: mask}]")))
    assert [s.split("=")[0] for s in start.settings] == ["envs", "learner.learning_rate"]
    assert "learner.learning_rate=0.0005" in start.settings and "legal_moves: free" in \
        start.settings[0]
    keep = preflight(RunRequest("new", str(tmp_path), "tiny-cpu", ("seed=5",),
                                keep_run_config=True))
    assert keep.settings == ("seed=5",)  # (a new run: the overrides start it)


@pytest.mark.parametrize(("overrides", "message"), [
    (("engine.max_model_len=100000",), "engine.max_model_len 100000 exceeds the model's context"
     " of 2048 tokens"),
    (("model.base=/no/such/model",), "model.base /no/such/model is not a model folder"),
    (("eval.opponents=[hosted:m@http://127.0.0.1:1/v1]",), "http://127.0.0.1:1/v1/models is "
     "unreachable"),
    (("seed=-1",), "seed"),
], ids=["model fit", "base model", "services", "setting"])
def test_a_new_run_is_refused_in_one_line_and_nothing_is_written(tmp_path, tiny_model,
                                                                  overrides, message):
    line = refused(tmp_path, RunRequest("new", str(tmp_path / "runs"), "tiny-cpu", overrides))
    assert message in line
    assert not (tmp_path / "runs").exists()


def test_an_existing_run_is_refused_before_it_is_touched(tmp_path, existing):
    root = str(existing.root.parent)
    # Another config than the run's own, and settings without a config.
    assert "was started with another config: seed (0 in the run, 5 now)" in refused(
        tmp_path, RunRequest("exp", root, "tiny-cpu", ("seed=5",)))
    assert "--set (overrides) changes a run's settings: it needs CONFIG" in refused(
        tmp_path, RunRequest("exp", root, overrides=("seed=5",)))
    # A live process holds it (another open file: flock refuses it in this process too).
    with RunLock(existing.lock):
        assert "is in use by pid" in refused(tmp_path, RunRequest("exp", root))
    # A committed round whose manifest does not read.
    existing.manifest(0).parent.mkdir(parents=True)
    existing.manifest(0).write_text("{not json")
    assert str(existing.manifest(0)) in refused(tmp_path, RunRequest("exp", root))


def test_a_root_that_cannot_be_created_is_refused(tmp_path, tiny_model):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = refused(tmp_path, RunRequest("new", str(blocker / "runs"), "tiny-cpu"))
    assert "is not writable" in line and "not a folder" in line


def test_keep_run_config_sets_the_given_config_aside_and_says_so(tmp_path, existing):
    start = preflight(RunRequest("exp", str(existing.root.parent), "tiny-cpu", ("seed=5",),
                                 add_rounds=1, keep_run_config=True))
    assert start.config.seed == 0 and start.config.rounds == 1  # its own, one round more
    [note] = start.notes
    assert "continuing it with its own config" in note


def test_a_gpu_run_whose_plan_cannot_fit_is_refused_with_the_dry_runs_line(
        tmp_path, capsys, monkeypatch):
    """On a GPU too small for it (a fake 8 GiB card: this machine's GPU, as the preflight
    reads it) the qwen3 preset is refused at the start with the line `ub train --dry-run
    --gpu-memory 8` ends with; on an 80 GiB one it starts; on the CPU it has no GPU plan."""
    from ub.flows.cli import main

    model = tmp_path / "Qwen3-1.7B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_1_7B))
    (model / "model.safetensors").write_bytes(b"")  # (no weights are read)
    settings = (f"model.base={model}", "batch.max_train_len=4096")
    request = RunRequest("qwen", str(tmp_path / "runs"), "qwen3-1.7b-simpletak", settings)
    if gpu_plan.this_machines_gpu() is None:
        assert preflight(request).notes == ()  # skipped cleanly
    monkeypatch.setattr(gpu_plan, "this_machines_gpu", lambda: (8.0, "8 GiB GPU"))
    line = refused(tmp_path, request)
    assert line.startswith("the engine's share (engine.gpu_memory_utilization: 4.8 GiB)")
    assert line.endswith("(1 more for this machine's 8 GiB GPU: `ub train CONFIG --dry-run` "
                         "lists them)")

    assert main(["train", "qwen3-1.7b-simpletak", "--root", str(tmp_path / "runs"),
                 *(f"--set={s}" for s in settings), "--dry-run", "--gpu-memory", "8"]) == 2
    dry_run = capsys.readouterr()
    first_problem = line[:line.rindex(" (1 more")]
    assert f"cannot fit: {first_problem}\n" in dry_run.out
    assert dry_run.err == f"ub: error: {first_problem} (1 more above)\n"
    monkeypatch.setattr(gpu_plan, "this_machines_gpu", lambda: (80.0, "80 GiB GPU"))
    assert preflight(request).notes == ()


def test_a_gpu_run_on_a_cluster_planned_from_a_driver_without_a_gpu_says_so(
        tmp_path, tiny_model, monkeypatch):
    monkeypatch.setattr(gpu_plan, "this_machines_gpu", lambda: None)
    config = load_config("tiny-cpu", ["cluster.address=127.0.0.1:1", "cluster.rollout.num_gpus=1"])
    assert "GPU plan not checked" in gpu_plan.check_run_fits_gpu(config)
    assert gpu_plan.check_run_fits_gpu(load_config("tiny-cpu")) is None  # a CPU run


def test_ub_train_refuses_what_the_flow_refuses_with_the_same_line(tmp_path, tiny_model):
    """The installed command, as a user runs it: one line, exit 2, in seconds, no run folder."""
    ub = str(Path(sys.executable).parent / "ub")
    runs = tmp_path / "runs"
    shown = subprocess.run([ub, "train", "--root", str(runs), "--set",
                            "engine.max_model_len=100000"], capture_output=True, text=True,
                           timeout=120)
    line = refused(tmp_path, RunRequest("tiny-cpu", str(runs), "tiny-cpu",
                                        ("engine.max_model_len=100000",)))
    assert (shown.returncode, shown.stderr) == (2, f"ub: error: {line}\n")
    assert not runs.exists()


def test_a_dead_holders_lock_record_stays_for_the_run_that_recovers_it(existing):
    """The preflight looks at the lock without taking it: the process that takes it next
    still finds the dead holder's record (the flow notes that it recovered its lock)."""
    holder = subprocess.run(
        [sys.executable, "-c", "import os, sys; from pathlib import Path; "
         "from ub.run.folder.lock import RunLock; RunLock(Path(sys.argv[1])).acquire(); "
         "os._exit(0)",
         str(existing.lock)], timeout=60)
    assert holder.returncode == 0
    preflight(RunRequest("exp", str(existing.root.parent)))
    lock = RunLock(existing.lock).acquire()
    try:
        assert lock.recovered_from is not None and lock.recovered_from["pid"] != os.getpid()
    finally:
        lock.release()


def test_the_flow_pickles_as_prefect_ray_ships_it():
    """prefect-ray pickles the flow (its function by value, with the globals it names) into
    every Ray task's context: the preflight's handover must not put an unpicklable global in
    the flow's body (a ContextVar there failed every `ub train --ray` run)."""
    import cloudpickle

    from ub.flows.selfplay import selfplay

    assert cloudpickle.loads(cloudpickle.dumps(selfplay)).name == "selfplay"
