"""On-policy distillation over real HTTP: a student engine samples, a teacher engine (another checkpoint)
scores the samples through our pool; the teacher logprobs equal a direct HF forward of the teacher."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.rollout.generate import generate
from slime.rollout.opd import TeacherScorer
from slime.servers.embedded import EngineServer
from slime.train.logprobs import sample_logprobs
from slime.types import Sample, Status
from tests.fixtures.tiny_model import write_tiny_llama

torch.set_num_threads(1)
PROMPTS = [[0, 5, 9, 17, 3], [0, 44], [0, 8, 6, 4, 2, 33, 31]]
CONFIG = RolloutConfig(request_timeout_s=30, max_retries=1, retry_backoff_s=0.01)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd")
    return write_tiny_llama(root / "student", seed=0), write_tiny_llama(root / "teacher", seed=5, hidden_size=48)


async def test_teacher_engine_scores_student_samples_like_an_hf_forward(dirs):
    student_dir, teacher_dir = dirs
    async with (
        EngineServer(student_dir, port=0, seed=0, weight_version="0") as student,
        EngineServer(teacher_dir, port=0, seed=1) as teacher,
    ):
        async with (
            HttpEnginePool([student.url], config=CONFIG) as student_pool,
            HttpEnginePool([teacher.url], config=CONFIG) as teacher_pool,
        ):
            samples = [Sample(prompt_ids=p, group_id=0, index=i) for i, p in enumerate(PROMPTS)]
            await asyncio.gather(
                *(
                    generate(s, {"temperature": 1.0}, pool=student_pool, max_response_len=12, engine_version=0)
                    for s in samples
                )
            )
            scorer = TeacherScorer(teacher_pool)
            await asyncio.gather(*(scorer.score(s) for s in samples))  # concurrent: one batched prefill on the teacher
    hf_teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.response_ids
        want = sample_logprobs(hf_teacher, s.prompt_ids, s.response_ids, 1.0)
        assert len(s.teacher_logprobs) == len(s.response_ids)
        assert max(abs(a - b) for a, b in zip(s.teacher_logprobs, want)) <= 1e-5
        # a different model: the student's own logprobs are not the teacher's
        assert max(abs(a - b) for a, b in zip(s.teacher_logprobs, s.rollout_logprobs)) > 1e-2
    assert scorer.num_scored == len(PROMPTS) and scorer.num_failed == 0


async def test_an_unreachable_teacher_fails_the_sample_after_bounded_retries():
    s = Sample(prompt_ids=[0, 5], status=Status.COMPLETED)
    s.append([7, 1], [-0.5, -0.1], policy_version=0)
    async with HttpEnginePool(
        ["http://127.0.0.1:9"], config=RolloutConfig(request_timeout_s=2, max_retries=1, retry_backoff_s=0.01)
    ) as pool:
        async with asyncio.timeout(10):
            await TeacherScorer(pool).score(s)
    assert s.status is Status.FAILED and s.teacher_logprobs is None
    assert (
        s.evidence["teacher_error"]["type"] == "EngineUnavailable"
        and "127.0.0.1:9" in s.evidence["teacher_error"]["message"]
    )
