"""Shared prefixes, computed once: ``learner.pack_prefixes`` (ub/learner/packing.py).

The packing functions on hand-made rows (the trie's nodes, positions, ancestry and index map),
then the learner with packing against the learner without it on rows that share prefixes as a
round's decisions do: the same scores, decision states, gradients and update, to the rounding
of float32 sums (tests/float_rounding.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from float_rounding import adam_first_step_bound, gradients_within_rounding, sum_rounding

from ub.batch import Batch
from ub.errors import UbError
from ub.learner import Learner, LearnerConfig
from ub.learner.packing import (
    PackedRows,
    pack_rows,
    resolve_pack_prefixes,
    subtree_ends,
    unpack,
)
from ub.learner.token_masks import TokenMasks
from ub.model.lora import LoraSettings

VOCAB = 500

# -- the packing functions ---------------------------------------------------------------------

# Rows that are prefixes of one another (2 of 0, 4 of 0), identical (0 and 5), one of one token,
# one of none (all padding); 0 pads.
ROWS = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3], [7], [], [1, 2, 3, 4]]


def padded(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    width = width or max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


def assert_consistent(packed: PackedRows, inputs: torch.Tensor, lengths: list[int]) -> None:
    """What any packing must hold: each row's position maps to a node with its token and its
    position, attending exactly to the nodes of the row's earlier positions; past a row's
    length, to the zero slot."""
    r, n = packed.input_ids.shape
    tokens, positions = packed.input_ids.flatten(), packed.position_ids.flatten()
    mask = packed.attention_mask[:, 0]
    assert mask.shape == (r, n, n) and packed.index.shape == inputs.shape
    for b, length in enumerate(lengths):
        nodes = packed.index[b, :length]
        assert tokens[nodes].tolist() == inputs[b, :length].tolist()
        assert positions[nodes].tolist() == list(range(length))
        assert (packed.index[b, length:] == r * n).all()
        if length:
            row = int(nodes[0]) // n
            assert (nodes // n == row).all()  # a row's nodes are in one packed row
            for p, node in enumerate((nodes % n).tolist()):
                assert set(torch.nonzero(mask[row, node]).flatten().tolist()) == \
                    set((nodes[:p + 1] % n).tolist())


def test_a_trie_computes_each_shared_prefix_once() -> None:
    inputs, lengths = padded(ROWS), [len(r) for r in ROWS]
    packed = pack_rows(inputs, lengths)
    # Nodes 1, 1-2, 1-2-3, 1-2-3-4, 1-2-5 and 7, in depth-first order, in one packed row.
    assert packed.nodes == 6
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 0]]
    assert packed.index.tolist() == [[0, 1, 2, 3], [0, 1, 4, 6], [0, 1, 2, 6], [5, 6, 6, 6],
                                     [6, 6, 6, 6], [0, 1, 2, 3]]
    assert packed.attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],  # 5 below 1-2, beside 3 and 4
        [0, 0, 0, 0, 0, 1],  # 7: a root of its own
    ]
    assert_consistent(packed, inputs, lengths)


def test_packed_rows_hold_whole_paths_and_a_long_row_alone() -> None:
    inputs, lengths = padded(ROWS), [len(r) for r in ROWS]
    packed = pack_rows(inputs, lengths, row_nodes=3)
    assert_consistent(packed, inputs, lengths)
    # 1-2-3-4 passes 3 nodes: a packed row of its own (a row is never split), which its twin
    # shares; 1-2-5 computes 1-2 again in the next.
    assert packed.input_ids.tolist() == [[1, 2, 3, 0], [1, 2, 3, 4], [1, 2, 5, 0], [7, 0, 0, 0]]
    assert packed.nodes == 11
    # A padding slot attends to itself only, and no node to it.
    mask = packed.attention_mask[:, 0]
    assert mask[3, 1:, 1:].equal(torch.eye(3, dtype=torch.bool))
    assert not mask[3, 0, 1:].any()


def test_lengths_cut_rows_and_the_width_pads_to_a_multiple() -> None:
    inputs = padded(ROWS)
    lengths = [2, 2, 2, 1, 0, 4]  # (what the row's scored positions need)
    packed = pack_rows(inputs, lengths, multiple=8)
    assert packed.input_ids.shape == (1, 8) and packed.nodes == 5  # 1, 1-2, 7, 1-2-3, 1-2-3-4
    assert_consistent(packed, inputs, lengths)


def test_random_rows_keep_every_property() -> None:
    rng = random.Random(0)
    stems = [[rng.randrange(1, 6) for _ in range(rng.randint(1, 12))] for _ in range(4)]
    rows = [rng.choice(stems)[:rng.randint(0, 12)] + [rng.randrange(1, 4)
                                                       for _ in range(rng.randint(0, 5))]
            for _ in range(40)]
    inputs, lengths = padded(rows, 20), [len(r) for r in rows]
    for row_nodes in (1, 7, 30, 1000):
        packed = pack_rows(inputs, lengths, row_nodes=row_nodes)
        assert_consistent(packed, inputs, lengths)
        assert packed.nodes <= sum(lengths)


def test_subtree_ends_close_at_the_next_node_no_deeper() -> None:
    assert subtree_ends([0, 1, 2, 3, 2, 0]) == [5, 5, 4, 4, 5, 6]
    assert subtree_ends([]) == []


def test_unpack_gathers_states_and_adds_up_the_gradients_of_shared_nodes() -> None:
    inputs, lengths = padded(ROWS), [len(r) for r in ROWS]
    packed = pack_rows(inputs, lengths)
    hidden = torch.arange(6.0).view(1, 6, 1).repeat(1, 1, 2).requires_grad_()
    rows = unpack(hidden, packed)
    assert rows.shape == (6, 4, 2)
    assert rows[1, :, 0].tolist() == [0.0, 1.0, 4.0, 0.0]  # 1-2-5, then the zero slot
    rows.sum().backward()
    assert hidden.grad is not None
    # Nodes 1 and 1-2 are in four rows, 1-2-3 in three, 1-2-3-4 in two, 1-2-5 and 7 in one.
    assert hidden.grad[0, :, 0].tolist() == [4.0, 4.0, 3.0, 2.0, 1.0, 1.0]


def test_auto_packs_on_the_cpu_and_flash_attention_cannot() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_pack_prefixes("auto", cpu, "sdpa")
    assert resolve_pack_prefixes("auto", cpu, "eager")
    assert not resolve_pack_prefixes("auto", cuda, "sdpa")
    assert resolve_pack_prefixes(True, cuda, "sdpa")
    assert not resolve_pack_prefixes(False, cpu, "sdpa")
    assert not resolve_pack_prefixes("auto", cuda, "flash_attention_2")
    with pytest.raises(UbError, match="flash_attention_2 takes none"):
        resolve_pack_prefixes(True, cuda, "flash_attention_2")


# -- the learner with and without packing --------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(small_qwen3: Path) -> Path:
    return small_qwen3


def config(model_dir: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model_dir), lora=LoraSettings(rank=8, alpha=16, dropout=0.0),
                    learning_rate=5e-3, length_normalizer=16, micro_batch_tokens=512, seed=3)
    return LearnerConfig(**{**settings, **overrides})


def decisions(seed: int = 0, games: int = 3, turns: int = 4) -> Batch:
    """Rows that share prefixes as a round's decisions do: every prompt starts with the same
    rules; a game's later prompt repeats its earlier prompt and move (that row whole is a
    prefix of it); one row twice; and a row of one prompt token."""
    rng = random.Random(seed)

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(rng.randint(low, high))]

    rules = tokens(24, 24)
    rows: list[tuple[list[int], list[int]]] = []
    for _ in range(games):
        prompt = rules + tokens(2, 8)
        for _ in range(turns):
            move = tokens(1, 3)
            rows.append((prompt, move))
            prompt = prompt + move + tokens(3, 6)
    rows += [rows[1], ([5], [7])]
    width = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.int64)
    completion_mask = torch.zeros(len(rows), width)
    behaviour = torch.zeros(len(rows), width)
    for b, (prompt, move) in enumerate(rows):
        n = len(prompt) + len(move)
        input_ids[b, :n] = torch.tensor(prompt + move)
        completion_mask[b, len(prompt):n] = 1.0
        behaviour[b, len(prompt):n] = torch.tensor([-rng.uniform(0.05, 1.0) for _ in move])
    advantages = torch.tensor([rng.gauss(0.0, 1.0) for _ in rows])
    return Batch(input_ids=input_ids, completion_mask=completion_mask,
                 behaviour_logprobs=behaviour, advantages=advantages,
                 lengths=torch.tensor([len(p) + len(c) for p, c in rows]),
                 returns=advantages.clone())


def legal_moves(scored: int, seed: int = 0) -> TokenMasks:
    """A hand-made legal-move mask: every other scored token held to a few tokens (its own
    among them), the rest free."""
    rng = random.Random(seed)
    offsets, ids = [0], []
    for i in range(scored):
        allowed = sorted(rng.sample(range(1, VOCAB), 5)) if i % 2 == 0 else []
        ids += allowed
        offsets.append(len(ids))
    return TokenMasks(torch.tensor(offsets), torch.tensor(ids, dtype=torch.long),
                      torch.full((scored,), -1), None)


def test_the_body_computes_fewer_tokens_and_scores_the_same(model_dir: Path) -> None:
    batch = decisions()
    ids, scored = batch.input_ids, batch.completion_mask[:, 1:] > 0
    # Masked tokens are those sampled under the mask: the mask allows each row's own token.
    masks = legal_moves(int(scored.sum()))
    targets = ids[:, 1:][scored]
    for i in range(0, len(targets), 2):
        masks.ids[int(masks.offsets[i])] = targets[i]
    found, computed = {}, {}
    for pack in (False, True):
        learner = Learner(config(model_dir, pack_prefixes=pack))
        assert learner.policy.pack_prefixes is pack
        seen: list[int] = []
        embed = learner.policy.causal_lm.model.embed_tokens
        hook = embed.register_forward_hook(
            lambda m, i, o, record=seen.append: record(i[0].numel()))
        with torch.no_grad():
            found[pack] = learner.policy.score(ids, scored, with_states=True, masks=masks)
        hook.remove()
        computed[pack] = seen[0]
    # Each shared prefix once: far fewer tokens through the body than the padded rows.
    assert computed[True] < 0.6 * computed[False]
    plain, packed = found[False], found[True]
    terms = ids.numel()  # (no sum in the forward pass has more terms than the batch's tokens)
    for name in ("logprobs", "entropy", "legal_logmass", "states"):
        expected, got = getattr(plain, name), getattr(packed, name)
        assert expected is not None and got is not None and got.shape == expected.shape, name
        torch.testing.assert_close(got, expected, rtol=0, msg=name, atol=sum_rounding(
            terms, float(expected.abs().max())))


@pytest.mark.parametrize("overrides", [
    {},
    {"gradient_checkpointing": True},
    {"micro_batch_tokens": 64},  # many micro-batches
    {"algorithm": "a2c", "algorithm_params": {"value_learning_rate": 0.05}},  # decision states
    {"attn_implementation": "eager"},  # an additive mask
    {"pad_to_multiple": 16},
])
def test_an_update_with_packing_is_the_same_update(model_dir: Path, overrides) -> None:
    """The same gradients to the rounding of float32 sums, and the same update to what one
    Adam step makes of it (:mod:`float_rounding`)."""
    batch = decisions(seed=1)
    plain = Learner(config(model_dir, pack_prefixes=False, **overrides))
    packing = Learner(config(model_dir, pack_prefixes=True, **overrides))
    assert packing.policy.pack_prefixes and not plain.policy.pack_prefixes
    plain.accumulate_gradients(batch)
    packing.accumulate_gradients(batch)
    grads, packed_grads = plain.lora_gradients(), packing.lora_gradients()
    gradients_within_rounding(packed_grads, grads, terms=batch.input_ids.numel())

    expected, metrics = plain.update(batch), packing.update(batch)
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    assert expected["optimizer_steps"] == metrics["optimizer_steps"] == 1
    assert not expected["grad_clipped"]
    lr, eps = expected["learning_rate"], plain.config.adam_eps
    state, packed_state = plain.lora_state(), packing.lora_state()
    for name, weight in state.items():
        bound = adam_first_step_bound(grads[name], packed_grads[name], lr, eps, weight)
        assert ((packed_state[name] - weight).abs() <= bound).all(), name


def test_ppo_with_minibatches_and_target_kl_runs_packed(model_dir: Path) -> None:
    batch = decisions(seed=2, games=4)
    settings = dict(algorithm="ppo", minibatches=3, learning_rate=3e-2, target_kl=1e-2,
                    micro_batch_tokens="auto", algorithm_params={"tis_cap": 2.0})
    runs = {}
    for pack in (False, True):
        learner = Learner(config(model_dir, pack_prefixes=pack, **settings))
        runs[pack] = learner.update(batch)
    # Both measure their start (tis_cap), move it alike and stop before the same step.
    assert runs[True]["early_stopped"] and runs[False]["early_stopped"]
    assert runs[True]["optimizer_steps"] == runs[False]["optimizer_steps"]
    assert runs[True]["stopped_at_kl"] == pytest.approx(runs[False]["stopped_at_kl"], rel=1e-4)
    assert runs[True]["loss"] == pytest.approx(runs[False]["loss"], rel=1e-4, abs=1e-6)


def test_a_head_ub_does_not_chunk_scores_unpacked(model_dir: Path) -> None:
    learner = Learner(config(model_dir, pack_prefixes=True))
    learner.policy._chunked_head = False
    learner.policy.configure(learner.config)
    assert not learner.policy.pack_prefixes
