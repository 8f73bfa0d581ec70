"""A sync reward function that hangs costs its samples (FAILED, with evidence) and nothing else:
other rewards and every other thread user go on, and the process still exits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import textwrap
import threading
import time

from slime.rollout.rewards import score_sample
from slime.types import Sample, Status


async def test_hung_sync_rewards_do_not_starve_other_rewards_or_the_default_executor():
    release = threading.Event()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=2)
    )  # 2 cores: min(32, 2 + 4) = 6 in a run

    def reward(sample):
        if sample.index < 8:  # 8 samples of a step hang (e.g. a regex that backtracks forever)
            release.wait()
        return 1.0

    try:
        samples = [Sample(prompt_ids=[1], index=i) for i in range(9)]
        t0 = time.monotonic()
        async with asyncio.timeout(5):  # before the fix: the default executor filled up and this deadlocked
            await asyncio.gather(*(score_sample(s, reward, timeout_s=0.3) for s in samples))
            assert await asyncio.to_thread(lambda: "the train step runs") == "the train step runs"
        assert time.monotonic() - t0 < 2
        assert [s.status for s in samples[:8]] == [Status.FAILED] * 8 and samples[8].reward == 1.0
        evidence = samples[0].evidence["reward_error"]
        assert evidence["type"] == "TimeoutError" and "--reward-timeout-s" in evidence["message"]
    finally:
        release.set()


def test_a_run_with_a_hung_sync_reward_still_exits(tmp_path):
    script = textwrap.dedent("""
        import asyncio, threading
        from slime.rollout.rewards import score_sample
        from slime.types import Sample

        async def main():
            sample = Sample(prompt_ids=[1])
            await score_sample(sample, lambda s: threading.Event().wait(), timeout_s=0.2)
            print(sample.status.value)

        asyncio.run(main())
    """)
    # before the fix asyncio.run waited at exit for the stuck thread of its default executor, forever
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0 and out.stdout.strip() == "failed", out.stderr
