"""The batching model runner: one thread that owns the model, the waiting queue and the running batch.

One iteration of the loop (between two iterations nothing touches the model)::

    take posted control ops and new requests (under the lock) -> run the ops (abort, pause, ...)
    -> apply weight updates whose barrier is clear -> if paused: wait
    -> admit waiting requests up to max_running_requests, prefill them in one left-padded
       forward, sample their first token, merge the survivors into the running batch
    -> one decode forward for every running row, sample, drop finished rows

Consumes: ``EngineRequest``s from ``submit`` and control ops from the async side.
Produces: finished requests (their ``done`` future resolves in this thread; the aiohttp side
awaits it through ``asyncio.wrap_future``) and control-op futures.
Waits for: a condition variable, when there is nothing to run.

Weight updates take a barrier like SGLang's model write-lock: requests submitted before the
update must finish first, requests submitted after it wait in the queue; while paused the update
applies at once and paused requests continue on the new weights (``weight_versions`` spans).

Not done: chunked prefill, prefix (radix) cache, preemption on memory pressure (the KV cache is
plain CPU tensors that grow with the batch), speculative decoding, penalties, grammars.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import DynamicCache

from slime.hf_compat import CACHE_KWARG
from slime.servers.embedded.batch import BatchKV, prefill_inputs
from slime.servers.embedded.model import LoadedModel, copy_weights_
from slime.servers.embedded.request import EngineRequest, finish_length, finish_reason_after, resolve
from slime.servers.embedded.route_capture import RouteCapture
from slime.servers.embedded.sampling import sample_next, token_logprobs

__all__ = ["ModelRunner", "PauseMode"]

logger = logging.getLogger(__name__)

PauseMode = Literal["abort", "retract", "in_place"]


@dataclass
class _Update:
    tensors: dict[str, torch.Tensor] | None  # None: only the version changes
    weight_version: str | None
    barrier: int  # requests with seq < barrier finish first (unless paused)
    future: concurrent.futures.Future


class ModelRunner:
    """Owns ``loaded.model`` on its own thread; all other methods are thread-safe and non-blocking.

    Args:
        loaded: the model, tokenizer and EOS ids to serve.
        max_running_requests: rows decoded together; the rest wait in FIFO order.
        weight_version: initial version string stamped on generated tokens.
        max_prefill_tokens: padded tokens (rows x longest context) per prefill forward; at least
            one request is always admitted.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_running_requests: int = 256,
        weight_version: str = "default",
        max_prefill_tokens: int = 16384,
    ):
        self.loaded = loaded
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.weight_version = weight_version
        self.error: BaseException | None = None
        self.step_hook: Callable[[ModelRunner], None] | None = None
        """Test-only: called on the runner thread after every decode step (may block to hold the runner)."""
        self._cond = threading.Condition()
        self._inbox: list[EngineRequest] = []
        self._ops: list[tuple[Callable[[], None], concurrent.futures.Future]] = []
        self._seq = 0
        self._closed = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="slime-engine-runner", daemon=True)
        # Owned by the runner thread:
        self._waiting: list[EngineRequest] = []
        self._running: list[EngineRequest] = []
        self._batch: BatchKV | None = None
        self._pending: list[_Update] = []
        self._paused = False
        self._routes = RouteCapture(loaded.model)  # MoE models: each token's experts (return_routed_experts)

    # ---- thread-safe API -------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._inbox)

    @property
    def num_pending_ops(self) -> int:
        """Control ops posted and not yet run (tests wait on this to order events)."""
        return len(self._ops)

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Abort everything, stop the thread and wait for it (idempotent)."""
        with self._cond:
            self._closed = True
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def submit(self, reqs: list[EngineRequest]) -> None:
        """Queue requests (FIFO); each resolves ``req.done`` when it finishes or is aborted."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine runner is stopped")
            for req in reqs:
                req.seq = self._seq
                self._seq += 1
            self._inbox.extend(reqs)
            self._cond.notify()

    def abort(
        self, *, rid_prefix: str | None = None, rids: set[str] | None = None, message: str = "Aborted"
    ) -> concurrent.futures.Future:
        """Abort requests whose rid starts with ``rid_prefix``, or is in ``rids``, or every request
        when neither is given (SGLang's ``abort_all``). Result: how many were aborted."""
        if rids is not None:
            return self._post(lambda: self._abort_where(lambda r: r.rid in rids, message))
        return self._post(
            lambda: self._abort_where(lambda r: rid_prefix is None or r.rid.startswith(rid_prefix), message)
        )

    def pause(self, mode: PauseMode) -> concurrent.futures.Future:
        """Stop running forwards. ``abort``: abort all first; ``retract``: evict running rows back to
        the queue head (their KV is recomputed on continue); ``in_place``: keep everything."""
        return self._post(lambda: self._pause(mode))

    def resume(self) -> concurrent.futures.Future:
        return self._post(lambda: setattr(self, "_paused", False))

    def update_weights(
        self, tensors: dict[str, torch.Tensor] | None, *, weight_version: str | None = None, abort_all: bool = False
    ) -> concurrent.futures.Future:
        """Load checked ``tensors`` (see ``model.read_hf_weights``) between steps and set the version.

        Result: the number of requests that were paused around the update (0 unless paused).
        """
        future: concurrent.futures.Future = concurrent.futures.Future()

        def op(barrier: int) -> None:
            if abort_all:
                self._abort_where(lambda r: True, "Aborted")
            self._pending.append(_Update(tensors, weight_version, barrier, future))

        posted = self._post(op, with_barrier=True)
        posted.add_done_callback(lambda f: f.cancelled() or f.exception() is None or resolve(future, exc=f.exception()))  # type: ignore[func-returns-value]
        return future

    # ---- runner thread ---------------------------------------------------------------------------
    def _post(self, fn: Callable[..., object], *, with_barrier: bool = False) -> concurrent.futures.Future:
        """Run ``fn`` on the runner thread before its next step; ``with_barrier`` passes it the
        sequence number of the next request to be submitted (everything before it is "in flight")."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def op(*args: int) -> None:  # the barrier, when with_barrier
            try:
                result = fn(*args)
            except Exception as exc:  # a bad control request, reported to its caller
                resolve(future, exc=exc)
            else:
                resolve(future, result)

        with self._cond:
            if self._closed:
                future.set_exception(RuntimeError("the engine runner is stopped"))
                return future
            self._ops.append((functools.partial(op, self._seq) if with_barrier else op, future))
            self._cond.notify()
        return future

    def _run(self) -> None:
        try:
            with torch.no_grad():
                while True:
                    with self._cond:
                        while not (self._ops or self._inbox or self._stopping or self._has_work()):
                            self._cond.wait()
                        ops, self._ops = self._ops, []
                        self._waiting.extend(self._inbox)
                        self._inbox.clear()
                    for op, _ in ops:
                        op()
                    if self._stopping:
                        break
                    self._apply_updates()
                    if self._paused:
                        continue
                    self._admit()
                    if self._running:
                        self._decode_step()
                        if self.step_hook is not None:
                            self.step_hook(self)
        except BaseException as exc:  # a bug: fail every caller loudly instead of hanging them
            logger.exception("engine runner crashed")
            self.error = exc
        finally:
            with self._cond:
                self._closed = True
                leftovers = self._running + self._waiting + self._inbox
                self._inbox.clear()
                unrun, self._ops = self._ops, []
            for _, future in unrun:
                resolve(future, exc=RuntimeError("the engine runner stopped"))
            for req in leftovers:
                if self.error is not None:
                    resolve(req.done, exc=RuntimeError(f"engine runner crashed: {self.error!r}"))
                req.abort("The engine is shutting down.")
            for update in self._pending:
                resolve(update.future, exc=RuntimeError("the engine stopped before the weight update ran"))

    def _has_work(self) -> bool:
        if self._pending and self._update_ready():
            return True
        if self._paused:
            return False
        if self._running:
            return True
        return self.max_running_requests > 0 and any(map(self._admissible, self._waiting))

    def _admissible(self, req: EngineRequest) -> bool:
        return not self._pending or req.seq < self._pending[0].barrier

    def _update_ready(self) -> bool:
        barrier = self._pending[0].barrier
        return self._paused or not (self._running or any(r.seq < barrier for r in self._waiting))

    def _apply_updates(self) -> None:
        while self._pending and self._update_ready():
            update = self._pending.pop(0)
            if update.tensors is not None:
                copy_weights_(self.loaded.model, update.tensors)
            if update.weight_version is not None:
                self.weight_version = update.weight_version
            num_paused = len(self._running) + len(self._waiting) if self._paused else 0
            resolve(update.future, num_paused)

    def _pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            self._abort_where(lambda r: True, "Aborted")
        elif mode == "retract":
            for req in self._running:
                req.queued = True
                req.num_retractions += 1
            self._waiting[:0] = self._running
            self._running, self._batch = [], None
        self._paused = True

    def _abort_where(self, pred: Callable[[EngineRequest], bool], message: str) -> int:
        hit = [r for r in self._waiting + self._running if pred(r)]
        self._waiting = [r for r in self._waiting if not pred(r)]
        self._keep_rows([i for i, r in enumerate(self._running) if not pred(r)])
        for req in hit:
            req.abort(message)
        return len(hit)

    def _keep_rows(self, rows: list[int]) -> None:
        if len(rows) == len(self._running):
            return
        self._running = [self._running[i] for i in rows]
        if rows:
            assert self._batch is not None  # held whenever requests run (rows of it were running)
            self._batch.select(rows)
        else:
            self._batch = None

    def _admit(self) -> None:
        free = self.max_running_requests - len(self._running)
        chosen: list[EngineRequest] = []
        width = 0
        for req in self._waiting:
            if len(chosen) >= free:
                break
            if not self._admissible(req):
                continue
            width = max(width, len(req.prompt_ids) + len(req.output_ids))
            if chosen and (len(chosen) + 1) * width > self.max_prefill_tokens:
                break
            chosen.append(req)
        if chosen:
            taken = {id(r) for r in chosen}
            self._waiting = [r for r in self._waiting if id(r) not in taken]
            self._prefill(chosen)

    def _prefill(self, reqs: list[EngineRequest]) -> None:
        contexts = [r.context_ids for r in reqs]
        inputs = prefill_inputs(contexts)
        mask = inputs.pop("mask")
        want_input_lp = [r.return_logprob and r.logprob_start_len >= 0 and r.input_logprobs is None for r in reqs]
        cache = DynamicCache()
        logits = self.loaded.model(
            **inputs, **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=0 if any(want_input_lp) else 1
        ).logits
        self._routes.after_prefill(reqs, mask)  # return_routed_experts: the experts of every context token
        width = mask.shape[1]
        for i, req in enumerate(reqs):
            req.queued = False
            if want_input_lp[i]:
                ctx = contexts[i]
                rows = logits[i, width - len(ctx) : width - 1]  # [P - 1, V] predicting ctx[1:]
                lps = token_logprobs(rows, torch.tensor(ctx[1:]), req.params.temperature).tolist()
                # SGLang's first entry is always null (docs/sglang.md#generate-response): the logits that would
                # score it (position start - 1) are not computed there, so we drop ours too.
                scored: list[float | None] = [None, *lps]
                req.input_logprobs = [None, *scored[req.logprob_start_len + 1 :]]
        batch = BatchKV(cache, mask)
        keep = self._sample(reqs, logits[:, -1, :])
        if not keep:
            return
        if len(keep) < len(reqs):
            batch.select(keep)
        if self._batch is None:
            self._batch = batch
        else:
            self._batch.extend(batch)
        self._running.extend(reqs[i] for i in keep)

    def _decode_step(self) -> None:
        assert self._batch is not None  # called only while requests run, and then their cache is held
        inputs = self._batch.decode_inputs([r.output_ids[-1] for r in self._running])
        logits = self.loaded.model(**inputs, use_cache=True).logits[:, -1, :]
        self._routes.after_decode(self._running)
        self._keep_rows(self._sample(self._running, logits))

    def _sample(self, reqs: list[EngineRequest], logits: torch.Tensor) -> list[int]:
        """Sample one token per row, append it, finish rows that are done; return the rows still running."""
        token_ids, logprobs = sample_next(logits, [r.params for r in reqs], [r.generator for r in reqs])
        keep = []
        for i, (req, tok, lp) in enumerate(zip(reqs, token_ids.tolist(), logprobs.tolist())):
            if req.params.max_new_tokens == 0:
                req.finish(finish_length(0))
                continue
            req.append(tok, lp, self.weight_version)
            reason = finish_reason_after(
                req,
                eos_token_ids=self.loaded.eos_token_ids,
                tokenizer=self.loaded.tokenizer,
                context_length=self.loaded.context_length,
            )
            if reason is None:
                keep.append(i)
            else:
                req.finish(reason)
        return keep
