"""``Config``: the root of the sections, the run-wide fields, and the checks that span sections."""

from __future__ import annotations

import msgspec

from slime.config._base import STRUCT, require
from slime.config.data import DataConfig
from slime.config.debug import DebugConfig
from slime.config.engine import EngineConfig
from slime.config.loop import LoopConfig
from slime.config.obs import ObsConfig
from slime.config.rollout import RolloutConfig
from slime.config.sync import SyncConfig
from slime.config.train import TrainConfig
from slime.errors import ConfigError

__all__ = ["Config"]


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
    save_interval: int = 0
    """Checkpoint every N rollout steps into RUN_DIR/checkpoints (``--save-interval``); 0 = never."""
    load: str | None = None
    """Resume from this run directory's latest checkpoint (``--load``); usually the same as ``--save``."""
    seed: int = 1234
    """The run's seed (``--seed``), its one copy: the prompt order (``--rollout-shuffle``; offline samples use
    seed + 1), the trainer's torch seed and the engines' sampling seed are all passed this value."""

    def trainer_kwargs(self) -> dict[str, float | int]:
        """What a trainer needs from outside its ``train`` section, as keyword arguments of ``TorchTrainer`` and
        ``MegatronTrainer``: the engines' sampling temperature (its logprobs must match theirs), the staleness
        bound (``build_train_batch``'s check) and the run's seed. Each is read from its one field."""
        return dict(rollout_temperature=self.rollout.rollout_temperature, max_staleness=self.loop.max_staleness, seed=self.seed)

    def validate(self) -> Config:
        """Check every section (its own ``validate``), then the checks across sections. Returns self.

        Raises:
            ConfigError: naming the CLI flag(s).
        """
        for section in (self.loop, self.rollout, self.train, self.data, self.sync, self.engine, self.obs, self.debug):
            section.validate()
        require([
            (
                self.loop.over_sampling_batch_size >= self.loop.rollout_batch_size or self.train.loss_type == "sft_loss",
                "--over-sampling-batch-size",
                self.loop.over_sampling_batch_size,
                f">= --rollout-batch-size ({self.loop.rollout_batch_size})",
            ),
            (not (self.sync.colocate and self.loop.mode == "async"), "--colocate with --rollout-mode", self.loop.mode,
             "sync or april: colocated engines cannot generate while the trainer trains"),
            (self.save_interval >= 0, "--save-interval", self.save_interval, ">= 0"),
        ])
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
