"""The embedded engine: a small inference server speaking SGLang 0.5.23's native HTTP subset.

It is the CPU default engine of slime, not a mock. It serves an HF causal LM (fp32, CPU) with real
continuous batching: requests decode together, one forward per step, over a left-padded
``DynamicCache``; newcomers are prefilled between decode steps and merged in; finished and aborted
rows leave. Logprobs equal a plain full forward of the same HF model (about 1e-6 in fp32) under
SGLang's temperature-scaled convention (``sampling.token_logprobs``, shared with the trainer).

Layout::

    server.py    EngineServer (async context manager) and ``main(argv)`` for ``slime engine``
    state.py     ServerState: what the route classes read from the server (a Protocol; EngineServer is one)
    routes.py    route classes (generate, control, info) and SGLang's reply and error shapes
    parse.py     /generate body -> EngineRequests (0.5.23 contract: closed sampling_params keys)
    runner.py    ModelRunner: the model thread, waiting queue, running batch, control ops
    batch.py     BatchKV: left-padded KV cache, merge / select / decode inputs
    sampling.py  SamplingParams, sample_next, token_logprobs, seeded generators
    request.py   EngineRequest and the response object
    model.py     load the model / tokenizer, read and check safetensors for reloads
    weights.py   WeightRoutes (sessions, process groups, tensor / distributed / delta updates), MemoryRoutes

Served: /generate (``input_ids`` or ``text``, single or batch, ``n``), /abort_request,
/pause_generation (abort / retract / in_place), /continue_generation, /update_weights_from_disk,
/update_weight_version, /flush_cache, /health, /health_generate, /ready, /model_info,
/get_model_info, /server_info, /get_server_info, /begin_weight_update, /end_weight_update,
/init_weights_update_group, /update_weights_from_distributed (gloo), /destroy_weights_update_group,
/update_weights_from_tensor (safetensors payloads), /update_weights_from_delta (slime's own),
/release_memory_occupation, /resume_memory_occupation.

What it does not do (it answers 400 with a message where a client could ask for it):

* no streaming (``stream: true`` -> 400), no OpenAI ``/v1/*`` routes, no ``top_logprobs_num`` /
  ``token_ids_logprob``, no hidden states, LoRA or multimodal inputs;
* no penalties (frequency / presence / repetition), ``min_new_tokens``, ``logit_bias``, grammars
  (``json_schema`` / ``regex`` / ``ebnf``), ``stop_regex`` or beam search: each is accepted only at
  its default value;
* no radix / prefix cache (``cached_tokens`` is always 0; ``/flush_cache`` is a no-op that still
  refuses while busy), no chunked prefill, no paged KV pool or memory-pressure preemption;
* no NCCL (the weights-update group is gloo) and no pickled / CUDA IPC tensor payloads; memory
  release drops the weights and holds generation (see ``weights.py``); no auth (``--api-key``), no
  router, one process = one "GPU".
* ``stop`` strings and ``text`` need a tokenizer in the model directory; without one they are
  refused and responses carry no ``text`` (like ``--skip-tokenizer-init``).
"""

from typing import Any

__all__ = ["EngineServer", "main", "token_logprobs"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``slime.servers.embedded.sampling`` (imported by the trainer) pulls in only torch.
    if name in ("EngineServer", "main"):
        from slime.servers.embedded import server

        return getattr(server, name)
    if name == "token_logprobs":
        from slime.servers.embedded.sampling import token_logprobs

        return token_logprobs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
