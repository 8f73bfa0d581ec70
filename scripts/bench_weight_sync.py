"""Weight-sync benchmark: bytes, seconds and GB/s of each strategy, delta sizes after AdamW, NCCL on 2 GPUs.

CPU part (the embedded engine in its own process, the trainer side in this one)::

    python scripts/bench_weight_sync.py cpu [--hf-checkpoint DIR] [--repeats 5] [--json OUT]

    Model: ``--hf-checkpoint``, else the warm-start architecture of scripts/make_warmstart.py with
    random weights. For disk, distributed (gloo), tensor (safetensors over HTTP) and delta it times
    ``save`` (stage) and ``load`` (push into the engine) of full syncs; then it takes one AdamW step
    (and a step after 10 warm-up steps) and measures delta sizes: (a) full fp32, (b) changed-element
    sparse (int32 index + fp32 value per changed element), (c) the codec's encoding, checking that
    (c) decodes bit-exact; also for bf16 copies (what an SGLang engine holds).

GPU part (2 GPUs; rank 0 = trainer, rank 1 = an engine's receiving side)::

    torchrun --nproc-per-node 2 scripts/bench_weight_sync.py gpu [--size-mb 1024] [--json OUT]

    Side by side: the link (NCCL all_reduce and broadcast bus bandwidth of one ``--size-mb`` tensor
    over torchrun's default group) and slime's weights-update group (``slime.sync.group``, built
    apart from that default group, as in a real run) broadcasting a random Llama's weights in bf16
    and fp32, per tensor and as flat buckets of ``--update-weight-buffer-size`` bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

BUFFER = 512 << 20  # slime's default --update-weight-buffer-size


def warmstart_like(path: Path) -> Path:
    """The warm-start architecture (scripts/make_warmstart.py MODEL_DIMS) with random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from slime.data.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def adamw_steps(model_dir: str, lr: float, warmup: int = 0, only: str | None = None):
    """(weights before, after) the last of ``warmup + 1`` AdamW steps on random next-token batches."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = [p for n, p in model.named_parameters() if only is None or n.startswith(only)]
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    vocab = model.config.vocab_size
    for i in range(warmup + 1):
        if i == warmup:
            before = {n: t.clone() for n, t in model.state_dict().items()}
        ids = torch.randint(0, vocab, (16, 32))
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return before, {n: t.detach().clone() for n, t in model.state_dict().items()}


def delta_sizes(before, after, dtype=torch.float32) -> dict:
    from slime.sync.codec import decode_payload, decode_tensor, encode_payload, encode_tensor

    old = {n: t.to(dtype) for n, t in before.items()}
    new = {n: t.to(dtype) for n, t in after.items()}
    itemsize = torch.empty((), dtype=dtype).element_size()
    full = sum(t.numel() * itemsize for t in new.values())
    bits = {2: torch.int16, 4: torch.int32}[itemsize]
    changed = sum(int((old[n].view(bits) != new[n].view(bits)).sum()) for n in new)
    t0 = time.monotonic()
    encoded = [e for n in new if (e := encode_tensor(n, old[n], new[n])) is not None]
    payload = encode_payload(encoded, {})
    t_encode = time.monotonic() - t0
    _, metas, parts = decode_payload(payload)
    exact = all(
        torch.equal(decode_tensor(n, m, parts, old[n]).view(torch.uint8), new[n].view(torch.uint8))
        for n, m in metas.items()
    )
    numel = sum(t.numel() for t in new.values())
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "changed_frac": changed / numel,
        "full_bytes": full,
        "entropy_bits": diff_entropy(old, new),
        "sparse_bytes": changed * (4 + itemsize),
        "encoded_bytes": sum(e.nbytes for e in encoded),
        "payload_bytes": len(payload),
        "payload_ratio": len(payload) / full,
        "encode_s": t_encode,
        "bit_exact": exact,
        "encodings": sorted({e.encoding for e in encoded}),
    }


def diff_entropy(old: dict, new: dict) -> float:
    """Empirical entropy, bits per element, of the exact ``new - old`` values given the exponent of ``old``:
    what a coder that models the difference per exponent class could reach (not a bound for cleverer ones)."""
    import numpy as np

    d = torch.cat([(new[n] - old[n]).float().reshape(-1) for n in new]).numpy().view(np.uint32)
    e = (torch.cat([old[n].float().reshape(-1) for n in new]).numpy().view(np.uint32) >> 23) & 0xFF
    total = 0.0
    for exp in np.unique(e):
        _, counts = np.unique(d[e == exp], return_counts=True)
        p = counts / counts.sum()
        total += counts.sum() / d.size * float(-(p * np.log2(p)).sum())
    return total


async def bench_cpu(args) -> dict:
    from safetensors.torch import load_file

    from slime.config import RolloutConfig, SyncConfig
    from slime.engines.fleet.processes import launch_embedded_engines
    from slime.engines.pool import HttpEnginePool
    from slime.sync.delta import DeltaWeightSync
    from slime.sync.disk import DiskWeightSync
    from slime.sync.distributed import DistributedWeightSync
    from slime.sync.tensor import TensorWeightSync

    tmp = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    model_dir = args.hf_checkpoint or str(warmstart_like(tmp / "model"))
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    num_params = sum(t.numel() for t in state.values())
    full_bytes = sum(t.numel() * t.element_size() for t in state.values())
    cfg = SyncConfig(weights_dir=str(tmp / "weights"), update_weight_buffer_size=args.update_weight_buffer_size)
    out: dict = {"model": model_dir, "num_params": num_params, "state_bytes": full_bytes, "strategies": {}, "delta": {}}
    async with (
        launch_embedded_engines(
            model_dir, num_engines=1, threads=1, max_running_requests=8, startup_timeout_s=120
        ) as urls,
        HttpEnginePool(urls, config=RolloutConfig(control_timeout_s=600)) as pool,
    ):
        await pool.wait_ready(120)
        save_hf = lambda d: _save_hf(state, model_dir, d)  # noqa: E731
        makers = {
            "disk": lambda: DiskWeightSync(cfg, pool=pool, save_fn=save_hf),
            "distributed": lambda: DistributedWeightSync(cfg, pool=pool, state_fn=lambda: dict(state)),
            "tensor": lambda: TensorWeightSync(cfg, pool=pool, state_fn=lambda: dict(state)),
            "delta (full)": lambda: DeltaWeightSync(cfg, pool=pool, state_fn=lambda: dict(state)),
        }
        version = 0
        for name, make in makers.items():
            sync, saves, loads = make(), [], []
            for _ in range(args.repeats + 1):  # the first one warms up (and makes the process group)
                version += 1
                t0 = time.monotonic()
                staged = await sync.save(version)
                t1 = time.monotonic()
                await sync.load(staged, version)
                saves.append(t1 - t0)
                loads.append(time.monotonic() - t1)
                if name.startswith("delta"):
                    sync = make()  # no base: every sync is a full one
            await sync.close()
            s, ld = statistics.median(saves[1:]), statistics.median(loads[1:])
            out["strategies"][name] = {
                "bytes": full_bytes,
                "save_s": s,
                "load_s": ld,
                "gb_per_s": full_bytes / (s + ld) / 1e9,
                "load_gb_per_s": full_bytes / ld / 1e9,
            }
        for label, kw in [
            ("1 AdamW step, lr 1e-6", dict(lr=1e-6)),
            ("1 AdamW step, lr 1e-5", dict(lr=1e-5)),
            ("11th AdamW step, lr 1e-6", dict(lr=1e-6, warmup=10)),
            ("1 AdamW step, lr 1e-6, last layer only", dict(lr=1e-6, only="model.layers.3.")),
        ]:
            before, after = adamw_steps(model_dir, **kw)
            row = {"fp32": delta_sizes(before, after), "bf16": delta_sizes(before, after, torch.bfloat16)}
            sync = DeltaWeightSync(cfg, pool=pool, state_fn=lambda: dict(after), base=before)  # noqa: B023  # used within this iteration
            await pool.update_weights_from_disk(
                _save_hf(before, model_dir, str(tmp / "before")), weight_version=str(version)
            )
            version += 1
            t0 = time.monotonic()
            await sync.load(await sync.save(version), version)
            row["sync"] = {**sync.stats, "wall_s": time.monotonic() - t0}
            out["delta"][label] = row
    return out


def _save_hf(state: dict, model_dir: str, out_dir: str) -> str:
    import shutil

    from safetensors.torch import save_file

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, out_dir)
    save_file(
        {n: t.contiguous() for n, t in state.items()},
        str(Path(out_dir) / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return out_dir


def bench_gpu(args) -> dict:
    """Run under torchrun with 2 processes (GPU part; see module doc)."""
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from slime.sync.group import WeightsUpdateGroup, master_store
    from slime.sync.wire import buckets

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 2, f"the GPU part needs exactly 2 processes, got WORLD_SIZE={world}"
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")  # the "training job's" default group; ours stays apart from it
    out: dict = {"gpu": torch.cuda.get_device_name(), "link": {}, "weights": {}}

    def timed(fn, repeats=args.repeats) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.monotonic()
            fn()
            torch.cuda.synchronize()
            times.append(time.monotonic() - t0)
        return statistics.median(times)

    big = torch.ones(args.size_mb << 18, device="cuda")  # float32: size_mb MiB
    nbytes = big.numel() * 4
    out["link"]["all_reduce_busbw_gb_s"] = (
        nbytes / timed(lambda: dist.all_reduce(big)) / 1e9
    )  # busbw = algbw * 2(n-1)/n = algbw at n=2
    out["link"]["broadcast_busbw_gb_s"] = nbytes / timed(lambda: dist.broadcast(big, src=0)) / 1e9
    store = master_store("127.0.0.1", 2, 600) if rank == 0 else None  # the trainer's side of slime's own group
    port = [store.port if store is not None else None]
    dist.broadcast_object_list(port, src=0)
    group = WeightsUpdateGroup.join(
        group_name="bench",
        rank=rank,
        world_size=2,
        backend="nccl",
        timeout_s=600,
        master_address="127.0.0.1",
        master_port=port[0],
        store=store,
    )
    out["link"]["weights_group_broadcast_gb_s"] = nbytes / timed(lambda: group.broadcast([big])) / 1e9
    cfg = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256),
        vocab_size=32000,
    )
    with torch.device("meta"):
        shapes = {n: (t.shape) for n, t in LlamaForCausalLM(cfg).state_dict().items()}
    out["num_params"] = sum(s.numel() for s in shapes.values())
    for dtype in (torch.bfloat16, torch.float32):
        tensors = [(n, torch.randn(s, device="cuda").to(dtype)) for n, s in shapes.items()]
        total = sum(t.numel() * t.element_size() for _, t in tensors)
        parts = buckets(tensors, args.update_weight_buffer_size)
        for flat in (False, True):
            run = lambda: [group.broadcast([t for _, t in b], flattened=flat) for b in parts]  # noqa: E731, B023  # timed within this iteration
            dt = timed(run, max(1, args.repeats // 2))
            out["weights"][f"{str(dtype)[6:]} {'flat buckets' if flat else 'per tensor'}"] = {
                "bytes": total,
                "seconds": dt,
                "gb_per_s": total / dt / 1e9,
                "num_buckets": len(parts),
            }
        del tensors
    group.destroy()
    dist.destroy_process_group()
    return out if rank == 0 else {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["cpu", "gpu"])
    p.add_argument(
        "--hf-checkpoint", default=None, help="CPU part: HF model dir (default: random warm-start architecture)"
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--update-weight-buffer-size", type=int, default=BUFFER)
    p.add_argument("--size-mb", type=int, default=1024, help="GPU part: link-test tensor size")
    p.add_argument("--hidden", type=int, default=1024, help="GPU part: Llama hidden size (random weights)")
    p.add_argument("--layers", type=int, default=24, help="GPU part: Llama layers")
    p.add_argument("--threads", type=int, default=1, help="CPU part: torch threads of this process")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    result = asyncio.run(bench_cpu(args)) if args.part == "cpu" else bench_gpu(args)
    if result:
        text = json.dumps(result, indent=1, default=str)
        print(text)
        if args.json:
            Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
