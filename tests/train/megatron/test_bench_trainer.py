"""scripts/gpu/bench_trainer.py on the CPU at the ``tiny`` shape: the H200 benchmark's own code path, so it cannot rot.

The script's ``main`` runs as on the GPU (random model written by ``make_hf_dir``, synthetic groups,
``measure``, the profile, JSON and table), with one substitution: megatron's DDP and optimizer
allocate on CUDA, so the megatron backend is conftest's CPU trainer (its own step code, torch's
AdamW). What this checks is the harness (every number present and consistent, the speed-up rows,
the profile's fields), not speed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from slime.train_metrics import TrainMetrics

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu" / "bench_trainer.py"
sys.path.insert(0, str(ROOT / "tests" / "gpu"))  # megatron_common, as the script imports it


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_trainer_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_trainer_runs_both_backends_at_a_tiny_shape_on_the_cpu(
    tmp_path, megatron_cpu, cpu_megatron_trainer, capsys, monkeypatch
):
    from slime.bench.trainer import megatron_backend
    from slime.train.megatron.layers import SDPACoreAttention

    script = _load_script()
    ratios_at_build = []

    def cpu_megatron(cfg, model_dir, device):
        ratios_at_build.append(SDPACoreAttention.dense_padding_ratio)
        trainer = cpu_megatron_trainer(cfg, model_dir, megatron_cpu)
        trainer.close = lambda: None  # the module's parallel state outlives this trainer (megatron_cpu)
        return megatron_backend(trainer)

    factories = {"megatron": cpu_megatron}
    argv = [
        "--backends",
        "transformers,megatron,megatron+varlen_attention",
        "--shapes",
        "tiny",
        "--num-samples",
        "4",
        "--seq-len",
        "64",
        "--max-tokens-per-gpu",
        "128",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--profile",
        "--model-root",
        str(tmp_path / "models"),
        "--out",
        str(tmp_path / "out"),
    ]
    assert script.main(argv, factories=factories) == 0

    out = capsys.readouterr().out
    assert "bench_trainer: PASSED" in out and "| tiny | megatron |" in out and "| tiny | transformers |" in out
    result = json.loads((tmp_path / "out" / "bench_trainer.json").read_text())
    tiny = result["shapes"]["tiny"]
    assert tiny["tokens_per_step"] == 4 * 64 and tiny["train_flops_per_step"] == 3 * tiny["fwd_flops_per_step"] > 0
    for name in ("transformers", "megatron"):
        r = tiny["backends"][name]
        assert len(r["rl_step_times_s"]) == len(r["old_logprob_pass_times_s"]) == 2
        assert r["rl_step_s"] > 0 and r["old_logprob_pass_s"] > 0 and r["train_opt_s"] > 0
        assert r["mfu_train_opt"] > 0 and r["mfu_rl_step"] > 0 and r["loss"] is not None
        assert r["attention_dense_fraction"] is None  # reported by the megatron step on a GPU in half precision only
    times = tiny["backends"]["megatron"]["rl_step_times_s"]
    ref_s = tiny["backends"]["transformers"]["rl_step_s"]
    assert f"megatron's steps give {ref_s / max(times):.2f}x to {ref_s / min(times):.2f}x" in out
    assert tiny["speedup_rl_step"] == pytest.approx(
        tiny["backends"]["transformers"]["rl_step_s"] / tiny["backends"]["megatron"]["rl_step_s"]
    )
    candidate = tiny["backends"]["megatron+varlen_attention"]  # same weights, data and math as the default
    assert candidate["rl_step_vs_megatron"] == pytest.approx(
        tiny["backends"]["megatron"]["rl_step_s"] / candidate["rl_step_s"]
    )
    assert candidate["loss"] == pytest.approx(tiny["backends"]["megatron"]["loss"], rel=1e-5, abs=1e-7)
    assert candidate["grad_norm"] == pytest.approx(tiny["backends"]["megatron"]["grad_norm"], rel=1e-5)
    assert "megatron+varlen_attention RL step" in out
    assert ratios_at_build == [
        SDPACoreAttention.dense_padding_ratio,
        0.0,
    ]  # the candidate was in place for its build and steps only
    for r in tiny["backends"].values():
        assert len(r["gc_pause_ms_per_step"]) == 2 and r["gc_full_collections"] == sum(
            s["gc_full"] for s in r["per_step"][1:]
        )
        assert len(r["per_step"]) == 3 and [s["rl_step_s"] for s in r["per_step"][1:]] == r["rl_step_times_s"]
        assert {"graphs_compiled", "gc_ms", "old_logprob_pass_s"} <= r["per_step"][0].keys()
    profile = json.loads((tmp_path / "out" / "bench_trainer_profile.json").read_text())["tiny"]
    for name in ("transformers", "megatron"):
        p = profile[name]
        assert p["wall_ms"] > 0 and p["gpu_busy_ms"] > 0 and p["top_kernels"] and p["host_syncs"] >= 0


def test_the_reference_and_the_megatron_step_see_the_same_loss_on_the_cpu(tmp_path, megatron_cpu, cpu_megatron_trainer):
    """Same groups, weights and objective: two RL steps' losses and grad norms agree (fp32 on the CPU)."""
    import megatron_common
    import torch

    from slime.bench.trainer import SHAPES, TransformersReference
    from slime.config import MegatronConfig, TrainConfig

    model_dir = megatron_common.make_hf_dir(str(tmp_path / "tiny"), SHAPES["tiny"], dtype=torch.float32, device="cpu")
    groups = megatron_common.make_groups(
        vocab_size=SHAPES["tiny"]["vocab_size"], num_groups=1, group_size=4, prompt_len=8, response_len=24
    )
    cfg = TrainConfig(
        global_batch_size=2,
        micro_batch_size=1,
        lr=1e-2,
        megatron=MegatronConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=64),
    )
    ref = TransformersReference(cfg, model_dir=model_dir, device=torch.device("cpu"), precision="fp32")
    megatron = cpu_megatron_trainer(cfg, model_dir, megatron_cpu)
    for _ in range(2):  # two optimizer steps per RL step: the second is off-policy (ratio != 1, loss != 0)
        got, want = ref.rl_step(groups).to_dict(), megatron.train_step(groups).to_dict()
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-3) and got["grad_norm"] > 0
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-3, abs=1e-7)
    assert abs(got["loss"]) > 1e-5


