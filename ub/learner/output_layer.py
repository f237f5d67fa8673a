"""The output layer in chunks: each completion token's logprob and the policy's entropy (each
with its gradient), without a (tokens x vocabulary) tensor that lives across a micro-batch.

Scoring ``N`` completion tokens the plain way materializes ``N x V`` float32 logits and
log-probabilities and keeps them for backward: with Qwen3's 151,936-token vocabulary that is
~10-20 GB at 16k tokens, more than the transformer body's activations. Here the logits are made
``chunk`` rows at a time, reduced to what ub needs (the sampled token's logprob, the entropy),
and dropped; backward makes them again from the saved hidden states. Peak memory is one chunk's
logits, whatever ``N``.

Why not Liger Kernel's fused linear cross-entropy: it has no sampling temperature and no entropy,
and it runs on Triton only, so the CPU suite could not run the code a GPU runs. This is plain
torch on any device; on a GPU its time is a few percent of an update's (the output layer's
matmuls are the same ones, chunked).

The gradient, per chunk, for ``logp = z[y] / T - logsumexp(z / T)`` with ``z = h W^T``:
``d logp / d z = (onehot(y) - softmax(z / T)) / T``; for the entropy ``H`` of ``p = softmax(z /
T)``: ``d H / d z = -p * (z / T - sum(p * z / T)) / T``; then ``dh = dz W`` (and ``dW = dz^T h``
if the output weights train).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ub.learner.token_masks import TokenMasks

CHUNK_BYTES = 128 * 2**20
"""float32 logits per chunk (~128 MiB: 220 tokens at Qwen3's vocabulary, 8,192 at the tiny
model's 4,096). A chunk's backward holds about three such tensors; larger chunks are no faster
on a GPU once a chunk's matmul fills it."""


def chunk_tokens(vocab_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Completion tokens per chunk for a vocabulary of ``vocab_size``."""
    return max(1, chunk_bytes // (4 * vocab_size))


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float, allowed: torch.Tensor | None = None,
                  full_lse: torch.Tensor | None = None) -> torch.Tensor:
    """The tempered logits of a chunk, masked where ``allowed`` says; ``full_lse``: receives
    the log-sum-exp of the whole vocabulary's, before the mask."""
    # In the model's dtype, like the plain lm_head call; the softmax in float32.
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    logits = logits / temperature if temperature != 1.0 else logits
    if full_lse is not None:
        full_lse.copy_(torch.logsumexp(logits, dim=-1))
    # The legal-move mask, where a token was sampled under one: the distribution over what
    # was allowed there (-inf elsewhere, as vLLM's logits processor leaves it).
    return logits if allowed is None else logits.masked_fill_(~allowed, float("-inf"))


def _zero_masked(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """``logits`` with its -inf entries (masked tokens, probability 0) at 0, so that sums of
    ``p * z`` are 0 there rather than NaN."""
    return logits if allowed is None else logits.masked_fill_(~allowed, 0.0)


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, targets: torch.Tensor, temperature: float,
                chunk: int, with_entropy: bool, masks: TokenMasks | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32,
                              device=hidden.device)
        # log(mass of the allowed tokens over the whole vocabulary): 0 where all are allowed
        legal = torch.zeros(n if masks is not None else 0, dtype=torch.float32,
                            device=hidden.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            allowed = None if masks is None else masks.allowed(start, end, weight.shape[0])
            full = None if allowed is None else torch.empty(end - start, dtype=torch.float32,
                                                            device=hidden.device)
            logits = _chunk_logits(hidden[start:end], weight, bias, temperature, allowed, full)
            lse = torch.logsumexp(logits, dim=-1)
            logprobs[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - lse
            if full is not None:
                legal[start:end] = lse - full
            if with_entropy:  # H = logsumexp(z) - sum(p * z), with p = softmax(z)
                p = torch.softmax(logits, dim=-1)
                entropy[start:end] = lse - torch.linalg.vecdot(p, _zero_masked(logits, allowed))
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk, ctx.masks = temperature, chunk, masks
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)  # (an output the loss does not use gets None)
        return logprobs, entropy, legal

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None,
                 grad_legal: torch.Tensor | None = None) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets = ctx.saved_tensors
        temperature, chunk, masks = ctx.temperature, ctx.chunk, ctx.masks
        want_hidden, want_weight, want_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if want_bias else None
        for start in range(0, hidden.shape[0], chunk):
            end = min(start + chunk, hidden.shape[0])
            h = hidden[start:end]
            allowed = None if masks is None else masks.allowed(start, end, weight.shape[0])
            logits = _chunk_logits(h, weight, bias, temperature, allowed)
            g = None if grad_logprobs is None else grad_logprobs[start:end, None].float()
            # dlogp/dz = onehot(y) - p and dH/dz = -p * (z - sum(p * z)) (z: the tempered
            # logits), so dz = -p * (g_H * (z - sum(p * z)) + g) + onehot(y) * g, built in the
            # softmax's buffer. (Masked tokens: p = 0, so dz = 0 there.)
            grad_logits = torch.softmax(logits, dim=-1)
            q = grad_logits.clone() if grad_legal is not None and allowed is not None else None
            if grad_entropy is not None:
                _zero_masked(logits, allowed)
                logits -= torch.linalg.vecdot(grad_logits, logits)[:, None]
                logits.mul_(grad_entropy[start:end, None].float())
                if g is not None:
                    logits.add_(g)
                grad_logits.mul_(logits).neg_()
            elif g is not None:
                grad_logits.mul_(-g)
            else:
                grad_logits.zero_()
            del logits
            if g is not None:
                grad_logits.scatter_add_(-1, targets[start:end, None], g)
            if q is not None:
                # d(log of the allowed tokens' mass in the whole softmax)/dz = q - p (q: the
                # masked softmax, p: the whole vocabulary's)
                assert grad_legal is not None
                whole = torch.nn.functional.linear(h, weight, bias).float()
                whole = whole / temperature if temperature != 1.0 else whole
                q.sub_(torch.softmax(whole, dim=-1)).mul_(grad_legal[start:end, None].float())
                grad_logits.add_(q)
                del whole, q
            if temperature != 1.0:
                grad_logits.div_(temperature)
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += (grad_logits.t() @ h).float()
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0).float()
            del grad_logits
        return (grad_hidden,
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype),
                None, None, None, None, None)


