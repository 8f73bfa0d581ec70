"""``--rollout-function-path``: a function in THUDM/slime's signature makes each step's groups."""

from __future__ import annotations

import json

import pytest

from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.config.rollout import builtin_rollout_note
from slime.data.dataset import PromptRow, PromptSource
from slime.errors import ConfigError, PluginError
from slime.loop.buffer import DataBuffer
from slime.loop.driver import run_training
from slime.loop.rollout_function import RolloutFunctionScheduler
from slime.loop.version import PolicyVersion
from slime.rollout.plugin_check import main as check_plugin
from slime.rollout.slime_compat import RolloutArgs, RolloutFnTrainOutput, SlimeSample, to_groups
from slime.types import OFFLINE_VERSION, Sample, Status
from tests.fixtures.tiny_model import write_tiny_llama
from tests.loop import rollout_fns


async def half(sample):
    return 1.0


def _config(**loop) -> Config:
    return Config(
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_function_path="tests.loop.rollout_fns.sft_rollout"),
        loop=LoopConfig(rollout_batch_size=2, **loop),
    )


def _args(config: Config) -> RolloutArgs:
    return RolloutArgs(
        config.rollout, config.loop, config.data, hf_checkpoint=config.engine.hf_checkpoint, seed=config.seed
    )


def _rf_scheduler(fn, **kw):
    config = _config()
    return RolloutFunctionScheduler(config.loop, config.rollout, fn, args=_args(config), **kw)


async def test_a_slime_signature_rollout_function_runs_a_step_end_to_end(tmp_path):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i} w5 w9"}) for i in range(8)) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts), num_eval_prompts=0),
        rollout=RolloutConfig(
            n_samples_per_prompt=2,
            rollout_max_response_len=8,
            request_timeout_s=60,
            rollout_function_path="tests.loop.rollout_fns.generate_rollout",
        ),
        loop=LoopConfig(rollout_batch_size=2, num_rollout=2),
        train=TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=4),
        engine=EngineConfig(hf_checkpoint=str(model), startup_timeout_s=60),
        run_dir=str(tmp_path / "run"),
    )
    rollout_fns.CALLS.clear()
    summary = await run_training(config, reward_fn=half, progress=False)
    assert rollout_fns.CALLS == [{"rollout_id": 0, "engine_version": 0}, {"rollout_id": 1, "engine_version": 1}]
    assert summary["groups_trained"] == 4 and summary["final_policy_version"] == 2 and summary["trained_tokens"] > 0
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert [r["num_samples"] for r in steps] == [4, 4]
    assert all(
        r["reward_mean"] == 0.75 for r in steps
    )  # sample 0 of each group scored by `half` (1.0), the other set to 0.5


async def test_an_sft_style_function_s_samples_are_rewarded_tagged_offline_and_checked():
    buffer = DataBuffer()
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(3)]
    sched = _rf_scheduler(
        rollout_fns.sft_rollout,
        source=PromptSource(rows, shuffle=False),
        tokenize=lambda text: [1, 2, 3],
        buffer=buffer,
        reward_fn=half,
    )
    groups = await sched.next_batch(2)
    assert [g.group_id for g in groups] == [0, 1] and [g.data_index for g in groups] == [0, 1]
    s = groups[0].samples[1]
    assert s.prompt_ids == [1, 2, 3] and s.response_ids == [7, 7, 8, 9] and s.loss_mask == [0, 0, 1, 1]
    assert s.versions == [OFFLINE_VERSION] * 4 and s.metadata["offline_logprobs"] is False and s.reward == 1.0
    assert [g.group_id for g in await sched.next_batch(2)] == [2, 3] and buffer.taken == {0, 1, 2, 3}
    sched = _rf_scheduler(
        rollout_fns.left_pending,
        source=PromptSource(rows, shuffle=False),
        tokenize=lambda text: [1],
        buffer=DataBuffer(),
        reward_fn=half,
    )
    with pytest.raises(
        PluginError,
        match=r"^--rollout-function-path=tests.loop.rollout_fns.sft_rollout \(step 1\): group 0 sample 0: "
        r"status is 'pending'",
    ):
        await sched.next_batch(2)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: setattr(s, "loss_mask", [1]), "group 0 sample 0: loss_mask has 1 entries for response_length=2"),
        (
            lambda s: setattr(s, "rollout_log_probs", [-0.1, float("nan")]),
            "group 0 sample 0: rollout_log_probs holds nan",
        ),
        (lambda s: setattr(s, "reward", {"score": 1.0}), "group 0 sample 0: reward is dict"),
        (lambda s: setattr(s, "response_length", 9), "group 0 sample 0: response_length=9 with 3 tokens"),
    ],
)
def test_a_slime_sample_outside_the_contract_is_one_line_naming_it(edit, message):
    s = SlimeSample(tokens=[1, 5, 6], response_length=2, status=SlimeSample.Status.COMPLETED)
    edit(s)
    with pytest.raises(PluginError, match="^" + message):
        to_groups([[s]], n_samples_per_prompt=1, engine_version=0, next_group_id=0)


