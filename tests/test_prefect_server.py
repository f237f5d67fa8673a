"""prefect.yaml on a real Prefect server, as its users run it: `prefect server start` on
loopback, `prefect deploy --all`, the scheduler creating SCHEDULED runs for both deployments, and
deployment runs completing on a process worker: ub's component logs in the flow run's logs, and
the nightly continuation of a run that was started with overrides; a deployment run with a
bad setting refused at its start by the run's preflight, with `ub train`'s line, logged once and
without a traceback; and `ub train` on a terminal, reporting to this server, without Prefect's
usage-data notice.

(With SQLAlchemy 2.1 the scheduler failed on every loop and no scheduled run ever appeared;
requirements/cpu.lock pins the 2.0 series for that reason.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from processes import as_from_a_terminal, in_a_terminal
from servers import free_port, serving, stop, wait_for

ROOT = Path(__file__).resolve().parents[1]
PREFECT = [sys.executable, "-m", "prefect"]
DEPLOYMENTS = [d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())
               ["deployments"]]
SCHEDULED = [d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())
             ["deployments"] if d.get("schedules")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real Prefect server (API, UI off, scheduler every 2 s) with its own home."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2")
    api = f"http://127.0.0.1:{port}/api"
    with serving([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                 f"{api}/health", home / "server.log", timeout=180, env=env,
                 start_new_session=True):
        env["PREFECT_API_URL"] = api
        yield api, env, home


def _cli(env: dict, *args: str, timeout: float = 300) -> str:
    result = subprocess.run([*PREFECT, *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def deployed(server):
    api, env, _ = server
    _cli(env, "work-pool", "create", "ub-process", "--type", "process")
    _cli(env, "--no-prompt", "deploy", "--all")
    found = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    return {d["name"]: d["id"] for d in found}


def _flow_runs(api: str, **flow_run_filter) -> list[dict]:
    response = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": flow_run_filter},
                          timeout=30)
    response.raise_for_status()
    return response.json()


def test_the_scheduler_creates_runs_for_every_scheduled_deployment(server, deployed):
    api = server[0]
    assert sorted(deployed) == sorted(DEPLOYMENTS)

    def scheduled_for_all() -> dict[str, int] | None:
        runs = _flow_runs(api, state={"type": {"any_": ["SCHEDULED"]}})
        counts = {name: sum(r["deployment_id"] == id_ for r in runs)
                  for name, id_ in deployed.items() if name in SCHEDULED}
        return counts if all(counts.values()) else None

    wait_for(scheduled_for_all, 90, "scheduled flow runs for every deployment")


def test_every_deployed_parameter_has_a_description(server, deployed):
    """Prefect's UI shows a parameter's description from the flow's docstring (``Args:``)."""
    api = server[0]
    for name, id_ in deployed.items():
        deployment = httpx.get(f"{api}/deployments/{id_}", timeout=10).json()
        properties = deployment["parameter_openapi_schema"]["properties"]
        assert properties and all(p.get("description") for p in properties.values()), (
            name, {k: p.get("description") for k, p in properties.items()})


def _trigger(env: dict, params: dict, deployment: str = "selfplay/nightly-train") -> str:
    out = _cli(env, "deployment", "run", deployment, "--params", json.dumps(params))
    return next(line.split()[-1] for line in out.splitlines() if "UUID" in line)


def _logs(api: str, flow_run_id: str) -> list[dict]:
    response = httpx.post(f"{api}/logs/filter", timeout=30, json={
        "logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200})
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def worker(server, deployed):
    """A process worker on the ``ub-process`` pool, as `prefect worker start` runs it: it runs
    the triggered deployment runs; its output is in ``worker.log`` (returned)."""
    _, env, home = server
    output = home / "worker.log"
    with output.open("w") as log:
        # (unbuffered: a failing test reads the log while the worker runs)
        process = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "ub-process"],
                                   cwd=ROOT, env={**env, "PREFECT_WORKER_QUERY_SECONDS": "2",
                                                  "PYTHONUNBUFFERED": "1"},
                                   stdout=log, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, preexec_fn=as_from_a_terminal)
        try:
            yield output
        finally:
            stop(process)


def _finished(api: str, run_id: str, worker_log: Path, timeout: float = 600) -> dict:
    """The final state of flow run ``run_id`` (the worker's output with a timeout)."""
    def final() -> dict | None:
        state = _flow_runs(api, id={"any_": [run_id]})[0]["state"]
        return state if state["type"] in ("COMPLETED", "FAILED", "CRASHED") else None

    try:
        return wait_for(final, timeout, "the triggered run finishes", poll=2)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}\n{worker_log.read_text()[-6000:]}") from None


