"""Servers on the far side of the wire, speaking SGLang's HTTP subset: the embedded engine
(``embedded/``, a real CPU model) and the simulated engine (``sim/``, no model, for timing studies)."""
