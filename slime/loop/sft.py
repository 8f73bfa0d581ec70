"""The SFT run: ``slime train --loss-type sft_loss`` trains on a dataset, with RL's checkpoints, logs and resume.

No engine is launched and nothing is generated or rewarded (THUDM/slime spells this
``--rollout-function-path slime.rollout.sft_rollout.generate_rollout --loss-type sft_loss
--disable-compute-advantages-and-returns --debug-train-only``; here ``--loss-type sft_loss`` implies
the rest, and those flags are accepted: one INFO line names them). One step::

    rows    = rollout_batch_size rows from --prompt-data (PromptSource: file order, or shuffled
              per epoch with --rollout-shuffle; its position is checkpointed)
    groups  = one single-sample group per row (slime.data.sft.to_group: ids, assistant loss mask)
    metrics = trainer.train_step(groups)   # losses.sft_loss; global_batch_size rows per optimizer
                                           # step, micro-batches of micro_batch_size rows or of
                                           # --max-tokens-per-gpu tokens (--use-dynamic-batch-size)

Steps: ``--num-rollout``, or ``--num-epoch`` passes (``epochs * rows // rollout_batch_size``).
Evaluation: the mean NLL per trained token of ``--eval-prompt-data`` (same row format; at most
``--num-eval-prompts`` rows), before the first step, every ``--eval-interval`` steps and after the
last, as ``{"kind": "eval", "eval_loss": ...}`` records in ``RUN_DIR/metrics.jsonl``.

Outputs (``--save RUN_DIR``): ``metrics.jsonl`` (a ``kind: step`` record per step: ``train/loss``,
``train/nll``, ``train/grad_norm``, ``train/lr``, tokens, epoch, time), ``trained_rows.jsonl`` (the
data index of every row each step trained, for audits and the resume test), ``config.json``,
``summary.json``, ``report.txt`` (``slime report``'s text), ``model/`` (the final weights, an HF directory with the tokenizer files) and,
with ``--save-interval N``, ``checkpoints/`` (``slime.loop.checkpoint``: weights, optimizer, lr
position, RNG, data position). ``--load RUN_DIR`` resumes from the latest checkpoint: the next step
trains the rows right after the checkpoint's, and the records after it are cut from the logs.

Not covered: the megatron backend under torchrun for SFT (its loss path accepts ``sft_loss``, but
this driver builds the torch trainer); a resumed run with another ``--rollout-batch-size`` or data file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from slime.config import Config, DataConfig, LoopConfig
from slime.data.dataset import PromptSource
from slime.data.sft import SFTExample, load_sft_file, model_context_len, to_group
from slime.errors import ConfigError
from slime.hf_checkpoint import load_tokenizer
from slime.loop.checkpoint import LoopState, load_checkpoint
from slime.loop.run import RunFiles, finish_run, holds_run_folders, open_run, run_steps
from slime.obs.observers import Observers
from slime.step_record import MetricsRow, RunSummary, SFTStepRecord, steps_of
from slime.train.lr_schedule import resolve_lr_schedule
from slime.train_metrics import TrainMetrics
from slime.types import Group, JsonObject

if TYPE_CHECKING:
    from slime.train.torch_backend import TorchTrainer

__all__ = ["run_sft", "load_sft_data", "num_sft_steps"]

log = logging.getLogger(__name__)


def check_sft_steps(loop: LoopConfig, num_rows: int) -> None:
    """With ``--num-epoch``, refuse a step larger than the dataset (it would pass over it several times).

    Raises:
        ConfigError: ``--rollout-batch-size`` > rows of ``--prompt-data``.
    """
    if loop.num_epoch is not None and loop.rollout_batch_size > num_rows:
        raise ConfigError(
            f"--rollout-batch-size={loop.rollout_batch_size} is larger than --prompt-data ({num_rows} rows): "
            f"one step would pass over the data {loop.rollout_batch_size / num_rows:.1f} times, more than "
            f"--num-epoch={loop.num_epoch} asks; use a batch of at most {num_rows} rows"
        )


def load_sft_data(
    d: DataConfig, tokenizer: Any, *, max_len: int | None = None
) -> tuple[list[SFTExample], list[SFTExample], int]:
    """Train and eval examples (``slime.data.sft``) and how many bad rows were skipped.

    ``d``: the data section. ``max_len``: the model's context (``slime.data.sft.model_context_len``); longer rows are bad rows."""
    if d.prompt_data is None:
        raise ConfigError(
            "--loss-type sft_loss needs --prompt-data (JSONL or Parquet of chat messages or prompt/response rows)"
        )
    kw = dict(
        tokenizer=tokenizer, input_key=d.input_key, tool_key=d.tool_key, on_bad_data=d.on_bad_data, max_len=max_len
    )
    train, num_bad = load_sft_file(d.prompt_data, flag="--prompt-data", **kw)
    evals: list[SFTExample] = []
    if d.eval_datasets:
        if len(d.eval_datasets) > 1:
            raise ConfigError(f"--eval-prompt-data: SFT evaluates one file, got {len(d.eval_datasets)} named datasets")
        evals, bad_eval = load_sft_file(d.eval_datasets[0][1], flag="--eval-prompt-data", **kw)
        num_bad += bad_eval
    return train, evals[: d.num_eval_prompts], num_bad


