"""The built-in synthetic task for the CPU demo: multi-term addition with a short worked solution.

A problem sums 2 to 4 numbers of 1 to 3 digits. The prompt is the sum followed by ``=``; the
solution adds the terms left to right, one step per ``;``, and ends with ``#`` and the answer::

    prompt    "47+385+9="
    solution  "47+385=432;432+9=441;#441"      (then <eos>)
    label     "441"

A direct answer (``"#441"``) is also well formed: the reward checks only the final answer, by exact
string match against the label, and never the scratchpad. The demo's warm start
(``scripts/make_warmstart.py``) is fine-tuned on a mix of both styles; direct answers are rarely
right beyond the smallest sums, so RL has an easy, real thing to learn (work it out) before it
improves the arithmetic itself. Responses run from 2 characters (``"#7"``) to 46 (four 3-digit
terms, worked), plus ``<eos>``, so a batch of rollouts finishes at very different times, which
partial rollouts need.

Train/eval split: every prompt string belongs to exactly one split, fixed by a hash of the prompt
(``split_of``: sha256, 1 in 10 prompts is "eval"). ``generate_dataset`` draws from a random stream
seeded by ``(split, seed)`` and keeps only prompts of the requested split, so train and eval sets
are disjoint for any seeds, and the same ``(n, seed, split)`` always gives the same rows.

Also here: ``evaluate_hf_model``, a small batched sampler over a Hugging Face causal LM used by
``scripts/make_warmstart.py`` to measure the warm start. The RL run evaluates through the
inference engine instead.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from slime.data.split_stream import split_stream
from slime.stop import raise_if_stopped
from slime.types import JsonObject

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from slime.types import Sample

__all__ = [
    "MIN_TERMS",
    "MAX_TERMS",
    "MAX_DIGITS",
    "EVAL_FRACTION",
    "make_problem",
    "split_of",
    "iter_problems",
    "generate_dataset",
    "write_jsonl",
    "read_jsonl",
    "extract_answer",
    "score",
    "reward",
    "hf_generate",
    "sample_hf_model",
    "score_hf_model",
    "evaluate_hf_model",
]

MIN_TERMS = 2
MAX_TERMS = 4
MAX_DIGITS = 3
EVAL_FRACTION = 10
"""One prompt in ``EVAL_FRACTION`` (by hash) belongs to the eval split."""

MAX_RESPONSE_CHARS = 46
"""Longest solution: three steps of ``ddd+ddd=dddd;`` style plus ``#dddd``; <eos> comes on top."""

_ANSWER_RE = re.compile(r"[^#]*#(\d+)")
_TRAILING_SPECIALS_RE = re.compile(r"(?:<eos>|<pad>|\s)+$")


def _draw_number(rng: random.Random, max_digits: int) -> int:
    num_digits = rng.randint(1, max_digits)
    low = 0 if num_digits == 1 else 10 ** (num_digits - 1)
    return rng.randint(low, 10**num_digits - 1)


def make_problem(
    rng: random.Random, *, max_terms: int = MAX_TERMS, max_digits: int = MAX_DIGITS
) -> tuple[str, str, str]:
    """Draw one problem.

    The number of terms is uniform in ``[MIN_TERMS, max_terms]``; each term first draws its digit
    count uniformly in ``[1, max_digits]``, then a value with that many digits (1-digit terms
    include 0).

    Returns:
        ``(prompt, label, solution)``, e.g. ``("47+385+9=", "441", "47+385=432;432+9=441;#441")``.
    """
    num_terms = rng.randint(MIN_TERMS, max_terms)
    terms = [_draw_number(rng, max_digits) for _ in range(num_terms)]
    steps = []
    total = terms[0]
    for term in terms[1:]:
        steps.append(f"{total}+{term}={total + term};")
        total += term
    prompt = "+".join(str(t) for t in terms) + "="
    label = str(total)
    return prompt, label, "".join(steps) + f"#{label}"


