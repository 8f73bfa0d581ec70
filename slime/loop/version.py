"""The run's policy version: one owner, read by everyone else.

::

    trainer step  ──► version.bump()     trainer = N + 1   (the trainer holds the new weights)
    weight sync   ──► version.publish()  engines = N + 1   (every engine loaded them)
    scheduler, generate, eval, checkpoint ──► version.engines / version.trainer (read only)

Between steps ``trainer == engines``; between a train step and the end of its weight sync,
``engines == trainer - 1``. A token is stamped with ``engines`` when its request is sent (or older,
``slime.rollout.generate.token_versions``), so a token's lag at training is how many updates
happened since it was sampled. A run without weight sync (rollout-only, train-only) never publishes
from a moving trainer: rollout-only never bumps; train-only publishes the trainer's version as if
its (absent) engines had loaded it, so records match the recording run.
"""

from __future__ import annotations

__all__ = ["PolicyVersion"]


class PolicyVersion:
    """The policy version of the trainer's weights and of the engines' weights (ints, 0 = the start model).

    Args:
        start: the version of the weights the run starts from (a resumed run: its checkpoint's).

    Raises (``bump``):
        RuntimeError: the trainer reports another version than the one bumped (the trainer's own
            counter drifted: its checkpoint or a backend bug).
    """

    __slots__ = ("_trainer", "_engines")

    def __init__(self, start: int = 0):
        self._trainer = self._engines = int(start)

    @property
    def trainer(self) -> int:
        """The version of the trainer's weights: bumped once per train step."""
        return self._trainer

    @property
    def engines(self) -> int:
        """The version the engines serve: the trainer's, published by each weight sync."""
        return self._engines

    def bump(self, reported: float | None = None) -> int:
        """A train step finished: the trainer holds version ``trainer + 1``. ``reported``: the version the
        trainer says it holds now (its ``policy_version`` metric), checked against ours. Returns the new version."""
        # bumped before the check: the trainer reports the version it holds after its step, so the new count
        self._trainer += 1
        if reported is not None and int(reported) != self._trainer:
            raise RuntimeError(
                f"the trainer reports policy version {int(reported)} after its step, the loop counts {self._trainer}"
            )
        return self._trainer

    def publish(self) -> None:
        """The engines loaded the trainer's weights."""
        # copied, not counted: the engines can only catch up with the trainer, never pass it
        self._engines = self._trainer

    def __repr__(self) -> str:
        return f"PolicyVersion(trainer={self._trainer}, engines={self._engines})"
