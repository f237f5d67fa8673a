"""A run whose root is a store URL (``file://``, through fsspec as ``s3://`` would be): one
machine is killed while publishing, another machine with an empty working copy resumes the run
from the store, and the store then holds exactly the uninterrupted local run's data."""

from __future__ import annotations

import signal
import subprocess
import sys

from faults.runs import differences, train
from ub.run.folder.layout import RunPaths
from ub.run.folder.store import RunStore, fetch_checkpoint, sync


def test_a_run_in_a_store_resumes_on_another_machine_and_loses_nothing(
        reference, fault_config, prefect_api, tmp_path, monkeypatch, ledger):
    ref, _ = reference
    store = f"file://{tmp_path}/store"
    # Machine A dies while publishing round 1 (round 0 is in the store, round 1 in part).
    ledger["faults injected"] += 1
    first = train(fault_config, store, prefect_api,
                  env={"UB_WORK_DIR": str(tmp_path / "a"), "UB_FAULT_AT": "store.put:30"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert RunStore(f"{store}/run").committed_rounds() == [0]

    # Machine B has nothing of the run: it fetches round 0 and what round 1 published.
    second = train(fault_config, store, prefect_api,
                   env={"UB_WORK_DIR": str(tmp_path / "b")})
    assert second.returncode == 0, second.stderr[-2000:]
    assert RunStore(f"{store}/run").committed_rounds() == [0, 1]

    # What the store holds (read by a third machine) is the uninterrupted run.
    monkeypatch.setenv("UB_WORK_DIR", str(tmp_path / "c"))
    paths = RunPaths.of(store, "run")
    sync(paths)
    for update in range(len(paths.committed_rounds()) + 1):
        fetch_checkpoint(paths, paths.checkpoint(update))
    found = differences(paths.root, ref)
    ledger["faults survived" if not found else "faults lost"] += 1
    assert not found, found

    # ... and `ub sql` reads it in place.
    sql = ("SELECT (SELECT count(*) FROM steps) AS steps, (SELECT count(*) FROM eval_games) "
           "AS eval_games, (SELECT max(round) FROM ratings) AS rated")
    out = subprocess.run([sys.executable, "-m", "ub.flows.cli", "sql", f"{store}/run", sql,
                          "--format", "csv"], capture_output=True, text=True, timeout=120)
    local = subprocess.run([sys.executable, "-m", "ub.flows.cli", "sql", str(ref), sql,
                            "--format", "csv"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == local.stdout and out.stdout.splitlines()[1].endswith(",1")
