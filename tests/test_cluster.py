"""The Ray execution helpers that need no cluster: resource checks, core claims, the address
switch. (A real Ray cluster runs the flow in tests/faults/test_ray.py.)"""

from __future__ import annotations

import pytest

from ub.errors import UbError
from ub.run.config.load import WorkerResources, validate_config
from ub.run.folder.layout import RunPaths
from ub.run.processes.cluster import check_api_shared, check_fits, claim_cores
from ub.run.steps.rounds import resolve_run_config

ONE_GPU = WorkerResources(num_cpus=1, num_gpus=1)
ROLES = [("rollout", 0, ONE_GPU), ("rollout", 1, ONE_GPU), ("learner", 0, ONE_GPU)]
CPU_ROLES = [(role, index, WorkerResources(num_cpus=1)) for role, index, _ in ROLES]


def test_workers_that_fit_the_cluster_are_accepted():
    check_fits(ROLES, {"CPU": 3.0, "GPU": 3.0})
    check_fits(CPU_ROLES, {"CPU": 3.0})


@pytest.mark.parametrize("available, message", [
    ({"CPU": 2.0, "GPU": 3.0}, r"need 3 CPUs \(2 rollout and 1 learner workers.*has 2"),
    ({"CPU": 8.0}, r"need 3 GPUs .*has 0"),
])
def test_workers_the_cluster_cannot_hold_are_refused(available, message):
    # Ray would otherwise queue the last worker forever and the run would hang.
    with pytest.raises(UbError, match=message):
        check_fits(ROLES, available)


@pytest.mark.parametrize("without", ["rollout", "learner"])
def test_workers_without_a_gpu_on_a_gpu_cluster_are_refused(without):
    """Ray hides no GPU from a worker that asked for none: every engine and learner would run
    on GPU 0 of its node while the others idle."""
    roles = [(role, i, WorkerResources(num_cpus=1) if role == without else r)
             for role, i, r in ROLES]
    with pytest.raises(UbError, match=rf"has 8 GPUs, but the run's {without} workers ask for "
                                      rf"none \(cluster.{without}.num_gpus: 0\).* GPU 0"):
        check_fits(roles, {"CPU": 16.0, "GPU": 8.0})


def _example(doc: str) -> tuple[dict, dict]:
    """docs/scaling.md's `ray start` head line (its CPUs and GPUs) and the cluster section of
    the config example after it."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).parents[1] / "docs" / doc).read_text()
    head = re.search(r"ray start --head .*--num-cpus (\d+) --num-gpus (\d+)", text)
    assert head is not None
    block = re.search(r"in the config:\n\n```yaml\n(.*?)```", text, re.S)
    assert block is not None
    config = yaml.safe_load(re.sub(r"#.*", "", block.group(1)))
    return {"CPU": float(head.group(1)), "GPU": float(head.group(2))}, config


def _roles(cluster) -> list:
    return ([("rollout", i, cluster.rollout) for i in range(cluster.rollout_workers)]
            + [("learner", i, cluster.learner) for i in range(cluster.learner_workers)])


@pytest.mark.parametrize("preset", ["qwen3-1.7b-simpletak", "qwen3-1.7b-simpletak-8gpu",
                                    "spiral-kuhn"])
def test_the_gpu_presets_and_the_documented_example_fit_the_documented_node(preset):
    """`ub train PRESET --ray HEAD:6379` on the node docs/scaling.md starts: one GPU per
    engine and for the learner, within the node's CPUs; the documented config too."""
    from ub.run.config.load import load_config

    node, example = _example("scaling.md")
    config = load_config(preset)
    assert config.cluster.rollout.num_gpus >= 1 and config.cluster.learner.num_gpus >= 1
    check_fits(_roles(config.cluster), node)
    documented = validate_config({"envs": [{"env_id": "TicTacToe-v0-train"}], **example})
    check_fits(_roles(documented.cluster), node)
    assert documented.rollout.shards % documented.cluster.rollout_workers == 0


