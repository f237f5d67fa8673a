"""Numbers read from text (issue 38): one parser, finite and in range, wherever the text comes
from (an actor spec, a ``--set`` value or config file, a port in a URL or an address)."""

from __future__ import annotations

import pytest

from ub.errors import UbError
from ub.numbers import (
    NumberError,
    first_non_finite,
    parse_float,
    parse_int,
    parse_port,
    url_port,
)


@pytest.mark.parametrize(("text", "message"), [
    ("nan", "expected a finite number, got 'nan'"),
    ("-inf", "expected a finite number, got '-inf'"),
    ("1e999", "expected a finite number, got '1e999'"),  # (float() overflows to inf)
    ("lots", "expected a number, got 'lots'"),
    ("-0.5", "must be >= 0, got -0.5"),
])
def test_a_float_is_finite_and_in_range(text, message):
    with pytest.raises(NumberError, match=message):
        parse_float(text, 0)


def test_numbers_and_ports():
    assert parse_float(" 2.5 ") == 2.5 and parse_int("7", 0, 7) == 7
    with pytest.raises(NumberError, match=r"expected a whole number, got '1\.5'"):
        parse_int("1.5")
    with pytest.raises(NumberError, match="must be <= 7, got 8"):
        parse_int("8", maximum=7)
    assert parse_port("8000") == 8000
    for text in ("0", "65536", "nan", "-1"):
        with pytest.raises(NumberError, match=f"a port is a whole number from 1 to 65535, got "
                           f"'{text}'"):
            parse_port(text)
    assert url_port("http://user:pw@[::1]:8000/v1") == 8000
    assert url_port("s3://bucket/runs") is None and url_port("http://host:/v1") is None
    with pytest.raises(NumberError, match="got 'nan'"):
        url_port("http://127.0.0.1:nan/v1")


def test_the_first_non_finite_value_is_found_by_its_key():
    data = {"a": [1.0, {"b": 2}], "c": {"d": [0.5, float("inf")]}, "e": float("nan")}
    assert first_non_finite(data) == ("c.d.1", float("inf"))
    assert first_non_finite({"a": [1, "nan", True]}) is None


def test_every_number_parsed_from_text_is_finite(tmp_path):
    """Each of these reached what it feeds before (an HTTP client, a socket, AdamW, the PPO
    loss, a reward) and failed there with a traceback, or silently trained on it."""
    from ub.actors.hosted import parse_hosted
    from ub.cli.args import yaml_section
    from ub.model.tiny.config import TinyModelConfig
    from ub.run.config.load import load_config
    from ub.run.processes.cluster import check_reachable
    from ub.settings import apply_overrides

    with pytest.raises(UbError, match=r"option timeout: Input should be a finite number"):
        parse_hosted("hosted:m@http://127.0.0.1:1/v1?timeout=.nan")
    with pytest.raises(UbError, match=r"option temperature: Input should be a finite number"):
        parse_hosted("hosted:m@http://127.0.0.1:1/v1?temperature=.inf")
    with pytest.raises(UbError, match=r"option timeout: Input should be a valid number"):
        parse_hosted("hosted:m@http://127.0.0.1:1/v1?timeout=nan")
    with pytest.raises(UbError, match=r"a port is a whole number from 1 to 65535, got 'nan'"):
        parse_hosted("hosted:m@http://127.0.0.1:nan/v1")
    with pytest.raises(UbError, match=r"cluster.address=127.0.0.1:99999: a port is"):
        check_reachable("127.0.0.1:99999")
    with pytest.raises(UbError, match=r"learning_rate: Input should be a finite number"):
        TinyModelConfig.from_dict(apply_overrides({}, ["learning_rate=.nan"]))
    with pytest.raises(UbError, match=r"learner.algorithm_params.clip_eps_high: expected a "
                       r"finite number, got inf"):
        load_config("tiny-cpu", ["learner.algorithm=ppo",
                                 "learner.algorithm_params={clip_eps_high: .inf}"])
    config = tmp_path / "batch.yaml"
    config.write_text("batch:\n  step: [{name: format_reward, bonus: .nan}]\n")
    with pytest.raises(UbError, match=r"batch.yaml: step.0.bonus: expected a finite number"):
        yaml_section(str(config), "batch")
