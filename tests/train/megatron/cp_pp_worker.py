"""Run by test_megatron_cp_pp.py under ``torchrun --nproc-per-node N`` on the CPU (gloo): context and
pipeline parallel training steps against one rank.

One process group, several phases, each with megatron's parallel state built anew: first the
reference (rank 0 alone, TP = CP = PP = 1, its data-parallel peers idle), then each layout named
on the command line ("tp,cp,pp", e.g. "1,2,1" for CP=2). Every phase runs the trainer's own step
code (``MegatronTrainer._train_batch``: planning, packing with the CP split, the old-logprob pass,
the pipeline schedule, the RL loss and its backward) on the same batch: several samples of
different lengths, packed two per micro-batch. It records the per-token logprobs of the
old-logprob pass, the step loss and metrics, and the full gradient of every HF tensor
(gathered onto rank 0). ``_optimizer_step`` is replaced by what megatron's DDP and
``finalize_model_grads`` do to the gradients (sum over data x context parallel ranks; sum of the
tied embedding's two copies under PP; sum of the Q/K norms' gradients over TP) followed by the gather; the optimizer itself does not step.

CPU stand-ins (test code only): ``torch.cuda.current_device`` answers "cpu" and ``synchronize``
does nothing (``conftest.megatron_cpu``), ``Tensor.cuda`` is the identity (megatron copies the
tied embedding of a pipeline's last stage with ``.cuda()``), and the pipeline schedule's
token counter, allocated with ``device="cuda"``, is allocated on the CPU.

    torchrun --nproc-per-node N cp_pp_worker.py HF_DIR OUT_JSON LAYOUT [LAYOUT ...]

``SLIME_TEST_USE_ROLLOUT_LOGPROBS=1`` runs every phase with ``--use-rollout-logprobs``; ``SLIME_TEST_BF16=1`` with
``--bf16`` (bf16 weights in megatron's ``Float16Module``, as the trainer builds it) and records the dtype of the
logits the last stage hands to the logprob function.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import types

import torch
import torch.distributed as dist
from conftest import _PassThroughDDP  # the CPU stand-in for megatron's DDP, shared with the in-process tests

torch.cuda.current_device = lambda: "cpu"
torch.cuda.synchronize = lambda *a, **k: None
torch.Tensor.cuda = lambda self, *a, **k: self
torch.set_num_threads(1)


def _cpu_schedules() -> None:
    import megatron.core.pipeline_parallel.schedules as schedules

    proxy = types.ModuleType("torch_cpu")
    proxy.__dict__.update(torch.__dict__)
    proxy.zeros = lambda *a, device=None, **k: torch.zeros(*a, device="cpu" if device == "cuda" else device, **k)
    schedules.torch = proxy


def _groups(vocab: int):
    from slime.types import Group, Sample, Status

    g = torch.Generator().manual_seed(11)
    groups = []
    for gi in range(2):
        samples = []
        for i in range(3):
            s = Sample(
                prompt_ids=torch.randint(1, vocab, (3 + 2 * i + gi,), generator=g).tolist(),
                index=i,
                group_id=gi,
                reward=float((i + gi) % 2),
                status=Status.COMPLETED,
            )
            r = 3 + (i * 5 + 3 * gi) % 7
            s.append(
                torch.randint(1, vocab, (r,), generator=g).tolist(),
                (-torch.rand(r, generator=g)).tolist(),
                policy_version=0,
            )
            samples.append(s)
        groups.append(Group(group_id=gi, samples=samples))
    return groups


def _trainer(config, model_dir: str, ctx, *, rollout_temperature: float = 1.0):
    from megatron.core import parallel_state as ps

    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
    from slime.train.megatron.parallel import ControlChannel
    from slime.train.megatron.step import MegatronTrainStep
    from slime.train.megatron.trainer import MegatronTrainer
    from slime.train.megatron.weights import iter_hf_weights, unwrap

    class CpuStep(MegatronTrainStep):
        result: dict

        def before_update(self, batch, steps):
            batch = super().before_update(batch, steps)
            self.result["old_logprobs"] = batch.old_logprobs.clone()
            return batch

        def _optimizer_step(self) -> float:
            params = list(self.model.parameters())
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if self.ctx.world_size > 1 and ps.get_data_parallel_world_size(with_context_parallel=True) > 1:
                for p in params:  # megatron's DDP: sum over data x context parallel ranks
                    dist.all_reduce(p.grad, group=ps.get_data_parallel_group(with_context_parallel=True))
            if self.ctx.tp_size > 1:  # finalize_model_grads: replicated Q/K norms see only this rank's heads
                for name, p in self.model.named_parameters():
                    if "q_layernorm" in name or "k_layernorm" in name:
                        dist.all_reduce(p.grad, group=self.ctx.tp_group)
            if self.ctx.pp_size > 1 and self.arch.tie_word_embeddings and ps.is_rank_in_embedding_group():
                tied = unwrap(self.model).shared_embedding_or_output_weight()
                dist.all_reduce(tied.grad, group=ps.get_embedding_group())  # finalize_model_grads
            saved = [p.data for p in params]
            for p in params:
                p.data = p.grad
            self.result["grads"] = dict(iter_hf_weights(self.model, self.arch, self.ctx))
            for p, d in zip(params, saved):
                p.data = d
            return 1.0

    class CpuTrainer(MegatronTrainer):
        def __init__(self):  # MegatronTrainer.__init__ minus CUDA, megatron's DDP and optimizer
            self.config, self.model_dir, self.policy_version = config, model_dir, 0
            self.rollout_temperature, self.max_staleness = rollout_temperature, None
            self._lock = threading.Lock()
            self.arch = ModelArch.from_hf_config(load_hf_config(model_dir))
            self.tconfig = transformer_config(self.arch, config.megatron, use_cpu_initialization=True)
            self.ctx, self.channel = ctx, ControlChannel(ctx)
            self.pad_token_id, self.pad_to = 0, 1
            self.model = build_gpt_model(self.arch, self.tconfig, tp_size=ctx.tp_size, pp_rank=ctx.pp_rank)
            c = ctx
            load_hf_weights(
                self.model,
                HFCheckpointReader(model_dir),
                self.arch,
                tp_size=c.tp_size,
                tp_rank=c.tp_rank,
                pp_size=c.pp_size,
                pp_rank=c.pp_rank,
            )
            if self.tconfig.bf16:
                from megatron.core.transformer.module import Float16Module

                self.model = Float16Module(self.tconfig, self.model)
            self.ddp, self.ref_model, self.router_stats = _PassThroughDDP(self.model), None, None
            self.tconfig.no_sync_func = self.ddp.no_sync
            self.optimizer = types.SimpleNamespace(zero_grad=lambda: None)  # CpuStep replaces the optimizer step
            self.scheduler = types.SimpleNamespace(get_lr=lambda _: config.lr)
            self.result = {}
            self.step = self._new_step(CpuStep)
            self.step.result = self.result

    return CpuTrainer()


def _phase(hf_dir: str, tp: int, cp: int, pp: int, *, alone: bool) -> dict | None:
    from megatron.core import parallel_state as ps

    from slime.config import MegatronConfig, TrainConfig
    from slime.train.batch import build_train_batch
    from slime.train.megatron.parallel import init_parallel

    bf16 = os.environ.get("SLIME_TEST_BF16") == "1"
    mcfg = MegatronConfig(
        tensor_model_parallel_size=tp, context_parallel_size=cp, pipeline_model_parallel_size=pp, bf16=bf16
    )
    ctx = init_parallel(mcfg, seed=0)
    try:
        if alone:  # the reference: rank 0 as a job of one rank
            if ctx.rank != 0:
                return None
            ctx = dataclasses.replace(ctx, world_size=1, dp_size=1, dp_rank=0, dp_group=None)
        bypass = os.environ.get("SLIME_TEST_USE_ROLLOUT_LOGPROBS") == "1"  # --use-rollout-logprobs in every phase
        config = TrainConfig(
            lr=1e-3, global_batch_size=6, micro_batch_size=2, loss_agg="token_mean", entropy_coef=0.01, megatron=mcfg,
            use_rollout_logprobs=bypass,
        )  # fmt: skip
        trainer = _trainer(config, hf_dir, ctx, rollout_temperature=0.9)
        batch = build_train_batch(_groups(trainer.arch.vocab_size), pad_token_id=0, current_version=0)
        from slime.train.megatron import step as step_mod

        dtypes: set[str] = set()
        real = step_mod.vocab_parallel_logprobs
        step_mod.vocab_parallel_logprobs = lambda logits, *a, **k: (
            dtypes.add(str(logits.dtype)),
            real(logits, *a, **k),
        )[1]
        try:
            metrics = trainer._train_batch(batch).to_dict()
        finally:
            step_mod.vocab_parallel_logprobs = real
        if not alone:  # the last stage computes the logprobs: every rank's dtypes, onto rank 0
            every: list = [None] * dist.get_world_size()
            dist.all_gather_object(every, sorted(dtypes))
            dtypes = {d for seen in every for d in seen}
        return dict(trainer.result, metrics=metrics, mask=batch.loss_mask, logit_dtypes=sorted(dtypes))
    finally:
        if alone:
            dist.barrier()
        ps.destroy_model_parallel()


def main(hf_dir: str, out_path: str, *layouts: str) -> None:
    _cpu_schedules()
    dist.init_process_group("gloo")
    ref = _phase(hf_dir, 1, 1, 1, alone=True)
    out = {}
    for layout in layouts:
        tp, cp, pp = (int(x) for x in layout.split(","))
        got = _phase(hf_dir, tp, cp, pp, alone=False)
        if dist.get_rank() != 0:
            continue
        mask = ref["mask"] > 0
        grads = {
            k: float((got["grads"][k] - v).abs().max() / v.abs().max().clamp_min(1e-12))
            for k, v in ref["grads"].items()
        }
        out[layout] = {
            "logprob_max_abs_diff": float((got["old_logprobs"] - ref["old_logprobs"])[mask].abs().max()),
            "logprobs_nonzero": bool((ref["old_logprobs"][mask] != 0).all()),
            "loss": [got["metrics"]["loss"], ref["metrics"]["loss"]],
            "entropy": [got["metrics"]["entropy"], ref["metrics"]["entropy"]],
            "ratio_mean": [got["metrics"]["ratio_mean"], ref["metrics"]["ratio_mean"]],
            "grad_names_match": sorted(got["grads"]) == sorted(ref["grads"]),
            "grad_max_rel_diff": max(grads.values()),
            "grad_worst": max(grads, key=grads.get),
            "grad_norm_ref": float(sum(v.double().pow(2).sum() for v in ref["grads"].values()) ** 0.5),
            "logit_dtypes": [got["logit_dtypes"], ref["logit_dtypes"]],  # only the last stage computes logprobs
        }
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
