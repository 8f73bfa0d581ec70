"""GPU check (c), verdict: every parallel configuration's metrics match the 1-GPU run within bf16 tolerance.

    python tests/gpu/megatron_compare_parallel.py DIR single tp2 dp2 [tp2sp]   # reads DIR/parallel_NAME.json
    python tests/gpu/megatron_compare_parallel.py DIR moe_single moe_ep2 ... --out megatron_moe_parallel.json

Tolerance per metric: |a - b| <= atol + rtol * |b| with rtol 2e-2 and atol 2e-3 (bf16 has 8
mantissa bits; TP changes the order of the reductions inside matmuls and the vocab softmax, DP
the order of the gradient sum, EP the order of the expert outputs' sums). Every metric of the
reference run is compared, the MoE router metrics (``moe_*``) included. Writes
$OUT/megatron_parallel.json (or ``--out NAME``); exits 1 on a mismatch.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_common import write_json  # noqa: E402

RTOL, ATOL = 2e-2, 2e-3


def main(in_dir: str, names: list[str], out_name: str = "megatron_parallel.json") -> int:
    runs = {}
    for n in names:
        path = os.path.join(in_dir, f"parallel_{n}.json")
        runs[n] = json.load(open(path)) if os.path.isfile(path) else None
    ref = runs[names[0]]
    report: dict[str, object] = {"reference": names[0], "runs": runs, "mismatches": []}
    if ref is None:
        report["mismatches"].append(f"{names[0]}: no result")
    for n in names:
        if runs[n] is not None and runs[n].get("weights_gathered_bit_exact") is False:
            report["mismatches"].append(f"{n}: weights gathered onto rank 0 differ from the checkpoint")
    for n in names[1:]:
        if runs[n] is None:
            report["mismatches"].append(f"{n}: no result")
            continue
        for i, (a, b) in enumerate(zip(runs[n]["steps"], ref["steps"] if ref else [])):
            for key, vb in b.items():
                if key not in a:
                    report["mismatches"].append(f"{n} step {i} {key}: missing (in {names[0]}: {vb})")
                    continue
                va = a[key]
                if not abs(va - vb) <= ATOL + RTOL * abs(vb):
                    report["mismatches"].append(f"{n} step {i} {key}: {va} vs {names[0]} {vb}")
    report["passed"] = not report["mismatches"]
    write_json(out_name, report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = "megatron_parallel.json"
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        del argv[i : i + 2]
    raise SystemExit(main(argv[0], argv[1:], out))
