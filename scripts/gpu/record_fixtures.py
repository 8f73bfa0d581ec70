"""Merge the /generate bodies recorded by the real-SGLang contract suite into the CPU replay fixtures.

    python scripts/gpu/record_fixtures.py RECORDED_JSON VERSION [--date YYYY-MM-DD]

RECORDED_JSON is what ``scripts/gpu/sglang_contract.sh`` writes ($OUT/sglang_bodies.json). Each
``generate/<name>`` entry becomes ``VERSION/<name>`` in tests/engines/data/sglang_bodies.json, with
the ``expect`` block that tests/engines/test_protocol.py checks, computed from the body itself
(ids, logprobs, finish reason, versions, counts), so CI parses the real server's shapes; the
non-generate bodies (model_info, pause, update, abort) go under ``recorded[VERSION]`` for reference.
Long bodies are cut to their first 64 tokens (aligned lists cut together, counts adjusted).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "engines" / "data" / "sglang_bodies.json"
MAX_TOKENS = 64


def _cut(body: dict) -> dict:
    body = json.loads(json.dumps(body))
    meta = body["meta_info"]
    n = len(body.get("output_ids") or [])
    if n > MAX_TOKENS:
        body["output_ids"] = body["output_ids"][:MAX_TOKENS]
        meta["output_token_logprobs"] = meta["output_token_logprobs"][:MAX_TOKENS]
        meta["completion_tokens"] = MAX_TOKENS
        if "output_token_logprobs_length" in meta:
            meta["output_token_logprobs_length"] = MAX_TOKENS
        body["text"] = None if body.get("text") is None else "(cut)"
    return body


def _expect(body: dict) -> dict:
    meta = body["meta_info"]
    fr = meta["finish_reason"]
    out = {
        "output_ids": body.get("output_ids") or [],
        "output_logprobs": [e[0] for e in meta.get("output_token_logprobs") or []],
        "finish_type": fr["type"],
        "weight_version": meta.get("weight_version"),
        "token_weight_versions": None,
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "rid": meta.get("id", ""),
    }
    for key in ("message", "length", "matched"):
        if key in fr:
            out[key] = fr[key]
    return out


def merge(recorded: dict, version: str, date: str) -> int:
    fixtures = json.loads(FIXTURES.read_text())
    n = 0
    for name, entry in sorted(recorded.items()):
        if not name.startswith("generate/") or entry.get("status") != 200:
            continue
        body = _cut(entry["body"])
        fixtures["generate"][f"{version}/{name.split('/', 1)[1]}"] = {
            "return_logprob": bool(entry["request"]["body"].get("return_logprob")),
            "source": f"recorded from SGLang {version} on an H200, {date} (scripts/gpu/sglang_contract.sh)",
            "body": body,
            "expect": _expect(body),
        }
        n += 1
    fixtures.setdefault("recorded", {})[version] = {
        k: v for k, v in sorted(recorded.items()) if not k.startswith("generate/")
    }
    FIXTURES.write_text(json.dumps(fixtures, indent=2) + "\n")
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recorded")
    p.add_argument("version")
    p.add_argument("--date", default=datetime.date.today().isoformat())
    ns = p.parse_args()
    n = merge(json.loads(Path(ns.recorded).read_text()), ns.version, ns.date)
    print(f"{n} /generate bodies of SGLang {ns.version} merged into {FIXTURES}")


if __name__ == "__main__":
    main()