def _one_step_argv(backends, tmp_path):
    """One timed step, no warm-up, 4 samples of 64 tokens at the tiny shape."""
    argv = [
        "--backends",
        backends,
        "--shapes",
        "tiny",
        "--num-samples",
        "4",
        "--seq-len",
        "64",
        "--max-tokens-per-gpu",
        "128",
    ]
    return argv + ["--steps", "1", "--warmup", "0", "--model-root", str(tmp_path / "m"), "--out", str(tmp_path / "o")]


def test_a_failing_candidate_is_recorded_and_the_bench_goes_on(tmp_path, capsys, monkeypatch):
    import contextlib

    script = _load_script()

    @contextlib.contextmanager
    def broken():
        raise RuntimeError("cuDNN: no kernel for this shape")
        yield

    monkeypatch.setitem(script.CANDIDATES, "broken", broken)
    with pytest.raises(SystemExit, match=r"unknown shapes/backends: \['transformers\+broken'\]"):  # megatron only
        script.main(["--backends", "transformers,transformers+broken", "--shapes", "tiny"])
    argv = _one_step_argv("transformers,megatron+broken", tmp_path)
    assert script.main(argv, factories={"megatron": lambda *a: pytest.fail("built despite its candidate failing")}) == 0
    tiny = json.loads((tmp_path / "o" / "bench_trainer.json").read_text())["shapes"]["tiny"]["backends"]
    assert tiny["megatron+broken"] == {"skipped": "RuntimeError: cuDNN: no kernel for this shape"}
    assert tiny["transformers"]["rl_step_s"] > 0 and "bench_trainer: PASSED" in capsys.readouterr().out


