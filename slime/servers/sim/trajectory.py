"""Which trajectory a request continues, how long it is, and its (deterministic) tokens and logprobs.

The simulated engine has no model, so a trajectory's whole future is a function of its identity:
``total`` (response tokens, the last one EOS), the token at each response position, and its logprob.

Identity (the convention a resuming client must follow):

1. ``sampling_params.sampling_seed`` = s when sent: id = ("seed", s).
2. else the rid's *stem*: the rid with a trailing ``-a<k>-r<k>[-]`` removed (the abort/resume counters
   that ``slime.rollout.generate.request_id`` appends), so ``slime-g7-s3-a0-r0-`` and its resume
   ``slime-g7-s3-a1-r1-`` share id ("rid", "slime-g7-s3"). A rid without that suffix is its own stem.
3. else (no seed, no rid): the request is a fresh trajectory keyed on all its ``input_ids``.

For ids 1 and 2 the tracker remembers the prompt of each trajectory (its length and a hash of its
tokens) the first time it sees it: a later request with the same id whose ``input_ids`` start with a
remembered prompt is a resume, and ``already = len(input_ids) - prompt_len`` response tokens are
carried in it. Otherwise it is a new trajectory whose prompt is all of ``input_ids``. The key of a
trajectory hashes (engine seed, id, prompt), so one seed reused across prompts still gives each
prompt its own length, and the same (seed, prompt) always gives the same response, as a
deterministic-sampling SGLang would.

Example: seed 5, prompt of 9 tokens -> total 40. Aborted after 12 tokens, re-sent with 21 input ids
and the same seed: already = 12, it produces positions 12..39, identical to an uninterrupted run.

Not covered: the memory is per engine process, so a resume routed to another engine (a failover)
is taken as a new trajectory with a longer prompt; ids are forgotten least-recently-used beyond
``max_tracked_trajectories``.
"""

from __future__ import annotations

import collections
import hashlib
import re
from dataclasses import dataclass

import numpy as np

from slime.servers.sim.config import SimConfig
from slime.servers.sim.lengths import LengthDistribution, mix64, mix64_array, unit_uniform

__all__ = ["Trajectory", "TrajectoryTracker", "rid_stem", "FIRST_TOKEN_ID"]

FIRST_TOKEN_ID = 3
"""Output ids (other than EOS) lie in [3, vocab_size): 0, 1 and 2 look like pad/BOS/EOS to a tokenizer."""
_RID_SUFFIX = re.compile(r"-a\d+-r\d+-?$")
_POS_MULT = np.uint64(0xD1B54A32D192ED03)
_PREFIX_SALT = 0x5EED5EED5EED5EED
_LOGPROB_RANGE = 3.0  # logprobs lie in [-3.0001, -0.0001], rounded to 4 decimals


def rid_stem(rid: str) -> str:
    """``"slime-g7-s3-a1-r1-"`` -> ``"slime-g7-s3"``; a rid without the suffix is returned unchanged."""
    stem = _RID_SUFFIX.sub("", rid)
    return stem or rid


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One trajectory's fixed future.

    Attributes:
        key: 64-bit hash of (engine seed, id, prompt); seeds every draw below.
        prompt_len: tokens of the original prompt (``input_ids`` minus carried response tokens).
        total: target response length in tokens, in [1, max_response_len]; position total - 1 is EOS.
    """

    key: int
    prompt_len: int
    total: int


class TrajectoryTracker:
    """Resolves requests to trajectories and draws their tokens (see the module docstring)."""

    def __init__(self, config: SimConfig, lengths: LengthDistribution):
        self.config = config
        self.lengths = lengths
        self._seed_h = mix64(config.seed)
        self._known: collections.OrderedDict[tuple[str, object], dict[int, set[int]]] = collections.OrderedDict()
        self._weights = np.zeros(0, dtype=np.uint64)

    @property
    def num_tracked(self) -> int:
        return len(self._known)

    def _prefix_hashes(self, input_ids: list[int]) -> np.ndarray:
        """[L + 1] uint64: entry p hashes ``input_ids[:p]`` (sum of id * w_j, wrapping; O(L) for all p)."""
        n = len(input_ids)
        if len(self._weights) < n:
            size = max(n, 2 * len(self._weights), 1024)
            self._weights = mix64_array(np.arange(size, dtype=np.uint64) ^ np.uint64(_PREFIX_SALT))
        out = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(np.asarray(input_ids, dtype=np.uint64) * self._weights[:n], out=out[1:])
        return out

    def resolve(self, input_ids: list[int], *, sampling_seed: int | None, rid: str | None) -> Trajectory:
        """The trajectory a request continues (remembering its prompt when it is new).

        ``already = len(input_ids) - result.prompt_len`` response tokens are carried in the request.
        """
        n = len(input_ids)
        prefix = self._prefix_hashes(input_ids)
        if sampling_seed is not None:
            ident: tuple[str, object] | None = ("seed", int(sampling_seed))
            ident_h = mix64(int(sampling_seed) ^ 0x5EED)
        elif rid:
            stem = rid_stem(rid)
            ident = ("rid", stem)
            ident_h = int.from_bytes(hashlib.blake2b(stem.encode(), digest_size=8).digest(), "little")
        else:
            ident, ident_h = None, 0
        prompt_len = n
        if ident is not None:
            known = self._known.get(ident)
            if known is None:
                known = self._known[ident] = {}
                if len(self._known) > self.config.max_tracked_trajectories:
                    self._known.popitem(last=False)
            else:
                self._known.move_to_end(ident)
            matches = [p for p, hashes in known.items() if p <= n and int(prefix[p]) in hashes]
            if matches:
                prompt_len = max(matches)
            else:
                known.setdefault(n, set()).add(int(prefix[n]))
        key = mix64(ident_h ^ mix64(int(prefix[prompt_len]) ^ mix64(prompt_len ^ self._seed_h)))
        length = round(self.lengths.quantile(unit_uniform(key)))
        return Trajectory(key=key, prompt_len=prompt_len, total=min(max(length, 1), self.config.max_response_len))

    def tokens(self, traj: Trajectory, start: int, end: int, *, logprobs: bool = True) -> tuple[list[int], list[float]]:
        """Response tokens at positions [start, end) and their logprobs ([] unless ``logprobs``).

        Position ``traj.total - 1`` is ``eos_token_id``; every other id is in [3, vocab_size) and
        never EOS. Logprobs are negative, in [-3.0001, -0.0001], 4 decimals.
        """
        assert 0 <= start <= end <= traj.total, f"positions [{start}, {end}) outside [0, {traj.total}]"
        if end == start:
            return [], []
        vocab, eos = self.config.vocab_size, self.config.eos_token_id
        h = mix64_array(np.arange(start, end, dtype=np.uint64) * _POS_MULT ^ np.uint64(traj.key))
        ids = (h % np.uint64(vocab - FIRST_TOKEN_ID)).astype(np.int64) + FIRST_TOKEN_ID
        if eos >= FIRST_TOKEN_ID:
            ids[ids == eos] = eos + 1 if eos + 1 < vocab else FIRST_TOKEN_ID
        if end == traj.total:
            ids[-1] = eos
        lps: list[float] = []
        if logprobs:
            u = (mix64_array(h) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
            lps = np.round(-(u * _LOGPROB_RANGE + 1e-4), 4).tolist()
        return ids.tolist(), lps
