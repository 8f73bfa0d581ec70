"""One contract suite for our client and generate path, run against every backend we can run here:
the embedded engine over loopback HTTP, and loopback servers replaying the recorded response
shapes of SGLang 0.5.2, 0.5.6 and 0.5.23 (tests/engines/data/sglang_bodies.json, from the protocol
notes) and of 0.5.17 (recorded from a real server on the H200 by scripts/gpu/sglang_contract.sh). Every backend must satisfy the same assertions:

- a finished request gives aligned output ids and logprobs, a stop/length finish reason, and our
  generate function turns it into a COMPLETED/TRUNCATED sample with aligned per-token lists;
- an aborted request (running, or still queued, in each version's shape) is HTTP 200 with
  ``finish_reason`` abort; our generate function keeps whatever tokens came back and marks the
  sample PARTIAL (resumable), never an error;
- ``/abort_request`` with ``abort_all`` is accepted.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.rollout.generate import generate
from slime.servers.embedded import EngineServer
from slime.types import Sample, Status
from tests.fixtures.tiny_model import write_tiny_llama

BODIES = json.loads((Path(__file__).parents[1] / "engines" / "data" / "sglang_bodies.json").read_text())["generate"]
REPLAYS = {
    "0.5.2": {
        "finished": "0.5.2/finished_with_logprobs",
        "abort": "0.5.2/running_abort",
        "queued_abort": "0.5.2/abort_before_prefill",
    },
    "0.5.6": {
        "finished": "0.5.6/finished_with_logprobs",
        "abort": "0.5.6/waiting_queue_abort",
        "queued_abort": "0.5.6/waiting_queue_abort",
    },
    "0.5.23": {
        "finished": "0.5.23/length",
        "abort": "0.5.23/running_abort",
        "queued_abort": "0.5.23/waiting_queue_abort",
    },
    # recorded from a real server on the H200; its queued abort is the HTTP 499 it answers for a
    # request aborted before scheduling (tests/e2e/test_sglang_contract.py)
    "0.5.17": {
        "finished": "0.5.17/finished_with_logprobs",
        "abort": "0.5.17/running_abort",
        "queued_abort": "http-499",
    },
}
HTTP_499 = {"error": {"message": "Request slime-g0-s0-a0-r0- was aborted"}}
CONFIG = RolloutConfig(request_timeout_s=30, max_retries=1, retry_backoff_s=0.01)
PROMPT = [0, 5, 9, 17, 3]


class _Replay:
    """A loopback server answering /generate with one recorded body per scenario."""

    def __init__(self, version: str):
        self.version = version
        self.scenario = "finished"
        self.aborts = 0

    async def generate(self, request: web.Request) -> web.Response:
        await request.json()
        name = REPLAYS[self.version][self.scenario]
        if name == "http-499":
            return web.json_response(HTTP_499, status=499)
        return web.json_response(BODIES[name]["body"])

    async def abort(self, request: web.Request) -> web.Response:
        body = await request.json()
        assert body.get("abort_all") is True
        self.aborts += 1
        return web.Response(status=200)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("contract") / "tiny", seed=0)


@pytest.fixture(params=["embedded", "0.5.2", "0.5.6", "0.5.23", "0.5.17"])
async def backend(request, model_dir):
    if request.param == "embedded":
        async with EngineServer(model_dir, port=0, seed=0, weight_version="0") as server:
            async with HttpEnginePool([server.url], config=CONFIG) as pool:
                yield request.param, pool, None
        return
    replay = _Replay(request.param)
    app = web.Application()
    app.router.add_post("/generate", replay.generate)
    app.router.add_post("/abort_request", replay.abort)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with HttpEnginePool([url], config=CONFIG) as pool:
            yield request.param, pool, replay
    finally:
        await runner.cleanup()


async def test_a_finished_request_gives_an_aligned_finished_sample(backend):
    name, pool, _ = backend
    r = await pool.generate(PROMPT, {"max_new_tokens": 8, "ignore_eos": True}, rid="c1-")
    assert r.finish_reason.type in ("stop", "length") and len(r.output_ids) == len(r.output_logprobs) > 0
    s = Sample(prompt_ids=list(PROMPT))
    await generate(s, {"ignore_eos": True}, pool=pool, max_response_len=8, engine_version=0)
    s.check_aligned()
    assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.response_ids and s.num_aborts == 0


@pytest.mark.parametrize("kind", ["abort", "queued_abort"])
async def test_an_aborted_request_keeps_its_tokens_and_leaves_a_resumable_sample(backend, kind):
    name, pool, replay = backend
    s = Sample(prompt_ids=list(PROMPT))
    if replay is not None:
        replay.scenario = kind
        await generate(s, {"ignore_eos": True}, pool=pool, max_response_len=200, engine_version=0)
        expected = HTTP_499 if REPLAYS[name][kind] == "http-499" else BODIES[REPLAYS[name][kind]]["body"]
        assert s.response_ids == expected.get("output_ids", [])
        await pool.abort_all()
        assert replay.aborts == 1
    else:
        task = asyncio.create_task(generate(s, {"ignore_eos": True}, pool=pool, max_response_len=200, engine_version=0))
        while not task.done():
            await asyncio.sleep(0.01)
            await pool.abort_all()
        await task
        assert len(s.response_ids) < 200
    s.check_aligned()
    assert s.status is Status.PARTIAL and s.num_aborts == 1 and s.status.is_resumable
