"""The printed table, the target check, the simulator-vs-real comparison and the PNG of ``slime bench rollout``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from slime.types import JsonObject

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from slime.bench.workload import Workload

__all__ = [
    "TARGETS",
    "REAL_ENGINE_TARGETS",
    "WORKLOAD_BOUND",
    "off_standard",
    "check_targets",
    "sim_vs_real",
    "format_table",
    "plot",
]

TARGETS: list[tuple[str, str, float]] = [
    # (name, ">=" or "<=", bound): issue 3, items 7-8
    ("april.speedup_vs_sync", ">=", 1.8),
    ("async.speedup_vs_sync", ">=", 2.5),
    ("april.slot_utilization", ">=", 0.6),
    ("async.slot_utilization", ">=", 0.85),
    ("sync.client_cpu_ms_per_request", "<=", 5.0),
    ("april.client_cpu_ms_per_request", "<=", 5.0),
    ("async.client_cpu_ms_per_request", "<=", 5.0),
    ("scheduler_completions_per_s", ">=", 10_000.0),
    ("http_ratio_vs_bare", ">=", 0.8),
]
REAL_ENGINE_TARGETS: list[tuple[str, str, float]] = [
    # issue 13, item 7: on a real SGLang; every delivered sample has exactly its drawn length
    ("april.speedup_vs_sync", ">=", 2.0),
    ("async.speedup_vs_sync", ">=", 3.0),
    ("sync.length_mismatch_samples", "<=", 0),
    ("april.length_mismatch_samples", "<=", 0),
    ("async.length_mismatch_samples", "<=", 0),
]


def _lookup(results: JsonObject, name: str) -> float | None:
    mode, _, key = name.partition(".")
    if key:
        value = results["modes"].get(mode, {}).get(key)
    else:
        value = results.get(name)
    return None if value is None else float(value)


WORKLOAD_BOUND = ("speedup_vs_sync", "slot_utilization")
"""Measures whose targets hold for the standard workload only (``Workload()``: its long tail, batch and train
time make the speedups); the others (CPU per request, length mismatches, the overhead benches) hold for any."""


def off_standard(wl: Workload, *, real_engine: bool = False) -> str | None:
    """How ``wl`` differs from the standard workload (``Workload()``; the seed, and on real engines the time
    scale, left out), e.g. ``"--steps 2 (standard 10)"``; None when it is the standard one."""
    from slime.bench.workload import Workload

    skip = {"seed", "time_scale"} if real_engine else {"seed"}
    standard = Workload()
    diffs = [
        f"--{name.replace('_', '-')} {getattr(wl, name)} (standard {getattr(standard, name)})"
        for name in wl.__struct_fields__
        if name not in skip and getattr(wl, name) != getattr(standard, name)
    ]
    return ", ".join(diffs) or None


def check_targets(
    results: JsonObject, targets: list[tuple[str, str, float]] = TARGETS, *, off_workload: str | None = None
) -> dict[str, JsonObject]:
    """``{name: {"target": ">= 1.8", "measured": x | None, "met": bool | None}}`` (None: not measured, or not
    applicable). ``off_workload`` (``off_standard``'s words): the ``WORKLOAD_BOUND`` targets are not applicable,
    ``"not_applicable": "off the standard workload: ..."``, whatever was measured."""
    out: dict[str, JsonObject] = {}
    for name, op, bound in targets:
        x = _lookup(results, name)
        met = None if x is None else (x >= bound if op == ">=" else x <= bound)
        out[name] = {"target": f"{op} {bound:g}", "measured": x, "met": met}
        if off_workload is not None and name.partition(".")[2] in WORKLOAD_BOUND:
            out[name] |= {"met": None, "not_applicable": f"off the standard workload: {off_workload}"}
    return out


def sim_vs_real(real: dict[str, JsonObject], sim: dict[str, JsonObject]) -> dict[str, JsonObject]:
    """Per mode in both: real vs simulated numbers per second of engine time, and the simulator's
    relative error on delivered tokens/s (``sim / real - 1``)."""
    out = {}
    for mode in real:
        if mode not in sim:
            continue
        r, s = real[mode], sim[mode]
        out[mode] = {
            "real_tokens_per_s": r["delivered_tokens_per_engine_s"],
            "sim_tokens_per_s": s["delivered_tokens_per_engine_s"],
            "rel_error": s["delivered_tokens_per_engine_s"] / r["delivered_tokens_per_engine_s"] - 1.0,
            "real_speedup_vs_sync": r.get("speedup_vs_sync"),
            "sim_speedup_vs_sync": s.get("speedup_vs_sync"),
            "real_occupancy": r["engine_occupancy"],
            "sim_occupancy": s["engine_occupancy"],
            "real_step_p50_s": r["step_time_p50_engine_s"],
            "sim_step_p50_s": s["step_time_p50_engine_s"],
            "real_off_policy": r["off_policy_token_fraction"],
            "sim_off_policy": s["off_policy_token_fraction"],
        }
    return out


# (header, format, metric key); each table's first column is the mode
_COLUMNS = [
    ("tokens/s", "{:,.0f}", "delivered_tokens_per_s"),
    ("x sync", "{:.2f}", "speedup_vs_sync"),
    ("trained tok/s", "{:,.0f}", "trained_tokens_per_s"),
    ("samples/s", "{:.1f}", "samples_per_s"),
    ("occupancy", "{:.3f}", "engine_occupancy"),
    ("slot util", "{:.3f}", "slot_utilization"),
    ("util busy", "{:.3f}", "slot_utilization_busy"),
    ("step p50 s", "{:.1f}", "step_time_p50_s"),
    ("step p99 s", "{:.1f}", "step_time_p99_s"),
    ("off-policy", "{:.3f}", "off_policy_token_fraction"),
    ("max lag", "{}", "max_version_lag"),
    ("wasted tok", "{:,}", "wasted_tokens"),
    ("cpu ms/req", "{:.2f}", "client_cpu_ms_per_request"),
    ("requests", "{:,}", "requests_issued"),
    ("aborted", "{:,}", "aborted_samples"),
    ("resumed", "{:,}", "resumed_samples"),
    ("len mismatch", "{:,}", "length_mismatch_samples"),
]
_SIM_COLUMNS = [
    ("real tok/s", "{:,.0f}", "real_tokens_per_s"),
    ("sim tok/s", "{:,.0f}", "sim_tokens_per_s"),
    ("sim error", "{:+.1%}", "rel_error"),
    ("real x sync", "{:.2f}", "real_speedup_vs_sync"),
    ("sim x sync", "{:.2f}", "sim_speedup_vs_sync"),
    ("real occ", "{:.3f}", "real_occupancy"),
    ("sim occ", "{:.3f}", "sim_occupancy"),
    ("real step p50 s", "{:.2f}", "real_step_p50_s"),
    ("sim step p50 s", "{:.2f}", "sim_step_p50_s"),
    ("real off-pol", "{:.3f}", "real_off_policy"),
    ("sim off-pol", "{:.3f}", "sim_off_policy"),
]


def _table(columns: list[tuple[str, str, str]], rows_by_mode: dict[str, JsonObject]) -> list[str]:
    rows = [["mode"] + [h for h, _, _ in columns]]
    for mode, m in rows_by_mode.items():
        rows.append([mode] + [("-" if m.get(k) is None else fmt.format(m[k])) for _, fmt, k in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_table(results: JsonObject) -> str:
    """A plain-text table (one row per mode), then the overhead numbers, the simulator-vs-real table
    (with ``--calibrate-sim``) and the target check."""
    lines = _table(_COLUMNS, results["modes"])
    for mode, m in results["modes"].items():
        hist = ", ".join(
            f"{k}: {v / max(1, sum(m['lag_histogram'].values())):.1%}" for k, v in m["lag_histogram"].items()
        )
        lines.append(f"{mode:>5} token lag (versions behind the trainer): {hist}")
    sched, http = results.get("scheduler"), results.get("http")
    if sched:
        lines.append(
            f"scheduler on an instant in-process engine: {sched['completions_per_s']:,.0f} completions/s "
            f"({sched['cpu_us_per_completion']:.1f} us CPU each); with SimEngine(instant) in-process: "
            f"{results.get('scheduler_sim_engine', {}).get('completions_per_s', float('nan')):,.0f}/s"
        )
    if http:
        lines.append(
            f"HTTP, instant engine on loopback, concurrency {http['concurrency']}: HttpEnginePool {http['http_requests_per_s']:,.0f} req/s "
            f"({http['ours_client_cpu_ms_per_request']:.3f} ms CPU/req), bare aiohttp {http['bare_aiohttp_requests_per_s']:,.0f} req/s "
            f"({http['bare_client_cpu_ms_per_request']:.3f} ms CPU/req): ratio {http['ratio_vs_bare']:.2f}"
        )
    cal = results.get("calibration")
    if cal:
        points = ", ".join(f"{n}: {ms:.2f}" for n, ms in cal["points"])
        prefill = (
            "-" if cal.get("prefill_ms_per_token") is None else f"{1000 * cal['prefill_ms_per_token']:.2f} us/token"
        )
        lines.append(
            f"calibration (real engine, before the modes): decode step = {cal['decode_step_ms']:.3f} + "
            f"{cal['decode_step_per_req_ms']:.5f} x running ms (r2 {cal['r2']:.3f}; ms per step at N running: {points}); "
            f"prefill {prefill}; weight load {cal['weight_sync_ms']:.0f} ms (median of the real run)"
        )
        lines.append(
            f"simulated engine calibrated to it (time scale {results['sim_workload']['time_scale']:g}; "
            "rates and step times per second of engine time):"
        )
        lines += _table(_SIM_COLUMNS, results["sim_vs_real"])
    for name, t in results["targets"].items():
        if t.get("not_applicable") and t["measured"] is not None:
            lines.append(f"target {name} {t['target']}: measured {t['measured']:.3g} -> n/a ({t['not_applicable']})")
        elif t["met"] is not None:
            lines.append(
                f"target {name} {t['target']}: measured {t['measured']:.3g} -> {'met' if t['met'] else 'MISSED'}"
            )
    return "\n".join(lines)


def plot(results: JsonObject, path: str | Path) -> None:
    """Three panels: delivered tokens/s, engine occupancy (client side), step time per step, in wall
    seconds. With a calibrated simulated run, its bars (hatched) and step times (dashed) sit beside
    the real ones, and every rate and time is per second of engine time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real, sim = results["modes"], results.get("sim_modes") or {}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.8))
    _bar_panels(ax1, ax2, real, sim)
    _step_time_panel(ax3, real, sim)
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


