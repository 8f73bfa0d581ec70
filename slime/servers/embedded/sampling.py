"""Sampling and logprobs for the embedded engine, and the one logprob function the trainer shares.

Which distribution a logprob comes from (SGLang's default, docs/sglang.md#generate-response):

    temperature >= 1e-6:  logprob = log_softmax(logits / temperature)[token]
    temperature <  1e-6:  logprob = log_softmax(logits)[token]      (greedy; SGLang rewrites it to top_k=1)

always *before* top-k / top-p / min-p truncation. ``token_logprobs`` is that formula; the trainer
imports it so both sides divide by the same temperature the same way.

Example (vocab 3, temperature 0.5)::

    logits = [2.0, 1.0, 0.0]  ->  logits / 0.5 = [4, 2, 0]  ->  log_softmax = [-0.1429, -2.1429, -4.1429]
    token_logprobs(torch.tensor([2.0, 1.0, 0.0]), torch.tensor(1), 0.5) == -2.1429

Sampling draws one float64 uniform per row from that request's own ``torch.Generator`` and inverts
a CDF, so a request's tokens depend only on its logits, its parameters and its generator, never on
which other requests share the batch. Without truncation the CDF runs in vocabulary order (no
sort); with truncation, in descending-probability order, following SGLang's torch sampler: sort
descending; drop tokens whose preceding cumulative mass exceeds ``top_p``; keep the
first ``top_k``; drop tokens below ``min_p`` x the top probability; the top token always survives.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

__all__ = ["GREEDY_EPS", "SamplingParams", "scaled_log_softmax", "token_logprobs", "sample_next", "seeded_generator"]

GREEDY_EPS = 1e-6
"""Temperatures below this are greedy (SGLang's threshold)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """The sampling knobs the embedded engine honours (a subset of SGLang's ``sampling_params``).

    Attributes:
        max_new_tokens: cap on output tokens; None = bounded only by the context length.
        temperature: >= 0; < 1e-6 means greedy.
        top_p: in (0, 1].
        top_k: >= 1, or -1 for the whole vocabulary.
        min_p: in [0, 1].
        stop_token_ids: extra stop tokens, on top of the model's EOS ids.
        stop: stop strings (need a tokenizer).
        ignore_eos: skip the token-stop check entirely (EOS and ``stop_token_ids``), as SGLang does.
        no_stop_trim: keep a matched stop string in ``text``.
        skip_special_tokens: drop special tokens when decoding ``text``.
    """

    max_new_tokens: int | None = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def scaled_log_softmax(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / t) in float32, with t = 1 wherever ``temperature`` < 1e-6 (greedy).

    Args:
        logits: [..., V] any float dtype.
        temperature: a float, or a tensor broadcastable to ``logits.shape[:-1]`` (one per row).

    Returns:
        [..., V] float32 natural-log probabilities.
    """
    logits = logits.float()
    t: torch.Tensor | float
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(device=logits.device, dtype=torch.float32)
        t = torch.where(t < GREEDY_EPS, torch.ones_like(t), t).unsqueeze(-1)
    else:
        t = float(temperature) if temperature >= GREEDY_EPS else 1.0
    return torch.log_softmax(logits / t, dim=-1)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """Logprob of ``token_ids`` under the temperature-scaled distribution (SGLang's default).

    Args:
        logits: [..., V] the logits that predicted each token (position i-1 for token i).
        token_ids: [...] int64, same leading shape as ``logits``.
        temperature: rollout temperature; a float or one per row. < 1e-6 = greedy = unscaled.

    Returns:
        [...] float32 natural log.

    Example: for a response ``r`` after prompt ``p`` and full-sequence logits ``z`` [T, V],
    ``token_logprobs(z[len(p) - 1 : -1], torch.tensor(r), 1.0)`` gives the engine's logprobs.
    """
    logp = scaled_log_softmax(logits, temperature)
    return logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)


def seeded_generator(seed: int, key: str) -> torch.Generator:
    """A CPU generator seeded from (``seed``, ``key``) via SHA-256, stable across runs and platforms."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def sample_next(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return it with its logprob.

    Args:
        logits: [B, V] next-token logits, one row per request.
        params: [B] each row's sampling parameters.
        generators: [B] each row's generator; one uniform is drawn per non-greedy row.

    Returns:
        (token_ids [B] int64, logprobs [B] float32), logprobs as in ``token_logprobs``.
    """
    vocab = logits.shape[-1]
    temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    logp = scaled_log_softmax(logits, temps)  # [B, V]
    token_ids = logits.argmax(dim=-1)  # greedy rows keep this
    plain = [i for i, p in enumerate(params) if not p.is_greedy and not _truncates(p, vocab)]
    truncated = [i for i, p in enumerate(params) if not p.is_greedy and _truncates(p, vocab)]
    if plain:  # inverse CDF in vocabulary order: no sort needed
        rows = torch.tensor(plain)
        cdf = logp[rows].exp().double().cumsum(dim=-1)  # [S, V]
        token_ids[rows] = _invert(cdf, _uniforms(generators, plain), vocab)
    if truncated:
        rows = torch.tensor(truncated)
        sub = [params[i] for i in truncated]
        top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in sub])[:, None]
        top_p = torch.tensor([p.top_p for p in sub], dtype=torch.float32)[:, None]
        min_p = torch.tensor([p.min_p for p in sub], dtype=torch.float32)[:, None]
        probs_sorted, order = logp[rows].exp().sort(dim=-1, descending=True)  # [S, V]
        before = probs_sorted.cumsum(dim=-1) - probs_sorted
        keep = (before <= top_p) & (torch.arange(vocab)[None, :] < top_k)
        keep &= probs_sorted >= min_p * probs_sorted[:, :1]
        keep[:, 0] = True
        cdf = (probs_sorted * keep).double().cumsum(dim=-1)  # [S, V]
        pick = _invert(cdf, _uniforms(generators, truncated), vocab)
        token_ids[rows] = order.gather(-1, pick[:, None]).squeeze(-1)
    return token_ids, logp.gather(-1, token_ids[:, None]).squeeze(-1)


def _truncates(p: SamplingParams, vocab: int) -> bool:
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def _uniforms(generators: list[torch.Generator], rows: list[int]) -> torch.Tensor:
    """[S] float64 in [0, 1), one draw from each row's own generator."""
    return torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64) for i in rows])


def _invert(cdf: torch.Tensor, uniform: torch.Tensor, vocab: int) -> torch.Tensor:
    """Index of the first CDF entry above ``uniform`` x total mass. cdf: [S, V] float64 -> [S] int64."""
    return torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).squeeze(-1).clamp_(max=vocab - 1)
