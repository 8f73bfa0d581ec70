"""Typed configuration: one ``msgspec.Struct`` section per component, under one root ``Config``.

Each component receives its own section, never the root (``Scheduler(config.loop, ...)``).
Slime-compatible CLI flags map onto these fields in ``slime/cli_args.py``; a test pins that map.
Values are checked at start: ``Config.validate`` raises ``ConfigError`` naming the CLI flag.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from slime.errors import ConfigError

__all__ = [
    "DataConfig",
    "RolloutConfig",
    "LoopConfig",
    "MegatronConfig",
    "TrainConfig",
    "SyncConfig",
    "EngineConfig",
    "ObsConfig",
    "DebugConfig",
    "Config",
    "SHARED_FIELDS",
]

_STRUCT = dict(kw_only=True, frozen=True, forbid_unknown_fields=True)

SHARED_FIELDS: dict[str, tuple[str, ...]] = {
    "rollout.n_samples_per_prompt": ("loop.n_samples_per_prompt",),
    "rollout.rollout_temperature": ("train.rollout_temperature",),
    "loop.max_staleness": ("train.max_staleness",),
    "seed": ("data.seed", "train.seed"),
}
"""Facts that several sections need, as ``{owner: copies}`` (dotted paths from the root ``Config``):
each section stays self-contained, the CLI sets every copy from the owner's flag, and
``Config.validate`` refuses a config (e.g. built in Python) whose copies disagree with their owner."""


class DataConfig(msgspec.Struct, **_STRUCT):
    prompt_data: str | None = None
    """JSONL or Parquet (by extension) file of prompts (``--prompt-data``; ``slime.data.dataset``). None: the
    built-in task (``builtin_task``)."""
    builtin_task: Literal["arith", "calc", "chain"] = "arith"
    """The built-in task used without ``--prompt-data`` (and its reward, without ``--custom-rm-path`` /
    ``--rm-type``): ``arith`` (``slime.data.arith``, the first demo), ``calc`` (``slime.data.calc``,
    large-number arithmetic with a calculator tool) or ``chain`` (``slime.data.chain``, addition chains with a
    long-tailed response length) (``--builtin-task``)."""
    input_key: str = "prompt"
    """Key of the prompt text in each row (``--input-key``)."""
    label_key: str | None = "label"
    """Key of the reference answer (``--label-key``)."""
    metadata_key: str | None = None
    """Key of a dict copied into ``Sample.metadata`` (``--metadata-key``)."""
    apply_chat_template: bool = False
    """Render the prompt as a user message (or a row's list of messages as given) with the HF
    tokenizer's ``apply_chat_template(..., add_generation_prompt=True)`` (``--apply-chat-template``)."""
    tool_key: str | None = None
    """Key of each row's tools, OpenAI function schema (``--tool-key``): kept in
    ``Sample.metadata["tools"]`` for the multi-turn generate, and rendered by the chat template."""
    rollout_shuffle: bool = False
    """Shuffle prompts each epoch with ``seed`` (``--rollout-shuffle``)."""
    curriculum_key: str | None = None
    """Key of a numeric difficulty (``--curriculum-key``): each epoch goes through the prompts in
    ascending difficulty instead of shuffled (ties: file order, or shuffled with ``--rollout-shuffle``)."""
    offline_data: str | None = None
    """JSONL (or Parquet) of pre-generated samples mixed into each batch at ``--offline-ratio``
    (``--offline-data``); see ``slime.data.offline``."""
    eval_prompt_data: str | tuple[str, ...] | None = None
    """Held-out prompts, JSONL or Parquet (``--eval-prompt-data``): one path (reported as ``accuracy``,
    ``pass@k``, ...), or THUDM/slime's ``name path`` pairs, e.g. ``("aime", "aime.jsonl", "math", "m.jsonl")``
    (each reported as ``eval/<name>/accuracy``, ...; ``eval_datasets``). None: the built-in task's eval split."""
    eval_config: str | None = None
    """THUDM/slime's YAML of eval datasets (``--eval-config``); read into ``eval_prompt_data`` and the
    eval sampling fields when the flags are parsed (``slime.eval_config``)."""
    num_eval_prompts: int = 200
    """How many eval prompts to score (``--num-eval-prompts``)."""
    on_bad_data: Literal["skip", "fail"] = "fail"
    """A malformed line: skip it with a warning and a count, or stop (``--on-bad-data``)."""
    rollout_max_prompt_len: int | None = None
    """Prompts over this many tokens (as rendered for the engine) are bad rows at load, named by
    ``path:line`` and skipped or refused by ``on_bad_data`` (``--rollout-max-prompt-len``, THUDM/slime's,
    whose dataset drops them). None = only the model's context bounds a prompt."""
    seed: int = 1234

    @property
    def eval_datasets(self) -> tuple[tuple[str | None, str], ...]:
        """``eval_prompt_data`` as ``(name, path)`` pairs; name None for one unnamed path. Example:
        ``"e.jsonl"`` -> ``((None, "e.jsonl"),)``; ``("aime", "a.jsonl")`` -> ``(("aime", "a.jsonl"),)``.

        Raises:
            ConfigError: an odd number of tokens (more than one), or a name used twice.
        """
        given = self.eval_prompt_data
        if given is None or len(given) == 0:
            return ()
        if isinstance(given, str) or len(given) == 1:
            return ((None, given if isinstance(given, str) else given[0]),)
        if len(given) % 2:
            raise ConfigError(f"--eval-prompt-data {' '.join(given)}: expected one path or 'name path' pairs, got {len(given)} values")
        names = given[0::2]
        if len(set(names)) != len(names):
            raise ConfigError(f"--eval-prompt-data: dataset names must be unique, got {list(names)}")
        return tuple(zip(names, given[1::2]))


class RolloutConfig(msgspec.Struct, **_STRUCT):
    n_samples_per_prompt: int = 8
    """Samples per prompt (the GRPO group size) (``--n-samples-per-prompt``)."""
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    rollout_max_response_len: int = 64
    """Cap on response tokens per sample, partial tokens included (``--rollout-max-response-len``)."""
    rollout_max_context_len: int | None = None
    """Cap on prompt + response tokens of a rollout sample (``--rollout-max-context-len``, THUDM/slime's): a
    sample's response cap is ``min(rollout_max_response_len, rollout_max_context_len - prompt tokens)``, and a
    prompt that leaves no room is a bad row at load. None = only the model's context bounds it."""

    def response_cap(self, prompt_len: int) -> int:
        """Response tokens a rollout sample of ``prompt_len`` prompt tokens may have (``rollout_max_context_len``)."""
        if self.rollout_max_context_len is None:
            return self.rollout_max_response_len
        return max(0, min(self.rollout_max_response_len, self.rollout_max_context_len - prompt_len))
    rollout_stop_token_ids: tuple[int, ...] = ()
    request_timeout_s: float = 300.0
    """Per /generate call (``--request-timeout-s``)."""
    control_timeout_s: float = 60.0
    """Per control call (abort, weight update, health) (``--control-timeout-s``)."""
    max_retries: int = 3
    """Retries of an unreachable engine call before giving up (``--max-retries``)."""
    retry_backoff_s: float = 0.5
    """First backoff; doubles per retry (``--retry-backoff-s``)."""
    reward_timeout_s: float = 30.0
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
    """``pkg.module.func`` of an async per-sample reward function (``--custom-rm-path``)."""
    rm_type: Literal["math", "deepscaler", "dapo", "code", "remote", "remote_rm"] | None = None
    """Built-in verifier used when ``custom_rm_path`` is unset (``--rm-type``): ``math`` (math-verify
    against the label; ``deepscaler`` and ``dapo``, slime's math rewards, are this verifier), ``code`` (test cases in the sandbox), ``remote`` / ``remote_rm`` (POST to
    ``rm_url``). See ``slime/rollout/verifiers/``."""
    rm_url: str | None = None
    """URL of a remote reward model for ``rm_type="remote"`` (``--rm-url``); it answers
    ``{"reward": float}`` to ``{"prompt", "response", "label"}``."""
    allow_unsafe_code_execution: bool = False
    """Let ``rm_type="code"`` run model-written code without an OS sandbox where bubblewrap is
    missing or cannot create namespaces (``--allow-unsafe-code-execution``); otherwise the run
    refuses to start. See ``slime/rollout/tools/sandbox.py``."""
    n_samples_per_eval_prompt: int = 1
    """Samples per eval prompt (``--n-samples-per-eval-prompt``); eval reports mean accuracy and pass@k."""
    eval_temperature: float = 0.0
    """Sampling temperature of evaluation (``--eval-temperature``); 0 = greedy (then one sample per prompt)."""
    eval_top_p: float | None = None
    """Top-p of evaluation (``--eval-top-p``); None = ``rollout_top_p``, as in THUDM/slime."""
    eval_max_response_len: int | None = None
    """Cap on response tokens of an eval sample (``--eval-max-response-len``); None = ``rollout_max_response_len``."""
    eval_top_k: int | None = None
    """Top-k of evaluation (``--eval-top-k``); None = ``rollout_top_k``, as ``eval_top_p``. -1 = the whole vocabulary."""

    @property
    def resolved_eval_top_k(self) -> int:
        return self.rollout_top_k if self.eval_top_k is None else self.eval_top_k

    @property
    def resolved_eval_top_p(self) -> float:
        return self.rollout_top_p if self.eval_top_p is None else self.eval_top_p

    @property
    def resolved_eval_max_response_len(self) -> int:
        return self.rollout_max_response_len if self.eval_max_response_len is None else self.eval_max_response_len


class LoopConfig(msgspec.Struct, **_STRUCT):
    mode: Literal["sync", "april", "async"] = "sync"
    """``sync``: wait for every sample (baseline). ``april``: over-provision, abort at target,
    recycle partials (``--partial-rollout`` selects it). ``async``: generation never stops; weights
    are updated in flight (pause in place, update, continue)."""
    rollout_batch_size: int = 16
    """Groups per training batch (``--rollout-batch-size``)."""
    over_sampling_batch_size: int = 32
    """Groups in flight in ``april`` mode (``--over-sampling-batch-size``); >= rollout_batch_size."""
    num_rollout: int = 50
    """Rollout steps (= policy updates of the version counter) (``--num-rollout``)."""
    n_samples_per_prompt: int = 8
    max_staleness: int = 4
    """Bound on version lag (AReaL's eta, ``--max-staleness``): admission control starts no group
    that could only be trained more than this many versions after its first token, and tokens
    older than this at consumption are handled by ``staleness_policy``."""
    staleness_policy: Literal["mask", "drop"] = "mask"
    """Over-stale tokens at consumption: mask them out of the loss, or drop their whole group
    (``--staleness-policy``)."""
    dynamic_sampling_filter_path: str | None = None
    """``pkg.module.func(group) -> bool`` keeping a finished group, or
    ``slime.loop.filters.nonzero_reward_std`` (``--dynamic-sampling-filter-path``)."""
    buffer_filter_path: str | None = None
    """``pkg.module.func(rollout_id, partial_groups, num) -> list[Group]`` choosing which partial
    groups resume next; default: oldest version first (``--buffer-filter-path``)."""
    abort_timeout_s: float = 30.0
    """How long stopping a step may wait for aborted requests to come back."""
    overlap_train: bool = False
    """April mode: after aborting the stragglers at the target, keep generating (partials first)
    while the trainer works (``--overlap-train``). Off by default: classic APRIL, where the
    engines idle during the train step and every token trained is at most one update old at its
    first token's abort."""
    eval_interval: int = 0
    """Evaluate every N rollout steps; 0 = only before and after (``--eval-interval``)."""
    skip_eval_before_train: bool = False
    """No eval before the first step (``--skip-eval-before-train``, THUDM/slime's); the later ones stay."""
    num_epoch: int | None = None
    """SFT: train this many passes over ``--prompt-data`` (``--num-epoch``, THUDM/slime's flag):
    ``num_rollout = num_epoch * rows // rollout_batch_size``, replacing ``--num-rollout``. None = use
    ``--num-rollout``. RL runs refuse it."""
    buffer_capacity: int | None = None
    """Ready + partial groups the data buffer holds (``--buffer-capacity``); beyond it the oldest
    partial groups are evicted, counted and lost on purpose. None = no bound."""
    offline_ratio: float = 0.0
    """Fraction of each batch's groups taken from ``--offline-data`` (``--offline-ratio``), in [0, 1);
    exact over batches (after k batches, floor(k * rollout_batch_size * ratio) offline groups)."""

    @property
    def online_groups_per_batch(self) -> int:
        """Fewest online groups a batch takes: rollout_batch_size - ceil(rollout_batch_size * offline_ratio),
        at least 1 (the B of admission control). Example: 4 groups, ratio 0.3 -> 4 - ceil(1.2) = 2."""
        return max(1, self.rollout_batch_size - math.ceil(self.rollout_batch_size * self.offline_ratio - 1e-9))


class MegatronConfig(msgspec.Struct, **_STRUCT):
    """The megatron-core backend's knobs (``--train-backend megatron``), spelled as Megatron-LM's flags.

    Algorithm, batch sizes, lr, weight decay, Adam betas and gradient clipping stay in
    ``TrainConfig`` and are shared with the torch backend; ``slime/train/megatron/parallel.py``
    maps both onto megatron-core's ``TransformerConfig``, ``OptimizerConfig`` and
    ``DistributedDataParallelConfig``. World size is only known under torchrun, so products of
    parallel sizes are checked there, not here.
    """

    tensor_model_parallel_size: int = 1
    """Tensor-parallel ranks per model replica (``--tensor-model-parallel-size``)."""
    pipeline_model_parallel_size: int = 1
    """Pipeline stages (``--pipeline-model-parallel-size``): megatron-core's 1F1B schedule over
    consecutive layers (must divide the layer count; dense models only)."""
    context_parallel_size: int = 1
    """Context-parallel ranks (``--context-parallel-size``): each sequence split over them in
    2 x CP load-balanced chunks, K/V all-gathered in attention (``slime.train.megatron.context_parallel``;
    dense models only)."""
    expert_model_parallel_size: int = 1
    """Expert-parallel ranks (``--expert-model-parallel-size``): an MoE layer's routed experts are
    split evenly over them (must divide ``num_experts``); > 1 only for MoE models."""
    expert_tensor_parallel_size: int | None = None
    """Tensor-parallel ranks inside one expert (``--expert-tensor-parallel-size``): each expert's
    SwiGLU width is split over them. None = ``tensor_model_parallel_size`` (Megatron-LM's default)."""
    moe_token_dispatcher_type: Literal["alltoall", "allgather"] = "alltoall"
    """How routed tokens reach the expert-parallel rank holding their expert
    (``--moe-token-dispatcher-type``): all-to-all of only the routed tokens, or an all-gather of
    every token (megatron-core's two dispatchers that run without Transformer Engine)."""
    moe_router_load_balancing_type: Literal["aux_loss", "none"] = "aux_loss"
    """Load-balancing loss added to the router's gradient (``--moe-router-load-balancing-type``):
    Switch Transformer's (arXiv 2101.03961) over each micro-batch, or "none". Takes effect only
    with ``moe_aux_loss_coeff`` > 0; the unscaled value is logged either way. (megatron's
    "seq_aux_loss" is left out: on slime's packed micro-batches it would see one sequence.)"""
    moe_aux_loss_coeff: float = 0.0
    """Weight of the load-balancing loss (``--moe-aux-loss-coeff``); 0 = not trained, only logged.
    Averaged over the optimizer step's tokens, as the RL loss is."""
    moe_expert_capacity_factor: float | None = None
    """Expert capacity, in multiples of the even share ``tokens * topk / num_experts``
    (``--moe-expert-capacity-factor``); tokens over capacity are dropped (lowest routing
    probability first) and counted in ``moe_dropped_token_frac``. None = dropless."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism over the tensor-parallel group (``--sequence-parallel``)."""
    use_dynamic_batch_size: bool = False
    """Pack micro-batches by ``max_tokens_per_gpu`` instead of ``micro_batch_size`` samples
    (``--use-dynamic-batch-size``). Also read by the torch backend, whose micro-batches are padded:
    there the budget bounds samples x longest sample of each micro-batch (``slime.train.batch.pack_by_token_budget``)."""
    max_tokens_per_gpu: int = 16384
    """Token budget of one packed micro-batch on one GPU (``--max-tokens-per-gpu``); a longer
    sample gets a micro-batch of its own."""
    min_lr: float = 0.0
    """Floor of the decayed learning rate (``--min-lr``)."""
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root"] = "constant"
    """Learning-rate schedule over optimizer steps (``--lr-decay-style``), megatron-core's
    ``OptimizerParamScheduler``; the torch backend follows it too (``slime.train.lr_schedule``), as it
    does ``--min-lr``, ``--lr-warmup-iters`` and ``--lr-decay-iters``."""
    lr_warmup_iters: int = 0
    """Linear warm-up, in optimizer steps (``--lr-warmup-iters``)."""
    lr_warmup_fraction: float | None = None
    """Warm-up as a fraction of the decay steps (``--lr-warmup-fraction``, Megatron's): when the run's
    optimizer steps are known, ``lr_warmup_iters = round(fraction x (lr_decay_iters or the run's
    optimizer steps))`` (``slime.train.lr_schedule.resolve_lr_schedule``)."""
    lr_decay_iters: int | None = None
    """Optimizer steps over which lr decays to ``min_lr`` (``--lr-decay-iters``); None = no decay."""
    adam_eps: float = 1e-8
    """Adam epsilon (``--adam-eps``)."""
    bf16: bool = False
    """bf16 training (``--bf16``); off = fp32. megatron: bf16 parameters and activations, fp32 master
    weights and grads. torch backend: fp32 parameters, grads and AdamW state (the master weights),
    forward and backward under ``torch.autocast(dtype=torch.bfloat16)``."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state over data-parallel ranks (``--use-distributed-optimizer``)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduce with the backward pass (``--overlap-grad-reduce``)."""
    recompute_granularity: Literal["full", "selective"] | None = None
    """Activation recomputation (``--recompute-granularity``); None = keep all activations."""
    recompute_method: Literal["uniform", "block"] | None = None
    """With ``full`` recompute: how layers are grouped (``--recompute-method``)."""
    recompute_num_layers: int | None = None
    """With ``full`` recompute: layers per group (uniform) or recomputed layers per stage (block)
    (``--recompute-num-layers``)."""
    distributed_timeout_minutes: int = 30
    """Timeout of collective operations between train ranks (``--distributed-timeout-minutes``)."""

    @property
    def resolved_expert_tensor_parallel_size(self) -> int:
        """``expert_tensor_parallel_size``, or the TP size when it is None."""
        etp = self.expert_tensor_parallel_size
        return self.tensor_model_parallel_size if etp is None else etp


class TrainConfig(msgspec.Struct, **_STRUCT):
    lr: float = 1e-5
    global_batch_size: int = 128
    """Samples per optimizer step (``--global-batch-size``)."""
    micro_batch_size: int = 32
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    clip_grad: float = 1.0
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    """Upper clip (clip-higher, DAPO); None = eps_clip."""
    use_tis: bool = False
    """Token-level truncated importance sampling between trainer and rollout logprobs (``--use-tis``)."""
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    deterministic_mode: bool = False
    """Deterministic trainer kernels and seed (``--deterministic-mode``, Megatron's;
    ``slime.train.determinism``). The engines are not covered: ``--sglang-enable-deterministic-inference``."""
    tis_level: Literal["token", "sequence", "geometric"] = "token"
    """Where the TIS ratio is taken (``--tis-level``, THUDM/slime's): per token, or one ratio per
    sample from its trained tokens' log ratios summed (``sequence``) or averaged (``geometric``),
    then truncated to [tis_clip_low, tis_clip] (``slime.train.offpolicy.tis_weights``)."""
    loss_agg: Literal["seq_mean", "token_mean"] = "seq_mean"
    """Loss aggregation: mean over each sample's tokens then over samples (slime's default), or
    one mean over every token of the step (``--calculate-per-token-loss``, DAPO)."""
    rollout_temperature: float = 1.0
    """Logits are divided by this before log_softmax, as SGLang does for returned logprobs."""
    max_staleness: int = 4
    num_threads: int = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the torch backend trains (``--train-device``): ``auto`` = the current CUDA device when
    torch sees one, else the CPU; ``cuda`` fails without one. The megatron backend always trains on
    CUDA (``cpu`` is refused with it)."""
    seed: int = 1234
    # Algorithm set and off-policy corrections (slime/train/; flag mapping in slime/cli_args.py).
    advantage_estimator: Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo", "gae"] = "grpo"
    """``--advantage-estimator``: GRPO, GSPO (sequence-level ratio and clip), REINFORCE++ (discounted
    return, batch-whitened), REINFORCE++-baseline (group mean baseline, batch-whitened), or PPO with a
    critic and GAE (``ppo``, slime's name; ``gae`` is the same). See slime/train/advantages.py."""
    disable_grpo_std_normalization: bool = False
    """GRPO/GSPO: only centre rewards on the group mean, no division by the group std (Dr. GRPO,
    arXiv 2503.20783) (``--disable-grpo-std-normalization``)."""
    normalize_advantages: bool = False
    """Whiten GRPO/GSPO/PPO advantages over the step's trained tokens (``--normalize-advantages``);
    REINFORCE++ and its baseline variant are always whitened."""
    gamma: float = 1.0
    """Per-token discount of REINFORCE++ returns and GAE (``--gamma``), in [0, 1]."""
    lambd: float = 1.0
    """GAE lambda (``--lambd``), in [0, 1]."""
    kl_coef: float = 0.0
    """KL-to-reference penalty folded into the per-token rewards of REINFORCE++(-baseline) and PPO
    (``--kl-coef``), estimator ``kl_loss_type``; ignored by GRPO/GSPO, as in slime. >= 0."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef * KL(policy || reference)`` to the loss (``--use-kl-loss``)."""
    kl_loss_coef: float = 0.0
    """Weight of the KL loss (``--kl-loss-coef``), >= 0; 0 with ``use_kl_loss`` reports it only."""
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = "k1"
    """Per-token KL estimator (``--kl-loss-type``); ``low_var_kl`` is k3 clamped to [-10, 10]."""
    ref_load: str | None = None
    """HF directory of the frozen reference model (``--ref-load``); None = the initial checkpoint."""
    entropy_coef: float = 0.0
    """Entropy bonus: loss -= entropy_coef * mean entropy (``--entropy-coef``), >= 0."""
    eps_clip_c: float | None = None
    """Dual-clip PPO constant c > 1: for A < 0 the loss is capped at -c * A (``--eps-clip-c``); None = off."""
    value_clip: float = 0.2
    """PPO critic: new values stay within old +- value_clip in the clipped value loss (``--value-clip``), > 0."""
    critic_lr: float | None = None
    """PPO critic learning rate (``--critic-lr``); None = ``lr``."""
    mis_level: Literal["none", "token", "sequence", "geometric"] = "none"
    """Masked importance sampling of exp(old_logp - rollout_logp) (``--mis-level``): mask tokens
    (token) or whole samples (sequence: product of ratios; geometric: geometric mean) whose ratio
    is outside [mis_lower_bound, mis_upper_bound]; weight the rest by the ratio."""
    mis_lower_bound: float = 0.5
    """MIS lower bound (``--mis-lower-bound``), in [0, mis_upper_bound]."""
    mis_upper_bound: float = 2.0
    """MIS upper bound (``--mis-upper-bound``)."""
    use_decoupled_ppo: bool = False
    """Decoupled PPO (Hilton et al. 2021; AReaL): clip around the trainer's pre-step policy and weight
    each token by exp(old_logp - rollout_logp) (``--use-decoupled-ppo``)."""
    behav_imp_weight_cap: float | None = None
    """Decoupled PPO: drop tokens whose behaviour weight exceeds this cap, > 1 (``--behav-imp-weight-cap``)."""
    mask_offpolicy_in_partial_rollout: bool = False
    """Train only the tokens of each sample's newest policy version (``--mask-offpolicy-in-partial-rollout``)."""
    use_opd: bool = False
    """On-policy distillation (``--use-opd``, THUDM/slime's flag): a teacher engine scores every finished
    sample (``slime.rollout.opd``; the teacher comes from ``--opd-teacher-load``, ``--opd-teacher-addrs``
    or a ``model: teacher`` group of ``--sglang-config``) and each trained token's advantage gets
    ``-opd_kl_coef * (old_logp - teacher_logp)`` on top of the estimator's (``slime.train.objective``)."""
    opd_kl_coef: float = 1.0
    """Weight of the per-token reverse KL in the advantage (``--opd-kl-coef``, slime's default 1.0), >= 0;
    next to the task advantage it sets the mix."""
    opd_only: bool = False
    """Pure distillation (``--opd-only``, needs ``--use-opd``): the advantage is the reverse-KL term alone.
    The task reward is still computed, logged (``reward_mean``, ``accuracy``) and used by eval; it just
    does not train (every estimator sees reward 0). THUDM/slime gets the same with a reward function
    that returns 0, which also zeroes what its logs show."""
    custom_reward_post_process_path: str | None = None
    """THUDM/slime's ``--custom-reward-post-process-path``, accepted only with ``use_opd``, where it is a
    no-op: slime's on-policy-distillation example uses it to move the teacher's logprobs from the reward
    payload onto the samples, which ``slime.rollout.opd`` does here (``slime.cli_args.apply_slime_opd``)."""
    loss_type: Literal["policy_loss", "sft_loss"] = "policy_loss"
    """``--loss-type`` (THUDM/slime's flag): ``policy_loss`` (RL, the objective above) or ``sft_loss``
    (supervised fine-tuning: masked negative log-likelihood of the loss-mask tokens, aggregated by
    ``loss_agg``; no rollouts, rewards, advantages or reference model). ``sft_loss`` makes ``slime
    train`` an SFT run (``slime.loop.sft``)."""
    train_backend: Literal["torch", "megatron"] = "torch"
    """``torch``: one HF model in this process (CPU or one GPU, ``--train-device``). ``megatron``: megatron-core's GPTModel
    with TP/DP under torchrun, rank 0 hosting the loop (``--train-backend``; slime/train/megatron/)."""
    megatron: MegatronConfig = MegatronConfig()
    """The megatron-core backend's parallelism, precision, schedule and packing knobs."""
    actor_num_nodes: int | None = None
    """Nodes of the trainer's torchrun job (``--actor-num-nodes``, THUDM/slime's flag; ``--nnodes``); None = 1.
    More than one needs ``--train-backend megatron``. See ``slime.engines.fleet.placement``."""
    actor_num_gpus_per_node: int | None = None
    """Trainer ranks (GPUs) per node (``--actor-num-gpus-per-node``; torchrun's ``--nproc-per-node``, checked
    against ``LOCAL_WORLD_SIZE``); None = torchrun's own count. With ``--colocate`` it also sets the default
    ``--rollout-num-gpus`` (nodes x GPUs per node), as in THUDM/slime."""


class SyncConfig(msgspec.Struct, **_STRUCT):
    """How new weights reach the engines after each train step (``slime/sync/``)."""

    method: Literal["disk", "distributed", "tensor", "delta"] = "disk"
    """``--weight-sync``: ``disk`` (safetensors + ``/update_weights_from_disk``), ``distributed``
    (broadcast over a gloo/NCCL group, ``/update_weights_from_distributed``), ``tensor`` (colocated:
    ``/update_weights_from_tensor``), ``delta`` (only what changed, checksummed; embedded engine)."""
    update_weight_buffer_size: int = 512 * 1024**2
    """Bytes per bucket of ``distributed`` / ``tensor`` / ``delta`` updates (``--update-weight-buffer-size``,
    slime's default 512 MiB): one HTTP call (and one flat broadcast) per bucket."""
    update_weights_timeout_s: float = 600.0
    """Bound on each weight-update HTTP call, the process-group rendezvous and each collective."""
    colocate: bool = False
    """Engines share the trainer's devices (``--colocate``): each step pauses generation, releases
    engine memory, trains, resumes it and syncs (``/release_memory_occupation``, docs/sglang.md#memory). Launched
    SGLang servers then get the trainer's GPUs and ``--enable-memory-saver`` (``sglang_launch.py``)."""
    weights_dir: str = ""
    """Where new safetensors are written for ``/update_weights_from_disk`` (default: RUN_DIR/weights)."""
    keep_last: int = 2
    """How many weight versions to keep on disk."""


class EngineConfig(msgspec.Struct, **_STRUCT):
    hf_checkpoint: str = ""
    """HF model directory the engines and the trainer start from (``--hf-checkpoint``)."""
    rollout_external_engine_addrs: tuple[str, ...] = ()
    """Engines that already run (``--rollout-external-engine-addrs``); empty = launch embedded ones."""
    num_engines: int = 1
    """Embedded engines to launch (``--rollout-num-engines``)."""
    max_running_requests: int = 256
    engine_threads: int = 1
    """torch threads per embedded engine."""
    startup_timeout_s: float = 120.0
    """Bound on one engine's (or router's) start, and on a restarted engine's return."""
    # Real SGLang (slime/engines/fleet/plan.py): launched from these, or attached to.
    rollout_num_gpus: int | None = None
    """GPUs for SGLang servers (``--rollout-num-gpus``); set (or ``sglang_config``) = launch SGLang instead
    of embedded engines; engines = rollout_num_gpus / rollout_num_gpus_per_engine."""
    rollout_num_gpus_per_engine: int = 1
    """GPUs (= ``--tp-size``) per SGLang server (``--rollout-num-gpus-per-engine``)."""
    rollout_num_gpus_per_node: int | None = None
    """GPUs of each node the placement lays servers (and trainer ranks) on (``--rollout-num-gpus-per-node``,
    THUDM/slime's); None = ``len(CUDA_VISIBLE_DEVICES)``, else 8 (``slime.engines.fleet.placement``)."""
    sglang_args: tuple[str, ...] = ()
    """Every ``--sglang-X ...`` flag of ``slime train``, prefix stripped (``--X ...``), values untouched,
    in order: appended to each ``sglang.launch_server`` command."""
    router_args: tuple[str, ...] = ()
    """Every ``--router-X ...`` flag, prefix stripped, for ``sglang_router.launch_router``."""
    sglang_router_ip: str | None = None
    """A router that already runs (``--sglang-router-ip``), or the address ours binds."""
    sglang_router_port: int | None = None
    """Its port (``--sglang-router-port``); None = a free port from ``base_port``."""
    sglang_config: str | None = None
    """YAML of server groups: models, roles (prefill/decode), per-group args (``--sglang-config``)."""
    base_port: int = 15000
    """First port tried for launched servers and routers (taken ports are skipped)."""
    health_check_interval_s: float = 10.0
    """Seconds between ``/health_generate`` probes of each engine (``--health-check-interval-s``); 0 = off."""
    health_check_timeout_s: float = 30.0
    """Bound on one probe (SGLang answers 503 after its own 20 s, docs/sglang.md#health)."""
    circuit_breaker_threshold: int = 3
    """Consecutive failures (requests or probes) that open an engine's circuit breaker."""
    circuit_breaker_cooldown_s: float = 10.0
    """First wait before a probe of an open breaker; doubles per failed probe, up to 8x."""
    max_engine_restarts: int = 3
    """Restarts of one launched engine before it stays out of rotation for the rest of the run."""
    opd_teacher_load: str | None = None
    """HF directory of the on-policy-distillation teacher (``--opd-teacher-load``): one embedded engine
    serving it is launched beside the actor's (its own pool, ``model: teacher``, never weight-synced).
    With SGLang servers, declare the teacher as a ``model: teacher`` group of ``--sglang-config`` instead."""
    opd_teacher_addrs: tuple[str, ...] = ()
    """Teacher engines (or one router) that already run, ``host:port`` or URLs (``--opd-teacher-addrs``)."""


class ObsConfig(msgspec.Struct, **_STRUCT):
    """What the run shows and records beyond metrics.jsonl (``slime/obs/``)."""

    enable_trace: bool = False
    """Write a Chrome/Perfetto trace of requests, rewards, train steps, weight syncs and evals to
    ``RUN_DIR/trace.json`` (``--enable-trace``)."""
    trace_flush_interval_s: float = 5.0
    """How often new trace events are appended to the file (a crash keeps all but the last interval)."""
    metrics_port: int | None = None
    """Serve Prometheus ``/metrics`` from the driver on this port (``--metrics-port``); None = off,
    0 = any free port (logged at start)."""
    metrics_host: str = "0.0.0.0"
    """Address the ``/metrics`` server binds (all interfaces, like prometheus_client's own server)."""
    use_tensorboard: bool = False
    """Log every scalar of each step record to TensorBoard (``--use-tensorboard``)."""
    tb_dir: str = ""
    """TensorBoard log directory (``--tb-dir``); empty = ``RUN_DIR/tb``."""
    use_wandb: bool = False
    """Log every scalar of each step record to Weights & Biases (``--use-wandb``; needs ``wandb``)."""
    wandb_project: str | None = None
    """W&B project (``--wandb-project``); None = W&B's default."""
    wandb_group: str | None = None
    """W&B run group (``--wandb-group``)."""


class DebugConfig(msgspec.Struct, **_STRUCT):
    """Record and replay of rollouts, and the one-sided runs (THUDM/slime's debug flags).

    Record and replay paths are templates with ``{rollout_id}``, the 1-based step number (the
    ``step`` of metrics.jsonl), e.g. ``runs/x/rollout_{rollout_id}.msgpack``.
    """

    save_debug_rollout_data: str | None = None
    """Write each step's groups, as taken for training (before staleness masking), to this template
    (``--save-debug-rollout-data``): msgpack of ``slime.loop.record.RolloutRecord``."""
    load_debug_rollout_data: str | None = None
    """Train on recorded groups, step by step, with no engine (``--load-debug-rollout-data``; implies
    ``debug_train_only``)."""
    debug_rollout_only: bool = False
    """Generate and reward, never train: weights never change (``--debug-rollout-only``, ``slime rollout``)."""
    debug_train_only: bool = False
    """Train only, on ``load_debug_rollout_data``: no engine, no generation, no eval, no weight sync
    (``--debug-train-only``)."""

    @property
    def train_only(self) -> bool:
        return self.debug_train_only or self.load_debug_rollout_data is not None


class Config(msgspec.Struct, **_STRUCT):
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    loop: LoopConfig = LoopConfig()
    train: TrainConfig = TrainConfig()
    sync: SyncConfig = SyncConfig()
    engine: EngineConfig = EngineConfig()
    obs: ObsConfig = ObsConfig()
    debug: DebugConfig = DebugConfig()
    run_dir: str = "runs/latest"
    """Run directory: metrics, summary, plots, weights, checkpoints (``--save``)."""
    save_interval: int = 0
    """Checkpoint every N rollout steps into RUN_DIR/checkpoints (``--save-interval``); 0 = never."""
    load: str | None = None
    """Resume from this run directory's latest checkpoint (``--load``); usually the same as ``--save``."""
    seed: int = 1234

    def validate(self) -> Config:
        """Check values; raise ``ConfigError`` naming the CLI flag (or, for ``SHARED_FIELDS`` that
        disagree, both fields and their values). Returns self."""
        disagreements = [f"{copy}={got!r} disagrees with {owner}={want!r}"
                         for owner, copies in SHARED_FIELDS.items() for want in [_field(self, owner)]
                         for copy in copies if (got := _field(self, copy)) != want]
        if disagreements:  # all of them at once: a Config built in Python may have several
            raise ConfigError("; ".join(disagreements) + ": each pair holds the same fact and must be equal "
                              "(the CLI sets both from one flag)")
        t = self.train
        m = self.train.megatron
        checks = [
            (self.loop.rollout_batch_size >= 1, "--rollout-batch-size", self.loop.rollout_batch_size, ">= 1"),
            (
                self.loop.over_sampling_batch_size >= self.loop.rollout_batch_size or self.train.loss_type == "sft_loss",
                "--over-sampling-batch-size",
                self.loop.over_sampling_batch_size,
                f">= --rollout-batch-size ({self.loop.rollout_batch_size})",
            ),
            (self.rollout.n_samples_per_prompt >= 1, "--n-samples-per-prompt", self.rollout.n_samples_per_prompt, ">= 1"),
            (self.rollout.rollout_max_response_len >= 1, "--rollout-max-response-len", self.rollout.rollout_max_response_len, ">= 1"),
            (self.rollout.rollout_temperature > 0, "--rollout-temperature", self.rollout.rollout_temperature, "> 0 for RL"),
            (0 < self.rollout.rollout_top_p <= 1, "--rollout-top-p", self.rollout.rollout_top_p, "in (0, 1]"),
            (self.loop.num_rollout >= 0, "--num-rollout", self.loop.num_rollout, ">= 0"),
            (self.train.lr > 0, "--lr", self.train.lr, "> 0"),
            (self.train.global_batch_size >= 1, "--global-batch-size", self.train.global_batch_size, ">= 1"),
            (self.train.micro_batch_size >= 1, "--micro-batch-size", self.train.micro_batch_size, ">= 1"),
            (self.train.eps_clip > 0, "--eps-clip", self.train.eps_clip, "> 0"),
            (self.train.eps_clip_high is None or self.train.eps_clip_high >= 0, "--eps-clip-high", self.train.eps_clip_high, ">= 0"),
            (0 <= self.train.tis_clip_low <= self.train.tis_clip, "--tis-clip-low", self.train.tis_clip_low, f"in [0, --tis-clip={self.train.tis_clip}]"),
            (t.tis_level == "token" or t.use_tis, "--tis-level", t.tis_level, "used with --use-tis (without it there is no TIS weight)"),
            (self.train.clip_grad >= 0, "--clip-grad", self.train.clip_grad, ">= 0 (0 = no clipping)"),
            (self.train.num_threads >= 1, "--train-threads", self.train.num_threads, ">= 1"),
            (not (t.train_backend == "megatron" and t.device == "cpu"), "--train-device", t.device, "auto or cuda with --train-backend megatron (CUDA only)"),
            (self.train.micro_batch_size <= self.train.global_batch_size, "--micro-batch-size", self.train.micro_batch_size, f"<= --global-batch-size ({self.train.global_batch_size})"),
            (t.eps_clip_c is None or t.eps_clip_c > 1.0, "--eps-clip-c", t.eps_clip_c, "> 1 (dual clip), or unset"),
            (0.0 <= t.gamma <= 1.0, "--gamma", t.gamma, "in [0, 1]"),
            (0.0 <= t.lambd <= 1.0, "--lambd", t.lambd, "in [0, 1]"),
            (t.kl_coef >= 0, "--kl-coef", t.kl_coef, ">= 0"),
            (t.kl_loss_coef >= 0, "--kl-loss-coef", t.kl_loss_coef, ">= 0"),
            (t.opd_kl_coef >= 0, "--opd-kl-coef", t.opd_kl_coef, ">= 0"),
            (not (self.engine.opd_teacher_load and self.engine.opd_teacher_addrs), "--opd-teacher-load with --opd-teacher-addrs",
             f"{self.engine.opd_teacher_load!r} and {list(self.engine.opd_teacher_addrs)}", "one teacher: launch one or attach to running ones"),
            (t.entropy_coef >= 0, "--entropy-coef", t.entropy_coef, ">= 0"),
            (t.value_clip > 0, "--value-clip", t.value_clip, "> 0"),
            (t.critic_lr is None or t.critic_lr > 0, "--critic-lr", t.critic_lr, "> 0, or unset (= --lr)"),
            (0 <= t.mis_lower_bound <= t.mis_upper_bound, "--mis-lower-bound", t.mis_lower_bound, f"in [0, --mis-upper-bound={t.mis_upper_bound}]"),
            (t.behav_imp_weight_cap is None or t.behav_imp_weight_cap > 1.0, "--behav-imp-weight-cap", t.behav_imp_weight_cap, "> 1, or unset"),
            (
                t.use_tis + (t.mis_level != "none") + t.use_decoupled_ppo <= 1,
                "--use-tis / --mis-level / --use-decoupled-ppo",
                f"use_tis={t.use_tis}, mis_level={t.mis_level}, use_decoupled_ppo={t.use_decoupled_ppo}",
                "at most one off-policy correction",
            ),
            (self.loop.max_staleness >= 0, "--max-staleness", self.loop.max_staleness, ">= 0"),
            (self.loop.buffer_capacity is None or self.loop.buffer_capacity >= 1, "--buffer-capacity", self.loop.buffer_capacity, ">= 1, or unset"),
            (0.0 <= self.loop.offline_ratio < 1.0, "--offline-ratio", self.loop.offline_ratio, "in [0, 1)"),
            (self.rollout.n_samples_per_eval_prompt >= 1, "--n-samples-per-eval-prompt", self.rollout.n_samples_per_eval_prompt, ">= 1"),
            (self.rollout.eval_temperature >= 0, "--eval-temperature", self.rollout.eval_temperature, ">= 0 (0 = greedy)"),
            (self.rollout.rollout_max_context_len is None or self.rollout.rollout_max_context_len >= 2, "--rollout-max-context-len",
             self.rollout.rollout_max_context_len, ">= 2 (a prompt token and a response token), or unset"),
            (self.rollout.eval_top_k is None or self.rollout.eval_top_k == -1 or self.rollout.eval_top_k >= 1, "--eval-top-k",
             self.rollout.eval_top_k, ">= 1, or -1 (the whole vocabulary)"),
            (self.rollout.eval_top_p is None or 0 < self.rollout.eval_top_p <= 1, "--eval-top-p", self.rollout.eval_top_p, "in (0, 1]"),
            (self.rollout.eval_max_response_len is None or self.rollout.eval_max_response_len >= 1, "--eval-max-response-len",
             self.rollout.eval_max_response_len, ">= 1"),
            (bool(self.data.eval_datasets) or self.data.eval_prompt_data is None, "--eval-prompt-data", self.data.eval_prompt_data,
             "one path or 'name path' pairs"),
            (self.sync.update_weight_buffer_size >= 1, "--update-weight-buffer-size", self.sync.update_weight_buffer_size, ">= 1 byte"),
            (self.sync.update_weights_timeout_s > 0, "update_weights_timeout_s", self.sync.update_weights_timeout_s, "> 0"),
            (not (self.sync.colocate and self.sync.method == "delta"), "--colocate with --weight-sync", self.sync.method,
             "disk, distributed or tensor: released engine weights are lost (docs/sglang.md#memory), so every delta would be a full sync"),
            (not (self.sync.colocate and self.loop.mode == "async"), "--colocate with --rollout-mode", self.loop.mode,
             "sync or april: colocated engines cannot generate while the trainer trains"),
            (m.tensor_model_parallel_size >= 1, "--tensor-model-parallel-size", m.tensor_model_parallel_size, ">= 1"),
            (m.pipeline_model_parallel_size >= 1, "--pipeline-model-parallel-size", m.pipeline_model_parallel_size, ">= 1"),
            (m.context_parallel_size >= 1, "--context-parallel-size", m.context_parallel_size, ">= 1"),
            (m.expert_model_parallel_size >= 1, "--expert-model-parallel-size", m.expert_model_parallel_size, ">= 1"),
            (m.expert_tensor_parallel_size is None or m.expert_tensor_parallel_size >= 1, "--expert-tensor-parallel-size", m.expert_tensor_parallel_size, ">= 1, or unset (= --tensor-model-parallel-size)"),
            (m.moe_aux_loss_coeff >= 0, "--moe-aux-loss-coeff", m.moe_aux_loss_coeff, ">= 0"),
            (m.moe_expert_capacity_factor is None or m.moe_expert_capacity_factor > 0, "--moe-expert-capacity-factor", m.moe_expert_capacity_factor, "> 0, or unset (dropless)"),
            (m.max_tokens_per_gpu >= 1, "--max-tokens-per-gpu", m.max_tokens_per_gpu, ">= 1"),
            (m.min_lr >= 0, "--min-lr", m.min_lr, ">= 0"),
            (self.data.rollout_max_prompt_len is None or self.data.rollout_max_prompt_len >= 1, "--rollout-max-prompt-len",
             self.data.rollout_max_prompt_len, ">= 1, or unset"),
            (m.lr_warmup_iters >= 0, "--lr-warmup-iters", m.lr_warmup_iters, ">= 0"),
            (m.lr_warmup_fraction is None or 0 <= m.lr_warmup_fraction < 1, "--lr-warmup-fraction", m.lr_warmup_fraction, "in [0, 1)"),
            (m.lr_warmup_fraction is None or m.lr_warmup_iters == 0, "--lr-warmup-fraction with --lr-warmup-iters",
             f"{m.lr_warmup_fraction} and {m.lr_warmup_iters}", "one of them (as in Megatron)"),
            (m.lr_decay_iters is None or m.lr_decay_iters >= 1, "--lr-decay-iters", m.lr_decay_iters, ">= 1, or unset"),
            (m.adam_eps > 0, "--adam-eps", m.adam_eps, "> 0"),
            (m.recompute_num_layers is None or m.recompute_num_layers >= 1, "--recompute-num-layers", m.recompute_num_layers, ">= 1, or unset"),
            (m.distributed_timeout_minutes >= 1, "--distributed-timeout-minutes", m.distributed_timeout_minutes, ">= 1"),
            (self.rollout.request_timeout_s > 0, "--request-timeout-s", self.rollout.request_timeout_s, "> 0"),
            (self.rollout.reward_timeout_s > 0, "--reward-timeout-s", self.rollout.reward_timeout_s, "> 0"),
            (self.rollout.max_retries >= 0, "--max-retries", self.rollout.max_retries, ">= 0"),
            (self.save_interval >= 0, "--save-interval", self.save_interval, ">= 0"),
            (self.engine.num_engines >= 1, "--rollout-num-engines", self.engine.num_engines, ">= 1"),
            (self.engine.rollout_num_gpus is None or self.engine.rollout_num_gpus >= 1, "--rollout-num-gpus", self.engine.rollout_num_gpus, ">= 1"),
            (self.engine.rollout_num_gpus_per_node is None or self.engine.rollout_num_gpus_per_node >= 1, "--rollout-num-gpus-per-node",
             self.engine.rollout_num_gpus_per_node, ">= 1, or unset"),
            (self.engine.rollout_num_gpus_per_engine >= 1, "--rollout-num-gpus-per-engine", self.engine.rollout_num_gpus_per_engine, ">= 1"),
            (t.actor_num_nodes is None or t.actor_num_nodes >= 1, "--actor-num-nodes", t.actor_num_nodes, ">= 1"),
            (t.actor_num_gpus_per_node is None or t.actor_num_gpus_per_node >= 1, "--actor-num-gpus-per-node", t.actor_num_gpus_per_node, ">= 1"),
            (self.engine.health_check_interval_s >= 0, "--health-check-interval-s", self.engine.health_check_interval_s, ">= 0 (0 = off)"),
            (self.obs.metrics_port is None or 0 <= self.obs.metrics_port <= 65535, "--metrics-port", self.obs.metrics_port, "in [0, 65535] (0 = any free port)"),
            (self.obs.trace_flush_interval_s >= 0, "trace_flush_interval_s", self.obs.trace_flush_interval_s, ">= 0"),
        ]
        for ok, flag, value, want in checks:
            if not ok:
                raise ConfigError(f"{flag}={value!r} is invalid: expected {want}")
        if self.loop.num_epoch is not None and self.loop.num_epoch < 1:
            raise ConfigError(f"--num-epoch={self.loop.num_epoch!r} is invalid: expected >= 1, or unset")
        if self.train.loss_type == "sft_loss":  # one sample per data row: --n-samples-per-prompt does not apply
            if self.loop.rollout_batch_size % self.train.global_batch_size != 0:
                raise ConfigError(f"--global-batch-size={self.train.global_batch_size} must divide --rollout-batch-size="
                                  f"{self.loop.rollout_batch_size} (SFT rows per step)")
            return self
        if self.loop.num_epoch is not None:
            raise ConfigError("--num-epoch: only with --loss-type sft_loss (RL runs count steps with --num-rollout)")
        samples = self.loop.rollout_batch_size * self.rollout.n_samples_per_prompt
        if samples % self.train.global_batch_size != 0 and not self.debug.debug_rollout_only:  # nothing trains in a rollout-only run
            raise ConfigError(
                f"--global-batch-size={self.train.global_batch_size} must divide --rollout-batch-size x "
                f"--n-samples-per-prompt = {self.loop.rollout_batch_size} x {self.rollout.n_samples_per_prompt} = {samples}"
            )
        return self


def _field(config: Config, path: str) -> object:
    """The value at a dotted path of ``config``, e.g. ``"train.seed"``."""
    value: object = config
    for name in path.split("."):
        value = getattr(value, name)
    return value
