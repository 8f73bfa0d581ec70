"""Micro-benchmark of the megatron backend's kernels on one GPU (issue 18 profiling).

    python scripts/gpu/bench_kernels.py [--tokens 16384] [--ffn 4864,8960] [--hidden 896,1536] [--vocab 151936]
                                        [--sections swiglu,rmsnorm,attention,padded,logprobs]

Times forward + backward of each variant of SwiGLU ([t, 1, 2f] -> [t, 1, f]: ours, eager, compiled with
static / dynamic sizes, megatron-core's ``bias_swiglu_impl``), RMSNorm ([t, 1, h]), causal attention over
packed sequences (torch's varlen flash kernel, SDPA per sequence, SDPA on a dense batch, slime's dense path),
the dense path on ragged micro-batches with its padding copies against varlen (``padded``), and the token
logprob passes over [t, vocab] bf16 logits (whole, in token chunks, per-block statistics; ``--vocab 0``
skips them); CUDA-event medians of 20 after 5 warm-up calls; prints ms and, where it applies, the effective
bandwidth (bytes a perfect kernel moves / time). Writes $OUT/bench_kernels.json. Results:
docs/bench_kernels_h200.json, docs/benchmarks.md (issue 18).
"""

# ruff: noqa: B023  # every closure is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F


