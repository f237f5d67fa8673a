"""Can the model learn to complete a TicTacToe line when it is told the answer?

Not a test. ``.venv/bin/python bench/line_probe.py [--task complete|block] [--steps 400]
[--every 100] [--lr 3e-3] [--full] [--rank 8] [--b-lr-ratio 1] [--model DIR]``

A diagnostic for the model side of issue 15. The RL runs' checkpoints complete their own lines
almost only along the one line their opening aims at; this asks whether the model could learn
the general skill at all within a budget like the demo's. Positions come from random-play
TicTacToe games (``ub.model.transcripts``) in which the player to move can complete a line of
its own (``complete``), or cannot but must stop the opponent's (``block``); the target is such a
cell. Supervised fine-tuning on those targets (cross-entropy on the completion's tokens, the
move and EOS, tokenized as the rollout and the pre-training do) is the strongest signal the
skill can get: RL's reward says only, and rarely, that a game was won. Every ``--every`` steps
the greedy move on held-out positions (from other games) is graded, overall and per kind of
line, with a 95% interval.

The adapter is a rank-``--rank`` LoRA on every projection, as the preset's; ``--full`` trains
every weight instead. ``--b-lr-ratio R`` is LoRA+ (Hayou et al., 2024): the ``lora_B`` matrices
step at ``R`` times the learning rate. The model: ``--model``, else the tiny CPU default
(``ub model tiny``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV = "TicTacToe-v0-train"
TEST_SEED_OFFSET = 10**6  # held-out positions come from games with these seeds and up


def positions(task: str, count: int, first_seed: int) -> list[tuple[str, set[int], str]]:
    """``count`` (prompt, target cells, line kind) from random games seeded from
    ``first_seed`` up."""
    from ub.games.builtin.tictactoe import LINES, completing_cells, opponent_mark, tictactoe_board
    from ub.model.transcripts import play_game

    out: list[tuple[str, set[int], str]] = []
    seed = first_seed
    while len(out) < count:
        for step in play_game(ENV, seed, seed):
            cells, me = tictactoe_board(step.prompt)
            other = opponent_mark(me)
            mine, theirs = completing_cells(cells, me), completing_cells(cells, other)
            targets = mine if task == "complete" else (theirs if not mine else set())
            if targets:
                who = me if task == "complete" else other
                cell = min(targets)
                line = next(line for line in LINES if cell in line and
                            sum(cells[i] == who for i in line) == 2)
                kind = {1: "row", 3: "column"}.get(line[1] - line[0], "diagonal")
                out.append((step.prompt, targets, kind))
        seed += 1
    return out[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("complete", "block"), default="complete")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--full", action="store_true", help="train every weight, no LoRA")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--b-lr-ratio", type=float, default=1.0,
                        help="LoRA+: lora_B's learning rate over --lr")
    parser.add_argument("--train-positions", type=int, default=6000)
    parser.add_argument("--test-positions", type=int, default=300)
    parser.add_argument("--model", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ub.evaluation import wilson_interval
    from ub.games.actions import extract_bracket
    from ub.model.lora import LoraSettings
    from ub.model.tiny import tiny_model_path

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    model_dir = args.model or str(tiny_model_path())
    train = positions(args.task, args.train_positions, 0)
    test = positions(args.task, args.test_positions, TEST_SEED_OFFSET)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if not args.full:
        from peft import get_peft_model

        model = get_peft_model(model, LoraSettings(rank=args.rank, alpha=2 * args.rank,
                                                   dropout=0.0).peft_config())
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in named if "lora_B" not in n], "lr": args.lr},
         {"params": [p for n, p in named if "lora_B" in n], "lr": args.lr * args.b_lr_ratio}],
        weight_decay=0.0)

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def grade() -> str:
        model.eval()
        hits, seen = Counter[str](), Counter[str]()
        for prompt, targets, kind in test:
            prompt_ids = torch.tensor([ids(prompt)])
            out = model.generate(prompt_ids, max_new_tokens=4, do_sample=False,
                                 pad_token_id=eos)
            text = tokenizer.decode(out[0, prompt_ids.shape[1]:])
            # As a rollout with the preset reads it: stop at the first "]", bracket extractor.
            action, ok = extract_bracket(text.split("]", 1)[0] + "]")
            move = int(action[1:-1]) if ok and action[1:-1].isdigit() else -1
            for key in ("all", kind):
                seen[key] += 1
                hits[key] += move in targets
        model.train()
        low, high = wilson_interval(hits["all"], seen["all"])
        kinds = ", ".join(f"{k} {hits[k] / seen[k]:.0%}" for k in ("row", "column", "diagonal")
                          if seen[k])
        return (f"{hits['all'] / seen['all']:.1%} [{low:.1%}, {high:.1%}] of {seen['all']} "
                f"held-out positions ({kinds})")

    what = "every weight" if args.full else f"rank-{args.rank} LoRA" + (
        f", lora_B at {args.b_lr_ratio:g}x" if args.b_lr_ratio != 1 else "")
    print(f"task {args.task}, {what}, lr {args.lr}, batch {args.batch}, {model_dir}", flush=True)
    print(f"step 0: {grade()}", flush=True)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = []
        for prompt, targets, _ in rng.sample(train, args.batch):
            move = [*ids(f" [{rng.choice(sorted(targets))}]"), eos]
            rows.append((ids(prompt), move))
        width = max(len(p) + len(c) for p, c in rows)
        input_ids = torch.full((len(rows), width), eos)
        labels = torch.full((len(rows), width), -100)
        for i, (prompt_ids, move) in enumerate(rows):
            input_ids[i, :len(prompt_ids) + len(move)] = torch.tensor(prompt_ids + move)
            labels[i, len(prompt_ids):len(prompt_ids) + len(move)] = torch.tensor(move)
        # Right padding and causal attention: no real token sees the padding.
        logits = model(input_ids=input_ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            print(f"step {step} ({step * args.batch} examples, "
                  f"{time.perf_counter() - started:.0f} s): {grade()}", flush=True)


if __name__ == "__main__":
    main()
