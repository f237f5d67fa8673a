"""Actor names: the one definition of which names play a model and what a checkpoint is called."""

from __future__ import annotations

import pytest

from ub.actors.names import checkpoint_actor, checkpoint_update, is_model_actor
from ub.run.folder.layout import checkpoint_name


@pytest.mark.parametrize(("name", "model"), [
    ("model", True), ("model:/runs/x/checkpoints/ckpt-000003", True), ("ckpt-000000", True),
    ("ckpt-1234567", True), ("random", False), ("expert", False),
    ("hosted:gpt@http://127.0.0.1:9/v1", False), ("ckpt-12", False), ("ckpt-00000a", False),
    ("models", False), ("ckpt-000001 ", False),
])
def test_which_names_play_a_model(name, model):
    assert is_model_actor(name) is model


def test_checkpoint_names_round_trip_and_are_the_folder_names():
    for update in (0, 7, 123456, 1234567):
        assert checkpoint_update(checkpoint_actor(update)) == update
        assert checkpoint_name(update) == checkpoint_actor(update)
    assert checkpoint_actor(4) == "ckpt-000004"
    assert checkpoint_update("random") is None
    with pytest.raises(ValueError):
        checkpoint_actor(-1)
