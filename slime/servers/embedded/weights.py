"""Weight-update and memory routes of the embedded engine beyond ``/update_weights_from_disk`` (docs/sglang.md#update-weights-from-tensor, #update-weights-from-distributed, #memory).

| route | reply |
| --- | --- |
| POST /begin_weight_update, /end_weight_update | ``{"success", "message"}``; 400 for a second begin, or end without begin |
| POST /init_weights_update_group | joins the group as rank ``rank_offset`` (gloo only: CPU); blocks until all joined |
| POST /update_weights_from_distributed | receives one broadcast per tensor (or one flat bucket), then loads |
| POST /destroy_weights_update_group | ``{"success", "message"}`` |
| POST /update_weights_from_tensor | base64 safetensors payload (never a pickle: 400) |
| POST /update_weights_from_delta | slime's own: a ``slime.sync.codec`` payload; answers the sha256 of what it wrote |
| GET/POST /release_memory_occupation, /resume_memory_occupation | JSON ``null``; 400 if not idle |

Semantics copied from SGLang 0.5.23: tensor, distributed and delta updates outside a
``begin_weight_update`` ... ``end_weight_update`` session answer 400 ``{"success": false, "message":
"... must run between begin_weight_update() and end_weight_update()"}``; the session does not hold
generation (pause first, as slime does). Every update goes through ``ModelRunner.update_weights``:
between decode steps, after in-flight requests unless paused, ``abort_all_requests`` honoured,
``weight_version`` set. ``flush_cache`` is accepted and has nothing to flush (no prefix cache). The
distributed route receives before it checks names, so a bad bucket cannot leave the sender's
broadcasts hanging; a dtype it cannot parse is refused before receiving (the sender then waits for
its group timeout).

Memory (CPU): release needs an idle engine (SGLang asserts it; here a 400). Releasing ``weights``
drops every parameter's storage (an empty tensor in its place); ``kv_cache`` has nothing to free once idle. While
anything is released, generation is held (runner paused; new requests queue) and weight updates
and ``/continue_generation`` are refused. Resuming ``weights`` re-allocates them as zeros: like SGLang without
``--enable-weights-cpu-backup``, the caller must sync weights again before generating. Tags:
``weights``, ``kv_cache``, ``cuda_graph`` (nothing to do); null or empty = all.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from dataclasses import dataclass, field

import torch
from aiohttp import web
from aiohttp.typedefs import Handler

from slime.servers.embedded.model import weight_targets
from slime.servers.embedded.state import ServerState, not_ready
from slime.servers.http import BadRequest
from slime.servers.http import field as _field
from slime.servers.http import json_response as _json
from slime.servers.http import read_json_object as _body
from slime.sync.base import SESSION_HINT
from slime.sync.codec import decode_payload, decode_tensor
from slime.sync.group import WeightsUpdateGroup
from slime.sync.wire import deserialize_safetensors, dtype_from_name, is_pickle, tensor_checksum
from slime.types import JsonObject

__all__ = [
    "add_weight_routes",
    "die_if_flush_fails",
    "EngineDied",
    "FLUSH_FAILED",
    "GROUP_TIMEOUT_S",
    "MemoryRoutes",
    "UpdateState",
    "WeightRoutes",
]

logger = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 600.0
"""Rendezvous and per-collective bound of a weights-update group (the init body has no timeout field)."""
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


FLUSH_FAILED = "AssertionError: Cache flush failed after updating weights"
"""What SGLang 0.5.17 logs before its scheduler dies (weight_updater.py:108, seen on the H200)."""


class EngineDied(RuntimeError):
    """The engine stopped serving, as SGLang does on ``FLUSH_FAILED`` (the route answers 500)."""


async def die_if_flush_fails(server: ServerState, flush_cache: bool, num_paused: int) -> None:
    """Behave like SGLang 0.5.17: an update with ``flush_cache`` while requests are paused in place
    cannot flush the cache, and the server dies (every request fails, health is 503 from then on).

    Raises:
        EngineDied: when it died; the route turns it into a 500 naming SGLang's assertion.
    """
    if not flush_cache or not num_paused:
        return
    logger.error("%s (%d requests paused in place); the engine stops, as SGLang 0.5.17 does", FLUSH_FAILED, num_paused)
    await asyncio.to_thread(server.require_runner().stop)
    raise EngineDied(
        f"{FLUSH_FAILED}: {num_paused} requests were paused in place (send flush_cache=false "
        "with an in-place update); the engine died, as SGLang 0.5.17 does"
    )


@dataclass
class UpdateState:
    """What the weight and memory routes share: the open session, the groups, what memory is released."""

    session_open: bool = False
    groups: dict[str, WeightsUpdateGroup] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    freed: list[tuple[torch.nn.Parameter, torch.Size]] = field(
        default_factory=list
    )  # released weights and their shapes
    paused_by_release: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight or memory change at a time


def _result(ok: bool, message: str, **extra: object) -> web.Response:
    return _json({"success": ok, "message": message, **extra}, 200 if ok else 400)


def _check_against_model(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> str | None:
    """None when every name is a weight of ``model`` with its shape; else what is wrong, in words."""
    expected = {name: t.shape for name, t in weight_targets(model).items()}
    unknown = sorted(set(tensors) - set(expected))
    wrong = sorted(n for n in set(tensors) & set(expected) if tensors[n].shape != expected[n])
    if unknown:
        return f"{len(unknown)} unknown tensor names (e.g. {unknown[:3]})"
    if wrong:
        return f"{len(wrong)} shape mismatches (e.g. {wrong[0]}: got {tuple(tensors[wrong[0]].shape)}, model {tuple(expected[wrong[0]])})"
    return None


class WeightRoutes:
    """Weight-update sessions, process groups, and the distributed / tensor / delta updates."""

    def __init__(self, server: ServerState, state: UpdateState):
        self.server, self.state = server, state

    def _refusal(self, what: str, *, needs_session: bool = True) -> web.Response | None:
        """The reply refusing update ``what`` (not ready, no open session, memory released), or None to go on."""
        if (refused := not_ready(self.server)) is not None:
            return refused
        if needs_session and not self.state.session_open:
            return _result(False, f"{what} {SESSION_HINT}.")
        if self.state.released:
            return _result(
                False,
                f"{what}: memory is released ({sorted(self.state.released)}); call resume_memory_occupation first.",
            )
        return None

    async def _apply(self, tensors: dict[str, torch.Tensor], body_or_control: JsonObject) -> str:
        """Load checked tensors between decode steps; returns the version note of the reply."""
        version = body_or_control.get("weight_version")
        abort_all = bool(body_or_control.get("abort_all_requests", False))
        update = self.server.require_runner().update_weights(tensors, weight_version=version, abort_all=abort_all)
        num_paused = await asyncio.wrap_future(update)
        await die_if_flush_fails(self.server, bool(body_or_control.get("flush_cache", True)), num_paused)
        return f" Weight version updated to {version}." if version else ""

    async def begin(self, request: web.Request) -> web.Response:
        _field(await _body(request, optional=True), "selector", str, "all")
        if self.state.session_open:
            return _result(
                False,
                "begin_weight_update() called while a weight update session is open; call end_weight_update() first.",
            )
        self.state.session_open = True
        return _result(True, "Weight update session started.")

    async def end(self, request: web.Request) -> web.Response:
        await _body(request, optional=True)
        if not self.state.session_open:
            return _result(False, "end_weight_update() called without begin_weight_update().")
        self.state.session_open = False
        return _result(True, "Weight update session ended.")

    async def init_group(self, request: web.Request) -> web.Response:
        """Join the group as rank ``rank_offset``; blocks (off the event loop) until every rank joined."""
        body = await _body(request)
        address, port = _field(body, "master_address", str), _field(body, "master_port", int)
        rank, world_size = _field(body, "rank_offset", int), _field(body, "world_size", int)
        name, backend = _field(body, "group_name", str, "weight_update_group"), _field(body, "backend", str, "nccl")
        if (refused := self._refusal("init_weights_update_group", needs_session=False)) is not None:
            return refused
        if name in self.state.groups:
            return _result(False, f"Process group {name!r} already exists; destroy it first.")
        try:
            self.state.groups[name] = await asyncio.to_thread(
                WeightsUpdateGroup.join,
                group_name=name,
                rank=rank,
                world_size=world_size,
                backend=backend,
                timeout_s=GROUP_TIMEOUT_S,
                master_address=address,
                master_port=port,
            )
        except (ValueError, RuntimeError) as exc:  # bad rank / backend, or the rendezvous failed
            return _result(False, f"Failed to initialize custom process group: {exc}")
        return _result(True, "Succeeded to initialize custom process group.")

    async def destroy_group(self, request: web.Request) -> web.Response:
        name = _field(await _body(request), "group_name", str, "weight_update_group")
        group = self.state.groups.pop(name, None)
        if group is None:
            return _result(False, f"Process group {name!r} does not exist.")
        group.destroy()
        return _result(True, f"Succeeded to destroy process group {name!r}.")

    async def from_distributed(self, request: web.Request) -> web.Response:
        """Receive one broadcast per tensor (or one flat bucket) from the group, check, then load."""
        body = await _body(request)
        names, dtypes, shapes = _field(body, "names", list), _field(body, "dtypes", list), _field(body, "shapes", list)
        name, load_format = (
            _field(body, "group_name", str, "weight_update_group"),
            _field(body, "load_format", str, None),
        )
        if not len(names) == len(dtypes) == len(shapes):
            raise BadRequest(f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
        if (refused := self._refusal("update_weights_from_distributed")) is not None:
            return refused
        if name not in self.state.groups or load_format not in (None, "flattened_bucket"):
            return _result(
                False,
                f"no process group {name!r}"
                if name not in self.state.groups
                else f"load_format {load_format!r} is not supported",
            )
        try:
            buffers = [torch.empty([int(d) for d in s], dtype=dtype_from_name(str(t))) for t, s in zip(dtypes, shapes)]
        except (ValueError, TypeError) as exc:  # refused before receiving: the sender waits for its group timeout
            return _result(False, f"bad dtypes or shapes: {exc}")
        async with self.state.lock:
            group = self.state.groups[name]
            received = await asyncio.to_thread(group.broadcast, buffers, flattened=load_format == "flattened_bucket")
            tensors = dict(zip(map(str, names), received))  # received first: a bad name cannot leave broadcasts hanging
            if (problem := _check_against_model(self.server.require_loaded().model, tensors)) is not None:
                return _result(False, f"Failed to update weights: {problem}")
            note = await self._apply(tensors, body)
        return _result(True, "Succeeded to update parameter online from distributed." + note)

    async def from_tensor(self, request: web.Request) -> web.Response:
        """Load one base64 safetensors payload (``serialized_named_tensors[0]``); pickles are refused."""
        body = await _body(request)
        payloads, load_format = _field(body, "serialized_named_tensors", list), _field(body, "load_format", str, None)
        if (refused := self._refusal("update_weights_from_tensor")) is not None:
            return refused
        if load_format not in (None, "direct") or not payloads or not isinstance(payloads[0], str):
            return _result(
                False,
                f"the slime embedded engine takes one base64 safetensors payload per TP rank with "
                f"load_format null or 'direct' (got load_format={load_format!r}, {len(payloads)} payloads)",
            )
        tensors = await self._decode_safetensors(payloads[0])
        if isinstance(tensors, web.Response):
            return tensors
        if (problem := _check_against_model(self.server.require_loaded().model, tensors)) is not None:
            return _result(False, f"Failed to update weights: {problem}")
        async with self.state.lock:
            note = await self._apply(tensors, body)
        return _result(True, "Succeeded to update model weights." + note)

    async def _decode_safetensors(self, payload: str) -> dict[str, torch.Tensor] | web.Response:
        """The tensors of a base64 safetensors payload, or the 400 reply saying why it is not one."""
        try:
            blob = await asyncio.to_thread(base64.b64decode, payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            return _result(False, f"serialized_named_tensors[0] is not base64: {exc}")
        if is_pickle(blob):
            return _result(
                False,
                "the slime embedded engine does not unpickle tensors (pickles run code; CUDA IPC "
                "handles need a GPU engine): send base64 safetensors (slime.sync.wire.serialize_safetensors)",
            )
        try:
            return await asyncio.to_thread(deserialize_safetensors, blob)
        except ValueError as exc:
            return _result(False, str(exc))

    async def from_delta(self, request: web.Request) -> web.Response:
        """Apply a ``slime.sync.codec`` delta against the weights held; answer the sha256 of each tensor written."""
        blob = await request.read()
        try:
            control, metas, parts = await asyncio.to_thread(decode_payload, blob)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if (refused := self._refusal("update_weights_from_delta")) is not None:
            return refused
        async with self.state.lock:
            base, current = control.get("base_weight_version"), self.server.require_runner().weight_version
            if base is not None and base != current:
                return _result(False, f"delta against weight_version {base!r}, but the engine holds {current!r}")
            live = weight_targets(self.server.require_loaded().model)
            if unknown := sorted(set(metas) - set(live)):
                return _result(
                    False, f"Failed to update weights: {len(unknown)} unknown tensor names (e.g. {unknown[:3]})"
                )
            try:
                tensors = await asyncio.to_thread(
                    lambda: {n: decode_tensor(n, m, parts, live[n]) for n, m in metas.items()}
                )
            except ValueError as exc:
                return _result(False, f"Failed to decode the delta: {exc}")
            note = await self._apply(tensors, control)
            live = weight_targets(self.server.require_loaded().model)
            checksums = await asyncio.to_thread(lambda: {n: tensor_checksum(live[n]) for n in tensors})
        return _result(True, "Succeeded to update model weights from delta." + note, checksums=checksums)


class MemoryRoutes:
    """``/release_memory_occupation`` and ``/resume_memory_occupation``, and the guard while released."""

    def __init__(self, server: ServerState, state: UpdateState):
        self.server, self.state = server, state

    @staticmethod
    def _tags(body: JsonObject) -> set[str]:
        tags = body.get("tags") or list(MEMORY_TAGS)
        if not isinstance(tags, list) or not set(tags) <= set(MEMORY_TAGS):
            raise BadRequest(f"tags must be a list of {list(MEMORY_TAGS)} or null: body.tags = {tags!r}")
        return set(tags)

    async def release(self, request: web.Request) -> web.Response:
        """Hold generation and drop the weights' storage (``weights`` tag); 400 unless idle."""
        tags = self._tags(await _body(request, optional=True))
        if (refused := not_ready(self.server)) is not None:
            return refused
        if inflight := len(self.server.inflight):
            return _json(
                {
                    "error": {
                        "message": f"release_memory_occupation needs an idle engine; {inflight} requests are in flight"
                    }
                },
                400,
            )
        async with self.state.lock:
            runner = self.server.require_runner()
            if not runner.paused:  # hold generation while memory is gone
                await asyncio.wrap_future(runner.pause("in_place"))
                self.state.paused_by_release = True
            if "weights" in tags and "weights" not in self.state.released:
                self._free_weights()
            self.state.released |= tags
        return _json(None)

    def _free_weights(self) -> None:
        self.state.freed = [
            (p, p.shape) for p in self.server.require_loaded().model.parameters()
        ]  # tied weights: one Parameter
        for p, _ in self.state.freed:
            p.data = torch.empty(0, dtype=p.dtype)  # drops the storage (it may be a read-only mmap of the checkpoint)

    async def resume(self, request: web.Request) -> web.Response:
        """Re-allocate released weights as zeros (sync weights again before generating); continue once nothing is released."""
        tags = self._tags(await _body(request, optional=True))
        if (refused := not_ready(self.server)) is not None:
            return refused
        async with self.state.lock:
            if "weights" in tags and self.state.freed:
                for p, shape in self.state.freed:
                    p.data = torch.zeros(shape, dtype=p.dtype)
                self.state.freed = []
                logger.warning(
                    "weights re-allocated as zeros after release: sync weights before generating (docs/sglang.md#memory)"
                )
            self.state.released -= tags
            if not self.state.released and self.state.paused_by_release:
                await asyncio.wrap_future(self.server.require_runner().resume())
                self.state.paused_by_release = False
        return _json(None)

    @web.middleware
    async def guard_released(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """While memory is released, a continue would run forwards and a disk load would write into freed storage."""
        if self.state.released and request.path in ("/continue_generation", "/update_weights_from_disk"):
            message = f"{request.path[1:]}: memory is released ({sorted(self.state.released)}); call resume_memory_occupation first"
            return _json({"error": {"message": message}}, 400)
        return await handler(request)


def add_weight_routes(app: web.Application, server: ServerState) -> None:
    """Register the routes above on ``app`` (called by ``routes.add_routes``), sharing one ``UpdateState``."""
    state = UpdateState()
    weights, memory = WeightRoutes(server, state), MemoryRoutes(server, state)
    app.middlewares.append(memory.guard_released)
    for path, handler in [
        ("/begin_weight_update", weights.begin),
        ("/end_weight_update", weights.end),
        ("/init_weights_update_group", weights.init_group),
        ("/destroy_weights_update_group", weights.destroy_group),
        ("/update_weights_from_distributed", weights.from_distributed),
        ("/update_weights_from_tensor", weights.from_tensor),
        ("/update_weights_from_delta", weights.from_delta),
    ]:
        app.router.add_post(path, handler)
    for path, handler in [("/release_memory_occupation", memory.release), ("/resume_memory_occupation", memory.resume)]:
        app.router.add_get(path, handler, allow_head=False)
        app.router.add_post(path, handler)
