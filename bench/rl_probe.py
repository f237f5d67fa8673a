"""Does a learner choice help RL itself? REINFORCE against the random player, in one file.

Not a test. ``.venv/bin/python bench/rl_probe.py [--mode lora|full] [--lr 3e-3] [--rounds 48]
[--games 96] [--minibatches 4] [--seed 0] [--eval-every 16] [--eval-games 400] [--model DIR]``

A diagnostic for issue 15, beside ``bench/line_probe.py``: that one asks how fast the model
learns lines when told the answer; this one asks how fast it learns to win when only the game's
result tells it, with nothing of ub's pipeline in between (no vLLM, Parquet, transforms or
Prefect), so a learner choice (LoRA or every weight, a learning rate) is judged in minutes of
one core. It is deliberately the plainest recipe:

- every round, ``--games`` TicTacToe games against the random player, seats alternating; the
  model samples at temperature 1 (the preset's ``max_tokens`` and stop at ``]``);
- an illegal move ends the game as a loss (the price ub's evaluation charges);
- each game's result (+1, 0, -1) is centred and scaled over the round's games, and every
  decision of the game gets it (REINFORCE with a batch-mean baseline, no discount);
- ``--minibatches`` AdamW steps per round on the round's decisions, the gradient clipped to 1;
- every ``--eval-every`` rounds, 400 greedy games against the random player, the same seeds and
  seats at every evaluation, with a 95% interval.

Its figures are not the demo's: ub's preset also plays Nim, itself and its older checkpoints,
prices an invalid move with a step penalty and uses PPO's ratio. docs/learning-log.md compares them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV = "TicTacToe-v0-train"
EVAL_SEED_OFFSET = 10**6  # evaluation games never share a seed with training games
MAX_NEW_TOKENS = 3  # " ", "[4]", EOS: a TicTacToe move of the tiny model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("lora", "full"), default="lora",
                        help="a rank-8 LoRA as the preset's, or every weight")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--rounds", type=int, default=48)
    parser.add_argument("--games", type=int, default=96, help="training games per round")
    parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps per round")
    parser.add_argument("--seed", type=int, default=0, help="training games and sampling")
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--eval-games", type=int, default=400)
    parser.add_argument("--model", default=None, help="default: the tiny CPU model")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ub.model.lora import LoraSettings
    from ub.model.tiny import tiny_model_path

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # two probes share the two cores
    model_dir = args.model or str(tiny_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"  # batched generation
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if args.mode == "lora":
        from peft import get_peft_model

        model = get_peft_model(model, LoraSettings(rank=8, alpha=16, dropout=0.0).peft_config())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    player = Player(model, tokenizer)

    def evaluate(label: str) -> None:
        from ub.evaluation import wilson_interval

        count = args.eval_games
        results = play([EVAL_SEED_OFFSET + g for g in range(count)], player, greedy=True)
        wins = sum(r.outcome == 1 for r in results)
        low, high = wilson_interval(wins, count)
        invalid = sum(r.invalid for r in results) / count
        print(f"{label}: {wins / count:.1%} [{low:.1%}, {high:.1%}] vs random, "
              f"{invalid:.1%} of games lost by an invalid move", flush=True)

    print(f"{args.mode}, lr {args.lr}, seed {args.seed}, {model_dir}", flush=True)
    evaluate("round 0")
    started = time.perf_counter()
    for index in range(args.rounds):
        first = args.seed * 10**5 + index * args.games
        results = play(list(range(first, first + args.games)), player, greedy=False)
        outcomes = [r.outcome for r in results]
        mean = sum(outcomes) / len(outcomes)
        std = (sum((o - mean) ** 2 for o in outcomes) / len(outcomes)) ** 0.5 or 1.0
        rows = [(prompt, tokens, (r.outcome - mean) / std)
                for r in results for prompt, tokens in r.decisions]
        random.Random(first).shuffle(rows)
        size = -(-len(rows) // args.minibatches)
        for start in range(0, len(rows), size):
            reinforce_step(model, tokenizer, optimizer, params, rows[start:start + size])
        print(f"round {index + 1}: won {sum(o == 1 for o in outcomes) / len(outcomes):.0%} of "
              f"its games, {sum(r.invalid for r in results) / len(results):.0%} lost by an "
              f"invalid move ({time.perf_counter() - started:.0f} s)", flush=True)
        if (index + 1) % args.eval_every == 0:
            evaluate(f"round {index + 1}")


class Player:
    """The model's moves for a batch of prompts, read as a preset rollout reads them."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos = tokenizer.eos_token_id

    def moves(self, prompts: list[str], greedy: bool) -> list[tuple[list[int], str | None]]:
        """Per prompt: the generated tokens up to the first ``]`` (what is trained on) and the
        bracketed action, or None if the text has none."""
        import torch

        from ub.games.actions import extract_bracket

        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True,
                                 add_special_tokens=False)
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(**encoded, max_new_tokens=MAX_NEW_TOKENS,
                                      do_sample=not greedy, temperature=1.0, top_p=1.0,
                                      pad_token_id=self.eos)
        moves = []
        for row in out[:, encoded["input_ids"].shape[1]:].tolist():
            tokens: list[int] = []
            for token in row:
                tokens.append(token)
                if token == self.eos or "]" in self.tokenizer.decode([token]):
                    break
            text = self.tokenizer.decode([t for t in tokens if t != self.eos])
            action, ok = extract_bracket(text.split("]", 1)[0] + "]")
            moves.append((tokens, action if ok else None))
        return moves