def test_a_slime_sample_kept_across_a_weight_update_is_stamped_with_its_oldest_version():
    """slime appends the engine's weight_version per generate call; a sample the function kept in data_buffer over
    an update holds tokens of both: every token takes the oldest (the staleness mask sees them), not the newest."""
    lp = [-0.1, -0.2, -0.3]
    kept = SlimeSample(tokens=[1, 5, 6, 7], response_length=3, rollout_log_probs=lp, weight_versions=["3", "4"])
    kept.status = SlimeSample.Status.COMPLETED
    groups, _ = to_groups([[kept]], n_samples_per_prompt=1, engine_version=5, next_group_id=0)
    assert groups[0].samples[0].versions == [3, 3, 3]
    fresh = SlimeSample(tokens=[1, 5], response_length=1, rollout_log_probs=[-0.1], status=SlimeSample.Status.COMPLETED)
    assert to_groups([[fresh]], n_samples_per_prompt=1, engine_version=5, next_group_id=0)[0][0].samples[
        0
    ].versions == [5]
    kept.weight_versions = ["default", "4"]  # SGLang's name before any update: no version of ours, read as the engine's
    groups, _ = to_groups([[kept]], n_samples_per_prompt=1, engine_version=5, next_group_id=0)
    assert groups[0].samples[0].versions == [4, 4, 4]


def test_our_samples_pass_through_and_bad_shapes_are_named():
    ok = Sample(prompt_ids=[1], status=Status.COMPLETED, reward=1.0)
    ok.append([4, 5], [-0.1, -0.2], 3)
    groups, _ = to_groups(
        type("Out", (), {"samples": [[ok]], "metrics": {"m": 1}})(),
        n_samples_per_prompt=1,
        engine_version=3,
        next_group_id=7,
    )
    assert groups[0].group_id == 7 and groups[0].samples[0] is ok and ok.group_id == 7
    with pytest.raises(PluginError, match="newer than the engine's 2"):
        to_groups([[ok]], n_samples_per_prompt=1, engine_version=2, next_group_id=0)
    with pytest.raises(
        PluginError, match="^returned a flat list of 3 samples, not a multiple of n_samples_per_prompt=2"
    ):
        to_groups([ok, ok, ok], n_samples_per_prompt=2, engine_version=3, next_group_id=0)
    with pytest.raises(PluginError, match="^returned NoneType; expected a non-empty list of groups"):
        to_groups(None, n_samples_per_prompt=1, engine_version=3, next_group_id=0)


def test_a_rollout_fn_train_output_becomes_groups_with_its_metrics():
    def sample(group_index, reward):
        return SlimeSample(
            group_index=group_index,
            tokens=[1, 5, 6],
            response_length=2,
            reward=reward,
            status=SlimeSample.Status.COMPLETED,
        )

    out = RolloutFnTrainOutput(
        samples=[[sample(10, 1.0), sample(10, 0.0)], [sample(11, 0.5), sample(11, 0.5)]], metrics={"m": 2.5}
    )
    groups, metrics = to_groups(
        out, n_samples_per_prompt=2, engine_version=0, next_group_id=4, rollout_id=3, data_index={11: 7}
    )
    assert metrics == {"m": 2.5}
    assert [g.group_id for g in groups] == [4, 5] and [g.rollout_id for g in groups] == [3, 3]
    assert [g.data_index for g in groups] == [-1, 7]
    assert [[s.reward for s in g.samples] for g in groups] == [[1.0, 0.0], [0.5, 0.5]]
    assert [[(s.group_id, s.index) for s in g.samples] for g in groups] == [[(4, 0), (4, 1)], [(5, 0), (5, 1)]]
    assert groups[0].samples[0].response_ids == [5, 6]
    with pytest.raises(PluginError, match="^returned an empty list"):
        to_groups(RolloutFnTrainOutput(samples=[]), n_samples_per_prompt=2, engine_version=0, next_group_id=0)


