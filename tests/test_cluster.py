"""The Ray execution helpers that need no cluster: resource checks, core claims, the address
switch. (A real Ray cluster runs the flow in tests/faults/test_ray.py.)"""

from __future__ import annotations

import pytest

from ub.errors import UbError
from ub.run.cluster import check_api_shared, check_fits, claim_cores
from ub.run.config import WorkerResources, validate_config
from ub.run.layout import RunPaths
from ub.run.rounds import resolve_run_config

ROLES = [("rollout", 0, WorkerResources(num_cpus=1)), ("rollout", 1, WorkerResources(num_cpus=1)),
         ("learner", 0, WorkerResources(num_cpus=1, num_gpus=1))]


def test_workers_that_fit_the_cluster_are_accepted():
    check_fits(ROLES, {"CPU": 3.0, "GPU": 1.0})


@pytest.mark.parametrize("available, message", [
    ({"CPU": 2.0, "GPU": 1.0}, r"need 3 CPUs \(2 rollout and 1 learner workers.*has 2"),
    ({"CPU": 8.0}, r"need 1 GPUs .*has 0"),
])
def test_workers_the_cluster_cannot_hold_are_refused(available, message):
    # Ray would otherwise queue the last worker forever and the run would hang.
    with pytest.raises(UbError, match=message):
        check_fits(ROLES, available)


def test_engine_workers_claim_distinct_cores(tmp_path):
    import os

    cores = sorted(os.sched_getaffinity(0))
    first = claim_cores(1, tmp_path)
    second = claim_cores(1, tmp_path)
    assert first == str(cores[0])
    if len(cores) > 1:
        assert second == str(cores[1])
    # every slot taken: share all cores rather than fail
    for _ in cores[2:]:
        claim_cores(1, tmp_path)
    assert claim_cores(1, tmp_path) is None


def test_ray_switch_overrides_the_config_and_resumes_the_run(tmp_path):
    config = validate_config({"envs": [{"env_id": "TicTacToe-v0-train"}],
                              "cluster": {"address": "10.0.0.1:6379"}})
    paths = RunPaths(tmp_path / "run")
    local, _ = resolve_run_config(paths, config, ray_address="local")
    assert local.cluster.address is None
    on_ray, _ = resolve_run_config(paths, config, ray_address="auto")
    assert on_ray.cluster.address == "auto"
    assert on_ray.training_settings() == config.training_settings()


@pytest.mark.parametrize("api_url, nodes, refused", [
    ("http://127.0.0.1:4200/api", 1, False),
    ("http://127.0.0.1:4200/api", 3, True),
    ("http://localhost:4200/api", 2, True),
    ("http://head.cluster:4200/api", 3, False),
])
def test_a_loopback_prefect_api_is_refused_on_several_nodes(api_url, nodes, refused):
    if refused:
        with pytest.raises(UbError, match=rf"has {nodes} nodes, but the Prefect API .* "
                                          r"export PREFECT_API_URL"):
            check_api_shared(api_url, nodes)
    else:
        check_api_shared(api_url, nodes)


def test_workers_get_the_settings_they_need_and_nothing_else(monkeypatch):
    from ub.run.cluster import ray_init_kwargs

    monkeypatch.setenv("AWS_PROFILE", "ub-runs")  # the run store's credentials
    monkeypatch.setenv("UB_WORK_DIR", "/scratch/ub")
    monkeypatch.setenv("UNRELATED_SETTING", "x")
    env = ray_init_kwargs("http://head:4200/api")["runtime_env"]["env_vars"]
    assert env["AWS_PROFILE"] == "ub-runs" and env["UB_WORK_DIR"] == "/scratch/ub"
    assert env["PREFECT_API_URL"] == "http://head:4200/api"
    assert "UNRELATED_SETTING" not in env
