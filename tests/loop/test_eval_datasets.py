"""THUDM/slime's eval flags: several eval datasets by name, --eval-top-p and --eval-max-response-len,
from the CLI through the driver's eval records and summary."""

from __future__ import annotations

import json

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import ConfigError
from slime.loop import assemble
from slime.loop.driver import run_training
from slime.loop.inputs import load_prompts
from tests.fixtures.fake_pool import run_on_a_recording_fake_pool
from tests.fixtures.tiny_model import write_tiny_llama


def parse(*argv: str) -> Config:
    return config_from_args(build_parser().parse_args(["--rollout-batch-size", "1", "--global-batch-size", "8", *argv]))


def test_eval_prompt_data_takes_one_path_or_name_path_pairs():
    assert parse("--eval-prompt-data", "e.jsonl", "--rm-type", "math").data.eval_datasets == ((None, "e.jsonl"),)
    assert parse(
        "--eval-prompt-data", "aime", "a.jsonl", "math", "m.jsonl", "--rm-type", "math"
    ).data.eval_datasets == (
        ("aime", "a.jsonl"),
        ("math", "m.jsonl"),
    )
    assert DataConfig(eval_prompt_data="e.jsonl").eval_datasets == (
        (None, "e.jsonl"),
    )  # a config built in Python, as before
    with pytest.raises(
        ConfigError,
        match=r"^--eval-prompt-data aime a.jsonl math: expected one path or 'name path' pairs, got 3 values$",
    ):
        parse("--eval-prompt-data", "aime", "a.jsonl", "math")
    with pytest.raises(ConfigError, match=r"names must be unique, got \['a', 'a'\]"):
        parse("--eval-prompt-data", "a", "x.jsonl", "a", "y.jsonl")


def test_user_eval_data_on_the_built_in_task_names_its_reward():
    """Trained on the built-in task, the run's reward is that task's: it scores rows of its own format only
    (others get 0 in silence), so a user's eval file needs the reward named, the built-in one included."""
    with pytest.raises(
        ConfigError,
        match=r"^--eval-prompt-data e.jsonl needs a reward: the default one, the built-in task's \(arith\), scores only that task's format \(rows in it: --rm-type arith\)",
    ):
        parse("--eval-prompt-data", "e.jsonl")
    with pytest.raises(
        ConfigError,
        match=r"^--eval-prompt-data a a.jsonl needs a reward: the default one, the built-in task's \(chain\)",
    ):
        parse("--builtin-task", "chain", "--eval-prompt-data", "a", "a.jsonl")
    for reward in (["--rm-type", "arith"], ["--rm-type", "math"], ["--custom-rm-path", "my.mod.fn"]):
        assert parse("--eval-prompt-data", "e.jsonl", *reward).data.eval_datasets == ((None, "e.jsonl"),)
    assert parse().data.eval_prompt_data is None  # the built-in task's own held-out split needs nothing


def test_the_eval_reward_rule_exempts_only_runs_that_compute_no_eval_reward(tmp_path):
    base = ("--eval-prompt-data", "e.jsonl")
    parse(
        *base, "--loss-type", "sft_loss", "--prompt-data", "p.jsonl", "--rollout-batch-size", "8"
    )  # SFT evaluates NLL
    parse(*base, "--load-debug-rollout-data", "r{rollout_id}.pt")  # a train-only replay drops the eval sets
    with pytest.raises(
        ConfigError, match=r"^--eval-prompt-data e.jsonl needs a reward"
    ):  # OPD-only evaluates its task reward
        parse(*base, "--use-opd", "--opd-only", "--prompt-data", "p.jsonl")
    parse("--use-opd", "--opd-only", "--prompt-data", "p.jsonl")  # no eval set: nothing to score
    (tmp_path / "eval.yaml").write_text("eval:\n  datasets: [{name: a, path: a.jsonl}]\n")
    with pytest.raises(ConfigError, match=rf"^--eval-config {tmp_path / 'eval.yaml'} needs a reward"):
        parse("--eval-config", str(tmp_path / "eval.yaml"))


def test_eval_sampling_defaults_to_the_rollouts_as_in_slime():
    r = parse("--rollout-top-p", "0.9", "--rollout-max-response-len", "32").rollout
    assert (r.resolved_eval_top_p, r.resolved_eval_max_response_len) == (0.9, 32)
    r = parse("--rollout-top-p", "0.9", "--eval-top-p", "0.7", "--eval-max-response-len", "16").rollout
    assert (r.resolved_eval_top_p, r.resolved_eval_max_response_len) == (0.7, 16)
    with pytest.raises(ConfigError, match=r"^--eval-top-p=1.5 is invalid: expected in \(0, 1\]$"):
        parse("--eval-top-p", "1.5")


def _jsonl(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in prompts))
    return str(path)


def test_load_prompts_by_name_keeps_each_dataset_apart(tmp_path):
    a, b = _jsonl(tmp_path / "a.jsonl", ["a1", "a2", "a3"]), _jsonl(tmp_path / "b.jsonl", ["b1"])
    config = Config(data=DataConfig(prompt_data=a, eval_prompt_data=("aa", a, "bb", b), num_eval_prompts=2))
    _, sets = load_prompts(config.data, seed=config.seed, by_name=True)
    assert {name: [r.prompt for r in rows] for name, rows in sets.items()} == {"aa": ["a1", "a2"], "bb": ["b1"]}
    _, flat = load_prompts(config.data, seed=config.seed)
    assert [r.prompt for r in flat] == ["a1", "a2", "b1"]


async def test_a_run_reports_each_named_eval_dataset_in_metrics_and_summary(tmp_path, monkeypatch):
    seen = run_on_a_recording_fake_pool(monkeypatch, assemble)

    async def reward(sample):  # "easy" prompts are always right
        return 1.0 if sample.prompt.startswith("w5") else 0.0

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    easy, hard = _jsonl(tmp_path / "easy.jsonl", ["w5 w6", "w5 w7"]), _jsonl(tmp_path / "hard.jsonl", ["w8 w9"])
    config = Config(
        data=DataConfig(prompt_data=easy, eval_prompt_data=("easy", easy, "hard", hard)),
        rollout=RolloutConfig(
            n_samples_per_prompt=2, eval_top_p=0.7, eval_max_response_len=3, rollout_max_response_len=8
        ),
        loop=LoopConfig(rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=1),
        train=TrainConfig(global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model)),
        debug=DebugConfig(debug_rollout_only=True),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=reward, progress=False)
    evals = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"
    ]
    assert evals and all(
        r["eval/easy/accuracy"] == 1.0 and r["eval/hard/accuracy"] == 0.0 and r["accuracy"] == 2 / 3 for r in evals
    )
    assert summary["eval/easy/accuracy_before"] == summary["eval/easy/accuracy_after"] == 1.0
    assert summary["eval/hard/accuracy_after"] == 0.0 and summary["eval_accuracy_after"] == 2 / 3
    eval_calls = [p for _, p in seen if p["top_p"] == 0.7]  # eval requests; the rollout's run at --rollout-top-p 1.0
    assert len(eval_calls) >= 3 and all(p["max_new_tokens"] <= 3 and p["temperature"] == 0.0 for p in eval_calls)