def test_a_gpu_cluster_refuses_the_cpu_settings_before_any_worker_starts(tmp_path,
                                                                         monkeypatch):
    """A real Ray head that says it has 8 GPUs (a fake count: Ray schedules by what it is
    told): the run's workers without GPUs are refused, and no worker was started."""
    import ray

    # A local ray.init otherwise turns on token authentication and writes ~/.ray/auth_token,
    # which every later `ray start` on this machine then requires (tests/faults/test_ray.py).
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")

    from ub.run.processes.cluster import start_workers
    from ub.run.steps.rounds import Run

    config = validate_config({"envs": [{"env_id": "TicTacToe-v0-train"}],
                              "cluster": {"address": "auto"}})
    run = Run(RunPaths(tmp_path / "run"), config, "tiny")
    ray.init(num_cpus=2, num_gpus=8, include_dashboard=False, log_to_driver=False,
             namespace="ub-test-gpu")
    try:
        assert ray.cluster_resources()["GPU"] == 8
        with pytest.raises(UbError, match=r"has 8 GPUs, but the run's rollout workers ask"):
            start_workers(run)
        assert not [a for a in ray.util.list_named_actors(all_namespaces=True)]
    finally:
        ray.shutdown()


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


SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN",
           "WANDB_API_KEY", "VLLM_API_KEY", "GOOGLE_API_KEY", "FSSPEC_S3_SECRET",
           "HF_HUB_APITOKEN", "UB_ACCESSKEY", "WANDB_CLIENTSECRET")  # (a secret inside a word)


def test_workers_get_the_settings_they_need_and_no_secret_they_do_not(monkeypatch):
    """Ray shows a job's ``runtime_env`` to whoever reads the cluster's state: the workers get
    the settings and the variables the run's actors read (a hosted opponent's key=), not every
    cloud credential of the driver's shell."""
    from ub.run.processes.cluster import ray_init_kwargs, run_variables

    settings = {"AWS_PROFILE": "ub-runs", "AWS_REGION": "eu-west-1", "UB_WORK_DIR": "/scratch/ub",
                "HF_HOME": "/scratch/hf", "WANDB_MODE": "offline",
                "GOOGLE_APPLICATION_CREDENTIALS": "/etc/ub/gcs.json",
                "PREFECT_API_KEY": "pnu_the-api-the-tasks-report-to"}
    for name, value in {**settings, "UNRELATED_SETTING": "x", "OPPONENT_API_KEY": "sk-needed",
                        **{name: f"secret-of-{name}" for name in SECRETS}}.items():
        monkeypatch.setenv(name, value)
    hosted = "hosted:m@https://api.example.com/v1?key=OPPONENT_API_KEY"
    config = validate_config({"model": {"base": "tiny"}, "envs": [{"env_id": "TicTacToe-v0-train"}],
                              "eval": {"opponents": ["random", hosted]}}, "test")
    assert run_variables(config) == ["OPPONENT_API_KEY"]

    env = ray_init_kwargs("http://head:4200/api", run_variables(config))["runtime_env"]["env_vars"]
    assert env.items() >= {**settings, "OPPONENT_API_KEY": "sk-needed",
                           "PREFECT_API_URL": "http://head:4200/api"}.items()
    assert "UNRELATED_SETTING" not in env
    assert not [name for name in SECRETS if name in env]
    # A URL with a password is a secret whatever its variable's name.
    monkeypatch.setenv("HF_ENDPOINT", "https://ub:hunter2@hub.example.com")
    monkeypatch.setenv("UB_MIRROR", "see s3://bucket and https://mirror.example.com/x@y")
    env = ray_init_kwargs(None)["runtime_env"]["env_vars"]
    assert "HF_ENDPOINT" not in env and "UB_MIRROR" in env
    # Named ones go too, secrets included (a node without credentials of its own).
    monkeypatch.setenv("UB_RAY_ENV", "HF_TOKEN, AWS_SECRET_ACCESS_KEY")
    env = ray_init_kwargs(None)["runtime_env"]["env_vars"]
    assert [name for name in SECRETS if name in env] == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN"]