_COLORS = {"sync": "#7f7f7f", "april": "#1f77b4", "async": "#d62728"}


def _bar_panels(ax1: Axes, ax2: Axes, real: dict[str, JsonObject], sim: dict[str, JsonObject]) -> None:
    """Delivered tokens/s (with each mode's speedup over sync) and engine occupancy per mode; the simulated
    run's bars hatched beside the real ones."""
    modes = list(real)
    width = 0.4 if sim else 0.8
    xs = list(range(len(modes)))
    rate = "delivered_tokens_per_engine_s" if sim else "delivered_tokens_per_s"
    for ax, key, title in (
        (ax1, rate, "delivered tokens/s (whole loop)"),
        (ax2, "engine_occupancy", "engine occupancy (client side)"),
    ):
        for offset, runs, hatch in ((0.0, real, None), (width, sim, "//")):
            if not runs:
                continue
            vals = [runs[m].get(key) or 0.0 for m in modes]
            bars = ax.bar(
                [x + offset for x in xs],
                vals,
                width,
                color=[_COLORS.get(m, "C0") for m in modes],
                hatch=hatch,
                edgecolor="k" if hatch else None,
                label="simulated" if hatch else ("real" if sim else None),
            )
            if key.startswith("delivered"):
                for bar, m in zip(bars, modes):
                    s = runs[m].get("speedup_vs_sync")
                    if s is not None:
                        ax.annotate(
                            f"{s:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom"
                        )
        ax.set_xticks([x + (width / 2 if sim else 0) for x in xs], modes)
        ax.set_title(title)
        if sim:
            ax.legend(loc="upper left", fontsize=8)
    top = max(max(r.get(rate) or 0.0 for r in runs.values()) for runs in (real, sim) if runs)
    ax1.set_ylim(0, 1.15 * top)
    ax2.set_ylim(0, 1)


def _step_time_panel(ax3: Axes, real: dict[str, JsonObject], sim: dict[str, JsonObject]) -> None:
    """Each mode's step times, per step (the simulated run's dashed), in engine seconds when there is one."""

    def scale(run: JsonObject) -> float:
        return run.get("time_scale", 1.0) if sim else 1.0

    for runs, style in ((real, "o-"), (sim, "x--")):
        for m in runs:
            times = [t * scale(runs[m]) for t in runs[m]["step_times_s"]]
            ax3.plot(
                range(1, len(times) + 1),
                times,
                style,
                label=f"{m}{' (sim)' if runs is sim else ''}",
                color=_COLORS.get(m),
            )
    ax3.xaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]  # the default AutoLocator (a MaxNLocator) takes it
    ax3.set_xlabel("step")
    ax3.set_ylabel("s")
    ax3.set_ylim(
        0, 1.3 * max(max(t * scale(r) for t in r["step_times_s"]) for runs in (real, sim) for r in runs.values())
    )
    ax3.set_title("step time (rollout + train + weight sync)")
    ax3.legend(loc="upper center", ncol=len(real), fontsize=8)
