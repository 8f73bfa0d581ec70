"""Per-token log-probabilities of a causal LM, computed the way the inference engine reports them.

SGLang returns, by default, the logprob of each sampled token under the *temperature-scaled*
distribution ``log_softmax(logits / temperature)``, taken before top-p / top-k / min-p filtering.
We compute the same quantity in the trainer so that, on the same weights and tokens, trainer and
engine agree (fp32 on CPU: to about 1e-5; ARCHITECTURE.md invariant 5). For greedy decoding
(``temperature <= 1e-6``) the logits are used unscaled, as SGLang does.

Layout: sequences are right-padded, ``position_ids`` are passed explicitly (``cumsum(mask) - 1``,
so a padded row has the same positions as the unpadded one), and output position ``t`` holds the
logprob of token ``t + 1`` given tokens ``0..t``. Shapes: B = batch, T = padded sequence length,
V = vocabulary.

Not covered: packed (varlen) sequences, and vocab-parallel logits (megatron handles those).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["GREEDY_TEMPERATURE", "compute_token_logprobs", "compute_token_logprobs_and_entropy", "sample_logprobs"]

GREEDY_TEMPERATURE = 1e-6
"""Temperatures at or below this mean greedy decoding: logits are not scaled."""


def _scaled_logits(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float) -> Tensor:
    """[B, T-1, V] float32 next-token logits, divided by ``temperature`` unless greedy."""
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, T]"
        )
    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)  # [B, T]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    logits = out.logits[:, :-1, :].float()  # [B, T-1, V]
    if temperature > GREEDY_TEMPERATURE:
        logits = logits / temperature
    return logits


def _gather_targets(log_probs: Tensor, input_ids: Tensor, valid: Tensor) -> Tensor:
    """[B, T-1] logprob of each next token (``input_ids[:, 1:]``), zeroed where ``valid`` is 0."""
    return log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) * valid  # [B, T-1]


def compute_token_logprobs_and_entropy(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float, entropy_grad: bool = False
) -> tuple[Tensor, Tensor]:
    """Next-token logprobs (differentiable) and the entropy of each next-token distribution.

    Args:
        model: an HF causal LM (anything whose ``forward`` takes ``input_ids``, ``attention_mask``,
            ``position_ids``, ``use_cache`` and returns ``.logits`` [B, T, V]).
        input_ids: [B, T] int64, right-padded.
        attention_mask: [B, T] int, 1 = real token, 0 = padding (only on the right).
        temperature: sampling temperature of the rollout; <= 1e-6 = greedy (unscaled logits).
        entropy_grad: keep the entropy in the autograd graph (for an entropy bonus).

    Returns:
        logprobs: [B, T-1] float32, natural log; ``logprobs[b, t] = log p(input_ids[b, t+1] | ..t)``;
            0.0 where the target ``t + 1`` is padding. Carries gradient when grad is enabled.
        entropy: [B, T-1] float32, nats, of the temperature-scaled distribution; detached unless
            ``entropy_grad``; 0.0 where the target is padding.
    """
    log_probs = torch.log_softmax(_scaled_logits(model, input_ids, attention_mask, temperature), dim=-1)  # [B, T-1, V]
    valid = attention_mask[:, 1:].to(log_probs.dtype)  # [B, T-1]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1) * valid  # [B, T-1]
    return _gather_targets(log_probs, input_ids, valid), entropy


def compute_token_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float
) -> Tensor:
    """Next-token logprobs under ``log_softmax(logits / temperature)``, as SGLang returns them.

    Args:
        model: an HF causal LM.
        input_ids: [B, T] int64, right-padded.
        attention_mask: [B, T] int, 1 = real token, 0 = padding (only on the right).
        temperature: sampling temperature; <= 1e-6 = greedy (unscaled logits).

    Returns:
        [B, T-1] float32, natural log; position ``t`` is the logprob of token ``t + 1``; 0.0 where
        that token is padding. Differentiable when grad is enabled.

    Example (prompt of 3, response of 2, T = 5): output positions 2 and 3 hold the logprobs of
    the two response tokens; positions 0 and 1 are prompt tokens (the caller masks them out).
    """
    log_probs = torch.log_softmax(_scaled_logits(model, input_ids, attention_mask, temperature), dim=-1)  # [B, T-1, V]
    return _gather_targets(log_probs, input_ids, attention_mask[:, 1:].to(log_probs.dtype))


@torch.no_grad()
def sample_logprobs(
    model: nn.Module, prompt_ids: Sequence[int], response_ids: Sequence[int], temperature: float
) -> list[float]:
    """The logprob of each response token of one sequence, for parity checks against an engine.

    Args:
        model: an HF causal LM (on CPU, or wherever its parameters live).
        prompt_ids: [P] int, P >= 1.
        response_ids: [R] int.
        temperature: the rollout's sampling temperature; <= 1e-6 = greedy.

    Returns:
        [R] float, natural log, ``log p(response_ids[j] | prompt_ids, response_ids[:j])`` under the
        temperature-scaled distribution; the same quantity as ``Sample.rollout_logprobs``.

    Raises:
        ValueError: when ``prompt_ids`` is empty (the first response token has no context).
    """
    if len(prompt_ids) == 0:
        raise ValueError("sample_logprobs: prompt_ids is empty; the first response token needs a context")
    if len(response_ids) == 0:
        return []
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)  # [1, P+R]
    mask = torch.ones_like(ids)
    logprobs = compute_token_logprobs(model, ids, mask, temperature=temperature)  # [1, P+R-1]
    start = len(prompt_ids) - 1
    return logprobs[0, start : start + len(response_ids)].tolist()
