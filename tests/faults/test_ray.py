"""A real local Ray cluster (``ray start --head`` on loopback, 2 CPUs) runs the selfplay flow
through prefect-ray's ``RayTaskRunner``: two rollout workers play a round's two shards in
parallel, two data-parallel learner ranks train, one rollout worker is killed mid-shard, and
the run's data equals the same run's in one process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy
import pytest
import yaml
from safetensors.torch import load_file

from faults.runs import CONFIG, TIMED_FILES, differences, free_port, ray_head, table_rows, train


@pytest.fixture(scope="module")
def ray_cluster():
    with ray_head(cpus=2) as address:
        yield address


@pytest.fixture(scope="module")
def one_process(reference):
    """The faults' reference run (``CONFIG``) in one process, one compute thread per engine and
    learner as on the Ray workers (the suite's setting: tests/conftest.py), so floating-point
    sums agree bit for bit."""
    return reference[0]


def on_ray(cluster: dict, prefect_api, tmp_path, env: dict[str, str] | None = None):
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "cluster": cluster}))
    result = train(path, tmp_path / "ray", prefect_api, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "ray" / "run"


def two_engines_two_ranks(address: str) -> dict:
    # the 2 CPUs go to the engines; the learner's two data-parallel ranks share them between
    # rounds
    return {"address": address, "rollout_workers": 2, "learner_workers": 2,
            "learner": {"num_cpus": 0}}


def assert_same_data(ray_run, one_process) -> None:
    found = differences(ray_run, one_process)
    for table in ("steps", "eval/steps"):
        if f"{table} rows differ" in found:
            # vLLM batches a shard's requests as they arrive, so two engines may group them
            # unlike one: the log-probs of the same sampled tokens can differ in their last bits.
            found.remove(f"{table} rows differ")
            found += _steps_differences(ray_run, one_process, table)
    # The checkpoints: where the learner ran is recorded in each manifest (its
    # learner_config.device_share: the share of the device a learner beside the engine keeps,
    # none on a worker of its own), so that field is left out. And two data-parallel ranks
    # each sum the gradients of every other micro-batch before the all-reduce adds the two
    # sums, where one process adds the micro-batches in turn (ub/distributed.py: "the
    # one-process gradient up to the order of floating-point additions"): the same sum for one
    # or two micro-batches a step (the suite's batches are one), last bits apart for three or
    # more. Only then are the adapter and optimizer tensors (their hashes, the update's
    # figures) compared within float rounding, which AdamW's step amplifies where a gradient
    # is near zero; everything else (a missing file, the RNG state, the config, the counts,
    # the micro-batch sizes) is compared exactly.
    found = [f for f in found if f not in _excused_checkpoint_differences(ray_run, one_process,
                                                                          found)]
    assert found == []


SUMMED = ("adapter_model.safetensors", "optimizer.safetensors")


def _excused_checkpoint_differences(run: Path, reference: Path, found: list[str]) -> list[str]:
    """The checkpoint findings among ``found`` that the causes above explain."""
    excused = []
    for folder in sorted((run / "checkpoints").glob("ckpt-*")):
        theirs = reference / "checkpoints" / folder.name
        rounding = _summed_in_another_order(folder, theirs) and all(
            _tensors_close(folder / name, theirs / name) for name in SUMMED)
        if rounding:
            excused += [f"{folder.name}/{name} differs" for name in SUMMED]
        manifest, metrics = "ub_checkpoint.json", "metrics.json"
        if _placed(folder / manifest, rounding) == _placed(theirs / manifest, rounding):
            excused.append(f"{folder.name}/{manifest} differs beyond its timing fields")
        if rounding and _figures_close(TIMED_FILES[metrics](folder / metrics),
                                       TIMED_FILES[metrics](theirs / metrics)):
            excused.append(f"{folder.name}/{metrics} differs beyond its timing fields")
    return excused


def _summed_in_another_order(mine: Path, theirs: Path) -> bool:
    """Whether the data-parallel update may have added its micro-batches' gradients in
    another order than one process: the same micro-batches, and a step of three or more (the
    ranks sum every other one; ``micro_batches`` counts all steps'). A checkpoint without an
    update (the cold start) never was."""
    a, b = (json.loads((folder / "metrics.json").read_text()) for folder in (mine, theirs))
    if "micro_batches" not in b or a.get("micro_batches") != b["micro_batches"]:
        return False
    return b["micro_batches"] >= b["optimizer_steps"] + 2


def _placed(manifest: Path, rounding: bool) -> dict:
    """A manifest without its timing fields and where the learner ran; without the hashes of
    the summed tensors too when they may differ in their last bits."""
    data = TIMED_FILES["ub_checkpoint.json"](manifest)
    data["learner_config"].pop("device_share", None)
    for name in SUMMED if rounding else ():
        data["files"][name].pop("sha256")  # (their sizes stay: the same tensors)
    return data


def _tensors_close(mine: Path, theirs: Path) -> bool:
    a, b = load_file(str(mine)), load_file(str(theirs))
    return a.keys() == b.keys() and all(
        numpy.allclose(a[k].float().numpy(), b[k].float().numpy(), rtol=1e-3, atol=1e-5)
        for k in a)


def _figures_close(mine: object, theirs: object) -> bool:
    """Equal, but floats (the summed losses, norms, KL) within float rounding."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return mine.keys() == theirs.keys() and all(_figures_close(mine[k], theirs[k])
                                                    for k in mine)
    if isinstance(mine, list) and isinstance(theirs, list):
        return len(mine) == len(theirs) and all(map(_figures_close, mine, theirs))
    if isinstance(mine, float) and isinstance(theirs, float):
        return bool(numpy.isclose(mine, theirs, rtol=1e-4, atol=1e-7))
    return json.dumps(mine) == json.dumps(theirs)


def test_a_run_on_ray_equals_the_same_run_in_one_process_even_when_a_worker_dies(
        ray_cluster, one_process, prefect_api, tmp_path, ledger):
    """Two engine workers play a round's shards side by side and two data-parallel learner
    ranks train; one engine worker is killed (SIGKILL) mid-generation: Ray restarts the actor,
    the Prefect task's retry replays the shard on it (a new engine), and the run's data equals
    the same run's in one process: games, ratings and evaluations exactly, the stored
    log-probs, and the ranks' summed gradients' updates up to float summation order. (One run
    shows both: the data-parallel learner on Ray had a run of its own before, which compared
    round 0's games and both updates, a subset of what this run compares.)"""
    fired = tmp_path / "fault-fired"
    ledger["faults injected"] += 1
    ray_run = on_ray(two_engines_two_ranks(ray_cluster), prefect_api, tmp_path,
                     env={"UB_FAULT_AT": "rollout.step:5", "UB_FAULT_ONCE": str(fired)})
    assert fired.exists()  # a worker was killed (in this run, once)
    logs = (ray_run / "logs" / "flow.log").read_text()
    assert "ray worker rollout-1" in logs and "ray worker learner-1" in logs
    assert "learners: 2 data-parallel ranks" in logs

    def plays(run) -> int:
        return sum((run / "logs" / log).read_text().count(": playing ")
                   for log in ("eval.log", "rollout.log"))

    assert plays(ray_run) == plays(one_process) + 1  # the killed shard, played again
    assert_same_data(ray_run, one_process)
    ledger["faults survived"] += 1


def _steps_differences(run, reference, table: str) -> list[str]:
    found = []
    pattern = "shard-0000.parquet" if table.startswith("eval") else "shard-*.parquet"
    for mine, theirs in zip(table_rows(run, table, pattern), table_rows(reference, table, pattern),
                            strict=True):
        for key, value in mine.items():
            if key == "completion_logprobs":
                # (null for scripted players' moves)
                if not numpy.allclose(numpy.array(value, dtype=float),
                                      numpy.array(theirs[key], dtype=float),
                                      atol=1e-4, equal_nan=True):
                    found.append(f"{mine['game_id']}: {key} differ beyond 1e-4")
            elif value != theirs[key]:
                found.append(f"{mine['game_id']}: {key} differs")
    return found


def test_an_unreachable_ray_address_is_a_clear_error(prefect_api, tiny_model, tmp_path):
    config = {**CONFIG, "cluster": {"address": f"127.0.0.1:{free_port()}"}}
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(config))
    result = train(path, tmp_path, prefect_api)
    assert result.returncode != 0
    assert "cannot reach the Ray cluster at cluster.address=127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_nightly_eval_of_a_ray_run_needs_no_cluster(one_process, tmp_path):
    from ub.flows.evaluate import evaluate_run

    run = tmp_path / "run"
    shutil.copytree(one_process, run)
    stored = yaml.safe_load((run / "config.yaml").read_text())
    stored["cluster"] = {**stored["cluster"], "address": "127.0.0.1:9"}  # the cluster is gone
    (run / "config.yaml").write_text(yaml.safe_dump(stored))

    result = evaluate_run(run_name="run", root=str(tmp_path), checkpoint=2)
    assert [row.games for row in result.rows] == [CONFIG["eval"]["games"]]
    # evaluating does not rewrite where the run trains
    assert yaml.safe_load((run / "config.yaml").read_text())["cluster"]["address"] == \
        "127.0.0.1:9"
