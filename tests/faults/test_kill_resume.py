"""SIGKILL at randomized points of a real `ub train`, resume, and nothing is lost: the run is
whole (`ub doctor` finds nothing), and its games, ratings, checkpoints and adapter bytes equal
the uninterrupted run's. ``UB_FAULT_SEED`` picks another sequence of kill points; the long
version is ``bench/faults.py``."""

from __future__ import annotations

import os
import random
import signal

from faults.runs import KILL_POINTS, differences, plan_faults, train


def test_killed_at_random_points_and_resumed_loses_nothing(reference, fault_config,
                                                           prefect_api, tmp_path, ledger):
    ref, census = reference
    assert set(KILL_POINTS) <= set(census), f"points never reached: {census}"
    seed = int(os.environ.get("UB_FAULT_SEED", "0"))
    faults = plan_faults(census, random.Random(seed), 3)
    injected = []
    for fault in faults:
        result = train(fault_config, tmp_path, prefect_api, env={"UB_FAULT_AT": fault})
        if result.returncode == 0:
            break  # the run finished before reaching the point
        assert result.returncode == -signal.SIGKILL, (fault, result.stderr[-2000:])
        injected.append(fault)
    ledger["faults injected"] += len(injected)
    result = train(fault_config, tmp_path, prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    found = differences(tmp_path / "run", ref)
    ledger["faults survived" if not found else "faults lost"] += len(injected)
    assert not found, f"seed {seed}, faults {injected}: {found}"
    assert len(injected) >= 2, f"seed {seed}: only {injected} of {faults} fired"


def test_an_engine_failure_mid_rollout_is_retried_and_replays_the_shard(
        reference, fault_config, prefect_api, tmp_path, ledger):
    """The engine raising mid-generation (here: injected between engine steps, requests in
    flight) fails the task playing the shard; Prefect retries it, the unfinished requests were
    aborted, and the retried shard plays the same games."""
    ref, _ = reference
    ledger["faults injected"] += 1
    result = train(fault_config, tmp_path, prefect_api,
                   env={"UB_FAULT_AT": "rollout.step:3:raise"})
    assert result.returncode == 0, result.stderr[-2000:]
    # (The first engine steps of a run are checkpoint 0's evaluation games.)
    log = (tmp_path / "run" / "logs" / "eval.log").read_text()
    assert "eval shard 0/0 failed" in log and "injected fault at rollout.step" in log
    assert log.count("eval shard 0/0: playing") == 2
    found = differences(tmp_path / "run", ref)
    ledger["faults survived" if not found else "faults lost"] += 1
    assert not found