def split_of(prompt: str) -> str:
    """The split ("train" or "eval") that owns ``prompt``; fixed by sha256 of the prompt text."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") % EVAL_FRACTION
    return "eval" if bucket == 0 else "train"


def iter_problems(seed: int, split: str, **kwargs: int) -> Iterable[tuple[str, str, str]]:
    """Endless stream of ``make_problem`` results that belong to ``split``, seeded by ``(split, seed)``."""
    return split_stream("arith", make_problem, split_of, seed, split, **kwargs)


def generate_dataset(n: int, seed: int, split: str, **kwargs: int) -> list[dict[str, str]]:
    """``n`` rows ``{"prompt": str, "label": str}`` of ``split``; deterministic in ``(n, seed, split)``.

    Train and eval rows never share a prompt (see the module docstring). Duplicates within one
    split can occur for the small problems, as they would in the task distribution.

    Args:
        n: number of rows.
        seed: stream seed; a larger ``n`` with the same seed extends the smaller list.
        split: "train" or "eval".
        **kwargs: passed to ``make_problem`` (``max_terms``, ``max_digits``).

    Raises:
        ValueError: for an unknown split.
    """
    rows: list[dict[str, str]] = []
    for prompt, label, _ in iter_problems(seed, split, **kwargs):
        if len(rows) == n:
            break
        rows.append({"prompt": prompt, "label": label})
        if len(rows) % 1024 == 0:
            raise_if_stopped(f"building {len(rows)} of {n} rows of the built-in task")
    return rows


def write_jsonl(rows: Iterable[JsonObject], path: str | Path) -> None:
    """Write one JSON object per line (parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: str | Path) -> list[JsonObject]:
    """Read rows written by ``write_jsonl`` (blank lines are skipped)."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def extract_answer(response_text: str) -> str | None:
    """The final answer of a response, or None when it is malformed.

    Well formed: exactly one ``#``, followed by digits that end the response. Trailing
    ``<eos>``/``<pad>`` strings and whitespace are ignored, so text decoded with or without
    ``skip_special_tokens`` scores the same. A response that runs on past its answer (no EOS,
    truncated) or hedges with several ``#`` answers is malformed.

    Example: ``"47+385=432;432+9=441;#441<eos>" -> "441"``; ``"#44;#441" -> None``.
    """
    text = _TRAILING_SPECIALS_RE.sub("", response_text)
    match = _ANSWER_RE.fullmatch(text)
    return match.group(1) if match else None


def score(response_text: str, label: str) -> float:
    """1.0 when the extracted answer equals ``label`` exactly (no leading zeros), else 0.0."""
    answer = extract_answer(response_text)
    return 1.0 if answer is not None and answer == str(label).strip() else 0.0


async def reward(sample: Sample) -> float:
    """The task's reward function (``slime.types.RewardFn``): ``score(sample.response, sample.label)``.

    Also records ``{"extracted_answer", "label"}`` in ``sample.evidence["arith"]``.

    Raises:
        ValueError: when the sample has no label (a dataset bug, not a wrong answer).
    """
    if sample.label is None:
        raise ValueError(f"Sample(group={sample.group_id}, index={sample.index}) has no label")
    answer = extract_answer(sample.response)
    sample.evidence["arith"] = {"extracted_answer": answer, "label": sample.label}
    return 1.0 if answer is not None and answer == sample.label.strip() else 0.0


reward.needs_label = True  # type: ignore[attr-defined]  # a function attribute; it reads Sample.label: prompt rows without one are refused at load (slime.types.RewardFn)


# ---------------------------------------------------------------------------------------------
# Measuring a Hugging Face model on the task (used by scripts/make_warmstart.py).
# ---------------------------------------------------------------------------------------------


def hf_generate(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = MAX_RESPONSE_CHARS + 2,
    batch_size: int = 256,
    generator: torch.Generator | None = None,
) -> list[str]:
    """Generate one response per prompt with a KV cache, left padding, and plain sampling.

    ``temperature == 0`` is greedy; otherwise tokens are drawn from ``softmax(logits / T)`` with
    no top-k/top-p, the same distribution the engine samples at that temperature.

    Returns:
        Response texts, cut at the first ``<eos>`` (which is not included).
    """
    import torch

    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    responses: list[str] = []
    try:
        with torch.no_grad():
            for start in range(0, len(prompts), batch_size):
                chunk = [tokenizer(p)["input_ids"] for p in prompts[start : start + batch_size]]
                responses.extend(
                    cast(str, tokenizer.decode(ids, skip_special_tokens=True))  # one id list decodes to one str
                    for ids in _generate_batch(model, chunk, eos_id, pad_id, temperature, max_new_tokens, generator)
                )
    finally:
        model.train(was_training)
    return responses


def _generate_batch(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    eos_id: int,
    pad_id: int,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
) -> list[list[int]]:
    import torch

    from slime.hf_compat import CACHE_KWARG, output_cache

    batch_size = len(prompt_ids)
    max_len = max(len(p) for p in prompt_ids)
    input_ids = torch.full((batch_size, max_len), pad_id, dtype=torch.long)  # [B, P], left padded
    attention_mask = torch.zeros((batch_size, max_len), dtype=torch.long)  # [B, P]
    for i, ids in enumerate(prompt_ids):
        input_ids[i, max_len - len(ids) :] = torch.tensor(ids)
        attention_mask[i, max_len - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]

    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
    cache, logits = output_cache(out), out.logits[:, -1].float()  # logits: [B, V]
    next_pos = position_ids[:, -1] + 1  # [B]
    finished = torch.zeros(batch_size, dtype=torch.bool)
    generated: list[list[int]] = [[] for _ in range(batch_size)]
    for _ in range(max_new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [B]
        else:
            tokens = logits.argmax(-1)  # [B]
        tokens = torch.where(finished, torch.full_like(tokens, pad_id), tokens)
        for i in torch.nonzero(~finished).flatten().tolist():
            if tokens[i].item() != eos_id:
                generated[i].append(int(tokens[i]))
        finished |= tokens == eos_id
        if bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones((batch_size, 1), dtype=torch.long)], dim=1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=next_pos[:, None],
            **{CACHE_KWARG: cache},
            use_cache=True,
        )
        cache, logits = output_cache(out), out.logits[:, -1].float()
        next_pos = next_pos + 1
    return generated


def sample_hf_model(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[JsonObject],
    *,
    num_samples: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    max_new_tokens: int = MAX_RESPONSE_CHARS + 2,
    batch_size: int = 256,
) -> list[list[str]]:
    """Responses ``[len(rows)][num_samples]`` for each row's prompt (see ``hf_generate``)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    prompts = [row["prompt"] for row in rows for _ in range(num_samples)]
    flat = hf_generate(
        model,
        tokenizer,
        prompts,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        generator=generator,
    )
    return [flat[i * num_samples : (i + 1) * num_samples] for i in range(len(rows))]


def score_hf_model(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, rows: list[JsonObject], **kwargs: Any
) -> list[list[float]]:
    """Scores ``[len(rows)][num_samples]`` (1.0/0.0); keyword arguments as in ``sample_hf_model``."""
    responses = sample_hf_model(model, tokenizer, rows, **kwargs)
    return [[score(text, row["label"]) for text in texts] for texts, row in zip(responses, rows)]


def evaluate_hf_model(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[JsonObject],
    temperature: float = 0.0,
    *,
    num_samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = MAX_RESPONSE_CHARS + 2,
    batch_size: int = 256,
) -> float:
    """Mean accuracy of ``model`` on ``rows`` (greedy when ``temperature == 0``), in [0, 1]."""
    scores = score_hf_model(
        model,
        tokenizer,
        rows,
        num_samples=num_samples,
        temperature=temperature,
        seed=seed,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    total = sum(len(s) for s in scores)
    return sum(sum(s) for s in scores) / total if total else 0.0
