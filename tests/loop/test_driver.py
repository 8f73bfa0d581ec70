"""The driver's data wiring: prompt rendering with the chat template, and the checks across mode flags."""

from __future__ import annotations

import pytest

from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.data.dataset import PromptRow, tokenize_row
from slime.errors import ConfigError
from slime.loop.inputs import prompt_tokenizer
from tests.fixtures.tiny_model import TINY_VOCAB_SIZE, _write_word_tokenizer

TEMPLATE = (
    "{% for t in tools or [] %}{{ t.function.name }} {% endfor %}"
    "{% for m in messages %}{{ m.content }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"
)


def test_chat_template_renders_text_and_messages_with_tools_as_apply_chat_template_does(tmp_path):
    from transformers import AutoTokenizer

    _write_word_tokenizer(tmp_path, TINY_VOCAB_SIZE)  # words w3 .. w63
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.chat_template = TEMPLATE
    tokenize = prompt_tokenizer(tok, apply_chat_template=True)
    want = tok.apply_chat_template(
        [{"role": "user", "content": "w3 w4"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tokenize("w3 w4") == list(want) and tok.decode(want) == "w3 w4 w9"
    messages = [{"role": "system", "content": "w5"}, {"role": "user", "content": "w3 w4"}]
    tool = {"type": "function", "function": {"name": "w7"}}
    row = PromptRow(index=0, prompt="w3 w4", messages=messages, tools=[tool])
    assert tok.decode(tokenize_row(tokenize, row)) == "w7 w5 w3 w4 w9"
    assert prompt_tokenizer(tok, apply_chat_template=False)("w3 w4") == tok.encode("w3 w4")


@pytest.mark.parametrize(
    "config, message",
    [
        (Config(debug=DebugConfig(debug_train_only=True)), "--debug-train-only needs --load-debug-rollout-data"),
        (Config(debug=DebugConfig(debug_rollout_only=True, load_debug_rollout_data="r_{rollout_id}")), "pick one"),
        (Config(debug=DebugConfig(save_debug_rollout_data="runs/rollout.msgpack")), "needs {rollout_id}"),
        (Config(debug=DebugConfig(save_debug_rollout_data="runs/{step}.msgpack")), "not a path template"),
        (Config(loop=LoopConfig(offline_ratio=0.5)), "--offline-ratio=0.5 needs --offline-data"),
        (Config(data=DataConfig(offline_data="o.jsonl")), "--offline-data needs --offline-ratio > 0"),
        (Config(rollout=RolloutConfig(n_samples_per_eval_prompt=4)), "needs --eval-temperature > 0"),
        (Config(debug=DebugConfig(debug_rollout_only=True), save_interval=1), "--debug-rollout-only: --save-interval"),
        (Config(engine=EngineConfig(opd_teacher_load="/t")), "a teacher is only used with --use-opd"),
        (Config(train=TrainConfig(opd_only=True)), "--opd-only needs --use-opd"),
    ],
)
def test_mode_flags_that_disagree_are_named_at_start(config, message):
    with pytest.raises(ConfigError, match=message.replace("{", "\\{").replace("}", "\\}")):
        config.validate().check_run_modes()  # as run_training: each section's checks, then those across them


def test_offline_samples_without_logprobs_get_the_trainers_own_before_its_step(tmp_path):
    from slime.data.offline import OfflineGroup, OfflineSample, OfflineSource
    from slime.loop.inputs import with_offline_logprobs as _with_offline_logprobs
    from slime.train.torch_backend import TorchTrainer
    from tests.fixtures.tiny_model import write_tiny_llama

    trainer = TorchTrainer(
        TrainConfig(lr=1e-3, global_batch_size=2, micro_batch_size=2, use_tis=True),
        model_dir=str(write_tiny_llama(tmp_path / "m")),
    )
    samples = [
        OfflineSample(response="a", response_ids=[7, 8, 1], reward=1.0),
        OfflineSample(response="b", response_ids=[9, 1], reward=0.0),
    ]
    group = OfflineSource(
        [OfflineGroup(index=0, row=PromptRow(index=0, prompt="x"), prompt_ids=[0, 5, 6], samples=samples)]
    ).next_group(group_id=0, rollout_id=1)
    assert all(lp == 0.0 for s in group.samples for lp in s.rollout_logprobs)
    metrics = _with_offline_logprobs(trainer)([group])
    assert all(lp < 0 for s in group.samples for lp in s.rollout_logprobs)
    assert (
        metrics.train_rollout_logprob_abs_diff_max < 1e-4
        and metrics.train_rollout_logprob_abs_diff < 1e-5
        and metrics.tis_mean == pytest.approx(1.0, abs=1e-5)
    )


def test_sft_runs_refuse_on_policy_distillation():

    config = Config(data=DataConfig(prompt_data="rows.jsonl"), train=TrainConfig(loss_type="sft_loss", use_opd=True))
    with pytest.raises(ConfigError, match="--use-opd: on-policy distillation needs the student's own rollouts"):
        config.check_sft_run()
    Config(data=DataConfig(prompt_data="rows.jsonl"), train=TrainConfig(loss_type="sft_loss")).check_sft_run()


def test_apply_chat_template_with_a_tokenizer_without_one_is_one_line_naming_the_dir(tmp_path):
    import asyncio

    from slime.loop.driver import run_training

    _write_word_tokenizer(tmp_path / "model", TINY_VOCAB_SIZE)  # no chat template
    (tmp_path / "model" / "config.json").write_text("{}")
    config = Config(
        engine=EngineConfig(hf_checkpoint=str(tmp_path / "model")),
        data=DataConfig(apply_chat_template=True),
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ConfigError) as info:
        asyncio.run(run_training(config, progress=False))
    assert str(info.value) == (
        f"--apply-chat-template: the tokenizer in {tmp_path / 'model'} has no chat template (no chat_template "
        "in tokenizer_config.json, no chat_template.jinja); use a model that has one (e.g. an -Instruct "
        "model), or drop --apply-chat-template to tokenize the raw prompt text"
    )
