"""A real local Ray cluster (``ray start --head`` on loopback, 2 CPUs) runs the selfplay flow
through prefect-ray's ``RayTaskRunner``: two rollout workers play a round's two shards in
parallel, a learner worker trains, and the run's data equals the same run's in one process."""

from __future__ import annotations

import shutil

import numpy
import pytest
import yaml

from faults.runs import CONFIG, differences, free_port, ray_head, table_rows, train


@pytest.fixture(scope="module")
def ray_cluster():
    with ray_head(cpus=2) as address:
        yield address


def test_a_run_on_ray_equals_the_same_run_in_one_process(ray_cluster, prefect_api, tiny_model,
                                                          tmp_path):
    config = {**CONFIG, "rollout": {**CONFIG["rollout"], "shards": 2},
              "cluster": {"address": ray_cluster, "rollout_workers": 2,
                          # the 2 CPUs go to the engines; the learner shares them between rounds
                          "learner": {"num_cpus": 0}}}
    on_ray_config, local_config = tmp_path / "ray.yaml", tmp_path / "local.yaml"
    on_ray_config.write_text(yaml.safe_dump(config))
    local_config.write_text(yaml.safe_dump({**config, "cluster": {"address": None}}))

    on_ray = train(on_ray_config, tmp_path / "ray", prefect_api)
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    # The same thread counts as the Ray workers (one core per engine, one learner thread), so
    # floating-point sums agree bit for bit.
    local = train(local_config, tmp_path / "local", prefect_api,
                  env={"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"})
    assert local.returncode == 0, local.stderr[-3000:]

    ray_run, local_run = tmp_path / "ray" / "run", tmp_path / "local" / "run"
    found = differences(ray_run, local_run)
    if "steps rows differ" in found:
        # vLLM batches a shard's requests as they arrive, so two engines may group them unlike
        # one: the log-probs of the same sampled tokens can differ in their last bits.
        found.remove("steps rows differ")
        found += _steps_differences(ray_run, local_run)
    assert found == []
    logs = (ray_run / "logs" / "flow.log").read_text()
    assert "ray worker rollout-1" in logs and "ray worker learner-0" in logs


def _steps_differences(run, reference) -> list[str]:
    found = []
    for mine, theirs in zip(table_rows(run, "steps"), table_rows(reference, "steps"), strict=True):
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


def test_the_nightly_eval_of_a_ray_run_needs_no_cluster(reference, tmp_path):
    from flows.evaluate import evaluate_run

    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    stored = yaml.safe_load((run / "config.yaml").read_text())
    stored["cluster"] = {**stored["cluster"], "address": "127.0.0.1:9"}  # the cluster is gone
    (run / "config.yaml").write_text(yaml.safe_dump(stored))

    rows = evaluate_run(run_name="run", root=str(tmp_path), checkpoint=2)
    assert [row["games"] for row in rows] == [CONFIG["eval"]["games"]]
    # evaluating does not rewrite where the run trains
    assert yaml.safe_load((run / "config.yaml").read_text())["cluster"]["address"] == \
        "127.0.0.1:9"
