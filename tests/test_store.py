"""A run's durable copy at an fsspec URL: publish order, what a store reader trusts, fetching
checkpoints with verification, catching a working copy up, clear errors. The store is a real
``file://`` fsspec filesystem, through the code path every fsspec store takes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ub.data.shards import ShardId, shard_path, write_parquet_atomic, write_shard
from ub.data.sql import connect_tables, query, run_sql
from ub.errors import UbError
from ub.learner.checkpoint import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MANIFEST,
    OPTIMIZER_STATE,
    CheckpointState,
)
from ub.learner.checkpoint_writer import write_checkpoint
from ub.model.lora import LoraSettings
from ub.run.folder.layout import RunPaths, write_json_atomic
from ub.run.folder.store import (
    RunStore,
    fetch_checkpoint,
    fetch_missing,
    fetch_round,
    publish,
    publish_checkpoint,
    sync,
)
from ub.run.folder.urls import is_url, working_copy


@pytest.fixture()
def paths(tmp_path, monkeypatch) -> RunPaths:
    """Run ``run`` under the store ``file://TMP/store``, its working copy under TMP/work."""
    monkeypatch.setenv("UB_WORK_DIR", str(tmp_path / "work"))
    return RunPaths.of(f"file://{tmp_path}/store", "run")


def checkpoint(folder: Path, update: int) -> Path:
    def adapter(into: Path) -> None:
        (into / ADAPTER_WEIGHTS).write_bytes(bytes(range(256)) * (update + 1))
        (into / ADAPTER_CONFIG).write_text(json.dumps({"r": 8}))

    state = CheckpointState(update, {"path": "tiny", "fingerprint": "x"},
                            LoraSettings(rank=8, alpha=16), metrics={"update": update})
    return write_checkpoint(folder, state, adapter)


def test_a_url_root_keeps_a_working_copy_per_store_path(tmp_path, monkeypatch):
    assert is_url("s3://bucket/runs") and is_url("file:///data/runs")
    assert not is_url("runs") and not is_url("/data/runs") and not is_url(Path("s3:/x"))
    monkeypatch.setenv("UB_WORK_DIR", str(tmp_path))
    assert working_copy("s3://bucket/runs/demo") == tmp_path / "s3" / "bucket" / "runs" / "demo"
    paths = RunPaths.of("s3://bucket/runs/", "demo")
    assert (paths.store, paths.root, paths.name) == (
        "s3://bucket/runs/demo", tmp_path / "s3" / "bucket" / "runs" / "demo", "demo")
    assert paths.location == "s3://bucket/runs/demo"
    local = RunPaths.of(tmp_path / "runs", "demo")
    assert local.store is None and local.location == str(tmp_path / "runs" / "demo")


def test_files_are_published_in_the_order_that_commits_them(paths, rollout, monkeypatch):
    steps, games = write_shard(paths.train_data, ShardId(0, 0), "run", rollout.steps, rollout.games)
    ckpt = checkpoint(paths.checkpoint(1), 1)
    state = write_json_atomic(paths.final_rewards_state(0), {"x": 1})
    ratings = write_json_atomic(paths.ratings(0), {"members": []})
    manifest = write_json_atomic(paths.manifest(0), {"round": 0})
    order: list[str] = []
    real_put = RunStore._put_file
    monkeypatch.setattr(RunStore, "_put_file",
                        lambda self, local, key: (order.append(key), real_put(self, local, key)))

    # Given all at once (as a resume publishes what the last process did not), in any order:
    publish(paths, manifest, games, ratings, *sorted(ckpt.iterdir()), state, steps)
    assert order.index("steps/round-000000/shard-0000.parquet") < order.index(
        "games/round-000000/shard-0000.parquet")
    ckpt_files = [k for k in order if k.startswith("checkpoints/")]
    assert ckpt_files[-1] == f"checkpoints/ckpt-000001/{MANIFEST}" and len(ckpt_files) >= 5
    assert order[-1] == "rounds/round-000000.json"
    assert set(RunStore(paths.store).files()) == set(order)
    assert not list(Path(paths.store[len("file://"):]).rglob(".*"))  # no temporary names left


def test_a_store_reader_trusts_what_a_local_reader_trusts(paths, rollout):
    write_shard(paths.train_data, ShardId(0, 0), "run", rollout.steps, rollout.games)
    write_shard(paths.eval_data, ShardId(0, 0), "run", rollout.steps, rollout.games)
    half = write_parquet_atomic(rollout.steps, shard_path(paths.train_data, "steps", ShardId(0, 1)))
    store = RunStore(paths.store)
    store.publish_missing(paths.root)
    # An unfinished put (a hidden temporary name) is not a file of the store.
    hidden = Path(store.path("games/round-000000/.shard-0001.parquet.tmp-1-deadbeef"))
    hidden.write_bytes(b"partial")
    assert "games/round-000000/.shard-0001.parquet.tmp-1-deadbeef" not in store.files()
    assert f"steps/round-000000/{half.name}" in store.files()

    sql = "SELECT count(*) AS n, count(DISTINCT game_id) AS games FROM steps"
    in_place = connect_tables({"steps": store.shard_dataset("steps"),
                               "eval_games": store.shard_dataset("games", "eval")})
    # Shard 1 has steps but no games file: not committed, in the store as on disk.
    assert run_sql(in_place, sql).to_pylist() == query(paths.train_data, sql).to_pylist() == [
        {"n": rollout.steps.num_rows, "games": rollout.games.num_rows}]
    games = [{"n": rollout.games.num_rows}]
    assert run_sql(in_place, "SELECT count(*) AS n FROM eval_games").to_pylist() == games