def test_a_deployment_run_with_a_bad_setting_fails_at_its_start_in_ub_trains_line(
        server, worker, tiny_model, tmp_path, capsys):
    """Issue 44: the flow, as a deployment runs it, makes `ub train`'s preflight. Before, with
    this setting, it wrote the run folder (checkpoint 0, logs, ub-run.json: 20 paths) and
    failed inside vLLM's engine start, twice; now it fails at its start with the one line
    `ub train` prints, and the runs folder is never made."""
    from ub.flows.cli import main

    api, env, _ = server
    runs, bad = tmp_path / "runs", "engine.max_model_len=100000"
    assert main(["train", "tiny-cpu", "--run", "bad", "--root", str(runs), "--set", bad]) == 2
    line = capsys.readouterr().err.removeprefix("ub: error: ").rstrip("\n")
    assert "engine.max_model_len 100000" in line and "\n" not in line

    run_id = _trigger(env, {"run_name": "bad", "root": str(runs), "overrides": [bad]})
    state = _finished(api, run_id, worker, timeout=300)
    assert state["type"] == "FAILED" and line in state["message"], state
    assert not runs.exists()
    wait_for(lambda: any(line in r["message"] for r in _logs(api, run_id)), 30,
              "the line in the flow run's logs")


def test_ub_train_on_a_terminal_prints_no_prefect_usage_notice(server, tiny_model, tmp_path):
    """Issue: `ub train` on a terminal, with a new runs folder, printed Prefect's "collects
    anonymous usage data" notice first. Prefect's client shows it at import on a TTY unless
    DO_NOT_TRACK is set, and ub set that only later, with vLLM's variables. Here a real pty and
    the environment of a user who set neither (none of the test's own, nor a CI's)."""
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS

    api = server[0]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k != "DO_NOT_TRACK" and k not in CI_ENV_VARS}
    env.update(PREFECT_API_URL=api, TERM="xterm-256color")
    code, text = in_a_terminal(
        [sys.executable, "-m", "ub.flows.cli", "train", "tiny-cpu", "--run", "tty", "--root",
         str(tmp_path / "runs"), "--rounds", "1", "--set", "rollout.games_per_round=4",
         "--set", "eval.every=0"], env, 600, cwd=ROOT, preexec_fn=as_from_a_terminal)
    assert code == 0, text[-3000:]
    assert "ub train" in text and "run data:" in text, text[-3000:]
    assert "usage data" not in text and "telemetry" not in text, text[:3000]


def _settled(log: Path, start: int, needle: str, quiet_s: float = 3.0) -> str:
    """The worker's output from ``start`` on, once it holds ``needle`` and has not grown for
    ``quiet_s`` seconds (the flow run's process logs on after its final state)."""
    seen = {"size": -1, "since": 0.0}

    def settled() -> str | None:
        text = log.read_bytes()[start:].decode("utf-8", "replace")
        if needle not in text or len(text) != seen["size"]:
            seen.update(size=len(text), since=time.monotonic())
            return None
        return text if time.monotonic() - seen["since"] >= quiet_s else None

    return wait_for(settled, 60, "the flow run's output in the worker's log", poll=0.5)


def test_a_config_typo_fails_a_deployment_run_with_one_line_and_no_traceback(
        server, worker, tiny_model, tmp_path, capsys):
    """Issue: an unknown key in a deployment run's overrides printed three ~30-line tracebacks
    of one UbError in the worker's log (the flow engine's, its re-raise in ``run_flow`` and in
    ``python -m prefect.engine``) and one in the flow run's logs. Now the run fails with
    `ub train`'s line, logged once, with no traceback in either."""
    from ub.flows.cli import main

    api, env, _ = server
    runs, bad = tmp_path / "runs", "rollout.games_per_rond=4"
    assert main(["train", "tiny-cpu", "--run", "typo", "--root", str(runs), "--set", bad]) == 2
    line = capsys.readouterr().err.removeprefix("ub: error: ").rstrip("\n")
    assert "did you mean games_per_round?" in line and "\n" not in line

    start = worker.stat().st_size
    run_id = _trigger(env, {"run_name": "typo", "root": str(runs), "overrides": [bad]})
    state = _finished(api, run_id, worker, timeout=300)
    assert state["type"] == "FAILED" and line in state["message"], state
    assert not runs.exists()

    # (Prefect's runner reports the process's exit status, 1 for every failed flow run, once
    # the process has ended: all of its output is in by then.)
    output = _settled(worker, start, "exited with status code", quiet_s=2)
    assert "Traceback" not in output, output
    said = [text for text in output.splitlines() if line in text]
    assert len(said) == 2, output  # ub's line, and Prefect's final state
    assert "| ERROR" in said[0] and said[0].endswith(f" - {line}"), output
    assert "Finished in state Failed(" in said[1], output
    logs = wait_for(lambda: [r for r in _logs(api, run_id) if "Finished in state" in r["message"]
                             ] and _logs(api, run_id), 30, "the flow run's logs")
    assert not [r["message"] for r in logs if "Traceback" in r["message"]]
    assert [r["message"] for r in logs if line in r["message"] and r["level"] >= 40] == [line]


