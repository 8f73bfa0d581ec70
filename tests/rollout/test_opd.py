"""slime/rollout/opd.py: the teacher request, alignment of teacher_logprobs, and failures as data."""

from __future__ import annotations

import math
import re

import pytest

from slime.engines.protocol import FinishReason, GenerateResult
from slime.errors import EngineTimeout, EngineUnavailable
from slime.rollout.opd import TEACHER_SAMPLING_PARAMS, TeacherScorer
from slime.types import Sample, Status


def teacher_lp(context: list[int], token: int) -> float:
    """The fake teacher's logprob of ``token`` after ``context``: depends on both, never 0."""
    return -0.01 * (1 + (sum(context) * 7 + token) % 97)


class FakeTeacherPool:
    """Answers like SGLang: entries for the input from ``logprob_start_len`` on, the first one null."""

    kv_cache_version = None

    def __init__(self, *, error: Exception | None = None, tamper=None):
        self.calls: list[dict] = []
        self.error, self.tamper = error, tamper

    async def generate(
        self, input_ids, sampling_params, *, rid=None, return_logprob=True, logprob_start_len=None, sticky_key=None
    ):
        self.calls.append(
            dict(
                input_ids=list(input_ids),
                sampling_params=dict(sampling_params),
                rid=rid,
                logprob_start_len=logprob_start_len,
            )
        )
        if self.error is not None:
            raise self.error
        ids = list(input_ids[logprob_start_len:])
        lps = [math.nan] + [teacher_lp(input_ids[: logprob_start_len + j], ids[j]) for j in range(1, len(ids))]
        if self.tamper is not None:
            ids, lps = self.tamper(ids, lps)
        return GenerateResult(
            output_ids=[],
            output_logprobs=[],
            finish_reason=FinishReason(type="length", length=0),
            input_token_ids=ids,
            input_logprobs=lps,
            rid=rid or "",
        )


def resumed_sample() -> Sample:
    """Aborted after 3 tokens under version 4, resumed and finished under version 5; a tool token in between."""
    s = Sample(prompt_ids=[1, 7, 9], group_id=3, index=1)
    s.append([11, 12, 13], [-0.1, -0.5, -0.2], policy_version=4)
    s.status, s.num_aborts = Status.PARTIAL, 1
    s.append([40], [0.0], policy_version=4, trainable=False)
    s.append([14, 2], [-0.3, -0.01], policy_version=5)
    s.status, s.num_resumes = Status.COMPLETED, 1
    return s


async def test_teacher_scores_the_whole_resumed_response_once_aligned_with_response_ids():
    pool, s = FakeTeacherPool(), resumed_sample()
    await TeacherScorer(pool).score(s)
    (call,) = pool.calls
    assert call["input_ids"] == [1, 7, 9, 11, 12, 13, 40, 14, 2]
    assert call["logprob_start_len"] == 2  # the last prompt token: SGLang's first entry is null
    assert call["sampling_params"] == TEACHER_SAMPLING_PARAMS == {"max_new_tokens": 0, "temperature": 1.0}
    full = s.prompt_ids + s.response_ids
    want = [teacher_lp(full[: 3 + i], tok) for i, tok in enumerate(s.response_ids)]
    assert s.teacher_logprobs == want and len(s.teacher_logprobs) == len(s.response_ids) == 6
    assert s.status is Status.COMPLETED
    s.check_aligned()
    with pytest.raises(ValueError, match="cannot grow"):
        s.append([5], [-0.1], policy_version=5)


@pytest.mark.parametrize(
    "error, tamper, match",
    [
        (EngineUnavailable("gave up after 4 attempts", url="http://t:1", endpoint="/generate"), None, "gave up"),
        (EngineTimeout("no reply in 300s", url="http://t:1", endpoint="/generate"), None, "300s"),
        (None, lambda ids, lps: (ids[:-1], lps[:-1]), "cover 6 tokens, expected 7"),
        (None, lambda ids, lps: (ids[:3] + [99] + ids[4:], lps), "first difference at entry 3"),
        (None, lambda ids, lps: (ids, lps[:2] + [math.nan] + lps[3:]), r"response token 1 \(id 12\) is nan"),
    ],
    ids=["unreachable", "timeout", "short", "wrong-token", "null-logprob"],
)
async def test_a_teacher_failure_marks_the_sample_failed_with_evidence_never_zeros(error, tamper, match):
    scorer, s = TeacherScorer(FakeTeacherPool(error=error, tamper=tamper)), resumed_sample()
    await scorer.score(s)
    assert s.status is Status.FAILED and s.teacher_logprobs is None
    assert s.evidence["teacher_error"]["where"] == "group 3 sample 1"
    assert 0 <= s.evidence["teacher_error"]["elapsed_s"] < 5
    assert re.search(match, s.evidence["teacher_error"]["message"])
    assert scorer.num_failed == 1 and scorer.num_scored == 0


async def test_only_finished_samples_are_scored():
    s = resumed_sample()
    s.status = Status.PARTIAL
    with pytest.raises(ValueError, match="status partial"):
        await TeacherScorer(FakeTeacherPool()).score(s)


async def test_an_empty_response_gets_empty_teacher_logprobs_without_a_call():
    pool, s = FakeTeacherPool(), Sample(prompt_ids=[1, 2], status=Status.TRUNCATED)
    await TeacherScorer(pool).score(s)
    assert s.teacher_logprobs == [] and pool.calls == []


def test_a_teacher_with_another_vocabulary_is_refused_naming_the_difference():
    from pathlib import Path

    from transformers import AutoTokenizer

    import slime.data
    from slime.errors import ConfigError
    from slime.rollout.opd import check_same_vocab

    assets = Path(slime.data.__file__).parent / "assets"
    arith = AutoTokenizer.from_pretrained(assets / "arith-warmstart")
    teacher = AutoTokenizer.from_pretrained(assets / "arith-opd-teacher")
    check_same_vocab(arith, teacher)  # the shipped demo pair shares one vocabulary
    calc = AutoTokenizer.from_pretrained(assets / "calc-warmstart")
    with pytest.raises(
        ConfigError, match=r"--opd-teacher-load='calc'.*differs from the student's \('arith'\): 18 tokens against 104"
    ):
        check_same_vocab(arith, calc, student_name="arith", teacher_name="calc")


@pytest.mark.parametrize(
    "extra, words",
    [
        ([], "--use-opd needs a teacher"),
        (["--opd-teacher-addrs", "127.0.0.1:9", "--opd-only", "--opd-kl-coef", "0"], "nothing would train"),
    ],
)
def test_opd_flag_combinations_that_cannot_work_are_refused_before_anything_starts(extra, words):
    from slime.cli.args import build_parser, config_from_args
    from slime.errors import ConfigError

    with pytest.raises(
        ConfigError, match=words
    ):  # the section's own checks (config_from_args), or those across sections
        config_from_args(build_parser().parse_args(["--use-opd", *extra])).check_run_modes()
