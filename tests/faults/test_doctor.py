"""`ub doctor`: damaged files are found and named, `--repair` quarantines what cannot be
trusted (deleting nothing), and the resumed run equals the undamaged one."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from faults.runs import differences, train
from ub.data.schema import SCHEMA_VERSION
from ub.flows.cli import main
from ub.run.folder.layout import check_run_format


def _copy(reference, tmp_path):
    ref, _ = reference
    shutil.copytree(ref, tmp_path / "run")
    return tmp_path / "run"


def test_a_healthy_run_is_ok(reference, capsys):
    ref, _ = reference
    assert main(["doctor", str(ref)]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        "run: 2 committed round(s), ok", "run format 2: shard folders round-NNNNNN",
        f"data schema v{SCHEMA_VERSION}: rounds 1-2"]


def test_a_format_1_run_still_reads_and_says_its_format(reference, fault_config, prefect_api,
                                                        tmp_path, capsys):
    """A run from before run format 2 (hive ``round=NNNNNN`` folders, no ub-run.json): the
    doctor finds it healthy and names its format, `ub sql` reads it, and a resume replays a
    round in the run's own layout."""
    run = _copy(reference, tmp_path)
    (run / "ub-run.json").unlink()
    for folder in sorted(run.glob("**/round-[0-9]*")):
        if folder.is_dir():
            folder.rename(folder.with_name(folder.name.replace("round-", "round=")))
    for manifest in (run / "rounds").glob("*.json"):  # format 1 manifests list round=R paths
        data = json.loads(manifest.read_text())
        data["shards"] = [s.replace("/round-", "/round=") for s in data["shards"]]
        manifest.write_text(json.dumps(data))
    assert main(["doctor", str(run)]) == 0
    out = capsys.readouterr().out
    assert "run format 1: shard folders round=NNNNNN" in out and "ok" in out
    assert main(["sql", str(run), "SELECT count(DISTINCT round) AS n FROM games",
                 "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "2"]
    shard = run / "games" / "round=000001" / "shard-0000.parquet"
    shard.write_bytes(shard.read_bytes()[:300])
    assert main(["doctor", str(run), "--repair"]) == 0
    result = train(fault_config, tmp_path, prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    assert shard.exists() and not list(run.glob("**/round-[0-9]*/"))
    assert check_run_format(run) == 1


def test_a_live_runs_temporary_files_are_work_in_progress(reference, tmp_path, capsys):
    from ub.run.folder.lock import RunLock

    run = _copy(reference, tmp_path)
    (run / "steps" / ".shard-0000.parquet.tmp-99-0123abcd").write_bytes(b"being written")
    with RunLock(run / "run.lock"):
        assert main(["doctor", str(run)]) == 0
        assert "is in use by pid" in capsys.readouterr().out
    assert main(["doctor", str(run)]) == 1


def test_damage_is_named_repaired_and_replayed(reference, fault_config, prefect_api, tmp_path,
                                               capsys):
    run = _copy(reference, tmp_path)
    shard = run / "games" / "round-000001" / "shard-0000.parquet"
    shard.write_bytes(shard.read_bytes()[:300])  # truncated
    (run / "checkpoints" / "ckpt-000002" / "adapter_model.safetensors").unlink()
    (run / "metrics" / "round-000000.parquet").write_text("garbage")
    orphan = run / "steps" / ".shard-0001.parquet.tmp-4242-0123abcd"
    orphan.write_bytes(b"half a file")

    assert main(["doctor", str(run)]) == 1
    out = capsys.readouterr().out
    assert "games/round-000001/shard-0000.parquet: is not a readable Parquet file" in out
    assert "checkpoints/ckpt-000002: checkpoint is missing adapter_model.safetensors" in out
    assert "metrics/round-000000.parquet: unreadable metrics" in out
    assert "steps/.shard-0001.parquet.tmp-4242-0123abcd: temporary file" in out
    assert "4 problem(s)" in out
    # Readers name the file too.
    assert main(["sql", str(run), "SELECT count(*) FROM games"]) == 2
    assert f"{shard}" in capsys.readouterr().err

    damaged = {p.relative_to(run) for p in run.rglob("*") if p.is_file()}
    assert main(["doctor", str(run), "--repair"]) == 0
    out = capsys.readouterr().out
    assert "run run is back at round 2" in out and "rewrote metrics/round-000000.parquet" in out
    # Nothing was deleted: what left the run is in quarantine/, byte for byte.
    [stamp] = (run / "quarantine").iterdir()
    kept = {p.relative_to(run) for p in run.rglob("*") if p.is_file()}
    moved = {p.relative_to(stamp) for p in stamp.rglob("*") if p.is_file()}
    assert damaged - kept == moved - {p.relative_to(run) for p in run.rglob("*")}
    assert (stamp / orphan.relative_to(run)).read_bytes() == b"half a file"
    assert main(["doctor", str(run)]) == 0
    capsys.readouterr()

    result = train(fault_config, tmp_path, prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    assert differences(run, reference[0]) == []


def test_the_repair_doctor_prints_works_as_printed_from_the_runs_parent_folder(
        reference, tmp_path, capsys, monkeypatch):
    """`ub doctor damaged` (the default `--root runs`, a relative path) prints the repair to
    run; it crashed (`... is not in the subpath of 'runs/damaged'`) before moving anything."""
    shutil.copytree(reference[0], tmp_path / "runs" / "damaged")
    monkeypatch.chdir(tmp_path)
    shard = Path("runs/damaged/games/round-000001/shard-0000.parquet")
    shard.write_bytes(shard.read_bytes()[:300])
    assert main(["doctor", "damaged"]) == 1
    printed = re.search(r"`(ub doctor [^`]+)`", capsys.readouterr().out).group(1)
    assert main(shlex.split(printed)[1:]) == 0
    out = capsys.readouterr().out
    assert "quarantined games/round-000001 -> quarantine/" in out
    assert "run damaged is back at round 2: `ub train --resume damaged` replays rounds 2..2" in out
    assert main(["doctor", "damaged"]) == 0


def test_a_run_stopped_before_its_first_round_is_ok_and_repairs(reference, tmp_path, capsys):
    """A run stopped a second after it started holds its config and maybe part of checkpoint
    0: doctor said `ckpt-000000 does not exist` (exit 1) and `--repair` crashed (`IndexError`)
    after quarantining files. (That such a run, repaired, resumes as if never stopped is
    test_kill_resume's first kill, in round 0's rollout.)"""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "ub-run.json"):
        shutil.copy(reference[0] / name, run / name)
    assert main(["doctor", str(run)]) == 0
    assert "run: 0 committed round(s), ok" in capsys.readouterr().out
    being_made = run / "checkpoints" / ".ckpt-000000.tmp-4242-0123abcd"  # checkpoint 0's
    being_made.mkdir(parents=True)
    (being_made / "adapter_config.json").write_text("{}")
    assert main(["doctor", str(run)]) == 1
    assert ".ckpt-000000.tmp-4242-0123abcd: temporary file" in capsys.readouterr().out
    assert main(["doctor", str(run), "--repair"]) == 0
    assert "quarantined checkpoints/.ckpt-000000.tmp" in capsys.readouterr().out
    assert main(["doctor", str(run)]) == 0
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "quarantine",
                                                     "run.lock", "ub-run.json"]


def _set_shard_metadata(run: Path, key: bytes, value: bytes) -> Path:
    import pyarrow.parquet as pq

    shard = run / "games" / "round-000001" / "shard-0000.parquet"
    table = pq.read_table(shard)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, key: value}), shard)
    return shard