def test_candidates_combine_and_an_unknown_one_in_a_combination_is_refused(tmp_path, capsys, monkeypatch):
    import contextlib

    script = _load_script()
    entered: list[str] = []

    def recording(name):
        @contextlib.contextmanager
        def swap():
            entered.append(name)
            raise RuntimeError(f"{name} refused")
            yield

        return swap

    events: list[str] = []

    def working(name):
        @contextlib.contextmanager
        def swap():
            events.append(f"enter {name}")
            try:
                yield
            finally:
                events.append(f"exit {name}")

        return swap

    monkeypatch.setitem(script.CANDIDATES, "a", recording("a"))
    monkeypatch.setitem(script.CANDIDATES, "x", working("x"))
    monkeypatch.setitem(script.CANDIDATES, "y", working("y"))
    with pytest.raises(SystemExit, match=r"unknown shapes/backends: \['nope'\]"):
        script.main(["--backends", "transformers,megatron+a+nope", "--shapes", "tiny"])
    argv = _one_step_argv("transformers,megatron+a+varlen_attention", tmp_path)
    assert script.main(argv, factories={"megatron": lambda *a: pytest.fail("built despite its candidate failing")}) == 0
    tiny = json.loads((tmp_path / "o" / "bench_trainer.json").read_text())["shapes"]["tiny"]["backends"]
    assert entered == ["a"] and tiny["megatron+a+varlen_attention"] == {"skipped": "RuntimeError: a refused"}
    argv[1] = "transformers,megatron+x+y"  # a build that fails inside both swaps: recorded, and both undone
    assert script.main(argv, factories={"megatron": lambda *a: {}["no megatron here"]}) == 0
    tiny = json.loads((tmp_path / "o" / "bench_trainer.json").read_text())["shapes"]["tiny"]["backends"]
    assert tiny["megatron+x+y"] == {"skipped": "KeyError: 'no megatron here'"}
    assert events == ["enter x", "enter y", "exit y", "exit x"]


def test_each_finished_shape_is_on_disk_before_the_next_one_runs(tmp_path, monkeypatch):
    script = _load_script()
    calls: list[str] = []

    def run_shape(name, args, factories, device, ceiling):
        calls.append(name)
        if len(calls) == 2:
            raise RuntimeError("a kernel fault ends the process")
        return {"backends": {"transformers": {"rl_step_s": 1.0}}}, {}

    monkeypatch.setattr(script, "run_shape", run_shape)
    with pytest.raises(RuntimeError, match="kernel fault"):
        script.main(["--shapes", "tiny,qwen2-0.5b", "--backends", "transformers", "--out", str(tmp_path / "o")])
    saved = json.loads((tmp_path / "o" / "bench_trainer.json").read_text())["shapes"]
    assert calls == ["tiny", "qwen2-0.5b"] and saved == {"tiny": {"backends": {"transformers": {"rl_step_s": 1.0}}}}


def test_gc_pauses_count_the_collections_inside_the_block_only():
    import gc

    from slime.bench.step_profile import GCPauses

    before = list(gc.callbacks)
    with GCPauses() as pauses:
        gc.collect()
        gc.collect(0)
    assert pauses.full == 1 and pauses.ms > 0 and gc.callbacks == before
    gc.collect()
    assert pauses.full == 1


def test_the_profile_counts_each_kernel_once_not_again_through_the_op_that_launched_it():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from slime.bench.step_profile import tally_events

    def row(key, device, us, count=1, cpu_us=0.0, annotation=False):
        return SimpleNamespace(
            key=key,
            device_type=device,
            self_device_time_total=us,
            self_cpu_time_total=cpu_us,
            count=count,
            is_user_annotation=annotation,
        )

    rows = [
        row("aten::mm", DeviceType.CPU, 5000.0, 10, cpu_us=300.0),  # the op: its kernels' time again
        row("nvjet_sm90_tst_256x128", DeviceType.CUDA, 5000.0, 10),
        row("CompiledFunction", DeviceType.CUDA, 5000.0, 10, annotation=True),  # a range over kernels counted above
        row("cudaLaunchKernel", DeviceType.CPU, 0.0, 12),
        row("cudaStreamSynchronize", DeviceType.CPU, 0.0, 2),
    ]
    kernels, syncs, launches = tally_events(rows, cuda=True)
    assert kernels == {"nvjet_sm90_tst_256x128": (5000.0, 10)} and (syncs, launches) == (2, 12)
    kernels, _, _ = tally_events(rows, cuda=False)  # no kernels on the CPU: ATen ops' own time
    assert kernels == {"aten::mm": (300.0, 10)}


