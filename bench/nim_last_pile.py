"""Does a run learn Nim's one winning move? The probability of taking the whole last pile.

Not a test. Two modes, both on a finished run's own data (``RUN`` is its folder):

``.venv/bin/python bench/nim_last_pile.py checkpoints RUN 0,8,16,32``
    For each checkpoint: on up to 150 of the run's own Nim prompts with one non-empty pile of
    two or more (the position where taking the whole pile wins at once), the policy's mean
    probability of that move, of taking one from the same pile, and how often its greedy move
    takes the whole pile.

``.venv/bin/python bench/nim_last_pile.py update RUN ROUND [VARIANT,...]``
    From checkpoint ``ROUND``, one learner update on round ``ROUND``'s batch (the run's own
    ``config.yaml``, assembled as the run assembled it), once per variant, and the same
    probabilities before and after. Variants zero some rows' advantages to see which rows move
    the policy where: ``full`` (none zeroed), ``one_pile`` (all but Nim decisions with one
    non-empty pile), ``one_pile_ge2`` (all but those with two or more in it), ``no_invalid``
    (invalid moves' rows), ``nim_no_invalid`` (TicTacToe's and invalid moves' rows).

``.venv/bin/python bench/nim_last_pile.py positions RUN 0,8,16,32``
    Position by position (one pile left: (2,0,0), (3,0,0), (0,2,0), (0,3,0), (0,4,0), (0,0,2)
    ... (0,0,5)), on 4 prompts each reached by random play from the opening (seeded: the same
    prompts for every run and checkpoint), each checkpoint's probability of taking the whole
    pile: over every token (``p``), and over the legal moves only (``legal``: what a policy
    sampled under ``legal_moves: mask`` plays); and the last checkpoint's likeliest legal
    move. This is the probe of issue 59.

The moves of the tiny model are whole tokens (``[2 5]`` is one token), which is what lets a
token's probability stand for a move's. docs/learning-log.md has what these showed (issue 42).
"""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import duckdb
import torch

NIM = "Nim-v0-train"
PROBE_PROMPTS = 150


def piles_of(observation: str) -> list[int]:
    """The board the observation ends with (Nim-v0's three piles)."""
    return [int(x) for x in re.findall(r"pile \d: (\d+)", observation)][-3:]


def one_pile_prompts(run: Path) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, completion ids, piles) of the run's valid Nim decisions with one non-empty
    pile of two or more, in file order."""
    rows = duckdb.connect().execute(
        f"""SELECT prompt_token_ids, completion_token_ids, observation
            FROM read_parquet('{run}/steps/*/*.parquet')
            WHERE env_id = '{NIM}' AND actor_kind = 'model' AND NOT invalid_move""").fetchall()
    found = []
    for prompt, completion, observation in rows:
        piles = piles_of(observation)
        if sum(p > 0 for p in piles) == 1 and max(piles) >= 2:
            found.append((prompt, completion, piles))
            if len(found) == PROBE_PROMPTS:
                break
    return found


class Probe:
    """The policy's probabilities of "take the whole pile" and "take one" on fixed prompts."""

    def __init__(self, base_model: str, prompts: list) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(base_model)
        self.prompts = prompts

    def token(self, move: str) -> int:
        ids = self.tokenizer.encode(move, add_special_tokens=False)
        if len(ids) != 1:
            raise SystemExit(f"{move!r} is {len(ids)} tokens: this probe needs whole-move tokens")
        return ids[0]

    @torch.no_grad()
    def __call__(self, model) -> str:
        model.eval()
        take_all, take_one, greedy = 0.0, 0.0, 0
        for prompt, completion, piles in self.prompts:
            pile = next(i for i, n in enumerate(piles) if n > 0)
            # The completion's first token is a deterministic space: score the move after it.
            ids = torch.tensor([list(prompt) + list(completion[:1])])
            p = torch.softmax(model(ids).logits[0, -1].float(), -1)
            whole = self.token(f"[{pile} {piles[pile]}]")
            take_all += p[whole].item()
            take_one += p[self.token(f"[{pile} 1]")].item()
            greedy += int(p.argmax().item() == whole)
        n = len(self.prompts)
        return (f"p(whole pile) {take_all / n:.4f}  p(one) {take_one / n:.4f}  "
                f"greedy takes the whole pile {greedy / n:.3f}")