def _edit_json(path: Path, edit) -> Path:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return path


DAMAGED_METADATA = {  # what was damaged -> (the file it names, what doctor says of it)
    "a schema version that is no JSON": (
        lambda run: _set_shard_metadata(run, b"ub.schema_version", b"{bad"),
        "has damaged ub metadata (its b'ub.schema_version' is b'{bad', not JSON text)"),
    "a schema version in quotes": (
        lambda run: _set_shard_metadata(run, b"ub.schema_version", b'"5"'),
        'has the schema version "5", not a number'),
    "a schema version in a list": (
        lambda run: _set_shard_metadata(run, b"ub.schema_version", b"[5]"),
        "has the schema version [5], not a number"),
    "a key that is no UTF-8": (
        lambda run: _set_shard_metadata(run, b"ub.\xff\xfe", b"1"),
        "has damaged ub metadata (its b'ub.\\xff\\xfe'"),
    "a count that is no number": (
        lambda run: _edit_json(run / "rounds" / "round-000001.json",
                               lambda m: {**m, "games": "many"}),
        "counts many games but its shards hold"),
    "a rating without its mu": (
        lambda run: _edit_json(run / "ratings" / "round-000001.json", lambda r: {
            **r, "members": [{k: v for k, v in m.items() if k != "mu"} for m in r["members"]]}),
        "missing 1 required positional argument: 'mu'"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_METADATA))
