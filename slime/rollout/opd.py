"""On-policy distillation (OPD): a teacher engine scores the student's sampled tokens.

The student samples as usual; once a sample is finished (never a partial one, so aborts, resumes
and weight updates cannot misalign it) the teacher, an engine serving a larger checkpoint, scores
its response in one prefill-only request over the SGLang protocol (docs/sglang.md#generate-request, #generate-response)::

    POST /generate {"input_ids": prompt_ids + response_ids, "return_logprob": true,
                    "logprob_start_len": len(prompt_ids) - 1,
                    "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}
    -> meta_info.input_token_logprobs = [[null, prompt_ids[-1], _], [lp_0, response_ids[0], _], ...]

SGLang's first input entry is always ``null`` (the logits that would score it are not kept), so we
start one position early, at the last prompt token, and drop that entry: the remaining entries are
exactly the response tokens, checked token by token. (THUDM/slime's ``--opd-type sglang`` asks from
position 0 and keeps the last ``len(response_ids)`` entries; starting at ``P - 1`` scores the same
tokens without returning the prompt's.) ``temperature`` 1.0 makes the teacher's logprobs its own
distribution whatever the engine does with temperature on input logprobs.

The result is ``Sample.teacher_logprobs`` ([num_response_tokens] float32, natural log), aligned with
``response_ids``; the trainer turns it into the per-token reverse-KL advantage
(``slime.train.objective``). Tool-output tokens (loss_mask 0) are scored too but carry no signal.

Failures are data, not zeros: a teacher that cannot be reached after the pool's retries, times out
(``--request-timeout-s``), refuses the request, or answers with the wrong tokens, a wrong count or a
non-finite logprob marks the sample ``Status.FAILED`` with ``evidence["teacher_error"]`` (type,
message, elapsed seconds), so it is never trained on; the scheduler counts it in ``failed_samples``.

Sources: Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD, arXiv 2306.13649); Thinking Machines Lab 2025, "On-Policy
Distillation" (per-token reverse KL as the advantage). Not covered: a teacher with another
tokenizer (ids are sent as they are), top-k / full-distribution KL (only the sampled token's).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from slime.engines.interface import GeneratePool
from slime.engines.protocol import GenerateResult
from slime.errors import ConfigError, EngineError
from slime.rollout.generate import request_id
from slime.types import Sample, Status

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["TeacherScorer", "TeacherError", "TEACHER_SAMPLING_PARAMS", "check_same_vocab"]

log = logging.getLogger(__name__)

TEACHER_SAMPLING_PARAMS = {"max_new_tokens": 0, "temperature": 1.0}
"""Prefill only: nothing is generated; logprobs of the teacher's own (temperature-1) distribution."""


class TeacherError(Exception):
    """The teacher answered, but not with one finite logprob per response token."""


class TeacherScorer:
    """Scores finished samples with a teacher pool; see the module docstring.

    Args:
        pool: a ``GeneratePool`` of teacher engines (``slime.engines.interface``); an ``HttpEnginePool``'s
            retries, breakers and ``request_timeout_s`` bound every call.

    Attributes:
        num_scored / num_failed: samples scored, and marked FAILED by a teacher failure.
    """

    def __init__(self, pool: GeneratePool):
        self.pool = pool
        self.num_scored = 0
        self.num_failed = 0

    async def score(self, sample: Sample) -> None:
        """Set ``sample.teacher_logprobs``, or mark the sample FAILED with evidence.

        Args:
            sample: a finished, not FAILED sample with at least one prompt token; left untouched
                when it has no response tokens (``teacher_logprobs = []``).

        Raises:
            ValueError: ``sample`` is not finished, or already FAILED (a bug in the caller).
        """
        if not sample.status.is_finished or sample.status is Status.FAILED:
            raise ValueError(
                f"TeacherScorer.score: group {sample.group_id} sample {sample.index} has status "
                f"{sample.status.value}; only finished, non-failed samples are scored"
            )
        if not sample.response_ids:
            sample.set_teacher_logprobs([])
            self.num_scored += 1
            return
        t0 = time.monotonic()
        start = len(sample.prompt_ids) - 1
        try:
            result = await self.pool.generate(
                sample.prompt_ids + sample.response_ids,
                TEACHER_SAMPLING_PARAMS,
                rid="teacher-" + request_id(sample),
                logprob_start_len=start,
                return_logprob=True,
            )
            logprobs = _response_logprobs(result, sample)
        except (EngineError, TeacherError) as exc:
            self._fail(sample, exc, time.monotonic() - t0)
            return
        sample.set_teacher_logprobs(logprobs)
        self.num_scored += 1

    def _fail(self, sample: Sample, exc: BaseException, elapsed_s: float) -> None:
        self.num_failed += 1
        sample.status = Status.FAILED
        where = f"group {sample.group_id} sample {sample.index}"
        log.warning(
            "teacher scoring failed for %s after %.2fs, sample marked FAILED: %s: %s",
            where,
            elapsed_s,
            type(exc).__name__,
            exc,
        )
        sample.evidence["teacher_error"] = {
            "where": where,
            "type": type(exc).__name__,
            "message": str(exc) or repr(exc),
            "elapsed_s": round(elapsed_s, 4),
        }


def check_same_vocab(
    student: PreTrainedTokenizerBase,
    teacher: PreTrainedTokenizerBase,
    *,
    student_name: str = "student",
    teacher_name: str = "teacher",
) -> None:
    """Refuse a teacher whose tokenizer maps tokens to other ids than the student's.

    The teacher scores the student's token ids as they are, so both must share one vocabulary (the
    same token -> id map); otherwise every teacher logprob is of some other token and the reverse KL
    is noise that still trains. Args are HF tokenizers.

    Raises:
        ConfigError: naming both directories and the first difference.
    """
    a, b = student.get_vocab(), teacher.get_vocab()
    if a == b:
        return
    if len(a) != len(b):
        diff = f"{len(a)} tokens against {len(b)}"
    else:
        tok = next(t for t in sorted(a) if a[t] != b.get(t))
        diff = f"token {tok!r} is id {a[tok]} for the student and {b.get(tok)} for the teacher"
    raise ConfigError(
        f"--opd-teacher-load={teacher_name!r}: its tokenizer differs from the student's ({student_name!r}): {diff}; "
        "on-policy distillation scores the student's token ids, so both need the same vocabulary"
    )


def _response_logprobs(result: GenerateResult, sample: Sample) -> list[float]:
    """The response tokens' logprobs out of a teacher reply asked from ``len(prompt_ids) - 1``.

    Raises:
        TeacherError: an aborted reply, entries that are not ``[prompt_ids[-1]] + response_ids``,
            or a non-finite logprob among the response entries.
    """
    if result.aborted:
        raise TeacherError(f"teacher request aborted: {result.finish_reason.message!r}")
    want = [sample.prompt_ids[-1], *sample.response_ids]
    got = list(result.input_token_ids)
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise TeacherError(
            f"teacher input_token_logprobs cover {len(got)} tokens, expected {len(want)} "
            f"(last prompt token + response); first difference at entry {first}"
        )
    values = list(result.input_logprobs[1:])
    bad = next((i for i, x in enumerate(values) if not math.isfinite(x)), None)
    if bad is not None:
        raise TeacherError(
            f"teacher logprob of response token {bad} (id {sample.response_ids[bad]}) is {values[bad]} (null or non-finite)"
        )
    return values
