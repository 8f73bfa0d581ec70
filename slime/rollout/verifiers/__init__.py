"""Built-in verifiers (reward functions), chosen with ``--rm-type``.

::

    math.py    MathVerifier: the final answer against the label, with HF math-verify
    code.py    CodeVerifier: the response's program against test cases, in the sandbox
    remote.py  RemoteRewardModel: POST to ``--rm-url``, read ``{"reward": float}``

Each is ``async (sample) -> float`` and writes ``sample.evidence["verifier"] = {"checked", "verdict",
"logs"}``. ``--custom-rm-path`` (a user function) takes precedence over ``--rm-type``.
"""

from __future__ import annotations

from slime.config import RolloutConfig
from slime.errors import ConfigError
from slime.types import RewardFn

__all__ = ["RM_TYPES", "reward_fn_from_config"]

RM_TYPES = ("math", "deepscaler", "dapo", "code", "remote", "remote_rm", "arith", "calc", "chain")
"""``--rm-type`` values; ``remote_rm`` is slime's spelling of ``remote``; ``arith`` / ``calc`` / ``chain`` are the
built-in tasks' rewards (``slime.data.<task>.reward``), for files in their format. slime's math rewards
``deepscaler`` and ``dapo`` are ``math`` here: math-verify's answer extraction instead of their string
matchers, and reward 0/1 (dapo's -1/1 gives the same GRPO advantages once divided by the group std)."""


def reward_fn_from_config(rollout: RolloutConfig) -> RewardFn | None:
    """The verifier that ``rollout.rm_type`` names (a built-in task's reward for ``arith`` / ``calc`` /
    ``chain``), or None when it is unset.

    The per-verifier timeout is ``reward_timeout_s`` (the reward boundary applies it as well). A
    ``RemoteRewardModel`` owns an HTTP session: ``await fn.close()`` when the run ends.

    Raises:
        ConfigError: ``remote`` without ``--rm-url``, or an unknown type.
        SandboxUnavailable (a ConfigError): ``code`` where bubblewrap cannot sandbox and
            ``--allow-unsafe-code-execution`` is not given.
    """
    kind = rollout.rm_type
    if kind is None:
        return None
    if kind in ("math", "deepscaler", "dapo"):
        from slime.rollout.verifiers.math import MathVerifier

        return MathVerifier(timeout_s=rollout.reward_timeout_s)
    if kind == "code":
        from slime.rollout.tools.sandbox import Sandbox
        from slime.rollout.verifiers.code import CodeVerifier

        # 1 MiB of output: long expected outputs and the harness's channel of large returned values fit
        return CodeVerifier(Sandbox(allow_unsafe=rollout.allow_unsafe_code_execution, max_output_bytes=1 << 20))
    if kind in ("arith", "calc", "chain"):
        import importlib

        return importlib.import_module(f"slime.data.{kind}").reward
    if kind in ("remote", "remote_rm"):
        if not rollout.rm_url:
            raise ConfigError(f"--rm-type={kind} needs --rm-url (the reward server's URL)")
        from slime.rollout.verifiers.remote import RemoteRewardModel

        try:
            return RemoteRewardModel(rollout.rm_url, timeout_s=rollout.reward_timeout_s)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    raise ConfigError(f"--rm-type={kind!r} is not one of {list(RM_TYPES)}")