def num_sft_steps(loop: LoopConfig, num_rows: int) -> int:
    """``--num-rollout``, or with ``--num-epoch E``: ``E * num_rows // rollout_batch_size`` (at least 1).

    Example: 1,000 rows, 3 epochs, 64 rows a step -> 46 steps (the last partial batch of rows is
    carried into the next step, never dropped, as ``PromptSource`` runs across epochs)."""
    if loop.num_epoch is None:
        return loop.num_rollout
    return max(1, loop.num_epoch * num_rows // loop.rollout_batch_size)


@holds_run_folders  # one run per run folder (slime.loop.run_lock)
async def run_sft(config: Config, *, progress: bool = True) -> RunSummary:
    """Run (or resume, with ``config.load``) an SFT job; returns the summary also written to ``RUN_DIR/summary.json``.

    Validate, read the data (which fixes the number of steps), build the trainer (resumed from the
    checkpoint), drive the steps, write the model and the summary.

    Raises:
        ConfigError: flags an SFT run cannot honour, or a chat template without usable assistant spans.
        DataError: a malformed row (``path:line``).
    """
    config.validate()
    config.check_sft_run()
    data = await _read_data(config)
    config = data.config
    files = open_run(config.run_dir, config.load, "trained_rows.jsonl", config)
    _log_data(data.train_rows, data.eval_rows, num_steps=data.num_steps, rows_per_step=config.loop.rollout_batch_size)
    source = PromptSource(data.train_rows, shuffle=config.data.rollout_shuffle, seed=config.seed)
    trainer = await _resumed_trainer(config, files, source, num_steps=data.num_steps)
    await _drive(config, files, trainer, source, data, progress=progress)
    return await _finish(files, trainer, data)


@dataclasses.dataclass(frozen=True)
class _SFTData:
    """The rows of an SFT run and what they fix: the number of steps (and the config carrying it)."""

    config: Config
    train_rows: list[SFTExample]
    eval_rows: list[SFTExample]
    num_bad: int
    num_steps: int


async def _read_data(config: Config) -> _SFTData:
    """Tokenize the rows under the base model's context; ``--num-epoch`` turns into a number of steps."""
    from transformers import AutoConfig

    base_model = config.engine.hf_checkpoint
    tokenizer = await asyncio.to_thread(load_tokenizer, base_model, flag="--hf-checkpoint")  # checks config.json too
    max_len = model_context_len(await asyncio.to_thread(AutoConfig.from_pretrained, base_model))
    train_rows, eval_rows, num_bad = await asyncio.to_thread(load_sft_data, config.data, tokenizer, max_len=max_len)
    check_sft_steps(config.loop, len(train_rows))
    num_steps = num_sft_steps(config.loop, len(train_rows))
    if num_steps != config.loop.num_rollout:
        config = msgspec.structs.replace(config, loop=msgspec.structs.replace(config.loop, num_rollout=num_steps))
    return _SFTData(config, train_rows, eval_rows, num_bad, num_steps)


async def _resumed_trainer(config: Config, files: RunFiles, source: PromptSource, *, num_steps: int) -> TorchTrainer:
    """The torch trainer on the checkpoint's model (or the base model), its lr schedule over the run's
    optimizer steps; on a resume, its optimizer state and the data position restored."""
    from slime.train import torch_backend  # torch loads only when an SFT run starts

    ckpt, resume = files.checkpoint, files.resume
    model_dir = str(ckpt / "model") if ckpt else config.engine.hf_checkpoint
    train_cfg = resolve_lr_schedule(
        config.train, num_steps * config.loop.rollout_batch_size // config.train.global_batch_size
    )
    trainer = await asyncio.to_thread(
        torch_backend.TorchTrainer,
        train_cfg,
        model_dir=model_dir,
        policy_version=resume.policy_version if resume else 0,
        **config.trainer_kwargs(),
    )
    if ckpt is not None and resume is not None:  # both or neither (open_run_dir)
        await asyncio.to_thread(load_checkpoint, ckpt, trainer=trainer)
        source.load_state_dict(resume.source)
        log.info(
            "resuming from %s (step %d, epoch %d, row %d of the epoch)",
            ckpt,
            resume.step,
            source.epoch,
            source.position,
        )
    return trainer


async def _drive(
    config: Config, files: RunFiles, trainer: TorchTrainer, source: PromptSource, data: _SFTData, *, progress: bool
) -> None:
    """Every step (and the evals and checkpoints between them), then the final eval."""
    observers = Observers(
        config.obs, files.run_dir, num_steps=data.num_steps, run_config=msgspec.to_builtins(config), progress=progress
    )
    async with observers as obs:
        mode = SFTMode(trainer, source, files, obs, data.eval_rows, rows_per_step=config.loop.rollout_batch_size)
        await run_steps(
            mode,
            files,
            obs,
            num_steps=data.num_steps,
            eval_interval=config.loop.eval_interval,
            save_interval=config.save_interval,
            eval_before=not config.loop.skip_eval_before_train,
        )
        await mode.evaluate(data.num_steps)


async def _finish(files: RunFiles, trainer: TorchTrainer, data: _SFTData) -> RunSummary:
    """Write the trained model to ``RUN_DIR/model`` and the summary; returns the summary."""
    files.metrics.close()
    await asyncio.to_thread(trainer.save_hf, str(files.run_dir / "model"))
    summary = _summary(
        files.metrics.records,
        num_steps=data.num_steps,
        num_rows=len(data.train_rows),
        num_bad=data.num_bad,
        wall_time_s=files.seconds(),
    )
    summary["model_dir"] = str(files.run_dir / "model")
    await asyncio.to_thread(finish_run, files, summary, plots=False)
    return summary


def _log_data(train_rows: list[SFTExample], eval_rows: list[SFTExample], *, num_steps: int, rows_per_step: int) -> None:
    """The run's data in one line: rows, their tokens and trained tokens, eval rows, steps."""
    log.info(
        "SFT: %d train rows (%d tokens, %d trained), %d eval rows; %d steps of %d rows",
        len(train_rows),
        sum(len(r.input_ids) for r in train_rows),
        sum(sum(r.loss_mask) for r in train_rows),
        len(eval_rows),
        num_steps,
        rows_per_step,
    )


class SFTMode:
    """The SFT run's part of the skeleton (``slime.loop.interface.RunMode``): ``rows_per_step`` rows a step, the
    eval loss of the eval rows, checkpoints of the trainer and the data position only."""

    def __init__(
        self,
        trainer: Any,
        source: PromptSource,
        files: RunFiles,
        obs: Observers,
        eval_rows: list[SFTExample],
        *,
        rows_per_step: int,
    ):
        self.trainer, self.source, self.files, self.obs, self.rows_per_step = trainer, source, files, obs, rows_per_step
        self.eval_groups = [to_group(ex, group_id=-1 - i, policy_version=0) for i, ex in enumerate(eval_rows)]

    async def step(self, step: int) -> tuple[SFTStepRecord, list[JsonObject]]:
        t0 = time.monotonic()
        rows = [self.source.next() for _ in range(self.rows_per_step)]
        version = self.trainer.policy_version
        groups = [
            to_group(ex, group_id=(step - 1) * len(rows) + k, policy_version=version) for k, ex in enumerate(rows)
        ]
        train_metrics = await asyncio.to_thread(self.trainer.train_step, groups)
        record = _step_record(
            step, self.trainer.policy_version, self.source, groups, train_metrics, time.monotonic() - t0
        )
        return record, [{"step": step, "data_index": [ex.index for ex in rows]}]

    def step_line(self, r: SFTStepRecord) -> str:
        return (
            f"step {r.step:>5} epoch {r.epoch} loss {r.train.get('loss', float('nan')):.4f} "
            f"lr {r.train.get('lr', float('nan')):.2e} grad_norm {r.train.get('grad_norm', float('nan')):.3f} "
            f"tokens {r.trained_tokens}/{r.num_tokens} tok/s {r.tokens_per_s:.0f} {r.step_time_s:.2f}s"
        )

    async def evaluate(self, step: int) -> None:
        if not self.eval_groups:
            return
        rec = {
            "kind": "eval",
            "step": step,
            "policy_version": self.trainer.policy_version,
            **await asyncio.to_thread(self.trainer.eval_loss, self.eval_groups),
        }
        self.files.metrics.write(rec)
        self.obs.record(rec, f"eval @ step {step}: loss {rec['eval_loss']:.4f} over {int(rec['eval_tokens'])} tokens")

    def quiesced(self) -> contextlib.AbstractAsyncContextManager[None]:
        return _nothing_in_flight()

    def loop_state(self, step: int) -> LoopState:
        # no scheduler or buffer: the trainer, the step and the data position are the whole state
        return LoopState(step=step, policy_version=self.trainer.policy_version, source=self.source.state_dict())


@contextlib.asynccontextmanager
async def _nothing_in_flight():
    yield


def _step_record(
    step: int, version: int, source: PromptSource, groups: list[Group], train: TrainMetrics, step_time_s: float
) -> SFTStepRecord:
    num_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for g in groups for s in g.samples)
    return SFTStepRecord(
        step=step,
        policy_version=version,
        epoch=source.epoch,
        num_rows=len(groups),
        num_tokens=num_tokens,
        trained_tokens=int(train.num_train_tokens or 0),
        tokens_per_s=num_tokens / max(step_time_s, 1e-9),
        step_time_s=step_time_s,
        train=train.to_dict(),
    )


def _summary(
    records: list[MetricsRow], *, num_steps: int, num_rows: int, num_bad: int, wall_time_s: float
) -> RunSummary:
    """Derived from every metrics record, so a resumed run counts its whole history."""
    steps = steps_of(records, SFTStepRecord)
    evals = [r for r in records if r.get("kind") == "eval"]
    return {
        "mode": "sft",
        "num_steps": num_steps,
        "num_train_rows": num_rows,
        "bad_data_lines_skipped": num_bad,
        "eval_loss_before": evals[0]["eval_loss"]
        if evals and evals[0].get("step") == 0
        else None,  # --skip-eval-before-train
        "eval_loss_after": evals[-1]["eval_loss"] if evals else None,
        "train_loss_last": steps[-1].train.get("loss") if steps else None,
        "trained_tokens": sum(r.trained_tokens for r in steps),
        "wall_time_s": round(wall_time_s, 1),
    }
