"""The client side of the inference engines: one engine's HTTP client, the pool over them, retries,
breakers, routing and the SGLang wire structs (``protocol.py``); ``fleet/`` starts and supervises the
engine processes."""
