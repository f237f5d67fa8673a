"""One process per run: a live holder refuses others, a dead one's lock is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ub.run.folder.layout import RunPaths, check_run_name, remove_orphans
from ub.run.folder.lock import RunLock, RunLocked

HOLD = """
import sys, time
from pathlib import Path
from ub.run.folder.lock import RunLock
RunLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _holder(path):
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_live_holder_refuses_a_second_process(tmp_path):
    path = tmp_path / "run" / "run.lock"
    child = _holder(path)
    try:
        with pytest.raises(RunLocked, match=rf"in use by pid {child.pid} on .* since"):
            RunLock(path).acquire()
    finally:
        child.kill()
        child.wait()


def test_a_killed_holder_leaves_a_lock_that_is_taken_over(tmp_path):
    path = tmp_path / "run" / "run.lock"
    child = _holder(path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    lock = RunLock(path).acquire()
    try:
        assert lock.recovered_from is not None and lock.recovered_from["pid"] == child.pid
    finally:
        lock.release()
    # Released cleanly: the next taker has nothing to recover.
    with RunLock(path) as again:
        assert again.recovered_from is None


def test_a_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, capsys):
    """`run.lock` made a link to a file outside the run: taking the lock (`ub doctor --repair`,
    `ub train`) truncated that file through the link and wrote the holder's record into it."""
    from ub.flows.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("envs: [{env_id: Nim-v0-train}]\n")
    victim = tmp_path / "notes.txt"
    victim.write_text("someone's notes")
    (run / "run.lock").symlink_to(victim)
    assert main(["doctor", str(run), "--repair"]) == 2
    assert "run.lock is a symbolic link: ub takes a run's lock only in a file of its own" in (
        capsys.readouterr().err)
    assert main(["doctor", str(run)]) == 1  # (reading the holder follows no link either)
    assert "problem: run.lock: a symbolic link" in capsys.readouterr().out
    assert victim.read_text() == "someone's notes"


def test_a_repair_passes_a_dead_holders_record_on_to_the_next_holder(tmp_path):
    """`ub doctor --repair` takes the lock of a killed `ub train`: its release emptied the
    file, so the next `ub train` never learned of the dead flow run (left Running)."""
    path = tmp_path / "run" / "run.lock"
    child = _holder(path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with RunLock(path, pass_on_recovered=True) as repair:
        assert repair.recovered_from["pid"] == child.pid
    with RunLock(path) as train:
        assert train.recovered_from is not None and train.recovered_from["pid"] == child.pid
    with RunLock(path) as later:
        assert later.recovered_from is None


def test_orphaned_temporary_files_are_removed_and_nothing_else(tmp_path):
    keep = [tmp_path / "steps" / "round=000000" / "shard-0000.parquet",
            tmp_path / "config.yaml", tmp_path / ".prefect" / "prefect.db",
            # set aside by `ub doctor --repair`: kept, never deleted
            tmp_path / "quarantine" / "20260101T000000" / ".shard-0002.parquet.tmp-9-00c0ffee"]
    orphans = [tmp_path / "steps" / "round=000000" / ".shard-0001.parquet.tmp-123-0badc0de",
               tmp_path / "checkpoints" / ".ckpt-000002.tmp-77-deadbeef" / "adapter.bin"]
    for path in keep + orphans:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    time.sleep(0.01)
    removed = remove_orphans(tmp_path)
    assert {p.name for p in removed} == {".shard-0001.parquet.tmp-123-0badc0de",
                                          ".ckpt-000002.tmp-77-deadbeef"}
    assert all(p.exists() for p in keep)
    assert not any(p.exists() for p in orphans)


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".hidden", "x" * 200, "a..b"])
def test_run_names_cannot_escape_the_runs_root(name, tmp_path):
    from ub.errors import UbError

    with pytest.raises(UbError, match="invalid run name"):
        check_run_name(name)
    with pytest.raises(UbError, match="invalid run name"):
        RunPaths.of(tmp_path, name)