def test_damaged_or_crafted_metadata_is_named_in_one_line(reference, tmp_path, capsys, damage):
    """Tracebacks from `ub doctor` and `ub sql` before, and doctor called the rating "ok"."""
    run = _copy(reference, tmp_path)
    make, said = DAMAGED_METADATA[damage]
    damaged = make(run)
    assert main(["doctor", str(run)]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines()
                if line.startswith("problem:")]
    assert problems == [f"problem: {damaged.relative_to(run)}: {problems[0].split(': ', 2)[2]}"]
    assert said in problems[0] and problems[0].endswith("(round 2 onwards)")
    for query in ("SELECT count(*) FROM games", "SELECT count(*) FROM ratings"):
        code = main(["sql", str(run), query, "--format", "csv"])
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and str(damaged) in err[0], err  # one line, naming the file
        # a shard cannot be read past; a round's record is left out of the tables it feeds
        assert code == (2 if damaged.suffix == ".parquet" else 0)


def test_a_manifest_pointing_at_nothing_is_found(reference, tmp_path, capsys):
    run = _copy(reference, tmp_path)
    manifest = run / "rounds" / "round-000000.json"
    data = json.loads(manifest.read_text())
    data["shards"] = ["games/round-000000/shard-0007.parquet"]
    manifest.write_text(json.dumps(data))
    assert main(["doctor", str(run)]) == 1
    out = capsys.readouterr().out
    assert "games/round-000000/shard-0007.parquet: missing games shard of a committed round" in out
    assert "shard-0000.parquet: shard of a committed round that its manifest does not list" in out
    assert main(["doctor", str(run), "--repair"]) == 0
    assert "back at round 1" in capsys.readouterr().out
    assert not (run / "rounds").exists() or not list((run / "rounds").iterdir())


@pytest.mark.parametrize("argv", [["doctor", "{run}"], ["sql", "{run}", "SELECT 1"],
                                  ["train", "--resume", "run", "--root", "{root}"],
                                  ["dashboard", "{run}", "--once"]])
def test_a_run_of_a_newer_format_is_refused(reference, tmp_path, capsys, argv):
    run = _copy(reference, tmp_path)
    (run / "ub-run.json").write_text(json.dumps({"format": 99, "ub_version": "9.0"}))
    before = sorted(p.stat().st_mtime_ns for p in run.rglob("*"))
    assert main([a.format(run=run, root=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "is in run format 99 (written by ub 9.0)" in err and "upgrade ub" in err
    assert sorted(p.stat().st_mtime_ns for p in run.rglob("*")) == before