def _time(fn, warmup: int = 5, iters: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def swiglu_variants():
    from slime.train.megatron import layers

    def eager(x):
        g, u = torch.chunk(x, 2, dim=-1)
        return F.silu(g) * u

    from slime.train.megatron import swiglu_kernel

    out = {"slime_fused": layers._swiglu, "slime_triton": swiglu_kernel.swiglu, "eager": eager}
    out["compile_static"] = torch.compile(eager, dynamic=False)
    out["compile_dynamic"] = torch.compile(eager, dynamic=True)

    def view2(x):
        xv = x.view(*x.shape[:-1], 2, x.shape[-1] // 2)
        return F.silu(xv[..., 0, :]) * xv[..., 1, :]

    out["view2_dynamic"] = torch.compile(view2, dynamic=True)

    import torch._inductor.config as ic

    with ic.patch({"triton.prefer_nd_tiling": True}):  # Inductor's config is read when the graph compiles
        nd = torch.compile(lambda x: eager(x), dynamic=True)
        nd(torch.randn(64, 1, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    out["nd_tiling_dynamic"] = nd

    def flat2d(x):
        x2 = x.reshape(-1, x.shape[-1])
        g, u = torch.chunk(x2, 2, dim=-1)
        return (F.silu(g) * u).view(*x.shape[:-1], -1)

    out["flat2d_dynamic"] = torch.compile(flat2d, dynamic=True)
    try:
        from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

        out["megatron_bias_swiglu"] = lambda x: bias_swiglu_impl(x, None)
    except Exception as exc:  # noqa: BLE001
        print("megatron bias_swiglu_impl unavailable:", exc)
    for name in ("swiglu_split", "swiglu_autograd"):
        fn = getattr(layers, "_" + name, None)
        if fn is not None:
            out[name] = fn
    return out


def _blocked_row_stats(x, local_target, scale: float, block: int):
    """_row_stats over [t, v] as per-block stats ([t, v / block], one read of x) combined per row."""
    t, v = x.shape
    z = x.float().view(t, v // block, block) * scale
    mb = z.amax(-1)
    zs = z - mb.unsqueeze(-1)
    e = torch.exp(zs)
    sb, qb = e.sum(-1), (e * zs).sum(-1)
    m = mb.amax(-1)
    f = torch.exp(mb - m.unsqueeze(-1))
    s = (sb * f).sum(-1)
    q = ((qb + (mb - m.unsqueeze(-1)) * sb) * f).sum(-1)
    at = x.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).float() * scale
    return m, s, q, at


def attention_variants(tokens: int) -> dict:
    """Causal attention over packed sequences, fwd+bwd: varlen (torch's flash) vs SDPA per sequence."""
    from slime.train.megatron import layers
    from slime.train.megatron.dense_attention import dense_attention

    res = {}
    for heads, kv, d in ((14, 2, 64), (12, 2, 128)):
        for seq in (4096, 1024):
            n = tokens // seq
            cu = torch.arange(0, tokens + 1, seq, device="cuda", dtype=torch.int32)
            q0 = torch.randn(tokens, heads, d, device="cuda", dtype=torch.bfloat16)
            k0 = torch.randn(tokens, kv, d, device="cuda", dtype=torch.bfloat16)
            v0 = torch.randn_like(k0)
            g = torch.randn_like(q0)
            scale = d**-0.5

            def varlen(q, k, v):
                return layers._VARLEN(q, k, v, cu, seq, scale)

            def per_seq(q, k, v):
                out = torch.empty_like(q)
                for a in range(0, tokens, seq):
                    qs, ks, vs = (x[a : a + seq].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
                    out[a : a + seq] = o.squeeze(0).transpose(0, 1)
                return out

            def dense(q, k, v):  # all sequences one length: a [n, h, s, d] batch
                qs, ks, vs = (x.view(n, seq, x.shape[1], d).transpose(1, 2) for x in (q, k, v))
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
                return o.transpose(1, 2).reshape(tokens, heads, d)

            def dense_path(q, k, v):  # SDPACoreAttention's dense path (no padding: one length)
                return dense_attention(q, k, v, (n, seq), scale, None)

            with torch.no_grad():  # the dense path's output against the varlen kernel's
                diff = (dense_path(q0, k0, v0).float() - varlen(q0, k0, v0).float()).abs().max().item()
                res[f"h{heads}kv{kv}d{d}/seq{seq}/dense_path_max_abs_diff"] = diff
                print(f"attention h{heads}kv{kv}d{d}/seq{seq} dense path vs varlen: max |diff| {diff:.2e}")

            for name, fn in (
                ("varlen", varlen),
                ("per_seq_sdpa", per_seq),
                ("dense_sdpa", dense),
                ("dense_path", dense_path),
            ):
                q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))

                def step(fn=fn, q=q, k=k, v=v):
                    fn(q, k, v).backward(g)
                    q.grad = k.grad = v.grad = None

                try:
                    ms = _time(step)
                except Exception as exc:  # noqa: BLE001
                    print(f"attention {name}: failed {type(exc).__name__}: {exc}")
                    continue
                key = f"h{heads}kv{kv}d{d}/seq{seq}/{name}"
                res[key] = {"fwd_bwd_ms": ms}
                print(f"attention {key:40s} fwd+bwd {ms:7.3f} ms")
    return res


def padded_attention(tokens: int) -> dict:
    """The dense path on ragged micro-batches (index copies included) against varlen, fwd+bwd, at padded/unpadded
    work ratios 1.0-1.33: four sequences of ``tokens`` / 4, the last one shortened to reach each ratio."""
    from slime.train.megatron import layers
    from slime.train.megatron.dense_attention import attention_layout, dense_attention, dense_index

    res = {}
    longest = tokens // 4
    for heads, kv, d in ((14, 2, 64), (12, 2, 128)):
        for ratio in (1.0, 1.12, 1.25, 1.33):
            last = round(longest * math.sqrt(max(4 / ratio - 3, 0.0)))
            bounds = (0, longest, 2 * longest, 3 * longest, 3 * longest + last)
            t = bounds[-1]
            work = (
                4 * longest**2 / sum((b - a) ** 2 for a, b in zip(bounds[:-1], bounds[1:]))
            )  # ~ratio (last is rounded)
            layout = attention_layout(bounds, math.inf, 1)  # always dense here: the timing decides
            assert layout is not None
            index = dense_index(bounds, layout[1])
            index = None if index is None else index.cuda()
            cu = torch.tensor(bounds, device="cuda", dtype=torch.int32)
            q0 = torch.randn(t, heads, d, device="cuda", dtype=torch.bfloat16)
            k0, v0 = (torch.randn(t, kv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            g = torch.randn_like(q0)
            fns = {
                "varlen": lambda q, k, v: layers._VARLEN(q, k, v, cu, longest, d**-0.5),
                "dense_path": lambda q, k, v: dense_attention(q, k, v, layout, d**-0.5, index),
            }
            times = {}
            for name, fn in fns.items():
                q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))

                def step(fn=fn, q=q, k=k, v=v):
                    fn(q, k, v).backward(g)
                    q.grad = k.grad = v.grad = None

                try:
                    times[name] = _time(step)
                except Exception as exc:  # noqa: BLE001
                    print(f"attention padded {name}: failed {type(exc).__name__}: {exc}")
            key = f"h{heads}kv{kv}d{d}/ratio{ratio}"
            res[key] = {"work_ratio": work} | {f"{n}_fwd_bwd_ms": ms for n, ms in times.items()}
            if len(times) == 2:
                with torch.no_grad():
                    res[key]["max_abs_diff"] = (
                        (fns["dense_path"](q0, k0, v0).float() - fns["varlen"](q0, k0, v0).float()).abs().max().item()
                    )
                res[key]["speedup"] = times["varlen"] / times["dense_path"]
            print(f"attention padded {key:28s} " + "  ".join(f"{k} {v:.3f}" for k, v in res[key].items()))
    return res


def logprob_variants(tokens: int, vocab: int) -> dict:
    from slime.train.megatron import logprobs

    dev = torch.device("cuda")
    x = (3 * torch.randn(tokens, vocab, device=dev)).bfloat16()
    tgt = torch.randint(0, vocab, (tokens,), device=dev)
    lse, c = torch.randn(tokens, device=dev) + 12, torch.randn(tokens, device=dev)
    res = {}
    gb = x.numel() * 2 / 1e9

    def run(name, fn, moved_gb):
        torch._dynamo.reset()
        try:
            ms = _time(fn)
        except Exception as exc:  # noqa: BLE001
            print(f"logprobs {name}: failed {type(exc).__name__}: {exc}")
            return
        res[name] = {"ms": ms, "tb_s": moved_gb / ms}
        print(f"logprobs t={tokens} v={vocab} {name:28s} {ms:7.3f} ms  {moved_gb / ms:6.2f} TB/s")

    def chunked(fn, n):
        def go():
            step = -(-tokens // n)
            for a in range(0, tokens, step):
                fn(a, min(a + step, tokens))

        return go

    rs = lambda a, b: logprobs._row_stats(x[a:b], tgt[a:b], 1.0, vocab)  # noqa: E731
    lg = lambda a, b: logprobs._logits_grad(x[a:b], tgt[a:b], lse[a:b], c[a:b], None, None, 1.0, vocab)  # noqa: E731
    for n in (2, 1, 4):
        run(f"row_stats/{n}chunks", chunked(rs, n), gb)
        run(f"logits_grad/{n}chunks", chunked(lg, n), 2 * gb)
    for block in (128, 256, 1024):
        if vocab % block == 0:
            f = torch.compile(_blocked_row_stats, fullgraph=True)
            for n in (1, 2):

                def go(a, b, f=f, block=block):
                    torch._dynamo.maybe_mark_dynamic(x[a:b], 0)
                    return f(x[a:b], tgt[a:b], 1.0, block)

                run(f"blocked{block}/{n}chunks", chunked(go, n), gb)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--ffn", default="4864,8960")
    p.add_argument("--hidden", default="896,1536")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument(
        "--sections", default="swiglu,rmsnorm,attention,padded,logprobs", help="comma-separated subset to run"
    )
    args = p.parse_args()
    sections = set(args.sections.split(","))
    known = {"swiglu", "rmsnorm", "attention", "padded", "logprobs"}
    if sections - known:
        raise SystemExit(f"--sections: unknown {sorted(sections - known)} (known: {sorted(known)})")
    out = os.environ.get("OUT", "/tmp/slime_gpu_out")
    os.makedirs(out, exist_ok=True)

    def save() -> None:  # after every section: a later failure or the call's limit keeps the finished ones
        with open(os.path.join(out, "bench_kernels.json"), "w") as fh:
            json.dump(res, fh, indent=1)

    dev = torch.device("cuda")
    res: dict = {"swiglu": {}, "rmsnorm": {}}
    for f in [int(v) for v in args.ffn.split(",")] if "swiglu" in sections else []:
        x0 = torch.randn(args.tokens, 1, 2 * f, device=dev, dtype=torch.bfloat16)
        g = torch.randn(args.tokens, 1, f, device=dev, dtype=torch.bfloat16)
        moved = (3 * f + 2 * f + f + 2 * f) * args.tokens * 2  # fwd read 2f write f; bwd read 2f + f, write 2f
        for name, fn in swiglu_variants().items():
            x = x0.clone().requires_grad_(True)

            def step():
                y = fn(x)
                y.backward(g)
                x.grad = None

            def fwd():
                with torch.no_grad():
                    fn(x)

            try:
                ms, ms_f = _time(step), _time(fwd)
            except Exception as exc:  # noqa: BLE001
                print(f"swiglu f={f} {name}: failed {type(exc).__name__}: {exc}")
                continue
            # against fp32 math: output and gradient, largest absolute difference
            xr = x0.float().requires_grad_(True)
            gate, up = xr.chunk(2, dim=-1)
            yr = F.silu(gate) * up
            yr.backward(g.float())
            y = fn(x)
            y.backward(g)
            diff = max((y.float() - yr).abs().max().item(), (x.grad.float() - xr.grad).abs().max().item())
            x.grad = None
            res["swiglu"][f"{f}/{name}"] = {
                "fwd_bwd_ms": ms,
                "fwd_ms": ms_f,
                "tb_s": moved / ms / 1e9,
                "max_abs_diff_fp32": diff,
            }
            print(
                f"swiglu f={f:5d} {name:22s} fwd+bwd {ms:7.3f} ms  fwd {ms_f:7.3f} ms  {moved / ms / 1e9:6.2f} TB/s  |diff| {diff:.3g}"
            )
    from slime.train.megatron import layers

    for h in [int(v) for v in args.hidden.split(",")] if "rmsnorm" in sections else []:
        x0 = torch.randn(args.tokens, 1, h, device=dev, dtype=torch.bfloat16)
        w = torch.ones(h, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn_like(x0)
        x = x0.clone().requires_grad_(True)

        def step():
            layers._rms_norm(x, w, 1e-6).backward(g)
            x.grad = None

        ms = _time(step)
        res["rmsnorm"][str(h)] = {"fwd_bwd_ms": ms}
        print(f"rmsnorm h={h:5d} slime_fused fwd+bwd {ms:7.3f} ms")
    save()
    if "attention" in sections:
        res["attention"] = attention_variants(args.tokens)
        save()
    if "padded" in sections:
        res["attention_padded"] = padded_attention(args.tokens)
        save()
    if args.vocab and "logprobs" in sections:
        res["logprobs"] = logprob_variants(args.tokens, args.vocab)
        save()


if __name__ == "__main__":
    main()