def _tiny_config(folder: Path, *, seed: int, eval: dict) -> Path:
    """A one-round config of 4 TicTacToe games on the tiny model, written to
    ``folder/tiny.yaml``."""
    config = folder / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "seed": seed, "rounds": 1, "model": {"base": "tiny"},
        "sampling": {"temperature": 1.0, "max_tokens": 8},
        "envs": [{"env_id": "TicTacToe-v0-train"}],
        "rollout": {"games_per_round": 4, "concurrency": 4},
        "batch": {"batch_size": 8}, "eval": eval}))
    return config


def test_deployment_runs_log_ub_lines_and_continue_a_run_started_with_overrides(
        server, worker, tiny_model, tmp_path):
    """Two runs of `nightly-train` on a process worker: the first starts a run with an
    override, the second continues it the way the schedule does (the deployment's config
    without the override). Both complete, and ub's own log lines are in the flow runs' logs."""
    api, env, _ = server
    config = _tiny_config(tmp_path, seed=3, eval={"every": 0})
    runs = tmp_path / "runs"
    common = {"run_name": "by-hand", "root": str(runs), "config": str(config), "add_rounds": 1}
    def run_to_the_end(params: dict) -> str:
        run_id = _trigger(env, params)
        state = _finished(api, run_id, worker)
        assert state["type"] == "COMPLETED", f"{state}\n{worker.read_text()[-6000:]}"
        return run_id

    started = run_to_the_end({**common, "overrides": ["seed=4"]})
    # The second night: the deployment's parameters, no override (before the fix: refused
    # with "was started with another config: seed (4 in the run, 3 now)").
    continued = run_to_the_end(common)
    run = runs / "by-hand"
    assert len(sorted((run / "rounds").glob("*.json"))) == 2  # one round per night
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 4  # its own config

    def ub_lines() -> list[dict] | None:
        found = [r for r in _logs(api, started) if r["name"].startswith("ub.")]
        return found or None

    lines = wait_for(ub_lines, 30, "ub's log lines in the flow run's logs")
    assert any(r["name"] == "ub.rollout" and "train shard 0/0 committed" in r["message"]
               for r in lines), [(r["name"], r["message"]) for r in lines]
    wait_for(lambda: any(r["name"] == "ub.flow" and "continuing it with its own config"
                          in r["message"] for r in _logs(api, continued)), 30,
              "the continuation's note in its flow run's logs")


def test_parts_of_a_sweep_run_side_by_side_on_one_worker_and_compare_as_one(
        server, worker, tiny_model, tmp_path, capsys):
    """The `sweep` deployment, run twice at once, an arm each, into one root: the process
    worker runs both flow runs side by side, and `ub compare` reads their runs as one sweep."""
    from ub.flows.cli import main

    api, env, _ = server
    config = _tiny_config(tmp_path, seed=0,
                          eval={"every": 1, "games": 4, "opponents": ["random"]})
    root = tmp_path / "sweep"
    common = {"config": str(config), "seeds": [0], "root": str(root), "quiet": True}
    ids = [_trigger(env, {**common, "arms": arm}, "sweep/sweep")
           for arm in ({"lr1": ["learner.learning_rate=0.001"]},
                       {"lr2": ["learner.learning_rate=0.002"]})]
    states = [_finished(api, run_id, worker) for run_id in ids]
    assert [s["type"] for s in states] == ["COMPLETED"] * 2, "\n".join(
        [f"{s['type']}: {s['message']}" for s in states] + worker.read_text().splitlines()[-80:])
    flow_runs = _flow_runs(api, id={"any_": ids})
    spans = [(r["start_time"], r["end_time"]) for r in flow_runs]
    # Named after what they run in Prefect's UI (issue 78: random names, `infallible-swan`)
    assert sorted(r["name"] for r in flow_runs) == [f"{root}: lr1", f"{root}: lr2"]
    runs = _flow_runs(api, parent_task_run_id={"is_null_": False})
    assert {"lr1-s0", "lr2-s0"} <= {r["name"] for r in runs}, [r["name"] for r in runs]
    (_, first_end), (second_start, _) = sorted(spans)
    assert second_start < first_end, spans  # (at once, not one after the other)
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "lr1-s0", "lr2-s0"]
    capsys.readouterr()
    assert main(["compare", str(root), "--format", "csv"]) == 0
    arms = {tuple(line.split(",")[i] for i in (2, -1))
            for line in capsys.readouterr().out.splitlines()[1:]}
    assert arms == {("lr1", "learner.learning_rate=0.001"), ("lr2", "learner.learning_rate=0.002")}
