"""The weights-update process group: the trainer (rank 0) plus every engine TP rank, kept apart from
any ``torch.distributed`` default group a training job has.

Why not ``init_process_group`` / ``new_group``: the trainer may already run inside a torchrun job
whose default group holds the train ranks only. ``new_group`` can only pick ranks of that group,
and a second ``init_process_group`` is refused. SGLang and THUDM/slime call torch's private
``_new_process_group_helper`` instead; that registers the group in torch's global tables and, when
the default NCCL group has a bound device, tries to split the new communicator from it. We build
the same thing by hand, touching no global state: a ``TCPStore`` (trainer = master), the store
prefixes that ``sglang.srt.utils.init_custom_process_group`` + ``_new_process_group_helper`` use
(``"<group>"``, ``"<group>/"``, then ``"cuda/"`` for NCCL or ``"cpu/"`` for gloo), and a bare
``ProcessGroupNCCL`` / ``ProcessGroupGloo`` backend object whose ``broadcast`` we call directly.
Both the trainer and the embedded engine use this module; against real SGLang the key layout is
meant to match torch's helper for NCCL (not verified on a live server; torch builds the gloo helper
group with a second ``cuda/`` backend that we do not create, so use NCCL with real SGLang).

Rendezvous: the trainer opens the store on port 0 without waiting (so the port is known), then
constructs its backend while the engines' ``/init_weights_update_group`` calls run; each side
blocks until all ``world_size`` ranks have joined, or ``timeout_s`` passes.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch
from torch.distributed import PrefixStore, Store, TCPStore

from slime.sync.wire import flatten, unflatten

__all__ = ["WeightsUpdateGroup", "master_store", "address_towards", "backend_for"]


def backend_for(device: torch.device) -> str:
    """``nccl`` for CUDA tensors, ``gloo`` otherwise (CPU)."""
    return "nccl" if device.type == "cuda" else "gloo"


def address_towards(url: str) -> str:
    """This host's address as seen from the engine at ``url`` (loopback for a local engine).

    Uses the routing table (a UDP socket ``connect`` sends nothing)."""
    host = urlsplit(url if "://" in url else f"http://{url}").hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def master_store(address: str, world_size: int, timeout_s: float, port: int = 0) -> TCPStore:
    """The rank-0 ``TCPStore`` on ``address:port`` (0 = a free port, read back from ``.port``); returns
    at once, the workers connect later."""
    return TCPStore(
        address, port, world_size, True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


@dataclass
class WeightsUpdateGroup:
    """One member of a weights-update group.

    Attributes:
        name: ``group_name`` (SGLang's default is ``"weight_update_group"``).
        rank / world_size: this member's rank (trainer 0; engine TP rank r of the engine with
            ``rank_offset`` k is k + r) and the number of members.
        backend: ``"gloo"`` or ``"nccl"``.
        pg: the torch backend object (``ProcessGroupGloo`` / ``ProcessGroupNCCL``).
        store: the ``TCPStore`` (held so that the master's server lives as long as the group).
    """

    name: str
    rank: int
    world_size: int
    backend: str
    pg: Any
    store: Store

    @classmethod
    def join(
        cls,
        *,
        group_name: str,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        master_address: str = "",
        master_port: int = 0,
        store: TCPStore | None = None,
    ) -> WeightsUpdateGroup:
        """Join the group (blocking until every member joined). Rank 0 passes its ``master_store``;
        the others pass ``master_address`` / ``master_port``.

        Raises:
            ValueError: bad rank / world size / backend, or ``nccl`` without CUDA.
            RuntimeError / DistNetworkError: the rendezvous failed or timed out (torch's errors).
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside the group of world_size {world_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend {backend!r}: expected 'gloo' or 'nccl'")
        if backend == "nccl" and not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
            raise ValueError("backend 'nccl' needs CUDA and a torch build with NCCL; use 'gloo' on CPU")
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = TCPStore(master_address, master_port, world_size, False, timeout=timeout)
        device = "cuda" if backend == "nccl" else "cpu"
        prefixed = PrefixStore(f"{device}/", PrefixStore(f"{group_name}/", PrefixStore(group_name, store)))
        if backend == "gloo":
            from torch.distributed import ProcessGroupGloo

            pg: Any = ProcessGroupGloo(
                prefixed, rank, world_size, timeout
            )  # Gloo or NCCL: no common base in torch's stubs
        else:
            from torch.distributed import ProcessGroupNCCL

            options = ProcessGroupNCCL.Options()
            options.is_high_priority_stream = False
            options._timeout = timeout
            pg = ProcessGroupNCCL(prefixed, rank, world_size, options)
        return cls(name=group_name, rank=rank, world_size=world_size, backend=backend, pg=pg, store=store)

    def broadcast(self, tensors: Sequence[torch.Tensor], *, flattened: bool = False) -> list[torch.Tensor]:
        """Broadcast from rank 0, one collective per tensor in order (or one flat uint8 buffer, SGLang's
        ``flattened_bucket``). On other ranks ``tensors`` are receive buffers. Blocking; returns the
        tensors (for ``flattened``: views of the received buffer)."""
        if flattened:
            if self.rank == 0:
                flat = flatten(tensors)
            else:
                flat = torch.empty(
                    sum(t.numel() * t.element_size() for t in tensors),
                    dtype=torch.uint8,
                    device=tensors[0].device if tensors else "cpu",
                )
            self._broadcast_one(flat)
            out = tensors if self.rank == 0 else unflatten(flat, [t.dtype for t in tensors], [t.shape for t in tensors])
        else:
            for t in tensors:
                self._broadcast_one(t)
            out = list(tensors)
        if self.backend == "nccl" and tensors:  # by device: this may run in a thread whose current device differs
            torch.cuda.synchronize(tensors[0].device)
        return list(out)

    def _broadcast_one(self, t: torch.Tensor) -> None:
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([t], opts).wait()

    def destroy(self) -> None:
        """Release the communicator (NCCL: ``shutdown``); the group cannot be used afterwards."""
        shutdown = getattr(self.pg, "shutdown", None) if self.backend == "nccl" else None
        if shutdown is not None:
            shutdown()
        self.pg = None
