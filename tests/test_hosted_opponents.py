"""Hosted opponents: a real OpenAI-compatible server (vLLM's, serving the tiny model on
loopback) and a misbehaving one (errors, garbage, slowness) exercise the same HTTP client."""

from __future__ import annotations

import sys
import time

import pytest
from servers import free_port, serving

from ub.actors.hosted import HostedSettings, check_hosted, parse_hosted
from ub.actors.spec import parse_actor
from ub.data.shards import ShardId, write_shard
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

RANDOM = parse_actor("random")


@pytest.fixture(scope="module")
def vllm_server(tiny_model, tmp_path_factory):
    """`vllm.entrypoints.openai.api_server` serving the tiny model as `tiny`."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    with serving([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                  str(tiny_model), "--served-model-name", "tiny", "--host", "127.0.0.1",
                  "--port", str(port), "--max-model-len", "1024",
                  # as ub serves on the CPU (ub.inference.patches.vllm_engine_args): compiling
                  # the model cost this fixture ~20 s warm, ~50 s on a fresh machine, and
                  # bought nothing
                  "--enforce-eager"],
                 f"{base}/models", tmp_path_factory.mktemp("vllm-serve") / "server.log",
                 timeout=300):
        yield base


def test_a_hosted_model_plays_real_games(vllm_server, tmp_path):
    hosted = parse_actor(f"hosted:tiny@{vllm_server}?max_tokens=16")
    check_hosted(hosted.name)
    played = play_games(assign_games(GameSpec("TicTacToe-v0-train"), [hosted, RANDOM], 6,
                                     base_seed=2))
    games = played.games.to_pylist()
    assert len(games) == 6 and {g["outcome"] for g in games} <= {"decisive", "draw"}
    steps = [s for s in played.steps.to_pylist() if s["actor_kind"] == "hosted"]
    assert steps and all(s["prompt"] and s["completion"] is not None for s in steps)
    assert all(s["prompt_token_ids"] is None for s in steps)  # never trained on
    write_shard(tmp_path, ShardId(0, 0), "hosted", played.steps, played.games)


def _play(actor: str, games: int = 2):
    return play_games(assign_games(GameSpec("TicTacToe-v0-train"), [parse_actor(actor), RANDOM],
                                   games, base_seed=1))


@pytest.mark.parametrize(("mode", "options", "message"), [
    ("500", "retries=1", r"failed after 2 attempt\(s\): HTTP 500; HTTP 500"),
    ("garbage", "retries=0", r"failed after 1 attempt\(s\): malformed reply"),
    ("slow", "retries=1&timeout=0.3", r"timed out after 0.3 s; timed out after 0.3 s"),
])
def test_failures_are_clear_errors_never_hangs(bad_server, mode, options, message):
    started = time.monotonic()
    with pytest.raises(UbError, match=message):
        _play(f"hosted:m@{bad_server}/{mode}/v1?{options}")
    assert time.monotonic() - started < 10


def test_skip_records_the_game_as_errored_and_goes_on(bad_server):
    played = _play(f"hosted:m@{bad_server}/500/v1?retries=0&on_failure=skip", games=3)
    games = played.games.to_pylist()
    assert len(games) == 3
    hosted_first = [g for g in games if g["actors"][0].startswith("hosted:")]
    assert hosted_first and all(g["outcome"] == "error" and "HTTP 500" in g["error"]
                                for g in hosted_first)


def test_unreachable_endpoint_and_missing_key_are_named(bad_server, monkeypatch):
    port = free_port()  # nothing listens there
    with pytest.raises(UbError, match=rf"127.0.0.1:{port}/v1/models is unreachable"):
        check_hosted(f"hosted:m@http://127.0.0.1:{port}/v1")
    monkeypatch.delenv("UB_TEST_HOSTED_KEY", raising=False)
    with pytest.raises(UbError, match="environment variable UB_TEST_HOSTED_KEY, which is not"):
        check_hosted(f"hosted:m@{bad_server}/ok/v1?key=UB_TEST_HOSTED_KEY")


def test_the_api_key_is_sent_but_never_stored(bad_server, monkeypatch, tmp_path):
    secret = "sk-test-5ecr3t-value"
    monkeypatch.setenv("UB_TEST_HOSTED_KEY", secret)
    played = _play(f"hosted:m@{bad_server}/ok/v1?key=UB_TEST_HOSTED_KEY")
    write_shard(tmp_path, ShardId(0, 0), "hosted", played.steps, played.games)
    for path in tmp_path.rglob("*.parquet"):
        assert secret.encode() not in path.read_bytes()


@pytest.mark.parametrize(("name", "message"), [
    ("hosted:nomodel", "must look like hosted:MODEL@BASE_URL"),
    ("hosted:m@ftp://x/v1", "is not an http"),
    ("hosted:m@http://x/v1?colour=red", "unknown option"),
    ("hosted:m@http://x/v1?model=other", r"unknown option\(s\) model; valid: concurrency, key,"),
    ("hosted:m@http://x/v1?timeout=-1", r"option timeout: Input should be greater than 0"),
    ("hosted:m@http://x/v1?retries=1.5", r"option retries: Input should be a valid integer"),
    ("hosted:m@http://x/v1?on_failure=shrug",
     r"option on_failure: got 'shrug'; input should be 'error' or 'skip'"),
])
def test_bad_hosted_names(name, message):
    with pytest.raises(UbError, match=message):
        parse_hosted(name)


def test_a_hosted_names_options_are_its_settings():
    assert parse_hosted("hosted:m@http://x/v1/") == HostedSettings.from_dict(
        {"model": "m", "base_url": "http://x/v1"})
    given = parse_hosted("hosted:m@http://x/v1?key=UB_KEY&timeout=60&retries=0&concurrency=2"
                         "&on_failure=skip&max_tokens=10&temperature=0.7")
    assert (given.key_env, given.timeout, given.retries, given.concurrency, given.on_failure,
            given.max_tokens, given.temperature) == ("UB_KEY", 60.0, 0, 2, "skip", 10, 0.7)
    assert parse_hosted("hosted:m@http://x/v1?key=").key_env is None
