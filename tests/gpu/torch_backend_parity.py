"""The main job's train step with the torch backend on a GPU, against the CPU fp32 trainer.

    python tests/gpu/torch_backend_parity.py --record 'DIR/rollout_{rollout_id}.msgpack' [--device cuda]

The groups are one recorded step of the main job (``scripts/quickstart.sh``'s recipe with
``--debug-rollout-only --save-debug-rollout-data``), so the tokens are what the policy sampled.
Three trainers start from the same checkpoint (the shipped arithmetic warm start) with the main
job's train config (global = micro batch 128, lr 3e-5, TIS, temperature 1): the reference (CPU,
fp32), ``--device`` fp32 and ``--device`` bf16 (autocast, fp32 master weights). Each computes the
old logprobs of the step, takes the train step, and computes them again (the next step's old
logprobs, after the update). Compared against the reference over the trained response tokens:

    fp32: mean |diff| <= 1e-5, max <= 1e-3 nats         (device placement alone)
    bf16: mean |diff| <= 1e-2, max <= 0.25 nats         (bf16 rounding of matmuls and attention)

and the step's loss within 1e-4 (fp32) / 1e-2 (bf16) of the reference's. Writes
$OUT/torch_backend_parity.json; exits 1 when a bound is missed. ``--device cpu`` runs the same
checks on the CPU (the bf16 trainer is then CPU autocast), which is how the script is tested here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

TOLERANCES = {"fp32": {"mean": 1e-5, "max": 1e-3, "loss": 1e-4}, "bf16": {"mean": 1e-2, "max": 0.25, "loss": 1e-2}}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--record", required=True, help="path template of the recorded step ({rollout_id})")
    p.add_argument("--model-dir", default=None, help="default: the shipped arithmetic warm start")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()

    from slime.cli.preflight import DEFAULT_CHECKPOINT
    from slime.config import MegatronConfig, TrainConfig
    from slime.loop.record import load_rollout_record
    from slime.train.batch import build_train_batch
    from slime.train.torch_backend import TorchTrainer

    model_dir = args.model_dir or DEFAULT_CHECKPOINT
    groups = load_rollout_record(args.record, 1).groups

    def trainer(device: str, bf16: bool) -> TorchTrainer:
        cfg = TrainConfig(
            global_batch_size=128,
            micro_batch_size=128,
            lr=3e-5,
            use_tis=True,
            num_threads=min(8, os.cpu_count() or 1),
            device=device,
            megatron=MegatronConfig(bf16=bf16),
        )
        return TorchTrainer(cfg, model_dir=model_dir, rollout_temperature=1.0, seed=1)

    def old_logprobs(t: TorchTrainer) -> tuple[torch.Tensor, torch.Tensor]:
        batch = build_train_batch(groups, pad_token_id=t.pad_token_id, current_version=t.policy_version)
        mbs = [mb for step in t._plan(batch.seq_lens.tolist()) for mb in step]
        return t._before_update(batch.to(t.device), mbs).old_logprobs.cpu(), batch.loss_mask

    runs = {}
    for name, device, bf16 in (("reference", "cpu", False), ("fp32", args.device, False), ("bf16", args.device, True)):
        t = trainer(device, bf16)
        before, mask = old_logprobs(t)
        t0 = time.perf_counter()
        metrics = t.train_step(groups).to_dict()
        if t.device.type == "cuda":
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
        after, _ = old_logprobs(t)
        runs[name] = dict(before=before, after=after, mask=mask, metrics=metrics, step_s=step_s, device=str(t.device))

    ref = runs["reference"]
    mask = ref["mask"].bool()
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "num_samples": int(mask.shape[0]),
        "num_train_tokens": int(mask.sum()),
        "tolerances": TOLERANCES,
        "checks": {},
    }
    ok = True
    for name in ("fp32", "bf16"):
        run, tol = runs[name], TOLERANCES[name]
        entry = {
            "device": run["device"],
            "train_step_s": run["step_s"],
            "reference_train_step_s": ref["step_s"],
            "loss": run["metrics"]["loss"],
            "reference_loss": ref["metrics"]["loss"],
            "train_rollout_logprob_abs_diff": run["metrics"].get("train_rollout_logprob_abs_diff"),
            "reference_train_rollout_logprob_abs_diff": ref["metrics"].get("train_rollout_logprob_abs_diff"),
        }
        passed = abs(entry["loss"] - entry["reference_loss"]) <= tol["loss"]
        for when in ("before", "after"):
            diff = (run[when] - ref[when]).abs()[mask]
            entry[f"{when}_step_mean_abs_diff"] = float(diff.mean())
            entry[f"{when}_step_p99_abs_diff"] = float(diff.quantile(0.99))
            entry[f"{when}_step_max_abs_diff"] = float(diff.max())
            passed &= (
                entry[f"{when}_step_mean_abs_diff"] <= tol["mean"] and entry[f"{when}_step_max_abs_diff"] <= tol["max"]
            )
        entry["passed"] = bool(passed)
        result["checks"][name] = entry
        ok &= passed
    result["passed"] = bool(ok)

    import json

    text = json.dumps(result, indent=2, sort_keys=True)
    print(text, flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "torch_backend_parity.json"), "w") as f:
        f.write(text + "\n")
    print(f"torch_backend_parity: {'PASSED' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
