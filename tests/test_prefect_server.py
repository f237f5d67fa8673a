"""prefect.yaml on a real Prefect server, as its users run it: `prefect server start` on
loopback, `prefect deploy --all`, the scheduler creating SCHEDULED runs for both deployments, and
a deployment run triggered by hand completing on a process worker.

(With SQLAlchemy 2.1 the scheduler failed on every loop and no scheduled run ever appeared;
requirements/cpu.lock pins the 2.0 series for that reason.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PREFECT = [sys.executable, "-m", "prefect"]
DEPLOYMENTS = [d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())
               ["deployments"]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(check, timeout: float, what: str, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(poll)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real Prefect server (API, UI off, scheduler every 2 s) with its own home."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2")
    log = (home / "server.log").open("w")
    process = subprocess.Popen([*PREFECT, "server", "start", "--host", "127.0.0.1",
                                "--port", str(port)], env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"

    def healthy() -> bool:
        assert process.poll() is None, (home / "server.log").read_text()[-3000:]
        try:
            return httpx.get(f"{api}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait_for(healthy, 180, "the Prefect server answers")
        env["PREFECT_API_URL"] = api
        yield api, env, home
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


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
                          timeout=10)
    response.raise_for_status()
    return response.json()


def test_the_scheduler_creates_runs_for_every_deployment(server, deployed):
    api = server[0]
    assert sorted(deployed) == sorted(DEPLOYMENTS)

    def scheduled_for_all() -> dict[str, int] | None:
        runs = _flow_runs(api, state={"type": {"any_": ["SCHEDULED"]}})
        counts = {name: sum(r["deployment_id"] == id_ for r in runs)
                  for name, id_ in deployed.items()}
        return counts if all(counts.values()) else None

    _wait_for(scheduled_for_all, 90, "scheduled flow runs for every deployment")


def test_a_run_triggered_by_hand_completes_on_a_process_worker(server, deployed, tiny_model,
                                                               tmp_path):
    api, env, _ = server
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "seed": 3, "rounds": 1, "model": {"base": "tiny"},
        "sampling": {"temperature": 1.0, "max_tokens": 8},
        "envs": [{"env_id": "TicTacToe-v0-train"}],
        "rollout": {"games_per_round": 4, "concurrency": 4},
        "batch": {"batch_size": 8},
        "eval": {"every": 0}}))
    out = _cli(env, "deployment", "run", "selfplay/nightly-train",
               "--param", "run_name=by-hand", "--param", f"root={tmp_path / 'runs'}",
               "--param", f"config={config}", "--param", "add_rounds=1")
    run_id = next(line.split()[-1] for line in out.splitlines() if "UUID" in line)
    worker = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "ub-process",
                               "--run-once"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        def finished() -> dict | None:
            state = _flow_runs(api, id={"any_": [run_id]})[0]["state"]
            return state if state["type"] in ("COMPLETED", "FAILED", "CRASHED") else None

        state = _wait_for(finished, 600, "the triggered run finishes", poll=3)
        assert state["type"] == "COMPLETED", (state, worker.communicate(timeout=60)[0][-4000:])
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(30)
    manifests = sorted((tmp_path / "runs" / "by-hand" / "rounds").glob("*.json"))
    assert len(manifests) == 1  # round 0 committed by the worker's flow run
