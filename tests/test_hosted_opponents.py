"""Hosted opponents: a misbehaving OpenAI-compatible server (errors, garbage, slowness) on
loopback exercises the HTTP client that plays real games against vLLM's own server in
test_serve.py (a checkpoint served by `ub serve` as a hosted opponent: one vLLM server start
for both)."""

from __future__ import annotations

import time

import pytest
from servers import free_port

from ub.actors.hosted import HostedSettings, check_hosted, parse_hosted
from ub.actors.spec import parse_actor
from ub.data.shards import ShardId, write_shard
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

RANDOM = parse_actor("random")


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
