"""``Config``: the root of the sections, the run-wide fields, and the checks that span sections."""

from __future__ import annotations

import logging
from typing import Annotated, Any, TypedDict

import msgspec

from slime.config._base import STRUCT, Range, check_ranges, require
from slime.config.data import DataConfig
from slime.config.debug import DebugConfig
from slime.config.engine import EngineConfig
from slime.config.loop import LoopConfig
from slime.config.obs import ObsConfig
from slime.config.rollout import SFT_ROLLOUT, RolloutConfig
from slime.config.routing_replay import check_routing_replay
from slime.config.sync import SyncConfig
from slime.config.train import TrainConfig
from slime.errors import ConfigError

__all__ = ["Config", "GROUP_BASELINE_ESTIMATORS"]

GROUP_BASELINE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")
"""Advantage estimators whose baseline is the mean reward of the sample's group (``slime.train.advantages``)."""

log = logging.getLogger(__name__)


class TrainerKwargs(TypedDict):
    """``Config.trainer_kwargs()``: a trainer's keyword arguments from outside its section."""

    rollout_temperature: float
    max_staleness: int | None
    seed: int


class Config(msgspec.Struct, **STRUCT):
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
    save_interval: Annotated[int, Range(ge=0, note="(0 = never)")] = 0
    """Checkpoint every N rollout steps into RUN_DIR/checkpoints (``--save-interval``); 0 = never."""
    load: str | None = None
    """Resume from this run directory's latest checkpoint (``--load``); usually the same as ``--save``."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 1234
    """The run's seed (``--seed``), its one copy: the prompt order (``--rollout-shuffle``; offline samples use
    seed + 1), the trainer's torch seed and the engines' sampling seed are all passed this value."""

    def trainer_kwargs(self) -> TrainerKwargs:
        """What a trainer needs from outside its ``train`` section, as keyword arguments of ``TorchTrainer`` and
        ``MegatronTrainer``: the engines' sampling temperature (its logprobs must match theirs), the staleness
        bound (``build_train_batch``'s check) and the run's seed. Each is read from its one field."""
        return TrainerKwargs(
            rollout_temperature=self.rollout.rollout_temperature, max_staleness=self.loop.max_staleness, seed=self.seed
        )

    def validate(self) -> Config:
        """Check every section (its own ``validate``), then the checks across sections. Returns self.

        Raises:
            ConfigError: naming the CLI flag(s).
        """
        check_ranges(self)
        for section in (self.loop, self.rollout, self.train, self.data, self.sync, self.engine, self.obs, self.debug):
            section.validate()
        check_routing_replay(self.rollout, self.train, self.data)  # --use-rollout-routing-replay's needs
        require(
            [
                (
                    self.loop.over_sampling_batch_size >= self.loop.rollout_batch_size
                    or self.train.loss_type == "sft_loss",
                    "--over-sampling-batch-size",
                    self.loop.over_sampling_batch_size,
                    f">= --rollout-batch-size ({self.loop.rollout_batch_size})",
                ),
                (
                    not (self.sync.colocate and self.loop.mode == "async"),
                    "--colocate with --rollout-mode",
                    self.loop.mode,
                    "sync or april: colocated engines cannot generate while the trainer trains",
                ),
            ]
        )
        if self.train.loss_type == "sft_loss":  # one sample per data row: --n-samples-per-prompt does not apply
            if self.loop.rollout_batch_size % self.train.global_batch_size != 0:
                raise ConfigError(
                    f"--global-batch-size={self.train.global_batch_size} must divide --rollout-batch-size="
                    f"{self.loop.rollout_batch_size} (SFT rows per step)"
                )
            return self
        if self.loop.num_epoch is not None:
            raise ConfigError("--num-epoch: only with --loss-type sft_loss (RL runs count steps with --num-rollout)")
        self._check_group_size()
        samples = self.loop.rollout_batch_size * self.rollout.n_samples_per_prompt
        if (
            samples % self.train.global_batch_size != 0 and not self.debug.debug_rollout_only
        ):  # nothing trains in a rollout-only run
            raise ConfigError(
                f"--global-batch-size={self.train.global_batch_size} must divide --rollout-batch-size x "
                f"--n-samples-per-prompt = {self.loop.rollout_batch_size} x {self.rollout.n_samples_per_prompt} = {samples}"
            )
        return self

    def _check_group_size(self) -> None:
        """A group-baseline estimator needs two samples a prompt: alone in its group, a sample's reward is its own
        baseline, so every advantage is 0 and nothing trains (the KL and entropy terms aside).

        Raises:
            ConfigError: ``--n-samples-per-prompt 1`` with ``GROUP_BASELINE_ESTIMATORS``, unless nothing trains on
                the advantages alone (``--use-opd`` adds the teacher's term, REINFORCE++-baseline's ``--kl-coef`` a
                per-token penalty; ``--debug-rollout-only`` trains nothing).
        """
        t = self.train
        if self.rollout.n_samples_per_prompt > 1 or t.advantage_estimator not in GROUP_BASELINE_ESTIMATORS:
            return
        if t.use_opd or self.debug.debug_rollout_only:
            return
        if t.advantage_estimator == "reinforce_plus_plus_baseline" and t.kl_coef > 0:  # the per-token KL penalty trains
            return
        raise ConfigError(
            f"--n-samples-per-prompt 1 with --advantage-estimator {t.advantage_estimator}: each sample is its group's own "
            "baseline, so every advantage is 0 and nothing trains; use --n-samples-per-prompt >= 2, or an estimator "
            "without a group baseline (--advantage-estimator reinforce_plus_plus or ppo)"
        )

    def check_reward_given(self) -> None:
        """An RL run of the CLI on the user's ``--prompt-data`` or ``--eval-prompt-data`` names its reward: the
        built-in task's reward (arithmetic unless ``--builtin-task``) scores only that task's format, and on other
        rows quietly gives 0.
        Called where flags become a config (``slime.cli.args.config_from_args``); a program that passes its own
        ``reward_fn`` to ``run_training`` is not checked.

        Raises:
            ConfigError: ``--prompt-data`` with neither ``--custom-rm-path`` nor ``--rm-type``, listing both, unless
                the run needs no reward (``--loss-type sft_loss``, ``--opd-only``, a train-only replay) or a user
                ``--rollout-function-path`` makes the groups (THUDM/slime's contract: it may set the rewards itself;
                samples it leaves unrewarded are scored by the default reward, as before); ``--eval-prompt-data`` (or
                ``--eval-config``) with neither flag, unless the run computes no eval reward (``--loss-type sft_loss``:
                NLL; a train-only replay: no eval), ``--opd-only`` included (its task reward is evaluated).
        """
        r, d, t = self.rollout, self.data, self.train
        if r.custom_rm_path is not None or r.rm_type is not None or r.uses_rollout_function:
            return
        no_eval_reward = t.loss_type == "sft_loss" or self.debug.train_only  # SFT evaluates NLL; a replay trains only
        if d.prompt_data is not None and not (no_eval_reward or t.opd_only):
            raise ConfigError(
                f"--prompt-data {d.prompt_data} needs a reward: pass --rm-type math|code|remote (a built-in verifier; "
                "--rm-type arith|calc|chain for rows in a built-in task's format) or --custom-rm-path pkg.module.fn (your "
                "function); runs that need none: --loss-type sft_loss, --opd-only"
            )
        if d.eval_prompt_data is not None and not no_eval_reward:
            # the default reward is the built-in task's: it would score the user's eval rows, 0 for any other format
            given = (
                f"--eval-config {d.eval_config}"
                if d.eval_config is not None
                else f"--eval-prompt-data {_shown(d.eval_prompt_data)}"
            )
            raise ConfigError(
                f"{given} needs a reward: the default one, the built-in task's ({d.builtin_task}), scores only that task's "
                f"format (rows in it: --rm-type {d.builtin_task}); else --rm-type math|code|remote or --custom-rm-path pkg.module.fn"
            )

    def updates_in_place(self) -> bool:
        """Whether the run updates weights while requests are paused in place: ``--rollout-mode async``
        without ``--colocate`` and with a trainer (``slime.loop.step.pause_mode``)."""
        return self.loop.mode == "async" and not self.sync.colocate and not self.debug.debug_rollout_only

    def with_placement_defaults(self) -> Config:
        """THUDM/slime's default: with ``--colocate`` and placement flags but no ``--rollout-num-gpus``,
        the rollout uses the actor's GPUs (nodes x GPUs per node). Other configs are returned unchanged
        (``slime.engines.fleet.placement``)."""
        t, e = self.train, self.engine
        actor_given = t.actor_num_nodes is not None or t.actor_num_gpus_per_node is not None
        if not (
            self.sync.colocate
            and actor_given
            and e.rollout_num_gpus is None
            and not e.sglang_config
            and not e.rollout_external_engine_addrs
        ):
            return self
        gpus = (t.actor_num_nodes or 1) * (t.actor_num_gpus_per_node or 1)
        return msgspec.structs.replace(self, engine=msgspec.structs.replace(e, rollout_num_gpus=gpus))

    def check_run_modes(self) -> None:
        """Checks across sections of the data and debug modes, at start (after ``validate``; the
        ``--rollout-function-path`` ones: ``check_rollout_function_modes``).

        Raises:
            ConfigError: naming the flags.
        """
        d, dbg, r, t, e = self.data, self.debug, self.rollout, self.train, self.engine
        problems = [
            (
                dbg.debug_train_only and dbg.load_debug_rollout_data is None and t.loss_type != "sft_loss",
                "--debug-train-only needs --load-debug-rollout-data (the recorded groups to train on)",
            ),
            (
                r.rollout_function_path == SFT_ROLLOUT and t.loss_type != "sft_loss",
                f"--rollout-function-path={SFT_ROLLOUT} is THUDM/slime's SFT: pass --loss-type sft_loss",
            ),
            (
                self.loop.offline_ratio > 0 and d.offline_data is None,
                f"--offline-ratio={self.loop.offline_ratio} needs --offline-data",
            ),
            (
                d.offline_data is not None and self.loop.offline_ratio == 0,
                "--offline-data needs --offline-ratio > 0 (the fraction of each batch it fills)",
            ),
            (
                r.n_samples_per_eval_prompt > 1 and r.eval_temperature == 0,
                f"--n-samples-per-eval-prompt={r.n_samples_per_eval_prompt} needs --eval-temperature > 0 (greedy samples are all the same)",
            ),
            (
                dbg.debug_rollout_only and bool(self.save_interval or self.load),
                "--debug-rollout-only: --save-interval / --load are not supported (nothing trains)",
            ),
            (
                (dbg.debug_rollout_only or dbg.train_only) and t.train_backend == "megatron",
                "--debug-rollout-only / --debug-train-only / --load-debug-rollout-data: not supported with --train-backend megatron yet",
            ),
            (
                not t.use_opd and bool(e.opd_teacher_load or e.opd_teacher_addrs),
                "--opd-teacher-load / --opd-teacher-addrs: a teacher is only used with --use-opd",
            ),
            (
                t.use_opd and not (e.opd_teacher_load or e.opd_teacher_addrs or e.sglang_config),
                "--use-opd needs a teacher: --opd-teacher-load HF_DIR, --opd-teacher-addrs host:port, or a 'teacher' group in --sglang-config",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ConfigError(message)
        self.check_rollout_function_modes()

    def check_rollout_function_modes(self) -> None:
        """Refuse the flags a whole-step rollout function replaces (``slime.loop.rollout_function``'s module doc).

        Raises:
            ConfigError: one line naming both flags.
        """
        if not self.rollout.uses_rollout_function:
            return
        flag = f"--rollout-function-path={self.rollout.rollout_function_path}"
        lp, dbg = self.loop, self.debug
        problems = [
            (
                lp.mode != "sync",
                f"--rollout-mode {lp.mode} (or --partial-rollout): the function makes a whole step per call, in sync; drop one of them",
            ),
            (lp.offline_ratio > 0, "--offline-ratio / --offline-data: mix offline samples inside the function instead"),
            (
                lp.dynamic_sampling_filter_path is not None,
                "--dynamic-sampling-filter-path: filter groups inside the function instead",
            ),
            (
                dbg.train_only,
                "--debug-train-only / --load-debug-rollout-data: a train-only run replays records and calls no rollout function",
            ),
            (
                self.train.use_opd,
                "--use-opd: teacher scoring runs in the built-in scheduler; not with a rollout function yet",
            ),
        ]
        for bad, what in problems:
            if bad:
                raise ConfigError(f"{flag} with {what}")

    def check_sft_run(self) -> None:
        """Flags that an SFT run (``--loss-type sft_loss``, ``slime.loop.sft``) cannot honour, refused at start;
        one INFO line for THUDM/slime's SFT flags it implies, one WARNING for RL flags it ignores.

        Raises:
            ConfigError: naming the flag.
        """
        for bad, message in self._sft_refusals():
            if bad:
                raise ConfigError(message)
        self._log_sft_implied_and_ignored()

    def _sft_refusals(self) -> list[tuple[bool, str]]:
        """(refused?, message) for each flag an SFT run cannot honour, in the order they are checked."""
        d, dbg, r = self.data, self.debug, self.rollout
        return [
            (
                d.prompt_data is None,
                "--loss-type sft_loss needs --prompt-data (JSONL or Parquet of chat messages or prompt/response rows)",
            ),
            (
                d.offline_data is not None,
                "--offline-data: not used by --loss-type sft_loss (every row of --prompt-data is trained on)",
            ),
            (
                dbg.debug_rollout_only
                or dbg.load_debug_rollout_data is not None
                or dbg.save_debug_rollout_data is not None,
                "--debug-rollout-only / --*-debug-rollout-data: not used by --loss-type sft_loss (it generates nothing)",
            ),
            (
                r.rollout_function_path not in (None, SFT_ROLLOUT),
                f"--rollout-function-path={r.rollout_function_path}: "
                f"--loss-type sft_loss trains on the rows of --prompt-data and calls no rollout function ({SFT_ROLLOUT} is implied)",
            ),
            (
                r.rollout_temperature != 1.0,
                f"--rollout-temperature={r.rollout_temperature}: SFT scores tokens at temperature 1 (the NLL of the data); leave it unset",
            ),
            (
                self.train.train_backend == "megatron",
                "--loss-type sft_loss runs the torch backend for now; --train-backend megatron "
                "shares its loss (objective.micro_batch_loss) but this driver does not start torchrun ranks",
            ),
            (
                self.train.use_opd,
                "--use-opd: on-policy distillation needs the student's own rollouts; --loss-type sft_loss generates none",
            ),
        ]

    def _log_sft_implied_and_ignored(self) -> None:
        """One INFO line for THUDM/slime's SFT flags that ``--loss-type sft_loss`` implies, one WARNING for the
        RL flags it ignores (each only when there is something to name)."""
        dbg, r = self.debug, self.rollout
        # THUDM/slime's SFT scripts pass these; here --loss-type sft_loss implies them
        implied = [
            flag
            for flag, given in (
                ("--debug-train-only", dbg.debug_train_only),
                (f"--rollout-function-path {SFT_ROLLOUT}", r.rollout_function_path == SFT_ROLLOUT),
            )
            if given
        ]
        if implied:
            log.info(
                "%s: implied by --loss-type sft_loss (no engine is launched; it trains on the rows of --prompt-data)",
                ", ".join(implied),
            )
        ignored = [flag for flag, value, default in self._rl_only_flags() if value != default]
        if ignored:
            log.warning(
                "--loss-type sft_loss ignores these RL flags: %s (SFT trains on the rows of --prompt-data; "
                "nothing is generated, rewarded or importance-weighted)",
                ", ".join(ignored),
            )

    def _rl_only_flags(self) -> list[tuple[str, Any, Any]]:
        """(flag, value, default) of the flags an SFT run never reads."""
        d = Config()
        pairs = [
            ("--rollout-mode / --partial-rollout", self.loop.mode, d.loop.mode),
            # its default follows the mode and the batch (LoopConfig.default_over_sampling), not the field's
            ("--over-sampling-batch-size", self.loop.over_sampling_batch_size, self.loop.default_over_sampling()),
            ("--n-samples-per-prompt", self.rollout.n_samples_per_prompt, d.rollout.n_samples_per_prompt),
            (
                "--custom-generate-function-path",
                self.rollout.custom_generate_function_path,
                d.rollout.custom_generate_function_path,
            ),
            ("--custom-rm-path", self.rollout.custom_rm_path, d.rollout.custom_rm_path),
            ("--rm-type", self.rollout.rm_type, d.rollout.rm_type),
            ("--use-tis", self.train.use_tis, d.train.use_tis),
            ("--tis-level", self.train.tis_level, d.train.tis_level),
            ("--rollout-max-prompt-len", self.data.rollout_max_prompt_len, d.data.rollout_max_prompt_len),
            ("--advantage-estimator", self.train.advantage_estimator, d.train.advantage_estimator),
            ("--use-kl-loss", self.train.use_kl_loss, d.train.use_kl_loss),
        ]
        if self.loop.num_epoch is not None:
            pairs.append(
                (
                    "--num-rollout (with --num-epoch, the epochs set the steps)",
                    self.loop.num_rollout,
                    d.loop.num_rollout,
                )
            )
        return pairs


def _shown(paths: str | tuple[str, ...]) -> str:
    """``--eval-prompt-data``'s value as its flag takes it (one path, or name path pairs)."""
    return paths if isinstance(paths, str) else " ".join(paths)