def test_a_checkpoint_is_fetched_whole_and_verified(paths, tmp_path):
    ckpt = checkpoint(paths.checkpoint(0), 0)
    publish_checkpoint(paths, ckpt)
    elsewhere = RunPaths(tmp_path / "other", paths.store)
    fetch_checkpoint(elsewhere, elsewhere.checkpoint(0))
    for file in ckpt.iterdir():
        assert (elsewhere.checkpoint(0) / file.name).read_bytes() == file.read_bytes()
    # Not published (or published without its manifest yet): not fetched, nothing made.
    checkpoint(paths.checkpoint(1), 1)
    store = RunStore(paths.store)
    store.put(paths.root, [f"checkpoints/ckpt-000001/{ADAPTER_WEIGHTS}"])
    fetch_checkpoint(elsewhere, elsewhere.checkpoint(1))
    assert not elsewhere.checkpoint(1).exists()
    # A damaged object is refused by name; nothing is left on the fetching machine.
    store.put(paths.root, [p.relative_to(paths.root).as_posix()
                           for p in sorted(paths.checkpoint(1).iterdir())])
    damaged = Path(store.path(f"checkpoints/ckpt-000001/{OPTIMIZER_STATE}"))
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    with pytest.raises(UbError, match=rf"ckpt-000001 in the run store is damaged .*"
                                      rf"{OPTIMIZER_STATE} does not match"):
        fetch_checkpoint(elsewhere, elsewhere.checkpoint(1))
    assert sorted(p.name for p in elsewhere.checkpoint(0).parent.iterdir()) == ["ckpt-000000"]


def test_sync_catches_a_new_machine_up_and_publishes_what_only_it_has(paths, rollout,
                                                                      tmp_path):
    write_shard(paths.train_data, ShardId(0, 0), "run", rollout.steps, rollout.games)
    checkpoint(paths.checkpoint(0), 0)
    checkpoint(paths.checkpoint(1), 1)
    write_json_atomic(paths.manifest(0), {"round": 0})
    paths.config.write_text("seed: 1\n")
    fetched, published = sync(paths)  # the first machine: publishes everything, in order
    assert fetched == [] and published[-1] == "rounds/round-000000.json"

    other = RunPaths(tmp_path / "machine-b", paths.store)
    fetched, published = sync(other)
    assert published == ["config.yaml"] and "rounds/round-000000.json" in fetched
    assert other.committed_rounds() == [0]
    assert other.checkpoint(1).exists()  # the latest, which the next round plays
    assert not other.checkpoint(0).exists()  # older ones come when something needs them
    # Round 1 runs on machine B; machine A catches up before its next round.
    write_json_atomic(other.manifest(1), {"round": 1})
    sync(other)
    assert fetch_missing(paths, paths.root / "rounds") == ["rounds/round-000001.json"]


def test_two_machines_that_drove_a_run_apart_are_refused(paths, tmp_path):
    write_json_atomic(paths.manifest(0), {"round": 0, "games": 1})
    sync(paths)
    other = RunPaths(tmp_path / "machine-b", paths.store)
    write_json_atomic(other.manifest(0), {"round": 0, "games": 2})
    with pytest.raises(UbError, match=r"hold different round 0s: two machines drove this run"):
        sync(other)


def test_unusable_stores_say_what_to_do(tmp_path):
    with pytest.raises(UbError, match=r"cannot open run store nosuch://x/run: .*install"):
        RunStore("nosuch://x/run").files()
    # (a file where the store's folder should be: refused the same way as a permission error)
    (tmp_path / "blocked").write_text("")
    write_json_atomic(tmp_path / "state" / "f.json", {})
    with pytest.raises(UbError, match=r"run store file://.*/blocked/run: cannot publish "
                                      r"state/f.json: .*credentials.*working copy"):
        RunStore(f"file://{tmp_path}/blocked/run").put(tmp_path, ["state/f.json"])