class Game:
    """One game against the random player; the model sits in seat ``seed % 2``."""

    def __init__(self, seed: int) -> None:
        import textarena as ta

        from ub.seeding import derive_seed

        self.env = ta.make(env_id=ENV)
        self.env.reset(num_players=2, seed=seed)
        self.seat = seed % 2
        self.rng = random.Random(derive_seed("random-player", seed))
        self.decisions: list[tuple[str, list[int]]] = []
        self.outcome = 0
        self.invalid = False
        self.done = False

    def advance(self) -> str | None:
        """Play the random player's moves; the model's prompt when it is to move, else None."""
        from ub.actors.scripted import random_action
        from ub.games.templates import get_template

        while not self.done:
            player_id, observation = self.env.get_observation()
            if player_id == self.seat:
                return get_template("plain").render(observation)
            self._step(random_action(self.env, self.rng))
        return None

    def answer(self, prompt: str, tokens: list[int], action: str | None) -> None:
        from ub.games.legal import legal_actions

        self.decisions.append((prompt, tokens))
        if action is None or action not in legal_actions(self.env):
            self.done, self.outcome, self.invalid = True, -1, True
        else:
            self._step(action)

    def _step(self, action: str) -> None:
        if self.env.step(action=action)[0]:
            rewards, _ = self.env.close()
            self.done = True
            self.outcome = (rewards[self.seat] > 0) - (rewards[self.seat] < 0)


def play(seeds: list[int], player: Player, greedy: bool) -> list[Game]:
    """Play the games together, one batched generation per turn of the model."""
    games = [Game(seed) for seed in seeds]
    while True:
        waiting = [(game, prompt) for game in games if (prompt := game.advance()) is not None]
        if not waiting:
            return games
        for (game, prompt), (tokens, action) in zip(
                waiting, player.moves([p for _, p in waiting], greedy), strict=True):
            game.answer(prompt, tokens, action)


def reinforce_step(model: Any, tokenizer: Any, optimizer: Any, params: list[Any],
                   rows: list[tuple[str, list[int], float]]) -> None:
    """One AdamW step on -advantage * log p(move) over ``rows``, the mean over rows."""
    import torch

    eos = tokenizer.eos_token_id
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, _, _ in rows]
    width = max(len(p) + len(t) for p, (_, t, _) in zip(prompts, rows, strict=True))
    input_ids = torch.full((len(rows), width), eos)
    scored = torch.zeros((len(rows), width))
    for i, (prompt, (_, tokens, _)) in enumerate(zip(prompts, rows, strict=True)):
        input_ids[i, :len(prompt) + len(tokens)] = torch.tensor(prompt + tokens)
        scored[i, len(prompt):len(prompt) + len(tokens)] = 1
    model.train()
    # Right padding and causal attention: no real token sees the padding.
    logits = model(input_ids=input_ids).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    advantages = torch.tensor([a for _, _, a in rows])
    loss = -((logprobs * scored[:, 1:]).sum(1) * advantages).mean()
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


if __name__ == "__main__":
    main()
