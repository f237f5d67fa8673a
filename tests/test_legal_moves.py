"""Legal moves by construction (``envs[].legal_moves: mask``): the engine samples only moves the
game accepts, the learner scores each token over what was allowed where it was sampled, and
the data says which moves were legal and which mode played.

Real components: vLLM (the tiny model's one-token moves, and a random model whose tokenizer
spells a move in several tokens), TextArena's games, the learner's policy, DuckDB over the
rollout's own tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from test_vllm_engine import engine_config, model_dir  # noqa: F401  (a fixture)

from ub.actors.spec import parse_actor
from ub.batch.assemble import Batch, masked_moves
from ub.batch.collate import collate
from ub.errors import UbError
from ub.games.move_mask import MoveConstraint, move_constraint, played_move, template_constraint
from ub.games.registry import games_with
from ub.games.specs import GameSpec
from ub.games.templates import get_template
from ub.inference.types import EngineConfig, GenerationRequest, SamplingConfig
from ub.learner import LearnerConfig
from ub.learner.output_layer import chunked_token_logprobs
from ub.learner.policy import Policy
from ub.learner.token_masks import token_masks
from ub.rollout import assign_games, play_games

NIM_START = ["[0 1]", "[0 2]", "[0 3]", "[1 1]", "[1 2]", "[2 1]"]
TINY_SAMPLING = SamplingConfig(temperature=1.0, max_tokens=8, stop=("]",))  # (the preset's)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def decode_each(tokenizer, ids) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


# ------------------------------------------------------------------------------------------
# The constraint
# ------------------------------------------------------------------------------------------


def test_a_one_token_move_is_a_choice_among_the_legal_moves_tokens(tiny_tokenizer):
    c = template_constraint(get_template("plain"), NIM_START, tiny_tokenizer)
    moves = {tiny_tokenizer.decode(list(m)) for m in c.moves}
    # Each move alone, and after the space the tiny model answers "Your action:" with.
    assert moves == {*NIM_START, *(" " + m for m in NIM_START)}
    first = c.next_allowed(None)
    assert sorted(decode_each(tiny_tokenizer, first)) == sorted([" ", *NIM_START])
    [after_space] = [m for m in c.moves if len(m) == 2][:1]
    assert sorted(decode_each(tiny_tokenizer, c.next_allowed(after_space[:1]))) == \
        sorted(NIM_START)
    # A complete move may only end the completion.
    assert c.next_allowed(after_space) == c.ends == (tiny_tokenizer.eos_token_id,)
    assert not c.free_text and not c.banned


def test_a_move_of_several_tokens_is_held_to_a_legal_one_token_by_token(
        model_dir):  # noqa: F811  (the fixture imported above)
    """The engine tests' random model: its tokenizer spells ``[0 3]`` in five tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    c = move_constraint(["[0 1]", "[0 3]", "[2 1]"], tok, free_text=False)
    ids = tok.encode("[0 3]", add_special_tokens=False)
    assert decode_each(tok, ids) == ["[", "0", " ", "3", "]"]
    steps = c.allowed_steps(ids)
    assert [sorted(decode_each(tok, a)) for a in steps] == [
        sorted(["[", " ["]), ["0", "2"], [" "], ["1", "3"], ["]"]]
    with pytest.raises(ValueError, match="was not allowed"):
        c.allowed_steps(tok.encode("[0 2]", add_special_tokens=False))  # not legal here


def test_text_before_the_move_is_free_but_for_brackets_and_the_end(tiny_tokenizer):
    """A reasoning template: any text, then the first bracket is the move, closed as the
    template closes it (``}`` of ``\\boxed{}``), then only the end of the turn."""
    template = get_template("qwen3-zs")
    c = template_constraint(template, NIM_START, tiny_tokenizer)
    assert c.free_text and c.next_allowed(None) is None
    eos, im_end = tiny_tokenizer.eos_token_id, tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert {eos, im_end} <= c.banned  # the completion cannot end before its move
    opening = [i for i in range(len(tiny_tokenizer)) if "[" in tiny_tokenizer.decode([i])]
    assert {t for t in opening if t not in c.starts} <= c.banned
    assert not c.starts & c.banned
    text = "I take two. \\boxed{[0 2]}"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    steps = c.allowed_steps(ids)
    move_at = next(i for i, t in enumerate(ids) if t in c.starts)
    assert all(a is None for a in steps[:move_at + 1])  # free text, and the move's first token
    assert decode_each(tiny_tokenizer, steps[-1]) == ["}"]  # the template's close, forced
    assert set(c.next_allowed(tuple(ids[move_at:]))) == {eos, im_end}
    assert played_move(text, NIM_START) == "[0 2]"
    with pytest.raises(ValueError, match="excluded from the text before a move"):
        c.allowed_steps(tiny_tokenizer.encode("[pile quantity] ok", add_special_tokens=False))


