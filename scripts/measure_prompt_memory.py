"""Peak memory of loading a large JSONL prompt file the way ``slime train`` does (issue 26, "a 200 MB prompt file is
read whole").

Writes a JSONL of ``--mb`` megabytes (rows of ~450 bytes: a prompt, a label, a metadata object) and a 3-row one to a
temporary directory, then in a fresh process each: ``slime.loop.inputs.load_prompts`` (every row parsed and checked,
as the driver does), a shuffled ``PromptSource`` over the rows, and 1000 prompts handed out. Prints one JSON line:
the peak RSS (``ru_maxrss``) of each process in MiB and the difference, the file's rows and the seconds the load
took. Run it from the repository root (``PYTHONPATH=.``); it writes nothing outside its temporary directory.

    python scripts/measure_prompt_memory.py --mb 200
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from slime.config import DataConfig
from slime.data.dataset import PromptSource
from slime.loop.inputs import load_prompts

t0 = time.monotonic()
train, _ = load_prompts(DataConfig(prompt_data=sys.argv[1], metadata_key="metadata", num_eval_prompts=0), seed=1)
source = PromptSource(train, shuffle=True, seed=1)
seen = [source.next().prompt[:8] for _ in range(1000)]
print(json.dumps({"rows": len(train), "load_s": round(time.monotonic() - t0, 2),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def write_prompts(path: Path, target_bytes: int) -> int:
    """A JSONL of ~``target_bytes`` bytes; returns its rows."""
    filler = " ".join(f"word{i % 97}" for i in range(60))  # ~400 characters of prompt text
    rows = 0
    with path.open("w") as f:
        while f.tell() < target_bytes:
            f.write(
                json.dumps(
                    {"prompt": f"Question {rows}: {filler}?", "label": str(rows % 1000), "metadata": {"id": rows}}
                )
                + "\n"
            )
            rows += 1
    return rows


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200, help="size of the large file in MB (default 200)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp, "small.jsonl"), Path(tmp, "large.jsonl")
        small.write_text(
            "".join(json.dumps({"prompt": f"p{i}", "label": "1", "metadata": {"id": i}}) + "\n" for i in range(3))
        )
        write_prompts(large, int(args.mb * 1e6))
        base, big = measure(small), measure(large)
    print(
        json.dumps(
            {
                "file_mb": args.mb,
                "rows": big["rows"],
                "load_s": big["load_s"],
                "peak_rss_mib_3_rows": base["peak_rss_mib"],
                "peak_rss_mib_large": big["peak_rss_mib"],
                "extra_mib": round(big["peak_rss_mib"] - base["peak_rss_mib"], 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