def test_fresh_data_gives_every_step_new_groups_and_counts_the_timed_steps_flops(tmp_path):
    import megatron_common
    import torch

    from slime.bench.trainer import SHAPES, flops_per_token

    script = _load_script()
    seen: list[tuple[list[int], list[int]]] = []

    class Recording:
        device = torch.device("cpu")

        def rl_step(self, groups):
            seen.append(([len(s.response_ids) for g in groups for s in g.samples], []))
            return TrainMetrics(loss=0.0, grad_norm=0.0)

        def old_logprob_pass(self, groups):
            seen[-1][1].extend(len(s.response_ids) for g in groups for s in g.samples)

        def close(self):
            pass

    argv = ["--backends", "transformers", "--shapes", "tiny", "--num-samples", "4", "--seq-len", "64", "--fresh-data"]
    argv += ["--steps", "2", "--warmup", "1", "--model-root", str(tmp_path / "m"), "--out", str(tmp_path / "o")]
    assert script.main(argv, factories={"transformers": lambda cfg, d, dev: Recording()}) == 0
    assert len(seen) == 3 and all(
        rl == old for rl, old in seen
    )  # the step and its old-logprob pass see one step's data
    assert len({tuple(rl) for rl, _ in seen}) == 3  # new groups every step
    kw = dict(
        vocab_size=SHAPES["tiny"]["vocab_size"], num_groups=1, group_size=4, prompt_len=8, response_len=56, ragged=True
    )
    timed = [
        [8 + len(s.response_ids) for g in megatron_common.make_groups(seed=i, **kw) for s in g.samples] for i in (2, 3)
    ]
    assert [[n - 8 for n in ls] for ls in timed] == [seen[1][0], seen[2][0]]
    tiny = json.loads((tmp_path / "o" / "bench_trainer.json").read_text())["shapes"]["tiny"]
    assert tiny["tokens_per_step"] == pytest.approx(sum(map(sum, timed)) / 2)
    want = sum(n * flops_per_token(SHAPES["tiny"], n)[0] for ls in timed for n in ls) / 2
    assert tiny["fwd_flops_per_step"] == pytest.approx(want) and tiny["train_flops_per_step"] == pytest.approx(3 * want)


def test_the_megatron_backend_without_cuda_is_refused_before_anything_is_built(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the megatron backend")
    script = _load_script()
    with pytest.raises(
        SystemExit, match="the megatron backend needs CUDA; on a CPU: --shapes tiny --backends transformers,torch"
    ):
        script.main(
            [
                "--shapes",
                "tiny",
                "--backends",
                "transformers,megatron+varlen_attention",
                "--model-root",
                str(tmp_path / "m"),
            ]
        )
    assert not (tmp_path / "m").exists()


def test_idle_gaps_sum_uncovered_time_and_name_the_kernel_that_ended_each_gap():
    from slime.bench.step_profile import idle_gaps

    # two streams overlap (b inside a); a 100 us gap before c, a 10 us one before d (below min_us), 50 us before c again
    events = [(0, 100, "a"), (20, 60, "b"), (200, 250, "c"), (260, 300, "d"), (350, 400, "c")]
    g = idle_gaps(events, min_us=20)
    assert g["idle_ms"] == pytest.approx(0.16)  # 100 + 10 + 50 us
    assert g["gaps"] == 2
    assert g["before"] == [{"name": "c", "ms": 0.15, "gaps": 2}]
    assert idle_gaps([])["idle_ms"] == 0 and idle_gaps([])["before"] == []


def test_sync_sites_count_the_python_lines_that_warned_of_a_sync():
    import warnings

    from slime.bench.step_profile import sync_sites

    def waits_here():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    def step():
        for _ in range(3):
            waits_here()
        warnings.warn("something else", UserWarning, stacklevel=1)  # not a sync: not counted

    shown = []
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *a, **k: shown.append(str(message))
        sites = sync_sites(step)
        innermost = sync_sites(step, depth=1)
    assert len(sites) == 1 and sites[0]["calls"] == 3
    assert "waits_here" in sites[0]["site"] and "step" in sites[0]["site"] and "warnings.py" not in sites[0]["site"]
    assert shown == ["something else"] * 2  # other warnings are shown as before
    assert innermost[0]["site"].split(" ")[1] == "waits_here"
    with warnings.catch_warnings(record=True) as seen:  # the hook is gone afterwards
        warnings.simplefilter("always")
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
    assert len(seen) == 1


def test_profile_summary_on_the_cpu_names_the_ops_with_the_most_host_time():
    import torch

    from slime.bench.step_profile import format_profile, profile_summary

    a = torch.randn(64, 64)
    s = profile_summary(lambda: [a @ a for _ in range(5)], "cpu", top=5)
    assert (
        s["host_ops"] and any("mm" in r["name"] for r in s["host_ops"]) and all(r["self_ms"] > 0 for r in s["host_ops"])
    )
    assert "idle_gaps" not in s  # no GPU timeline on the CPU
    assert "host" in format_profile("cpu", s)