def test_flags_the_function_replaces_are_refused_in_one_line():
    _config().check_run_modes()
    with pytest.raises(
        ConfigError, match=r"^--rollout-function-path=tests.loop.rollout_fns.sft_rollout with --rollout-mode april"
    ):
        _config(mode="april").check_run_modes()
    with pytest.raises(ConfigError, match="with --dynamic-sampling-filter-path"):
        _config(dynamic_sampling_filter_path="x.y").check_run_modes()
    train_only = Config(
        rollout=RolloutConfig(rollout_function_path="m.f"),
        debug=DebugConfig(debug_train_only=True, load_debug_rollout_data="r{rollout_id}"),
    )
    with pytest.raises(ConfigError, match="with --debug-train-only"):
        train_only.check_run_modes()


def test_thudm_slime_s_own_rollout_functions_are_the_built_in_scheduler():
    for path in ("slime.rollout.sglang_rollout.generate_rollout", "fully_async_rollout.generate_rollout_fully_async"):
        config = Config(rollout=RolloutConfig(rollout_function_path=path), loop=LoopConfig(mode="async"))
        assert not config.rollout.uses_rollout_function
        config.check_run_modes()  # not refused: the built-in scheduler runs it
    assert builtin_rollout_note("fully_async_rollout.generate_rollout_fully_async", "sync").endswith(
        "in --rollout-mode async does it; this run is --rollout-mode sync: pass --rollout-mode async for that"
    )


def test_args_adapter_names_a_missing_attribute():
    args = _args(_config())
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.sglang_router_ip) == (2, 2, None)
    with pytest.raises(
        AttributeError,
        match=r"^args.sglang_dp_size: not provided to rollout functions here \(slime_compat.RolloutArgs has: ",
    ):
        args.sglang_dp_size  # noqa: B018  # the attribute access raises


def test_check_plugin_passes_a_good_rollout_function_and_fails_a_broken_one(capsys):
    assert check_plugin(["tests.loop.rollout_fns.generate_rollout", "--kind", "rollout", "--timeout-s", "30"]) == 0
    out = capsys.readouterr().out
    assert "PASS rollout: returned 2 groups (2, 2 samples): aligned lists, finished" in out
    assert "WARN rollout: 2 of 4 samples have no reward" in out and out.rstrip().endswith("RESULT: PASS")
    assert check_plugin(["tests.loop.rollout_fns.left_pending", "--kind", "rollout"]) == 1
    out = capsys.readouterr().out
    assert "FAIL rollout: group 0 sample 0: status is 'pending'" in out and out.rstrip().endswith("RESULT: FAIL")
    assert check_plugin(["tests.loop.rollout_fns.wrong_signature", "--kind", "rollout"]) == 1
    assert "FAIL rollout: does not accept (args, rollout_id, data_buffer, evaluation=False)" in capsys.readouterr().out


async def test_an_async_function_returning_our_groups_is_awaited_and_its_raise_is_one_line():
    async def ours(args, rollout_id, data_buffer, evaluation=False):
        groups = []
        for group in data_buffer.get_samples(args.rollout_batch_size):
            samples = []
            for s in group:
                ours = Sample(prompt_ids=list(s.tokens), status=Status.COMPLETED)
                ours.append([4, 5], [-0.1, -0.2], args.engine_version)
                samples.append(ours)
            groups.append(samples)
        return groups

    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(3)]
    config = _config()
    sched = RolloutFunctionScheduler(
        config.loop,
        config.rollout,
        ours,
        args=_args(config),
        source=PromptSource(rows, shuffle=False),
        tokenize=lambda text: [1],
        buffer=DataBuffer(),
        reward_fn=half,
        version=PolicyVersion(4),
    )
    groups = await sched.next_batch(2)
    assert [s.versions for s in groups[1].samples] == [[4, 4], [4, 4]] and all(
        s.reward == 1.0 for g in groups for s in g.samples
    )

    async def raises(args, rollout_id, data_buffer, evaluation=False):
        raise RuntimeError("no engine here")

    sched.fn = raises
    with pytest.raises(PluginError, match=r"\(step 2\): raised RuntimeError: no engine here$"):
        await sched.next_batch(2)
