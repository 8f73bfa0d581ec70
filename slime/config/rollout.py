"""``RolloutConfig``: how samples are generated (sampling, requests, retries), rewarded and evaluated (``slime.rollout``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from slime.config._base import STRUCT, Range, check_ranges
from slime.errors import ConfigError

__all__ = ["RolloutConfig", "SFT_ROLLOUT", "BUILTIN_ROLLOUTS", "builtin_rollout_note", "MAX_SAMPLES_PER_PROMPT"]

MAX_SAMPLES_PER_PROMPT = 1024
"""Most samples per prompt (``--n-samples-per-prompt``, ``--n-samples-per-eval-prompt``): each is a task and a
request in flight, and 100000 of them per group left a run making no progress (issue 26)."""

SFT_ROLLOUT = "slime.rollout.sft_rollout.generate_rollout"
BUILTIN_ROLLOUTS = {
    "slime.rollout.sglang_rollout.generate_rollout": "THUDM/slime's default rollout: this project's built-in scheduler does it",
    "fully_async_rollout.generate_rollout_fully_async": "THUDM/slime's fully-async example: this project's built-in scheduler "
    "in --rollout-mode async does it",
    SFT_ROLLOUT: "THUDM/slime's SFT rollout: --loss-type sft_loss does it (it trains on the rows of --prompt-data, generating nothing)",
}
"""THUDM/slime's own ``--rollout-function-path`` values: names this project's built-in paths replace, never imported."""


def builtin_rollout_note(path: str | None, mode: str | None = None) -> str | None:
    """The one line logged for a THUDM/slime rollout function that the built-in scheduler replaces
    (with a hint when the fully-async one runs in another ``mode``); None otherwise."""
    if path is None:
        return None
    for name, note in BUILTIN_ROLLOUTS.items():
        if path == name or path.endswith("." + name) or path.replace(":", ".") == name:
            hint = (
                f"; this run is --rollout-mode {mode}: pass --rollout-mode async for that"
                if "async" in name and mode not in (None, "async")
                else ""
            )
            return f"--rollout-function-path={path}: {note}{hint}"
    return None


class RolloutConfig(msgspec.Struct, **STRUCT):
    n_samples_per_prompt: Annotated[int, Range(ge=1, le=MAX_SAMPLES_PER_PROMPT)] = 8
    """Samples per prompt (the GRPO group size) (``--n-samples-per-prompt``)."""
    rollout_temperature: Annotated[float, Range(gt=0, note="for RL")] = 1.0
    """Sampling temperature of the engines (``--rollout-temperature``). The one copy of the fact: the trainer
    divides its logits by it before log_softmax, as SGLang does for returned logprobs, and gets it from the
    run's wiring (``TorchTrainer(..., rollout_temperature=config.rollout.rollout_temperature)``)."""
    rollout_top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Top-p of the engines' sampling (``--rollout-top-p``)."""
    rollout_top_k: Annotated[int, Range(ge=1, also=(-1,), note="(the whole vocabulary)")] = -1
    """Top-k of the engines' sampling (``--rollout-top-k``); -1 = the whole vocabulary."""
    rollout_max_response_len: Annotated[int, Range(ge=1)] = 64
    """Cap on response tokens per sample, partial tokens included (``--rollout-max-response-len``)."""
    rollout_max_context_len: (
        Annotated[int, Range(ge=2, note="(a prompt token and a response token), or unset")] | None
    ) = None
    """Cap on prompt + response tokens of a rollout sample (``--rollout-max-context-len``, THUDM/slime's): a
    sample's response cap is ``min(rollout_max_response_len, rollout_max_context_len - prompt tokens)``, and a
    prompt that leaves no room is a bad row at load. None = only the model's context bounds it."""

    @property
    def uses_rollout_function(self) -> bool:
        """Whether a user rollout function replaces the built-in scheduler (a ``--rollout-function-path`` that is
        not one of ``BUILTIN_ROLLOUTS``)."""
        return self.rollout_function_path is not None and builtin_rollout_note(self.rollout_function_path) is None

    def response_cap(self, prompt_len: int) -> int:
        """Response tokens a rollout sample of ``prompt_len`` prompt tokens may have (``rollout_max_context_len``)."""
        if self.rollout_max_context_len is None:
            return self.rollout_max_response_len
        return max(0, min(self.rollout_max_response_len, self.rollout_max_context_len - prompt_len))

    rollout_stop_token_ids: tuple[Annotated[int, Range(ge=0, flag="rollout_stop_token_ids")], ...] = ()
    """Token ids that end a response besides the tokenizer's EOS."""
    request_timeout_s: Annotated[float, Range(gt=0)] = 300.0
    """Per /generate call (``--request-timeout-s``)."""
    control_timeout_s: Annotated[float, Range(gt=0)] = 60.0
    """Per control call (abort, weight update, health) (``--control-timeout-s``)."""
    max_retries: Annotated[int, Range(ge=0)] = 3
    """Retries of an unreachable engine call before giving up (``--max-retries``)."""
    retry_backoff_s: Annotated[float, Range(ge=0)] = 0.5
    """First backoff; doubles per retry (``--retry-backoff-s``)."""
    reward_timeout_s: Annotated[float, Range(gt=0)] = 30.0
    """Per reward call; a timeout marks the sample FAILED (``--reward-timeout-s``)."""
    reward_key: str | None = None
    """Which entry of a dict returned by the reward function is the reward (``--reward-key``, slime's);
    the whole dict is kept in ``Sample.evidence["reward_fields"]``. Float rewards are used as they are."""
    custom_generate_function_path: str | None = None
    """``pkg.module.func``: an async generate function ``(sample, sampling_params, **kwargs)``
    returning the sample or a list of finished samples (``--custom-generate-function-path``). If it
    takes a ``tokenizer`` argument, the run's tokenizer is bound to it."""
    rollout_function_path: str | None = None
    """``pkg.module.func`` of a function that makes a whole rollout step's groups, in THUDM/slime's
    contract ``(args, rollout_id, data_buffer, evaluation=False)`` (``--rollout-function-path``);
    it replaces the built-in scheduler for the step (``slime.loop.rollout_function``)."""
    custom_rm_path: str | None = None
    """``pkg.module.func`` of an async per-sample reward function (``--custom-rm-path``; one of it and ``--rm-type``)."""
    rm_type: Literal["math", "deepscaler", "dapo", "code", "remote", "remote_rm", "arith", "calc", "chain"] | None = (
        None
    )
    """Built-in verifier (``--rm-type``; one of ``--rm-type`` / ``--custom-rm-path``): ``math`` (math-verify
    against the label; ``deepscaler`` and ``dapo``, slime's math rewards, are this verifier), ``code`` (test cases in
    the sandbox), ``remote`` / ``remote_rm`` (POST to ``rm_url``), or a built-in task's reward for prompt files in
    its format: ``arith``, ``calc``, ``chain`` (``slime.data.<task>.reward``). See ``slime/rollout/verifiers/``."""
    rm_url: str | None = None
    """URL of a remote reward model for ``rm_type="remote"`` (``--rm-url``); it answers
    ``{"reward": float}`` to ``{"prompt", "response", "label"}``."""
    allow_unsafe_code_execution: bool = False
    """Let ``rm_type="code"`` run model-written code without an OS sandbox where bubblewrap is
    missing or cannot create namespaces (``--allow-unsafe-code-execution``); otherwise the run
    refuses to start. See ``slime/rollout/tools/sandbox.py``."""
    n_samples_per_eval_prompt: Annotated[int, Range(ge=1, le=MAX_SAMPLES_PER_PROMPT)] = 1
    """Samples per eval prompt (``--n-samples-per-eval-prompt``); eval reports mean accuracy and pass@k."""
    eval_temperature: Annotated[float, Range(ge=0, note="(0 = greedy)")] = 0.0
    """Sampling temperature of evaluation (``--eval-temperature``); 0 = greedy (then one sample per prompt)."""
    eval_top_p: Annotated[float, Range(gt=0, le=1)] | None = None
    """Top-p of evaluation (``--eval-top-p``); None = ``rollout_top_p``, as in THUDM/slime."""
    eval_max_response_len: Annotated[int, Range(ge=1)] | None = None
    """Cap on response tokens of an eval sample (``--eval-max-response-len``); None = ``rollout_max_response_len``."""
    eval_top_k: Annotated[int, Range(ge=1, also=(-1,), note="(the whole vocabulary)")] | None = None
    """Top-k of evaluation (``--eval-top-k``); None = ``rollout_top_k``, as ``eval_top_p``. -1 = the whole vocabulary."""
    use_rollout_routing_replay: bool = False
    """MoE routing replay (``--use-rollout-routing-replay``, THUDM/slime's): the engines return the experts each
    token was routed to (``return_routed_experts``; launched SGLang servers get ``--enable-return-routed-experts``,
    external ones must be started with it) and the megatron trainer's logprob and train passes use those experts
    (``slime.train.megatron.routing_replay``). MoE models and ``--train-backend megatron`` only."""

    @property
    def without_routes(self) -> RolloutConfig:
        """This config with ``use_rollout_routing_replay`` off: a teacher engine's pool (its experts are not replayed)."""
        return msgspec.structs.replace(self, use_rollout_routing_replay=False)

    @property
    def resolved_eval_top_k(self) -> int:
        return self.rollout_top_k if self.eval_top_k is None else self.eval_top_k

    @property
    def resolved_eval_top_p(self) -> float:
        return self.rollout_top_p if self.eval_top_p is None else self.eval_top_p

    @property
    def resolved_eval_max_response_len(self) -> int:
        return self.rollout_max_response_len if self.eval_max_response_len is None else self.eval_max_response_len

    def validate(self) -> None:
        """Check this section's values.

        Raises:
            ConfigError: naming the flag; both ``--custom-rm-path`` and ``--rm-type`` ("pick one").
        """
        check_ranges(self)
        if self.custom_rm_path is not None and self.rm_type is not None:
            raise ConfigError(
                f"--custom-rm-path {self.custom_rm_path} and --rm-type {self.rm_type}: pick one (both name the reward; "
                "a custom reward function would silently replace the verifier)"
            )
        # n_samples_per_eval_prompt > 1 with greedy eval is refused at run start (Config.check_run_modes), not
        # here: THUDM/slime's eval YAMLs set 16 samples with no temperature and must still parse (--dry-run)
