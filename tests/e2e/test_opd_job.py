"""The whole job with on-policy distillation, small: student and teacher embedded engines (subprocesses),
the teacher scoring over HTTP, the torch trainer on the reverse-KL advantage, disk weight sync."""

from __future__ import annotations

import json

import pytest

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.loop.driver import run_training
from tests.e2e.test_main_job import count_w7
from tests.fixtures.tiny_model import write_tiny_llama


@pytest.mark.parametrize("mode, teacher_is_student", [("april", False), ("sync", True)])
async def test_opd_job_scores_every_sample_and_reports_the_reverse_kl(tmp_path, mode, teacher_is_student):
    student = write_tiny_llama(tmp_path / "student", seed=0, with_tokenizer=True)
    teacher = (
        student
        if teacher_is_student
        else write_tiny_llama(tmp_path / "teacher", seed=4, hidden_size=48, with_tokenizer=True)
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(64)) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=4),
        rollout=RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=16, request_timeout_s=60),
        loop=LoopConfig(mode=mode, rollout_batch_size=2, over_sampling_batch_size=4, num_rollout=2, max_staleness=2),
        train=TrainConfig(lr=1e-3, global_batch_size=8, micro_batch_size=8, use_opd=True, opd_only=True),
        engine=EngineConfig(hf_checkpoint=str(student), startup_timeout_s=60, opd_teacher_load=str(teacher)),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=count_w7, progress=False)
    steps = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"
    ]
    assert len(steps) == 2 and all(r["failed_samples"] == 0 for r in steps)
    first = steps[0]  # on-policy: engine and trainer logprobs of the same weights agree (invariant 5)
    assert abs(first["opd/reverse_kl"] - first["train/opd_reverse_kl"]) < 1e-4
    if teacher_is_student:  # the teacher serves the student's own weights: nothing to distil
        assert abs(first["opd/reverse_kl"]) < 1e-4
    else:
        assert first["opd/reverse_kl"] > 0.05  # a different model
    assert summary["opd_reverse_kl_first_step"] == first["opd/reverse_kl"]