def test_a_format_1_run_in_a_store_is_read_and_fetched(paths, rollout, tmp_path):
    """A run stored by an older ub (shard folders ``round=NNNNNN``): the store reader lists its
    shards, and a machine without them fetches a round by number."""
    write_shard(paths.train_data, ShardId(0, 0), "run", rollout.steps, rollout.games)
    for table in ("steps", "games"):
        folder = paths.train_data / table
        (folder / "round-000000").rename(folder / "round=000000")
    store = RunStore(paths.store)
    store.publish_missing(paths.root)
    assert "games/round=000000/shard-0000.parquet" in store.files()
    in_place = connect_tables({"games": store.shard_dataset("games")})
    games = [{"n": rollout.games.num_rows}]
    assert run_sql(in_place, "SELECT count(*) AS n FROM games").to_pylist() == games
    other = RunPaths(tmp_path / "machine-b", paths.store)
    assert fetch_round(other, other.train_data, "games", 0) == [
        "games/round=000000/shard-0000.parquet"]
    assert shard_path(other.train_data, "games", ShardId(0, 0)).exists()


@pytest.fixture()
def shared_bucket(paths, tmp_path):
    """The run of ``paths`` (one checkpoint, round 0 committed) copied into an in-memory
    store, a bucket someone else can write to; yields (its run URL, its filesystem)."""
    import fsspec

    checkpoint(paths.checkpoint(1), 1)
    write_json_atomic(paths.manifest(0), {"round": 0})
    fs = fsspec.filesystem("memory")
    bucket = f"/{tmp_path.name}"
    store = RunStore(paths.store)
    store.publish_missing(paths.root)
    for key in store.files():
        fs.pipe(f"{bucket}/run/{key}", Path(store.path(key)).read_bytes())
    try:
        yield f"memory://{bucket}/run", fs
    finally:
        fs.rm(bucket, recursive=True)


@pytest.mark.parametrize("planted", [
    "checkpoints/ckpt-000001//{outside}",   # S3 and GCS allow `//` in a key: an absolute path
    "checkpoints/ckpt-000001/../../../../../../../..{outside}",
    "rounds/./round-000001.json",
    "/rounds/round-000001.json",
])
def test_a_store_key_that_leaves_the_run_is_refused_and_nothing_is_written(
        shared_bucket, tmp_path, planted):
    url, fs = shared_bucket
    outside = tmp_path / "outside" / "planted"
    key = planted.format(outside=outside)
    fs.pipe(f"{url.removeprefix('memory://')}/{key}", b"written by whoever can write the bucket")
    machine = RunPaths(tmp_path / "machine-b", url)
    readers = [lambda: sync(machine), lambda: RunStore(url).pull_records(tmp_path / "records")]
    if key.startswith("checkpoints/"):
        readers.append(lambda: fetch_checkpoint(machine, machine.checkpoint(1)))
    for reader in readers:
        with pytest.raises(UbError, match=rf"run store {url} holds an object under the key "
                                          rf"'{re.escape(key)}', which is no plain relative path"):
            reader()
    assert not (tmp_path / "outside").exists()
    assert not machine.root.exists() and not (tmp_path / "records").exists()


def test_a_fetched_file_lands_inside_its_destination_or_nowhere(paths, tmp_path):
    """A working copy whose folder is a link to elsewhere: the store's files are not written
    through it (every fetch proves its target inside the folder it fetches into)."""
    write_json_atomic(paths.manifest(0), {"round": 0})
    sync(paths)
    machine = RunPaths(tmp_path / "machine-b", paths.store)
    machine.root.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (machine.root / "rounds").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UbError, match=r"'rounds/round-000000.json' would be written to "
                                      rf"{tmp_path}/elsewhere/round-000000.json, outside"):
        sync(machine)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("linked", ["config.yaml", "rounds"])
def test_a_link_in_a_file_store_is_refused_and_its_target_never_copied(paths, tmp_path, linked):
    """Whoever can write to a shared ``file://`` store plants a link to a reader's private file:
    a resume copied the target into the working copy, quoted it in the config error and
    republished it into the store as a world-readable file (issue 69)."""
    write_json_atomic(paths.manifest(0), {"round": 0})
    paths.config.write_text("seed: 1\n")
    sync(paths)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "round-000000.json").write_text("the reader's secret")
    (victim / "private").write_text("the reader's secret")
    planted = Path(RunStore(paths.store).path(linked))
    if planted.is_dir():
        shutil.rmtree(planted)
    else:
        planted.unlink()
    planted.symlink_to(victim if linked == "rounds" else victim / "private")
    machine = RunPaths(tmp_path / "machine-b", paths.store)
    for reader in (lambda: sync(machine), lambda: RunStore(paths.store).pull_records(machine.root)):
        with pytest.raises(UbError, match=rf"holds a symbolic link at '{linked}': ub reads and "
                                          "republishes nothing through a link"):
            reader()
    assert planted.is_symlink()  # not replaced by its target's copy
    assert not machine.root.exists() or "secret" not in "".join(
        f.read_text() for f in machine.root.rglob("*") if f.is_file())


def test_a_link_in_the_working_copy_is_never_published(paths, tmp_path):
    (tmp_path / "private").write_text("the user's secret")
    write_json_atomic(paths.manifest(0), {"round": 0})
    paths.config.symlink_to(tmp_path / "private")
    with pytest.raises(UbError, match=r"holds a symbolic link at config.yaml: ub publishes "
                                      "nothing through a link"):
        sync(paths)
    assert "config.yaml" not in RunStore(paths.store).files()
