"""``HFCheckpointReader``: lazy per-tensor reads of an HF directory's safetensors (``model.load_hf_weights``
and ``slime convert`` read through it; ``slime.train.megatron.model`` re-exports it)."""

from __future__ import annotations

import os

import torch

from slime.hf_checkpoint import check_hf_dir

__all__ = ["HFCheckpointReader"]


class HFCheckpointReader:
    """Lazy per-tensor reads from an HF directory's safetensors files (single file or sharded index).

    Tensors come back on the CPU in their stored dtype; only the ones asked for are read.
    """

    def __init__(self, model_dir: str):
        """Raises ``CheckpointError`` for a missing, corrupt or truncated file (``slime.hf_checkpoint.check_hf_dir``)."""
        from safetensors import safe_open

        check_hf_dir(model_dir)
        self.model_dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.isfile(index):
            import json

            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(os.path.join(model_dir, "model.safetensors")):
            files, weight_map = ["model.safetensors"], None
        else:
            raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
        self._handles = {name: safe_open(os.path.join(model_dir, name), framework="pt") for name in files}
        if weight_map is None:
            weight_map = {key: "model.safetensors" for key in self._handles["model.safetensors"].keys()}
        self._where = weight_map

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"{self.model_dir}: the checkpoint has no tensor {name!r}")
        return self._handles[self._where[name]].get_tensor(name)
