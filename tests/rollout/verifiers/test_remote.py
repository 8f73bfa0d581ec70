"""The remote reward model against a tiny aiohttp server: good reply, HTTP 500, timeout, bad JSON."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from slime.config import RolloutConfig
from slime.errors import ConfigError, PluginError
from slime.rollout.rewards import score_sample
from slime.rollout.verifiers import reward_fn_from_config
from slime.rollout.verifiers.remote import RemoteRewardModel
from slime.types import Sample, Status


@pytest.fixture
async def rm_server():
    received, release = [], asyncio.Event()

    async def good(request):
        received.append(await request.json())
        return web.json_response({"reward": 0.75, "extra": "ignored"})

    async def slow(request):
        await release.wait()
        return web.json_response({"reward": 1.0})

    app = web.Application()
    app.router.add_post("/good", good)
    app.router.add_post("/error", lambda r: web.Response(status=500, text="model crashed"))
    app.router.add_post("/slow", slow)
    app.router.add_post("/badjson", lambda r: web.Response(text="reward=1"))
    app.router.add_post("/noreward", lambda r: web.json_response({"score": 1}))
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", received
    release.set()
    await runner.cleanup()


def probe() -> Sample:
    return Sample(prompt_ids=[0], prompt="1+1=", response="2", label="2")


async def test_good_reply_gives_the_reward_and_sends_prompt_response_label(rm_server):
    url, received = rm_server
    async with RemoteRewardModel(f"{url}/good", timeout_s=5) as rm:
        s = probe()
        assert await rm(s) == 0.75
    assert received == [{"prompt": "1+1=", "response": "2", "label": "2"}]
    assert s.evidence["verifier"]["verdict"] == "scored"


@pytest.mark.parametrize(
    "path, words",
    [("/error", "HTTP 500: 'model crashed'"), ("/badjson", "reply is not JSON"), ("/noreward", "no 'reward' key")],
)
async def test_bad_replies_raise_errors_naming_url_and_problem(rm_server, path, words):
    url, _ = rm_server
    async with RemoteRewardModel(f"{url}{path}", timeout_s=5) as rm:
        s = probe()
        with pytest.raises(PluginError, match=words) as info:
            await rm(s)
    assert f"{url}{path}" in str(info.value) and s.evidence["verifier"]["verdict"] == "error"


async def test_slow_server_times_out_quickly_and_the_sample_is_failed_not_the_run(rm_server):
    url, _ = rm_server
    async with RemoteRewardModel(f"{url}/slow", timeout_s=0.2) as rm:
        s = probe()
        t0 = time.monotonic()
        await score_sample(s, rm, timeout_s=5)
    assert time.monotonic() - t0 < 2
    assert s.status is Status.FAILED and "no reply within 0.2s" in s.evidence["reward_error"]["message"]


def test_rm_type_maps_to_verifiers_and_remote_needs_a_url():
    assert type(reward_fn_from_config(RolloutConfig(rm_type="math"))).__name__ == "MathVerifier"
    for slime_math in ("deepscaler", "dapo"):  # slime's math rewards: the math verifier here
        assert type(reward_fn_from_config(RolloutConfig(rm_type=slime_math))).__name__ == "MathVerifier"
    assert (
        type(reward_fn_from_config(RolloutConfig(rm_type="remote_rm", rm_url="http://h:1/rm"))).__name__
        == "RemoteRewardModel"
    )
    assert reward_fn_from_config(RolloutConfig()) is None
    with pytest.raises(ConfigError, match="--rm-url"):
        reward_fn_from_config(RolloutConfig(rm_type="remote"))
