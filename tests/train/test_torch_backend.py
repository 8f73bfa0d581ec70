import math
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
    base = dict(lr=3e-3, global_batch_size=4, micro_batch_size=2, num_threads=1)
    return TrainConfig(**{**base, **kw})


FACTS = dict(rollout_temperature=0.8, seed=0)
"""What the run hands a trainer from outside its section (``Config.trainer_kwargs``)."""


def _response_logprob(trainer, i):
    return sum(sample_logprobs(trainer.model, PROMPT, RESPONSES[i], trainer.rollout_temperature))


def test_repeated_steps_raise_the_rewarded_sample_and_lower_the_surrogate_loss(tiny_model_dir):
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir, **FACTS)
    groups = _groups()
    batch = build_train_batch(groups, pad_token_id=0, current_version=0)
    with torch.no_grad():
        logp0 = compute_token_logprobs(trainer.model, batch.input_ids, batch.attention_mask, temperature=0.8)
    before = [_response_logprob(trainer, i) for i in range(4)]
    surrogate = []
    for step in range(4):
        metrics = trainer.train_step(groups).to_dict()
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
    trainer = TorchTrainer(_config(use_tis=True), model_dir=tiny_model_dir, **FACTS)
    m = trainer.train_step(_groups()).to_dict()
    assert m["pg_clipfrac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-7)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert m["num_samples"] == 4 and m["num_train_tokens"] == 13
    assert m["reward_mean"] == 0.25 and m["grad_norm"] > 0 and m["train_time_s"] > 0
    assert (
        m["train_rollout_logprob_abs_diff_max"] >= m["train_rollout_logprob_abs_diff"] > 0
        and 0 <= m["tis_clipfrac"] <= 1
    )
    assert all(isinstance(v, float) for v in m.values())


def test_micro_batch_size_does_not_change_loss_or_gradient(tiny_model_dir):
    results = [
        TorchTrainer(_config(micro_batch_size=mbs), model_dir=tiny_model_dir, **FACTS).train_step(_groups()).to_dict()
        for mbs in (1, 4)
    ]
    assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=1e-6)
    assert results[0]["grad_norm"] == pytest.approx(results[1]["grad_norm"], rel=1e-5)


def test_global_batch_size_splits_the_rollout_into_optimizer_steps(tiny_model_dir):
    m = (
        TorchTrainer(_config(global_batch_size=2, micro_batch_size=1), model_dir=tiny_model_dir, **FACTS)
        .train_step(_groups())
        .to_dict()
    )
    assert m["num_optimizer_steps"] == 2


def test_failed_samples_do_not_train(tiny_model_dir):
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir, **FACTS)
    before = {k: v.clone() for k, v in trainer.state_dict_for_sync().items()}
    groups = _groups(rewards=(None, None, None, None), statuses={i: Status.FAILED for i in range(4)})
    m = trainer.train_step(groups).to_dict()
    assert m["num_train_tokens"] == 0 and m["num_optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.state_dict_for_sync().items())


def test_save_hf_round_trip_loads_equal_weights_and_copies_tokenizer_files(tiny_model_dir, tmp_path):
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir, **FACTS)
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