def chunked_token_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                           temperature: float = 1.0, *, with_entropy: bool = True,
                           chunk: int | None = None, masks: TokenMasks | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(head(hidden) / temperature)`` at ``targets``, and the entropy of the same
    distribution, chunk by chunk.

    :param hidden: (N, H) the last hidden states of the positions that predict the targets.
    :param head: the output layer (a plain ``Linear``: its weight may be tied to the embeddings).
    :param targets: (N,) int64 token ids.
    :param temperature: the sampling temperature (> 0).
    :param with_entropy: False skips the entropy (a softmax per chunk): ``None``.
    :param chunk: tokens per chunk; ``None``: :func:`chunk_tokens` of the vocabulary.
    :param masks: per target, the tokens allowed where it was sampled under the legal-move
        mask: its logprob and entropy are then the masked distribution's.
    :returns: ``(logprobs, entropy)``, both (N,) float32, both with their gradient (to
        ``hidden``, and to the head if it trains): an entropy bonus differentiates the
        entropy exactly.
    """
    logprobs, entropy, _legal = chunked_token_scores(hidden, head, targets, temperature,
                                                     with_entropy=with_entropy, chunk=chunk,
                                                     masks=masks)
    return logprobs, entropy


def chunked_token_scores(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                         temperature: float = 1.0, *, with_entropy: bool = True,
                         chunk: int | None = None, masks: TokenMasks | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`chunked_token_logprobs`, and with ``masks`` the log of the mass the whole
    vocabulary's softmax gives the tokens that were allowed at each target (0 where every
    token was), with its exact gradient (``None`` without masks)."""
    if chunk is None:
        chunk = chunk_tokens(head.weight.shape[0])
    logprobs, entropy, legal = _ChunkedLogprobs.apply(hidden, head.weight, head.bias, targets,
                                                      float(temperature), int(chunk),
                                                      with_entropy, masks)
    return logprobs, entropy if with_entropy else None, legal if masks is not None else None


def is_plain_linear(module: object) -> bool:
    """True if ``module`` is exactly ``torch.nn.Linear`` (not a LoRA or quantized wrapper,
    whose weight alone is not the layer)."""
    return type(module) is torch.nn.Linear
