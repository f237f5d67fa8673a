"""Hosted opponents: a misbehaving OpenAI-compatible server (errors, garbage, slowness) on
loopback exercises the HTTP client that plays real games against vLLM's own server in
test_serve.py (a checkpoint served by `ub serve` as a hosted opponent: one vLLM server start
for both)."""

from __future__ import annotations

import contextlib
import re
import time

import pytest
from servers import free_port
from stub_openai import STUB_KEY

from ub.actors import hosted
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
    keyed = f"hosted:m@{bad_server}/keyed/v1?key=UB_TEST_HOSTED_KEY"
    monkeypatch.setenv("UB_TEST_HOSTED_KEY", STUB_KEY)
    played = _play(keyed)  # (the stub answers 401 to a request without this bearer token)
    assert {g["outcome"] for g in played.games.to_pylist()} <= {"decisive", "draw"}
    with pytest.raises(UbError, match=r"failed after 1 attempt\(s\): HTTP 401"):
        _play(f"hosted:m@{bad_server}/keyed/v1")  # the same endpoint without the key
    write_shard(tmp_path, ShardId(0, 0), "hosted", played.steps, played.games)
    for path in tmp_path.rglob("*.parquet"):
        assert STUB_KEY.encode() not in path.read_bytes()
    # A wrong key is refused by the server, which echoes it: the error masks it.
    monkeypatch.setenv("UB_TEST_HOSTED_KEY", "sk-wrong-but-still-secret")
    with pytest.raises(UbError, match=r"HTTP 401: .*Bearer \*\*\*") as refused:
        _play(keyed)
    assert "sk-wrong-but-still-secret" not in str(refused.value)


SECRET = "sk-live-ABCDEF123"


@pytest.mark.parametrize(("given", "message"), [
    (f"hosted:m@{{server}}/keyed/v1?key={SECRET}", r"key= takes the name of the environment "
     r"variable that holds the API key .*, never the key itself"),
    (f"hosted:m@{{server}}/keyed/v1?key=%22{SECRET}%22", "key= takes the name"),
    (f"hosted:m@{{server}}/keyed/v1?key=1{SECRET[3:9]}", "not starting with a digit"),
    (f"hosted:m@http://user:{SECRET}@127.0.0.1:9/v1", r"'hosted:m@http://\*\*\*@127.0.0.1:9/v1': "
     "a URL with a user name or password is refused"),
    (f"hosted:m@{{server}}/keyed/v1?api_key={SECRET}", r"api_key=\*\*\*': unknown option"),
])
def test_a_key_given_in_place_of_its_variable_is_refused_and_never_shown(
        bad_server, tmp_path, capsys, given, message):
    from ub.flows.cli import main

    name = given.format(server=bad_server)
    out = tmp_path / "games"
    assert main(["play", "--env", "TicTacToe-v0-train", "--players", f"{name},random",
                 "--games", "1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("ub: error: hosted actor ")
    assert SECRET not in captured.err and SECRET[3:9] not in captured.err
    assert re.search(message, captured.err), captured.err
    assert not out.exists()


@pytest.mark.parametrize("token", ["ghp_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6",
                                   "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm1234567890",
                                   "AKIA" + "ABCDEFGHIJKLMNOP", "Xy7" * 8])
def test_a_key_that_would_pass_for_a_variables_name_is_refused_too(bad_server, capsys, token):
    """GitHub's and Hugging Face's tokens are letters, digits and `_`: `key=ghp_...` was taken
    for a variable's name, stored in the run and printed back as "the variable ghp_..."."""
    from ub.flows.cli import main

    name = f"hosted:m@{bad_server}/keyed/v1?key={token}"
    assert main(["play", "--env", "TicTacToe-v0-train", "--players", f"{name},random",
                 "--games", "1", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "key= takes the name of the environment variable" in err and token not in err
    assert hosted.shown(name).endswith("key=***")
    assert hosted.is_variable_name("OPENAI_API_KEY") and hosted.is_variable_name("hf_home_key")


def test_plain_http_to_another_machine_is_warned_about(bad_server, monkeypatch, capsys):
    monkeypatch.setenv("UB_TEST_HOSTED_KEY", STUB_KEY)
    for loopback in (f"{bad_server}/ok/v1?key=UB_TEST_HOSTED_KEY",
                     "https://api.example.invalid/v1?key=UB_TEST_HOSTED_KEY"):
        with contextlib.suppress(UbError):  # (the .invalid host answers nothing)
            check_hosted(f"hosted:m@{loopback}")
    assert "warning" not in capsys.readouterr().err
    remote = "hosted:m@http://api.example.invalid/v1?key=UB_TEST_HOSTED_KEY"
    with pytest.raises(UbError, match="is unreachable"):
        check_hosted(remote)
    err = capsys.readouterr().err
    assert err.startswith("ub: warning: hosted opponent m at http://api.example.invalid/v1 is "
                          "plain http to another machine: its API key ($UB_TEST_HOSTED_KEY) "
                          "and every prompt and reply cross the network unencrypted; use an "
                          "https:// URL\n"), err
    assert STUB_KEY not in err


@pytest.mark.parametrize(("name", "message"), [
    ("hosted:nomodel", "must look like hosted:MODEL@BASE_URL"),
    ("hosted:m@ftp://x/v1", "is not an http"),
    ("hosted:m@http://x/v1?colour=red", "unknown option"),
    ("hosted:m@http://x/v1?model=other", r"unknown option\(s\) model; valid: concurrency, key,"),
    ("hosted:m@http://x/v1?timeout=-1", r"option timeout: Input should be greater than 0"),
    ("hosted:m@http://x/v1?retries=1.5", r"option retries: Input should be a valid integer"),
    ("hosted:m@http://x/v1?retries=11", r"option retries: Input should be less than or equal to "
     "10"),
    ("hosted:m@http://x/v1?concurrency=257", r"option concurrency: .* less than or equal to 256"),
    ("hosted:m@http://x/v1?max_tokens=1000000", r"option max_tokens: .* less than or equal to "
     "65536"),
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
