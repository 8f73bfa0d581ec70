"""Importing megatron-core: one place that names the version range and quiets its import warnings.

megatron-core warns at import time when Transformer Engine and Apex are missing ("Falling back to
Torch optimizers", "Apex is not installed"). The megatron backend is built for exactly that case
(local layer spec, torch norms, torch Adam), so those warnings are expected noise here; they are
silenced for the import only, and every other warning still surfaces.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

__all__ = ["mcore", "MIN_VERSION"]

MIN_VERSION = (0, 16)
"""megatron-core 0.16.1 is the newest release for Python 3.11; 0.17+ needs Python 3.12. pyproject allows
0.16.1 to 0.19.x: tests/train/megatron passes against 0.16.1, 0.17.1, 0.18.2 and 0.19.2 with no version-dependent code
(0.18+ imports triton at import time, which CUDA builds of torch bring; 0.19 logs that ``GPTModel`` is
deprecated, in favour of ``HybridModel``, and still builds it)."""

_QUIET = (
    r".*Transformer Engine and Apex are not installed.*",
    r".*Apex is not installed.*",
    r".*Transformer Engine is not installed.*",
    r".*Could not import .*transformer_engine.*",
)


def mcore(module: str) -> ModuleType:
    """``importlib.import_module(module)`` for a ``megatron.core`` module, with a clear error if missing.

    Raises:
        ImportError: megatron-core is not installed (``pip install 'slime[megatron]'``) or too old.
    """
    with warnings.catch_warnings():
        for pattern in _QUIET:
            warnings.filterwarnings("ignore", message=pattern)
        try:
            root = importlib.import_module("megatron.core")
        except ImportError as exc:
            raise ImportError(
                "--train-backend megatron needs megatron-core >= 0.16 (pip install 'slime[megatron]'; "
                "megatron-core 0.16.1 is the newest for Python 3.11)"
            ) from exc
        version = tuple(int(x) for x in root.__version__.split(".")[:2])
        if version < MIN_VERSION:
            raise ImportError(f"megatron-core {root.__version__} is too old: the megatron backend needs >= 0.16")
        return importlib.import_module(module)