def _plain_grpo_reference_step(model_dir, config, groups):
    """The trainer before the algorithm options, written out by hand: GRPO advantages, PPO clip,
    optional TIS, seq_mean over each optimizer step, AdamW with grad clipping. Returns the model and
    the step losses."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    opt = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(config.adam_beta1, config.adam_beta2), weight_decay=config.weight_decay
    )
    batch = build_train_batch(groups, pad_token_id=0, current_version=0)
    mbs = [batch.slice(i, i + 1) for i in range(batch.num_samples)]  # micro_batch_size 1
    with torch.no_grad():
        old = [compute_token_logprobs(model, mb.input_ids, mb.attention_mask, temperature=0.8) for mb in mbs]
    losses = []
    for step in ([0, 1], [2, 3]):  # global_batch_size 2 -> two optimizer steps
        opt.zero_grad()
        total = 0.0
        for i in step:
            mb = mbs[i]
            ratio = (compute_token_logprobs(model, mb.input_ids, mb.attention_mask, temperature=0.8) - old[i]).exp()
            tok = torch.maximum(-ratio * mb.advantages, -ratio.clamp(0.8, 1.2) * mb.advantages)
            if config.use_tis:
                tok = tok * (old[i] - mb.rollout_logprobs).exp().clamp(0.0, 2.0)
            loss = (tok * mb.loss_mask).sum() / mb.loss_mask.sum() / len(step)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
        opt.step()
        losses.append(total)
    return model, losses


@pytest.mark.parametrize("use_tis", [False, True])
def test_default_config_trains_exactly_like_the_plain_grpo_ppo_reference(tiny_model_dir, use_tis):
    # the second optimizer step is off-policy (ratio != 1), so the clip and TIS weights are exercised
    config = _config(global_batch_size=2, micro_batch_size=1, use_tis=use_tis)
    reference, want_losses = _plain_grpo_reference_step(tiny_model_dir, config, _groups())
    trainer = TorchTrainer(config, model_dir=tiny_model_dir, **FACTS)
    m = trainer.train_step(_groups()).to_dict()
    assert m["loss"] == pytest.approx(sum(want_losses) / 2, abs=1e-6)
    got = trainer.state_dict_for_sync()
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0, msg=name)


def _weights_changed(before, module):
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_ppo_with_gae_trains_policy_and_critic_and_reports_value_metrics(tiny_model_dir):
    # rewards (1, 0, 0, 0); the critic head starts at 0, so old values are 0 and, with gamma = lambda = 1,
    # GAE gives A_t = sum of future rewards - V_t = R on every trained token, and returns = R:
    #   value_loss = seq_mean((0 - R)^2) = (1 + 0 + 0 + 0) / 4 = 0.25
    #   policy loss (ratio 1) = -seq_mean(A) = -0.25;  explained variance = 1 - Var(R - 0) / Var(R) = 0
    trainer = TorchTrainer(
        _config(advantage_estimator="ppo", gamma=1.0, lambd=1.0, critic_lr=1e-2), model_dir=tiny_model_dir, **FACTS
    )
    assert trainer.critic is not None and trainer.ref_model is None
    policy0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    critic0 = {k: v.clone() for k, v in trainer.critic.state_dict().items()}
    m = trainer.train_step(_groups()).to_dict()
    assert m["value_loss"] == pytest.approx(0.25, abs=1e-6) and m["loss"] == pytest.approx(-0.25, abs=1e-6)
    assert m["explained_variance"] == pytest.approx(0.0, abs=1e-6) and m["critic_grad_norm"] > 0
    assert _weights_changed(policy0, trainer.model) and _weights_changed(critic0, trainer.critic)
    m2 = trainer.train_step(_groups()).to_dict()  # the critic now predicts something: values move off 0
    assert m2["explained_variance"] != pytest.approx(0.0, abs=1e-6) and m2["value_loss"] != pytest.approx(
        0.25, abs=1e-6
    )


def test_kl_loss_keeps_a_frozen_reference_and_reports_kl(tiny_model_dir):
    trainer = TorchTrainer(
        _config(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="low_var_kl"), model_dir=tiny_model_dir, **FACTS
    )
    assert trainer.ref_model is not None and trainer.critic is None
    ref0 = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    policy0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    m1 = trainer.train_step(_groups()).to_dict()
    assert m1["kl_loss"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before the first update
    m2 = trainer.train_step(_groups()).to_dict()
    assert m2["kl_loss"] > 1e-7
    assert _weights_changed(policy0, trainer.model) and not _weights_changed(ref0, trainer.ref_model)


@pytest.mark.parametrize(
    "options",
    [
        dict(advantage_estimator="gspo", eps_clip=3e-4, eps_clip_high=4e-4),
        dict(advantage_estimator="reinforce_plus_plus", kl_coef=0.1, gamma=0.9),
        dict(advantage_estimator="reinforce_plus_plus_baseline"),
        dict(mis_level="sequence", mis_lower_bound=0.0),  # rollout logprobs of -1 put rho far below 0.5
        dict(use_decoupled_ppo=True, behav_imp_weight_cap=5.0),
        dict(
            eps_clip_c=3.0,
            entropy_coef=0.01,
            disable_grpo_std_normalization=True,
            mask_offpolicy_in_partial_rollout=True,
        ),
    ],
    ids=["gspo", "rf++", "rf++baseline", "mis", "decoupled", "dualclip-entropy-drgrpo"],
)
def test_every_option_trains_through_train_step(tiny_model_dir, options):
    trainer = TorchTrainer(_config(global_batch_size=2, **options), model_dir=tiny_model_dir, **FACTS)
    policy0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    m = trainer.train_step(_groups()).to_dict()
    assert m["num_optimizer_steps"] == 2 and all(math.isfinite(v) for k, v in m.items() if k != "explained_variance")
    assert _weights_changed(policy0, trainer.model)