def run_base_model(run: Path) -> str:
    """The base model the run's checkpoints record, found or built on this machine."""
    from ub.learner.base_identity import resolve_checkpoint_base

    return str(resolve_checkpoint_base(run / "checkpoints" / "ckpt-000000"))


def cmd_checkpoints(run: Path, checkpoints: list[int]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = run_base_model(run)
    probe = Probe(base, one_pile_prompts(run))
    print(f"{len(probe.prompts)} one-pile prompts (two or more left) from {run}")
    for k in checkpoints:
        model = AutoModelForCausalLM.from_pretrained(base)
        if k > 0:  # checkpoint 0 is the base model: a fresh adapter changes nothing
            model = PeftModel.from_pretrained(model, run / "checkpoints" / f"ckpt-{k:06d}")
        print(f"checkpoint {k}: {probe(model)}")


ONE_PILE_POSITIONS = [(2, 0, 0), (3, 0, 0), (0, 2, 0), (0, 3, 0), (0, 4, 0), (0, 0, 2),
                      (0, 0, 3), (0, 0, 4), (0, 0, 5)]
PROMPTS_PER_POSITION = 4


def position_prompts(positions: list[tuple[int, ...]], per_position: int, seed: int = 0
                     ) -> dict[tuple[int, ...], list[tuple[str, list[str]]]]:
    """For each position, ``per_position`` (observation, legal moves) pairs of the player to
    move there, reached by random legal play from Nim's opening (different histories)."""
    import random

    from ub.games.legal import legal_actions
    from ub.games.loop import Game
    from ub.games.specs import GameSpec

    rng = random.Random(seed)
    found: dict[tuple[int, ...], list[tuple[str, list[str]]]] = {p: [] for p in positions}
    for game_seed in range(100_000):
        if all(len(v) >= per_position for v in found.values()):
            return found
        game = Game(GameSpec(NIM), game_seed, f"probe-{game_seed}")
        while not game.done:
            piles = tuple(game.env.state.game_state["piles"])
            if piles in found and len(found[piles]) < per_position:
                found[piles].append((game.observation, legal_actions(game.env)))
                break
            game.apply(rng.choice(legal_actions(game.env)))
    raise SystemExit(f"random play reached only {({p: len(v) for p, v in found.items()})}")


def cmd_positions(run: Path, checkpoints: list[int]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ub.games.templates import get_template

    base = run_base_model(run)
    probe = Probe(base, [])
    space = probe.tokenizer.encode(" ", add_special_tokens=False)
    template = get_template("plain")
    prompts = position_prompts(ONE_PILE_POSITIONS, PROMPTS_PER_POSITION)
    table: dict[tuple[int, ...], list[str]] = {p: [] for p in prompts}
    likeliest: dict[tuple[int, ...], str] = {}
    for k in checkpoints:
        model = AutoModelForCausalLM.from_pretrained(base)
        if k > 0:
            model = PeftModel.from_pretrained(model, run / "checkpoints" / f"ckpt-{k:06d}")
        model.eval()
        for position, cases in prompts.items():
            pile = next(i for i, n in enumerate(position) if n > 0)
            whole, raw, legal_share = f"[{pile} {position[pile]}]", 0.0, 0.0
            best: dict[str, float] = {}
            for observation, legal in cases:
                ids = probe.tokenizer.encode(template.render(observation)) + space
                with torch.no_grad():
                    p = torch.softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
                legal_p = {m: p[probe.token(m)].item() for m in legal}
                raw += legal_p[whole]
                legal_share += legal_p[whole] / sum(legal_p.values())
                for m, q in legal_p.items():
                    best[m] = best.get(m, 0.0) + q / sum(legal_p.values())
            n = len(cases)
            table[position].append(f"{raw / n:.2f} / {legal_share / n:.2f}")
            top = max(best, key=lambda m: best[m])
            likeliest[position] = f"{top} {best[top] / n:.2f}"
    print(f"p(take the whole last pile), over every token / over the legal moves; "
          f"{PROMPTS_PER_POSITION} prompts per position; run {run}")
    print("| position | " + " | ".join(f"ckpt {k}" for k in checkpoints)
          + f" | ckpt {checkpoints[-1]}'s likeliest legal move |")
    print("|---" * (len(checkpoints) + 2) + "|")
    for position, cells in table.items():
        print(f"| {position} | " + " | ".join(cells) + f" | {likeliest[position]} |")


def cmd_update(run: Path, round_: int, variants: list[str]) -> None:
    from ub.batch import assemble_batch
    from ub.cli.batch import batch_config
    from ub.cli.learn import learner_config
    from ub.learner.learner import Learner

    start = str(run / "checkpoints" / f"ckpt-{round_:06d}")
    args = argparse.Namespace(
        config=str(run / "config.yaml"), algorithm=None, learning_rate=None, init_adapter=None,
        base_model=None, from_checkpoint=start, batch_size=None, seed=None, max_train_len=None,
        rounds=f"{round_}:{round_}")
    config = learner_config(args)
    batch = assemble_batch(run, batch_config(args))
    rows = batch.rows.to_pylist()
    observations = dict(((g, t), o) for g, t, o in duckdb.connect().execute(
        f"SELECT game_id, turn, observation FROM "
        f"read_parquet('{run}/steps/round-{round_:06d}/*.parquet')").fetchall())
    piles = [piles_of(observations[(r["game_id"], r["turn"])]) if r["env_id"] == NIM else []
             for r in rows]
    one_pile = torch.tensor([sum(p > 0 for p in ps) == 1 for ps in piles])
    two_or_more = one_pile & torch.tensor([bool(ps) and max(ps) >= 2 for ps in piles])
    invalid = torch.tensor([bool(r["invalid_move"]) for r in rows])
    tictactoe = torch.tensor([r["env_id"] != NIM for r in rows])
    zeroed = {"full": torch.zeros_like(invalid), "one_pile": ~one_pile,
              "one_pile_ge2": ~two_or_more, "no_invalid": invalid,
              "nim_no_invalid": invalid | tictactoe}
    print(f"round {round_}: {len(rows)} rows, {int((~tictactoe).sum())} Nim, "
          f"{int(one_pile.sum())} with one pile left ({int(two_or_more.sum())} of 2 or more), "
          f"{int(invalid.sum())} invalid")
    probe = Probe(config.base_model, one_pile_prompts(run))
    learner = Learner(config)
    for variant in variants:
        if variant not in zeroed:
            raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(zeroed)}")
        learner.start(start)
        before = probe(learner.policy.model)
        varied = copy.copy(batch)
        varied.advantages = batch.advantages.masked_fill(zeroed[variant], 0.0)
        metrics = learner.update(varied)
        print(f"{variant:15s} before: {before}\n{'':15s} after:  {probe(learner.policy.model)}  "
              f"(approx_kl {metrics.get('approx_kl', 0.0):.4f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    checkpoints = sub.add_parser("checkpoints")
    checkpoints.add_argument("run", type=Path)
    checkpoints.add_argument("checkpoints", help="comma-separated checkpoint numbers")
    positions = sub.add_parser("positions")
    positions.add_argument("run", type=Path)
    positions.add_argument("checkpoints", help="comma-separated checkpoint numbers")
    update = sub.add_parser("update")
    update.add_argument("run", type=Path)
    update.add_argument("round", type=int)
    update.add_argument("variants", nargs="?", default="full,one_pile,no_invalid")
    args = parser.parse_args()
    if args.mode == "checkpoints":
        cmd_checkpoints(args.run, [int(x) for x in args.checkpoints.split(",")])
    elif args.mode == "positions":
        cmd_positions(args.run, [int(x) for x in args.checkpoints.split(",")])
    else:
        cmd_update(args.run, args.round, args.variants.split(","))


if __name__ == "__main__":
    main()