def test_no_move_to_play_or_a_cut_move_is_said(tiny_tokenizer):
    with pytest.raises(ValueError, match="no legal move"):
        move_constraint([], tiny_tokenizer, free_text=False)
    assert played_move("I think [0", NIM_START) is None  # cut by max_tokens
    assert played_move("[9 9]", NIM_START) is None
    c = MoveConstraint.from_args(template_constraint(get_template("qwen3-zs"), NIM_START,
                                                     tiny_tokenizer).to_args())
    assert c == template_constraint(get_template("qwen3-zs"), NIM_START, tiny_tokenizer)


# ------------------------------------------------------------------------------------------
# The learner's output layer under a mask
# ------------------------------------------------------------------------------------------


def _hidden_and_head(seed: int, n: int, h: int, v: int) -> tuple[torch.Tensor, torch.nn.Linear]:
    """``n`` random hidden states (with their gradient) and a random ``h x v`` output layer."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=gen, requires_grad=True)
    head = torch.nn.Linear(h, v, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(v, h, generator=gen))
    return hidden, head


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_masked_logprobs_and_entropy_match_a_masked_log_softmax(chunk):
    """Values and gradients (an entropy bonus included) equal autograd through a plain
    log-softmax over the allowed tokens, whatever the chunking, for a mix of unconstrained
    tokens, allow-lists and free text with a banned set."""
    from ub.learner.token_masks import TokenMasks

    n, h, v = 7, 16, 40
    hidden, head = _hidden_and_head(0, n, h, v)
    allowed_lists = {1: [3, 5, 9], 4: [7], 5: [0, 1, 2, 3]}  # token 4: forced
    banned = torch.zeros(1, v, dtype=torch.bool)
    banned[0, [10, 11, 12, 13]] = True
    free_rows = {2, 6}
    offsets, ids, free = [0], [], []
    for i in range(n):
        ids += allowed_lists.get(i, [])
        offsets.append(len(ids))
        free.append(0 if i in free_rows else -1)
    masks = TokenMasks(torch.tensor(offsets), torch.tensor(ids), torch.tensor(free), banned)
    targets = torch.tensor([8, 5, 20, 30, 7, 2, 39])
    logprobs, entropy = chunked_token_logprobs(hidden, head, targets, 0.7, chunk=chunk,
                                               masks=masks)
    (logprobs.sum() + 0.3 * entropy.sum()).backward()
    got = hidden.grad.clone()

    hidden.grad = None
    mask = masks.allowed(0, n, v)
    logits = (hidden @ head.weight.t() / 0.7).masked_fill(~mask, float("-inf"))
    all_lp = torch.log_softmax(logits, -1)
    ref_lp = all_lp.gather(-1, targets[:, None]).squeeze(-1)
    ref_h = -(all_lp.exp() * all_lp.masked_fill(~mask, 0.0)).sum(-1)
    (ref_lp.sum() + 0.3 * ref_h.sum()).backward()
    assert torch.allclose(logprobs, ref_lp, atol=1e-5)
    assert logprobs[4] == 0.0 and entropy[4] == 0.0  # one move allowed: no choice, no gradient
    assert torch.allclose(entropy, ref_h, atol=1e-5)
    assert torch.allclose(got, hidden.grad, atol=1e-5)
    assert mask[0].all() and not mask[2, 10:14].any() and mask[2, 14:].all()


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("entropy_too", [False, True])
def test_the_legal_mass_and_its_gradient_match_autograd(chunk, entropy_too):
    """learner.legal_mass_coef's quantity: log of the whole softmax's mass on the allowed
    tokens, 0 where all were allowed; its gradient (with the logprob's, and the entropy's)
    equals autograd through plain log-sum-exps."""
    from ub.learner.output_layer import chunked_token_scores
    from ub.learner.token_masks import TokenMasks

    n, h, v = 6, 16, 40
    hidden, head = _hidden_and_head(1, n, h, v)
    allowed_lists = {0: [3, 5, 9], 2: [7, 8], 3: [0, 1, 2, 3], 5: [11]}
    offsets, ids = [0], []
    for i in range(n):
        ids += allowed_lists.get(i, [])
        offsets.append(len(ids))
    masks = TokenMasks(torch.tensor(offsets), torch.tensor(ids), torch.full((n,), -1), None)
    targets = torch.tensor([5, 20, 8, 1, 30, 11])
    logprobs, entropy, legal = chunked_token_scores(hidden, head, targets, 0.7, chunk=chunk,
                                                    masks=masks, with_entropy=entropy_too)
    loss = 0.5 * logprobs.sum() - 2.0 * legal.sum()
    if entropy_too:
        loss = loss + 0.3 * entropy.sum()
    loss.backward()
    got = hidden.grad.clone()

    hidden.grad = None
    mask = masks.allowed(0, n, v)
    whole = hidden @ head.weight.t() / 0.7
    logits = whole.masked_fill(~mask, float("-inf"))
    ref_legal = torch.logsumexp(logits, -1) - torch.logsumexp(whole, -1)
    all_lp = torch.log_softmax(logits, -1)
    ref = 0.5 * all_lp.gather(-1, targets[:, None]).sum() - 2.0 * ref_legal.sum()
    if entropy_too:
        ref = ref - 0.3 * (all_lp.exp() * all_lp.masked_fill(~mask, 0.0)).sum()
    ref.backward()
    assert torch.allclose(legal, ref_legal, atol=1e-5)
    assert legal[1] == 0.0 and legal[4] == 0.0 and (legal[[0, 2, 3, 5]] < 0).all()
    assert torch.allclose(got, hidden.grad, atol=1e-5)


# ------------------------------------------------------------------------------------------
# Engine and learner, end to end
# ------------------------------------------------------------------------------------------


def model_rows(steps: pa.Table) -> pa.Table:
    return steps.filter(np.array([k == "model" for k in steps["actor_kind"].to_pylist()]))


def batch_of(steps: pa.Table) -> Batch:
    c = collate(steps)
    return Batch(c.input_ids, c.completion_mask, c.behaviour_logprobs,
                 torch.zeros(steps.num_rows), c.lengths, masked_moves=masked_moves(steps))


def learner_and_engine_logprobs(model: Path, batch: Batch) -> tuple[torch.Tensor, ...]:
    """(learner's masked, learner's unmasked, engine's) logprobs of every completion token."""
    policy = Policy(LearnerConfig(base_model=str(model)))
    scored = batch.completion_mask[:, 1:] > 0
    with torch.no_grad():
        masked = policy.score(batch.input_ids, scored, with_entropy=False,
                              masks=policy.token_masks(batch, scored)).logprobs
        free = policy.score(batch.input_ids, scored, with_entropy=False).logprobs
    return masked, free, batch.behaviour_logprobs[:, 1:][scored]


@pytest.fixture(scope="module")
def masked_games(tiny_model):
    """The tiny model (base) against the random player, 30 games of each game, its sampling
    held to the legal moves (on the process's engine, as conftest's ``engine`` starts it)."""
    from ub.run.processes.worker import process_worker

    engine = process_worker().engine(EngineConfig(model=str(tiny_model)),
                                     SamplingConfig(temperature=1.0, max_tokens=16))
    tables = []
    for env in ("TicTacToe-v0-train", "Nim-v0-train"):
        spec = GameSpec(env, legal_moves="mask")
        actors = [parse_actor("model"), parse_actor("random")]
        tables.append(play_games(assign_games(spec, actors, 30, base_seed=7), engine=engine,
                                 base_seed=7, sampling=TINY_SAMPLING).steps)
    return pa.concat_tables(tables)


def test_under_the_mask_every_move_is_legal_and_the_data_says_so(masked_games):
    import duckdb

    steps = masked_games
    model = model_rows(steps).to_pylist()
    assert len(model) > 100
    assert not any(r["invalid_move"] for r in model)
    assert all(r["action"] in r["legal_moves"] for r in model)
    assert {r["legal_moves_mode"] for r in model} == {"mask"}
    scripted = [r for r in steps.to_pylist() if r["actor_kind"] == "scripted"]
    assert {r["legal_moves_mode"] for r in scripted} == {None}
    assert all(r["legal_moves"] for r in scripted)  # (theirs are recorded too)
    # docs/sql.md's query: win rate by how many legal moves the mover had (plain DuckDB).
    by_count = duckdb.sql("""
        SELECT len(legal_moves) AS legal, count(*) AS decisions
        FROM steps WHERE actor_kind = 'model' AND env_id = 'TicTacToe-v0-train'
        GROUP BY legal ORDER BY legal""").fetchall()
    assert by_count[-1][0] == 9 and by_count[0][0] < 9  # the opening and later positions


def test_greedy_play_is_held_to_the_legal_moves_too(engine):
    """Greedy decoding (temperature 0, as the presets' evaluation plays) under the mask plays
    only the moves the mask allows, even where the model's unconstrained greedy move is not
    among them. vLLM skips, for greedy requests, a logits processor that says it leaves the
    argmax alone, so the mask must say it changes it (the sampled games above would not show
    it). The tiny model's greedy moves happen to be legal in its games, so each position of its
    greedy games (TicTacToe, Nim) is asked again with its own greedy move taken out of the
    legal moves: the move it would play there unconstrained is then illegal."""
    greedy = SamplingConfig(temperature=0.0, max_tokens=8, stop=("]",))
    rows = []
    for env in ("TicTacToe-v0-train", "Nim-v0-train"):
        games = assign_games(GameSpec(env), [parse_actor("model"), parse_actor("random")], 6,
                             base_seed=5)
        rows += model_rows(play_games(games, engine=engine, base_seed=5,
                                      sampling=greedy).steps).to_pylist()
    rows = [r for r in rows if len(r["legal_moves"]) > 1]
    assert len(rows) > 20
    tok = engine.tokenizer

    def requests(mask: bool) -> list[GenerationRequest]:
        return [GenerationRequest(
            f"{'mask' if mask else 'free'}-{i}", r["prompt_token_ids"], seed=i, sampling=greedy,
            move_mask=template_constraint(get_template(r["template"]), others(r), tok)
            if mask else None) for i, r in enumerate(rows)]

    def others(row: dict) -> list[str]:  # the legal moves but the unconstrained greedy one
        return [m for m in row["legal_moves"] if m != row["action"]]

    free = engine.generate(requests(mask=False))
    assert [played_move(g.text, r["legal_moves"]) for g, r in zip(free, rows, strict=True)] \
        == [r["action"] for r in rows]  # (greedy: the games' own moves again)
    masked = engine.generate(requests(mask=True))
    off = [(g.text, r["action"]) for g, r in zip(masked, rows, strict=True)
           if played_move(g.text, others(r)) not in others(r)]
    assert not off, f"{len(off)} of {len(rows)} greedy moves left the mask, e.g. {off[:3]}"


def test_learner_scores_masked_moves_as_the_engine_sampled_them(tiny_model, masked_games):
    masked, free, engine = learner_and_engine_logprobs(tiny_model, batch_of(
        model_rows(masked_games)))
    assert (masked - engine).abs().max() < 1e-4
    # The mask changed something: unconstrained, the same tokens score lower.
    assert (free - engine).abs().max() > 1e-2 and bool((free <= masked + 1e-6).all())


def test_free_rows_score_exactly_as_without_masks(tiny_model, engine):
    """A batch with free rows only carries no masks, and the learner's scores are the
    unconstrained ones, as before the mask existed."""
    played = play_games(assign_games(GameSpec("Nim-v0-train"), [parse_actor("model"),
                                                                parse_actor("random")], 12,
                                     base_seed=3), engine=engine, base_seed=3,
                        sampling=TINY_SAMPLING).steps
    rows = model_rows(played)
    assert set(rows["legal_moves_mode"].to_pylist()) == {"free"}
    batch = batch_of(rows)
    assert batch.masked_moves is None
    masked, free, engine_lp = learner_and_engine_logprobs(tiny_model, batch)
    assert torch.equal(masked, free) and (free - engine_lp).abs().max() < 1e-4


@pytest.fixture(scope="module")
def spelled_engine(model_dir, tmp_path_factory):  # noqa: F811
    """The process's engine (in this process) on the random model whose tokenizer spells
    moves in several tokens."""
    from ub.run.processes.worker import process_worker
    from ub.vllm_environment import configure_vllm_environment

    configure_vllm_environment(cache_dir=tmp_path_factory.mktemp("cache"))
    yield process_worker().engine(engine_config(model_dir), SamplingConfig(max_tokens=16))
    process_worker().close_engine()  # (the next module starts its own)


@pytest.mark.parametrize("template", ["plain", "qwen3-zs"])
def test_a_tokenizer_that_spells_moves_in_several_tokens(spelled_engine, template,
                                                         model_dir):  # noqa: F811
    check_spelled_moves(spelled_engine, model_dir, template)


def check_spelled_moves(engine, model: Path, template: str) -> None:
    """The same guarantees where a move is several tokens, and (qwen3-zs) with text before
    it: every finished completion's first bracket is a legal move, and learner and engine
    agree on every token's logprob, the free text's included. (tests/test_engine_process.py
    runs it with vLLM's engine in a process of its own, as on a GPU.)"""
    sampling = SamplingConfig(temperature=1.0, max_tokens=64)
    tok = engine.tokenizer
    legal_sets = [NIM_START, ["[0 1]", "[2 3]"], ["[4]", "[0]", "[8]"]]
    requests, legal_of = [], {}
    for i in range(24):
        legal_of[f"m{i}"] = legal = legal_sets[i % len(legal_sets)]
        requests.append(GenerationRequest(
            f"m{i}-{template}", tok.encode(f"board player move {i} pass"), seed=i,
            sampling=sampling, move_mask=template_constraint(get_template(template), legal,
                                                             tok)))
    rows, finished = [], 0
    for gen in engine.generate(requests):
        legal = legal_of[gen.request_id.split("-")[0]]
        if gen.finish_reason == "stop":  # (the rest were cut at max_tokens)
            finished += 1
            assert played_move(gen.text, legal) in legal, gen.text
            assert template == "plain" or gen.text.endswith("}")
        rows.append({"prompt_token_ids": gen.prompt_token_ids,
                     "completion_token_ids": gen.completion_token_ids,
                     "completion_logprobs": gen.completion_logprobs, "template": template,
                     "legal_moves": legal, "legal_moves_mode": "mask"})
    assert finished >= 8  # (the random model reaches its move often enough)
    table = pa.Table.from_pylist(rows)
    masked, free, engine_lp = learner_and_engine_logprobs(model, batch_of(table))
    assert (masked - engine_lp).abs().max() < 1e-4
    assert (free - engine_lp).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------


def test_a_game_without_legal_moves_is_refused_at_preflight_in_one_line():
    from ub.run.config.load import load_config

    with pytest.raises(UbError) as err:
        load_config("tiny-cpu", ["envs=[{env_id: Battleship-v0, legal_moves: mask}]",
                                 "eval.envs=null"])
    message = str(err.value)
    assert "\n" not in message and "envs.0.legal_moves" in message
    assert "Battleship-v0" in message and ", ".join(games_with("legal_moves")) in message


def test_evaluation_plays_as_the_env_trains_unless_told():
    from ub.run.config.load import game_specs, load_config

    config = load_config("tiny-cpu")  # (the preset masks both games)
    assert {s.legal_moves for s in game_specs(config)} == {"mask"}
    assert {s.legal_moves for s in game_specs(config, config.eval.envs)} == {"mask"}
    unconstrained = load_config("tiny-cpu", ["eval.legal_moves=free"])
    assert {s.legal_moves for s in game_specs(unconstrained, unconstrained.eval.envs)} == \
        {"free"}
    assert {s.legal_moves for s in game_specs(unconstrained)} == {"mask"}  # (training's)
    free = load_config("tiny-cpu", ["envs.0.legal_moves=free", "envs.1.legal_moves=free"])
    assert {s.legal_moves for s in game_specs(free, free.eval.envs)} == {"free"}


def test_token_masks_name_a_row_the_tokenizer_cannot_have_sampled(tiny_tokenizer):
    steps = pa.Table.from_pylist([{
        "prompt_token_ids": [5, 6], "completion_token_ids": [7, 8], "completion_logprobs":
        [-1.0, -1.0], "template": "plain", "legal_moves": ["[0 1]"], "legal_moves_mode": "mask"}])
    batch = batch_of(steps)
    with pytest.raises(UbError, match=r"row 0 .*another tokenizer"):
        token_masks(batch, batch.completion_mask[:, 1:] > 0, len(tiny_tokenizer),
                    lambda t, m: template_constraint(get_template(t), m, tiny_tokenizer),
                    torch.device("cpu"))
