import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slime.config import TrainConfig
from slime.train.batch import build_train_batch
from slime.train.logprobs import compute_token_logprobs, sample_logprobs
from slime.train.losses import policy_loss
from slime.train.torch_backend import TorchTrainer
from slime.types import Group, Sample, Status

PROMPT = [5, 9, 2]
RESPONSES = [[17, 8, 41, 3], [30, 31, 32, 33], [40, 41, 42], [50, 51]]


def _groups(rewards=(1.0, 0.0, 0.0, 0.0), statuses=None):
    samples = []
    for i, (resp, r) in enumerate(zip(RESPONSES, rewards)):
        s = Sample(prompt_ids=list(PROMPT), index=i, reward=r, status=(statuses or {}).get(i, Status.COMPLETED))
        s.append(resp, [-1.0] * len(resp), policy_version=0)
        samples.append(s)
    return [Group(group_id=0, samples=samples)]


def _config(**kw):
    base = dict(lr=3e-3, global_batch_size=4, micro_batch_size=2, rollout_temperature=0.8, num_threads=1, seed=0)
    return TrainConfig(**{**base, **kw})


def _response_logprob(trainer, i):
    return sum(sample_logprobs(trainer.model, PROMPT, RESPONSES[i], trainer.config.rollout_temperature))


def test_repeated_steps_raise_the_rewarded_sample_and_lower_the_surrogate_loss(tiny_model_dir):
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir)
    groups = _groups()
    batch = build_train_batch(groups, pad_token_id=0, current_version=0)
    with torch.no_grad():
        logp0 = compute_token_logprobs(trainer.model, batch.input_ids, batch.attention_mask, temperature=0.8)
    before = [_response_logprob(trainer, i) for i in range(4)]
    surrogate = []
    for step in range(4):
        metrics = trainer.train_step(groups)
        assert metrics["policy_version"] == step + 1 and metrics["num_optimizer_steps"] == 1
        with torch.no_grad():
            logp = compute_token_logprobs(trainer.model, batch.input_ids, batch.attention_mask, temperature=0.8)
        # the unclipped surrogate against the initial policy: it must keep going down
        surrogate.append(policy_loss(logp, logp0, batch.advantages, batch.loss_mask, eps_clip=100.0)[0].item())
    after = [_response_logprob(trainer, i) for i in range(4)]
    assert surrogate == sorted(surrogate, reverse=True) and surrogate[-1] < surrogate[0] < 0
    assert after[0] > before[0] + 0.1
    assert all(a < b for a, b in zip(after[1:], before[1:]))


def test_first_optimizer_step_is_on_policy_and_metrics_are_reported(tiny_model_dir):
    trainer = TorchTrainer(_config(use_tis=True), model_dir=tiny_model_dir)
    m = trainer.train_step(_groups())
    assert m["pg_clipfrac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-7)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["num_samples"] == 4 and m["num_train_tokens"] == 13
    assert m["reward_mean"] == 0.25 and m["grad_norm"] > 0 and m["train_time_s"] > 0
    assert m["train_rollout_logprob_abs_diff"] > 0 and 0 <= m["tis_clipfrac"] <= 1
    assert all(isinstance(v, float) for v in m.values())


def test_micro_batch_size_does_not_change_loss_or_gradient(tiny_model_dir):
    results = [TorchTrainer(_config(micro_batch_size=mbs), model_dir=tiny_model_dir).train_step(_groups()) for mbs in (1, 4)]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)
    assert results[0]["grad_norm"] == pytest.approx(results[1]["grad_norm"], rel=1e-5)


def test_global_batch_size_splits_the_rollout_into_optimizer_steps(tiny_model_dir):
    m = TorchTrainer(_config(global_batch_size=2, micro_batch_size=1), model_dir=tiny_model_dir).train_step(_groups())
    assert m["num_optimizer_steps"] == 2


def test_failed_samples_do_not_train(tiny_model_dir):
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir)
    before = {k: v.clone() for k, v in trainer.state_dict_for_sync().items()}
    groups = _groups(rewards=(None, None, None, None), statuses={i: Status.FAILED for i in range(4)})
    m = trainer.train_step(groups)
    assert m["num_train_tokens"] == 0 and m["num_optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.state_dict_for_sync().items())


def test_save_hf_round_trip_loads_equal_weights_and_copies_tokenizer_files(tiny_model_dir, tmp_path):
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir)
    trainer.train_step(_groups())
    out = tmp_path / "weights" / "v1"
    for _ in range(2):  # the second save replaces the first in place
        assert trainer.save_hf(str(out)) == str(out)
    assert sorted(os.listdir(tmp_path / "weights")) == ["v1"]  # no temporary directories left
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(os.listdir(out))
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    on_disk = load_file(str(out / "model.safetensors"))
    for name, tensor in trainer.state_dict_for_sync().items():
        assert torch.equal(loaded[name], tensor) and torch.equal(on_disk[name], tensor), name
