"""The printed table, the target check and the PNG of ``slime bench rollout``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TARGETS", "check_targets", "format_table", "plot"]

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


def _lookup(results: dict[str, Any], name: str) -> float | None:
    mode, _, key = name.partition(".")
    if key:
        value = results["modes"].get(mode, {}).get(key)
    else:
        value = results.get(name)
    return None if value is None else float(value)


def check_targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{name: {"target": ">= 1.8", "measured": x | None, "met": bool | None}}`` (None: not measured)."""
    out = {}
    for name, op, bound in TARGETS:
        x = _lookup(results, name)
        met = None if x is None else (x >= bound if op == ">=" else x <= bound)
        out[name] = {"target": f"{op} {bound:g}", "measured": x, "met": met}
    return out


_COLUMNS = [
    ("mode", "{}", None),
    ("tokens/s", "{:,.0f}", "delivered_tokens_per_s"),
    ("x sync", "{:.2f}", "speedup_vs_sync"),
    ("trained tok/s", "{:,.0f}", "trained_tokens_per_s"),
    ("samples/s", "{:.1f}", "samples_per_s"),
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
]


def format_table(results: dict[str, Any]) -> str:
    """A plain-text table (one row per mode), then the overhead numbers and the target check."""
    rows = [[h for h, _, _ in _COLUMNS]]
    for mode, m in results["modes"].items():
        rows.append([mode] + [("-" if m.get(k) is None else fmt.format(m[k])) for _, fmt, k in _COLUMNS[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for mode, m in results["modes"].items():
        hist = ", ".join(f"{k}: {v / max(1, sum(m['lag_histogram'].values())):.1%}" for k, v in m["lag_histogram"].items())
        lines.append(f"{mode:>5} token lag (versions behind the trainer): {hist}")
    sched, http = results.get("scheduler"), results.get("http")
    if sched:
        lines.append(f"scheduler on an instant in-process engine: {sched['completions_per_s']:,.0f} completions/s "
                     f"({sched['cpu_us_per_completion']:.1f} us CPU each); with SimEngine(instant) in-process: "
                     f"{results.get('scheduler_sim_engine', {}).get('completions_per_s', float('nan')):,.0f}/s")
    if http:
        lines.append(f"HTTP, instant engine on loopback, concurrency {http['concurrency']}: EnginePool {http['http_requests_per_s']:,.0f} req/s "
                     f"({http['ours_client_cpu_ms_per_request']:.3f} ms CPU/req), bare aiohttp {http['bare_aiohttp_requests_per_s']:,.0f} req/s "
                     f"({http['bare_client_cpu_ms_per_request']:.3f} ms CPU/req): ratio {http['ratio_vs_bare']:.2f}")
    for name, t in results["targets"].items():
        if t["met"] is not None:
            lines.append(f"target {name} {t['target']}: measured {t['measured']:.3g} -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str | Path) -> None:
    """Three panels: delivered tokens/s, slot utilisation (with the targets), step time per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(results["modes"])
    colors = {"sync": "#7f7f7f", "april": "#1f77b4", "async": "#d62728"}
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.8))
    tps = [results["modes"][m]["delivered_tokens_per_s"] for m in modes]
    bars = ax1.bar(modes, tps, color=[colors.get(m, "C0") for m in modes])
    for bar, m in zip(bars, modes):
        s = results["modes"][m].get("speedup_vs_sync")
        if s is not None:
            ax1.annotate(f"{s:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    ax1.set_ylim(0, 1.15 * max(tps))
    ax1.set_title("delivered tokens/s (wall, whole loop)")
    util = [results["modes"][m].get("slot_utilization") or 0.0 for m in modes]
    ax2.bar(modes, util, color=[colors.get(m, "C0") for m in modes])
    for target, m in ((0.6, "april"), (0.85, "async")):
        if m in modes:
            i = modes.index(m)
            ax2.hlines(target, i - 0.4, i + 0.4, colors="k", linestyles="--", linewidth=1)
    ax2.set_ylim(0, 1)
    ax2.set_title("engine slot utilisation (dashed: target)")
    for m in modes:
        times = results["modes"][m]["step_times_s"]
        ax3.plot(range(1, len(times) + 1), times, "o-", label=m, color=colors.get(m))
    ax3.xaxis.get_major_locator().set_params(integer=True)
    ax3.set_xlabel("step")
    ax3.set_ylabel("s")
    ax3.set_ylim(0, 1.3 * max(max(results["modes"][m]["step_times_s"]) for m in modes))
    ax3.set_title("step time (rollout + train + weight sync)")
    ax3.legend(loc="upper center", ncol=len(modes))
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
