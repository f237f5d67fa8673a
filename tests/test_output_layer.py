"""The learner's output layer in chunks (ub.learner.output_layer): the same logprobs, entropy
and LoRA gradients as the plain (tokens x vocabulary) computation, for every algorithm, on a
random Qwen3 with Qwen3's real 151,936-token vocabulary, and memory that no longer grows with
completion tokens x vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ub.batch import Batch
from ub.learner import Learner, LearnerConfig, TokenBatch
from ub.learner.memory import saved_bytes
from ub.learner.output_layer import chunk_tokens, chunked_token_logprobs
from ub.learner.testing import QWEN3_VOCAB, build_qwen3, synthetic_batch
from ub.model.lora import LoraSettings


def plain_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """What the learner computed before: float32 log_softmax over the whole vocabulary."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return logprobs.gather(-1, targets[:, None]).squeeze(-1), entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 37, 10_000])
@pytest.mark.parametrize("loss", ["logprobs", "entropy", "both"])
def test_chunks_match_the_plain_output_layer(temperature: float, chunk: int, loss: str) -> None:
    """Values and gradients (to the hidden states, and to a trained head with a bias) equal
    the plain computation's, whatever the chunk size, for a loss of the logprobs, of the
    entropy (an entropy bonus) or of both."""
    torch.manual_seed(0)
    hidden = torch.randn(300, 32, requires_grad=True)
    head = torch.nn.Linear(32, 5000)
    targets = torch.randint(5000, (300,))
    upstream = torch.randn(300)  # a token-weighted loss, as the algorithms' are
    weight = {"logprobs": (1.0, 0.0), "entropy": (0.0, 0.3), "both": (1.0, 0.3)}[loss]

    def token_loss(logprobs: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        terms = [w * x for w, x in zip(weight, (logprobs, entropy), strict=True) if w]
        return (sum(terms) * upstream).sum()

    logprobs, entropy = chunked_token_logprobs(hidden, head, targets, temperature, chunk=chunk)
    token_loss(logprobs, entropy).backward()
    grads = [hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]
    hidden.grad = head.weight.grad = head.bias.grad = None

    reference, reference_entropy = plain_logprobs(head(hidden), targets, temperature)
    token_loss(reference, reference_entropy).backward()
    torch.testing.assert_close(logprobs, reference, rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy, reference_entropy, rtol=0, atol=2e-5)
    for got, want in zip(grads, [hidden.grad, head.weight.grad, head.bias.grad], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_no_tokens_x_vocabulary_tensor_is_kept_for_backward() -> None:
    """Autograd keeps the hidden states, not the logits: what backward holds grows with
    tokens x hidden size, never with tokens x vocabulary."""
    head = torch.nn.Linear(64, QWEN3_VOCAB, bias=False)
    kept = {}
    for tokens in (256, 1024):
        hidden = torch.randn(tokens, 64, requires_grad=True)
        targets = torch.randint(QWEN3_VOCAB, (tokens,))
        kept[tokens] = saved_bytes(lambda h=hidden, t=targets: chunked_token_logprobs(h, head, t),
                                   [head.weight])
        assert kept[tokens] < tokens * 64 * 4 + tokens * 8 + 1024  # hidden + targets
    # The plain way keeps 2 x 1024 x 151,936 float32 numbers (1.2 GB) for the same 1,024 tokens.
    assert kept[1024] < 1024 * QWEN3_VOCAB * 4 / 500


def test_chunk_size_follows_the_vocabulary() -> None:
    assert chunk_tokens(QWEN3_VOCAB) == 220  # ~128 MiB of float32 logits a chunk
    assert chunk_tokens(4096) == 8192
    assert chunk_tokens(10**12) == 1


# ------------------------------------------------------------------------------------------
# The learner, on a random one-layer Qwen3 with Qwen3's vocabulary
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3(tmp_path_factory.mktemp("qwen3-vocab"), hidden_size=64,
                       intermediate_size=128, num_hidden_layers=1)


def config(model: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model), lora=LoraSettings(rank=4, alpha=8),
                    length_normalizer=16, temperature=0.8, micro_batch_tokens=512,
                    max_grad_norm=None)
    return LearnerConfig(**{**settings, **overrides})


def reference_gradients(learner: Learner, batch: Batch, kl_coef: float
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The update's token logprobs and LoRA gradients the plain way: the model's full logits,
    log_softmax over the vocabulary, the algorithm's loss on those logprobs, one backward."""
    model, temperature = learner.policy.model, learner.config.temperature
    input_ids, scored = batch.input_ids, batch.completion_mask[:, 1:] > 0
    targets = input_ids[:, 1:][scored]
    logprobs, _ = plain_logprobs(model(input_ids=input_ids[:, :-1]).logits[scored], targets,
                                 temperature)
    normalizer = float(len(batch) * learner.config.length_normalizer)
    rows = torch.arange(len(batch))[:, None].expand_as(scored)[scored]
    loss, _ = learner.algorithm.loss(TokenBatch(
        logprobs=logprobs, behaviour_logprobs=batch.behaviour_logprobs[:, 1:][scored],
        advantages=batch.advantages[:, None].expand_as(scored)[scored], rows=rows,
        normalizer=normalizer))
    if kl_coef:
        with torch.no_grad(), model.disable_adapter():
            base, _ = plain_logprobs(model(input_ids=input_ids[:, :-1]).logits[scored],
                                     targets, temperature)
        d = base - logprobs
        loss = loss + kl_coef * (torch.exp(d) - d - 1).sum() / normalizer
    for p in learner.policy.params.values():
        p.grad = None
    loss.backward()
    return logprobs.detach(), learner.lora_gradients()


@pytest.mark.parametrize(("algorithm", "kl_coef"), [("reinforce", 0.0), ("ppo", 0.3)])
def test_learner_gradients_match_the_plain_output_layer(big_vocab_model: Path, algorithm: str,
                                                        kl_coef: float) -> None:
    learner = Learner(config(big_vocab_model, algorithm=algorithm, kl_coef=kl_coef))
    with torch.no_grad():  # a non-zero adapter, so that the KL term and PPO's ratio move
        for name, p in learner.policy.params.items():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(
                len(name))))
    batch = synthetic_batch(12, QWEN3_VOCAB, seed=3, prompt_lengths=(4, 30),
                            completion_lengths=(20, 40))
    batch.advantages[::5] = 0.0  # rows skipped (reinforce) or trained by the KL term alone
    assert int(batch.completion_mask.sum()) > chunk_tokens(QWEN3_VOCAB)  # several chunks

    learner.accumulate_gradients(batch)
    grads = learner.lora_gradients()
    scored = batch.completion_mask[:, 1:] > 0
    token_logprobs = learner.token_logprobs(batch)[:, 1:][scored]
    want_logprobs, want_grads = reference_gradients(learner, batch, kl_coef)

    torch.testing.assert_close(token_logprobs, want_logprobs, rtol=0, atol=1e-5)
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        assert float(want_grads[name].abs().max()) > 0, name
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-7, msg=name)

