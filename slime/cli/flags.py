"""The table of ``slime train``'s own flags: ``FLAGS`` maps each flag onto a config path and its argparse kwargs.

This is the whole CLI surface of ``slime train`` as data (``tests/test_cli_args.py`` pins it, so a new
flag is a deliberate change; flags that THUDM/slime has keep slime's spelling). How the table becomes a
parser and a validated ``Config`` (help texts from the config docstrings, the ``--sglang-*`` /
``--router-*`` pass-through, THUDM/slime's OPD flags) lives in ``slime/cli/args.py``, which re-exports
``FLAGS``.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["FLAGS"]

# flag -> (config path, argparse kwargs). A path "loop.mode=april" sets a constant when given.
FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--hf-checkpoint": (
        "engine.hf_checkpoint",
        dict(help="HF model dir (default: the shipped warm start of --builtin-task)"),
    ),
    "--rollout-external-engine-addrs": (
        "engine.rollout_external_engine_addrs",
        dict(nargs="+", help="engines already running (host:port)"),
    ),
    "--ray-placed-engines": (
        "engine.ray_placed_engines",
        dict(nargs="+", help="ROLE=URL of the engines slime train --ray placed (set by it on its trainer ranks)"),
    ),
    "--rollout-num-engines": ("engine.num_engines", dict(type=int, help="embedded engines to launch")),
    "--engine-threads": ("engine.engine_threads", dict(type=int, help="torch threads per embedded engine")),
    # Real SGLang (slime/engines/fleet/plan.py); every other --sglang-* / --router-* flag passes through.
    "--rollout-num-gpus": (
        "engine.rollout_num_gpus",
        dict(type=int, help="GPUs for SGLang servers (launches SGLang, not embedded engines)"),
    ),
    "--rollout-num-gpus-per-engine": (
        "engine.rollout_num_gpus_per_engine",
        dict(type=int, help="GPUs (tp size) per SGLang server"),
    ),
    "--rollout-num-gpus-per-node": (
        "engine.rollout_num_gpus_per_node",
        dict(type=int, help="GPUs of a node in the placement plan (default: CUDA_VISIBLE_DEVICES, else 8)"),
    ),
    "--sglang-router-ip": (
        "engine.sglang_router_ip",
        dict(help="a running sglang-router to use, or the address ours binds"),
    ),
    "--sglang-router-port": ("engine.sglang_router_port", dict(type=int)),
    "--sglang-config": (
        "engine.sglang_config",
        dict(help="YAML of SGLang server groups (models, prefill/decode, per-group args)"),
    ),
    "--health-check-interval-s": (
        "engine.health_check_interval_s",
        dict(type=float, help="seconds between engine health probes (0 = off)"),
    ),
    "--max-running-requests": ("engine.max_running_requests", dict(type=int)),
    "--engine-startup-timeout-s": (
        "engine.startup_timeout_s",
        dict(type=float, help="how long to wait for engines to be ready"),
    ),
    "--prompt-data": (
        "data.prompt_data",
        dict(help="JSONL or Parquet prompts (default: the built-in task, --builtin-task)"),
    ),
    "--builtin-task": (
        "data.builtin_task",
        dict(
            choices=["arith", "calc", "chain"],
            help="built-in task (data and reward) used without --prompt-data: "
            "arith (default), calc (tool calling; with slime.rollout.multiturn.calculator_generate) or chain (long-tailed lengths)",
        ),
    ),
    "--input-key": ("data.input_key", dict()),
    "--label-key": ("data.label_key", dict()),
    "--metadata-key": ("data.metadata_key", dict()),
    "--rollout-shuffle": ("data.rollout_shuffle", dict(action="store_true")),
    # Datasets (slime/data/): JSONL or Parquet by extension; --apply-chat-template, --tool-key and
    # --n-samples-per-eval-prompt / --eval-temperature are slime's flags.
    "--apply-chat-template": (
        "data.apply_chat_template",
        dict(action="store_true", help="render prompts with the tokenizer's chat template"),
    ),
    "--tool-key": ("data.tool_key", dict(help="key of each row's tools (OpenAI function schema)")),
    "--curriculum-key": (
        "data.curriculum_key",
        dict(help="key of a numeric difficulty: each epoch in ascending order instead of shuffled"),
    ),
    "--offline-data": ("data.offline_data", dict(help="JSONL of pre-generated samples mixed in at --offline-ratio")),
    "--offline-ratio": (
        "loop.offline_ratio",
        dict(type=float, help="fraction of each batch's groups from --offline-data, in [0, 1)"),
    ),
    "--n-samples-per-eval-prompt": (
        "rollout.n_samples_per_eval_prompt",
        dict(type=int, help="eval samples per prompt (mean accuracy and pass@k)"),
    ),
    "--eval-temperature": ("rollout.eval_temperature", dict(type=float, help="eval sampling temperature (0 = greedy)")),
    "--eval-prompt-data": (
        "data.eval_prompt_data",
        dict(nargs="+", help="held-out prompts: one path, or 'name path' pairs (THUDM/slime), reported per name"),
    ),
    "--eval-config": (
        "data.eval_config",
        dict(help="THUDM/slime's YAML of eval datasets (eval: defaults/datasets); slime.eval_config"),
    ),
    "--eval-top-p": ("rollout.eval_top_p", dict(type=float, help="eval top-p (default: --rollout-top-p)")),
    "--eval-top-k": ("rollout.eval_top_k", dict(type=int, help="eval top-k (default: --rollout-top-k; -1 = off)")),
    "--skip-eval-before-train": (
        "loop.skip_eval_before_train",
        dict(action="store_true", help="no eval before the first step"),
    ),
    "--eval-max-response-len": (
        "rollout.eval_max_response_len",
        dict(type=int, help="eval response cap (default: --rollout-max-response-len)"),
    ),
    "--num-eval-prompts": ("data.num_eval_prompts", dict(type=int)),
    "--on-bad-data": ("data.on_bad_data", dict(choices=["skip", "fail"])),
    "--rollout-max-prompt-len": (
        "data.rollout_max_prompt_len",
        dict(type=int, help="prompts over this many tokens are bad rows at load (--on-bad-data)"),
    ),
    "--rollout-batch-size": ("loop.rollout_batch_size", dict(type=int, help="groups per train step")),
    "--over-sampling-batch-size": ("loop.over_sampling_batch_size", dict(type=int, help="groups in flight (april)")),
    "--partial-rollout": (
        "loop.mode=april",
        dict(action="store_true", help="APRIL: over-provision, abort at target, resume partials"),
    ),
    "--rollout-mode": ("loop.mode", dict(choices=["sync", "april", "async"])),
    "--staleness-policy": ("loop.staleness_policy", dict(choices=["mask", "drop"])),
    "--dynamic-sampling-filter-path": ("loop.dynamic_sampling_filter_path", dict()),
    "--buffer-filter-path": ("loop.buffer_filter_path", dict()),
    "--buffer-capacity": (
        "loop.buffer_capacity",
        dict(type=int, help="ready + partial groups held; the oldest partial groups beyond it are evicted"),
    ),
    "--num-rollout": ("loop.num_rollout", dict(type=int)),
    "--max-staleness": ("loop.max_staleness", dict(type=int)),
    "--eval-interval": ("loop.eval_interval", dict(type=int)),
    "--overlap-train": ("loop.overlap_train", dict(action=argparse.BooleanOptionalAction)),
    "--n-samples-per-prompt": ("rollout.n_samples_per_prompt", dict(type=int)),
    "--rollout-max-response-len": ("rollout.rollout_max_response_len", dict(type=int)),
    "--rollout-max-context-len": (
        "rollout.rollout_max_context_len",
        dict(type=int, help="cap on prompt + response tokens of a rollout sample"),
    ),
    "--rollout-temperature": ("rollout.rollout_temperature", dict(type=float)),
    "--rollout-top-p": ("rollout.rollout_top_p", dict(type=float)),
    "--rollout-top-k": ("rollout.rollout_top_k", dict(type=int)),
    "--request-timeout-s": ("rollout.request_timeout_s", dict(type=float)),
    "--reward-timeout-s": ("rollout.reward_timeout_s", dict(type=float)),
    "--max-retries": ("rollout.max_retries", dict(type=int)),
    "--control-timeout-s": (
        "rollout.control_timeout_s",
        dict(type=float, help="seconds per engine control call (abort, weight update, health)"),
    ),
    "--retry-backoff-s": (
        "rollout.retry_backoff_s",
        dict(type=float, help="first retry backoff in seconds; doubles per retry"),
    ),
    "--custom-rm-path": ("rollout.custom_rm_path", dict()),
    "--reward-key": (
        "rollout.reward_key",
        dict(help="entry of a dict returned by the reward function that is the reward"),
    ),
    "--custom-generate-function-path": ("rollout.custom_generate_function_path", dict()),
    "--rollout-function-path": (
        "rollout.rollout_function_path",
        dict(help="a function making a whole step's groups (slime's contract; slime.rollout.slime_compat)"),
    ),
    "--rm-type": (
        "rollout.rm_type",
        dict(
            choices=["math", "deepscaler", "dapo", "code", "remote", "remote_rm", "arith", "calc", "chain"],
            help="built-in verifier (slime/rollout/verifiers/; deepscaler and dapo: the math verifier), "
            "or a built-in task's reward (arith, calc, chain) for --prompt-data in its format",
        ),
    ),
    "--rm-url": ("rollout.rm_url", dict(help="remote reward model URL (--rm-type remote)")),
    "--allow-unsafe-code-execution": (
        "rollout.allow_unsafe_code_execution",
        dict(
            action="store_true",
            help="run model-written code with less isolation where the OS sandbox is incomplete (--rm-type code)",
        ),
    ),
    "--global-batch-size": ("train.global_batch_size", dict(type=int)),
    "--micro-batch-size": ("train.micro_batch_size", dict(type=int)),
    "--lr": ("train.lr", dict(type=float)),
    "--weight-decay": ("train.weight_decay", dict(type=float)),
    "--adam-beta1": ("train.adam_beta1", dict(type=float)),
    "--adam-beta2": ("train.adam_beta2", dict(type=float)),
    "--clip-grad": ("train.clip_grad", dict(type=float)),
    "--eps-clip": ("train.eps_clip", dict(type=float)),
    "--eps-clip-high": ("train.eps_clip_high", dict(type=float)),
    "--loss-type": (
        "train.loss_type",
        dict(
            choices=["policy_loss", "sft_loss"],
            help="sft_loss: supervised fine-tuning on --prompt-data (no engines, no rewards)",
        ),
    ),
    "--num-epoch": ("loop.num_epoch", dict(type=int, help="SFT: passes over --prompt-data (sets the number of steps)")),
    "--calculate-per-token-loss": (
        "train.loss_agg=token_mean",
        dict(action="store_true", help="one mean over all tokens (DAPO) instead of per-sample means"),
    ),
    "--use-tis": ("train.use_tis", dict(action="store_true")),
    "--use-rollout-logprobs": ("train.use_rollout_logprobs", dict(action="store_true")),
    "--tis-clip": ("train.tis_clip", dict(type=float)),
    "--tis-clip-low": ("train.tis_clip_low", dict(type=float)),
    "--tis-level": (
        "train.tis_level",
        dict(
            choices=["token", "sequence", "geometric"],
            help="TIS ratio per token, or one per sample (product / geometric mean)",
        ),
    ),
    "--use-rollout-routing-replay": (
        "rollout.use_rollout_routing_replay",
        dict(action="store_true", help="MoE: the trainer replays the experts the engine routed each token to"),
    ),
    "--train-threads": ("train.num_threads", dict(type=int)),
    "--train-device": (
        "train.device",
        dict(choices=["auto", "cpu", "cuda"], help="torch backend: auto = CUDA when available, else the CPU"),
    ),
    # Algorithm set and off-policy corrections: slime's spelling where slime has the flag (MIS's
    # --mis-* keys are slime's mis.yaml keys; --use-decoupled-ppo / --behav-imp-weight-cap follow
    # AReaL's use_decoupled_loss / behav_imp_weight_cap). See slime/train/.
    "--advantage-estimator": (
        "train.advantage_estimator",
        dict(
            choices=[
                "grpo",
                "gspo",
                "reinforce_plus_plus",
                "reinforce_plus_plus_baseline",
                "ppo",
                "gae",
                "on_policy_distillation",
            ]
        ),
    ),  # the last: apply_slime_opd
    "--custom-reward-post-process-path": (
        "train.custom_reward_post_process_path",
        dict(help="THUDM/slime's OPD hook: a no-op with --use-opd (apply_slime_opd), an error otherwise"),
    ),
    "--disable-grpo-std-normalization": (
        "train.disable_grpo_std_normalization",
        dict(action="store_true", help="Dr. GRPO: centre rewards without dividing by the group std"),
    ),
    "--normalize-advantages": (
        "train.normalize_advantages",
        dict(action="store_true", help="whiten advantages over the step's trained tokens"),
    ),
    "--gamma": ("train.gamma", dict(type=float, help="discount of REINFORCE++ returns and GAE")),
    "--lambd": ("train.lambd", dict(type=float, help="GAE lambda")),
    "--eps-clip-c": ("train.eps_clip_c", dict(type=float, help="dual-clip PPO constant (> 1)")),
    "--entropy-coef": ("train.entropy_coef", dict(type=float)),
    "--use-kl-loss": ("train.use_kl_loss", dict(action="store_true", help="add a KL-to-reference loss")),
    "--kl-loss-coef": ("train.kl_loss_coef", dict(type=float)),
    "--kl-loss-type": ("train.kl_loss_type", dict(choices=["k1", "k2", "k3", "low_var_kl"])),
    "--kl-coef": ("train.kl_coef", dict(type=float, help="KL penalty folded into REINFORCE++/PPO rewards")),
    "--ref-load": ("train.ref_load", dict(help="HF dir of the reference model (default: --hf-checkpoint)")),
    "--value-clip": ("train.value_clip", dict(type=float)),
    "--critic-lr": ("train.critic_lr", dict(type=float, help="PPO critic lr (default: --lr)")),
    "--mis-level": (
        "train.mis_level",
        dict(choices=["none", "token", "sequence", "geometric"], help="masked importance sampling level"),
    ),
    "--mis-lower-bound": ("train.mis_lower_bound", dict(type=float)),
    "--mis-upper-bound": ("train.mis_upper_bound", dict(type=float)),
    "--use-decoupled-ppo": (
        "train.use_decoupled_ppo",
        dict(action="store_true", help="decoupled PPO objective (AReaL)"),
    ),
    "--behav-imp-weight-cap": ("train.behav_imp_weight_cap", dict(type=float)),
    "--mask-offpolicy-in-partial-rollout": (
        "train.mask_offpolicy_in_partial_rollout",
        dict(action="store_true", help="train only each sample's newest-version tokens"),
    ),
    # On-policy distillation (slime/rollout/opd.py, slime/train/objective.py): --use-opd and --opd-kl-coef
    # are slime's; slime's --opd-teacher-load names a Megatron checkpoint, ours an HF dir served by an engine.
    "--use-opd": (
        "train.use_opd",
        dict(
            action="store_true",
            help="on-policy distillation: a teacher engine scores each sample; reverse KL in the advantage",
        ),
    ),
    "--opd-kl-coef": (
        "train.opd_kl_coef",
        dict(type=float, help="weight of the per-token reverse KL in the advantage (default 1.0)"),
    ),
    "--opd-only": (
        "train.opd_only",
        dict(action="store_true", help="pure distillation: the task reward is logged and evaluated but does not train"),
    ),
    "--opd-teacher-load": (
        "engine.opd_teacher_load",
        dict(help="HF dir of the teacher: an embedded engine serving it is launched"),
    ),
    "--opd-teacher-addrs": (
        "engine.opd_teacher_addrs",
        dict(nargs="+", help="teacher engines already running (host:port)"),
    ),
    # Training backend (slime/train/megatron/): Megatron-LM's spelling; the batch, lr, weight-decay,
    # Adam and clip flags above are shared by both backends.
    "--deterministic-mode": (
        "train.deterministic_mode",
        dict(action="store_true", help="deterministic trainer kernels (torch.use_deterministic_algorithms) and seed"),
    ),
    "--train-backend": (
        "train.train_backend",
        dict(
            choices=["torch", "megatron"], help="torch: one HF model in-process; megatron: megatron-core under torchrun"
        ),
    ),
    "--tensor-model-parallel-size": ("train.megatron.tensor_model_parallel_size", dict(type=int)),
    "--pipeline-model-parallel-size": ("train.megatron.pipeline_model_parallel_size", dict(type=int)),
    "--context-parallel-size": ("train.megatron.context_parallel_size", dict(type=int)),
    "--expert-model-parallel-size": ("train.megatron.expert_model_parallel_size", dict(type=int)),
    "--expert-tensor-parallel-size": (
        "train.megatron.expert_tensor_parallel_size",
        dict(type=int, help="TP ranks inside one expert (default: --tensor-model-parallel-size)"),
    ),
    "--moe-token-dispatcher-type": (
        "train.megatron.moe_token_dispatcher_type",
        dict(choices=["alltoall", "allgather"]),
    ),
    "--moe-router-load-balancing-type": (
        "train.megatron.moe_router_load_balancing_type",
        dict(choices=["aux_loss", "seq_aux_loss", "none"]),
    ),
    "--moe-router-bias-update-rate": (
        "train.megatron.moe_router_bias_update_rate",
        dict(type=float, help="expert-bias step per optimizer step (sigmoid routers; 0: frozen)"),
    ),
    "--moe-aux-loss-coeff": (
        "train.megatron.moe_aux_loss_coeff",
        dict(type=float, help="load-balancing loss weight (0: only logged)"),
    ),
    "--moe-expert-capacity-factor": (
        "train.megatron.moe_expert_capacity_factor",
        dict(type=float, help="drop tokens over this multiple of the even expert load (default: dropless)"),
    ),
    "--sequence-parallel": ("train.megatron.sequence_parallel", dict(action="store_true")),
    "--use-dynamic-batch-size": (
        "train.megatron.use_dynamic_batch_size",
        dict(action="store_true", help="pack micro-batches by --max-tokens-per-gpu"),
    ),
    "--max-tokens-per-gpu": (
        "train.megatron.max_tokens_per_gpu",
        dict(type=int, help="token budget of one packed micro-batch"),
    ),
    "--min-lr": ("train.megatron.min_lr", dict(type=float)),
    "--lr-decay-style": (
        "train.megatron.lr_decay_style",
        dict(choices=["constant", "linear", "cosine", "inverse-square-root"]),
    ),
    "--lr-warmup-iters": ("train.megatron.lr_warmup_iters", dict(type=int)),
    "--lr-decay-iters": ("train.megatron.lr_decay_iters", dict(type=int)),
    "--lr-warmup-fraction": (
        "train.megatron.lr_warmup_fraction",
        dict(type=float, help="warm-up steps as a fraction of --lr-decay-iters (default: the run's optimizer steps)"),
    ),
    "--adam-eps": ("train.megatron.adam_eps", dict(type=float)),
    "--bf16": (
        "train.megatron.bf16",
        dict(action="store_true", help="bf16 training, fp32 master weights (torch backend: bf16 autocast)"),
    ),
    "--use-distributed-optimizer": ("train.megatron.use_distributed_optimizer", dict(action="store_true")),
    "--overlap-grad-reduce": ("train.megatron.overlap_grad_reduce", dict(action="store_true")),
    "--recompute-granularity": ("train.megatron.recompute_granularity", dict(choices=["full", "selective"])),
    "--recompute-method": ("train.megatron.recompute_method", dict(choices=["uniform", "block"])),
    "--recompute-num-layers": ("train.megatron.recompute_num_layers", dict(type=int)),
    "--distributed-timeout-minutes": ("train.megatron.distributed_timeout_minutes", dict(type=int)),
    "--logprob-impl": (
        "train.megatron.logprob_impl",
        dict(
            choices=["slime", "liger"],
            help="megatron backend: logprobs from the logits (slime) or liger-kernel's fused linear CE",
        ),
    ),
    # Observability (slime/obs/): slime's spelling for --use-wandb / --wandb-project / --wandb-group / --use-tensorboard.
    "--enable-trace": (
        "obs.enable_trace",
        dict(action="store_true", help="write a Chrome/Perfetto trace to RUN_DIR/trace.json"),
    ),
    "--metrics-port": (
        "obs.metrics_port",
        dict(type=int, help="serve Prometheus /metrics on this port (0 = any free port, logged)"),
    ),
    "--use-tensorboard": (
        "obs.use_tensorboard",
        dict(action="store_true", help="log every step scalar to TensorBoard"),
    ),
    "--tb-dir": ("obs.tb_dir", dict(help="TensorBoard log dir (default: RUN_DIR/tb)")),
    "--use-wandb": (
        "obs.use_wandb",
        dict(action="store_true", help="log every step scalar to Weights & Biases (needs wandb)"),
    ),
    "--wandb-project": ("obs.wandb_project", dict()),
    "--wandb-group": ("obs.wandb_group", dict()),
    # Weight sync (slime/sync/): --update-weight-buffer-size and --colocate are slime's flags.
    "--weight-sync": (
        "sync.method",
        dict(choices=["disk", "distributed", "tensor", "delta"], help="how new weights reach the engines"),
    ),
    "--update-weight-buffer-size": (
        "sync.update_weight_buffer_size",
        dict(type=int, help="bytes per weight-update bucket"),
    ),
    # Placement (slime/engines/fleet/placement.py): THUDM/slime's flags; the trainer is a torchrun job of these nodes x GPUs.
    "--actor-num-nodes": (
        "train.actor_num_nodes",
        dict(type=int, help="nodes of the trainer (torchrun --nnodes; > 1 needs --train-backend megatron)"),
    ),
    "--actor-num-gpus-per-node": (
        "train.actor_num_gpus_per_node",
        dict(type=int, help="trainer ranks per node (torchrun --nproc-per-node)"),
    ),
    "--colocate": (
        "sync.colocate",
        dict(action="store_true", help="engines share the trainer's devices: release memory while training"),
    ),
    "--save": ("run_dir", dict(help="run directory: metrics, summary, plots, weights")),
    "--save-interval": ("save_interval", dict(type=int, help="checkpoint every N steps")),
    "--load": ("load", dict(help="resume from this run directory's latest checkpoint")),
    "--seed": ("seed", dict(type=int)),
    # Record and replay (slime/loop/record.py), THUDM/slime's debug flags; paths are templates with {rollout_id}.
    "--save-debug-rollout-data": (
        "debug.save_debug_rollout_data",
        dict(help="write each step's groups to this path template ({rollout_id})"),
    ),
    "--load-debug-rollout-data": (
        "debug.load_debug_rollout_data",
        dict(help="train on recorded groups from this path template; no engine"),
    ),
    "--debug-rollout-only": (
        "debug.debug_rollout_only",
        dict(action="store_true", help="generate and reward, never train (slime rollout)"),
    ),
    "--debug-train-only": (
        "debug.debug_train_only",
        dict(action="store_true", help="train only, on --load-debug-rollout-data"),
    ),
}
