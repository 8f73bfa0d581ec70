"""Load an HF causal LM (fp32, CPU), its optional tokenizer and EOS ids; read safetensors for reloads.

``read_hf_weights`` is what ``/update_weights_from_disk`` uses: it reads every ``*.safetensors``
file of an HF directory (through ``model.safetensors.index.json`` when present) and checks names
and shapes against the live model before anything is copied, so a bad directory leaves the
served weights untouched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from slime.hf_checkpoint import check_hf_dir, check_safetensors_file
from slime.sync.hf_layout import checkpoint_views

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["LoadedModel", "load_model", "read_hf_weights", "copy_weights_"]

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class LoadedModel:
    """A model ready to serve.

    Attributes:
        model: the ``*ForCausalLM`` in eval mode, fp32, CPU.
        tokenizer: the HF tokenizer, or None when the directory has none.
        eos_token_ids: EOS ids from ``config.json`` and ``generation_config.json`` (union).
        context_length: ``max_position_embeddings``.
        vocab_size: logits width.
        model_type / architectures: from the config, echoed by ``/model_info``.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    eos_token_ids: frozenset[int]
    context_length: int
    vocab_size: int
    model_type: str
    architectures: list[str]


def _as_ids(value: int | Iterable[int] | None) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def load_model(model_path: str | Path) -> LoadedModel:
    """Load ``model_path`` (an HF directory) for serving.

    Raises:
        CheckpointError: a missing directory, config or weights, or a corrupt or truncated file
            (``slime.hf_checkpoint.check_hf_dir``); a ``ValueError``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = Path(model_path)
    check_hf_dir(path, tokenizer=True)
    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32).eval()
    model.requires_grad_(False)
    eos = _as_ids(config.eos_token_id)
    try:
        eos |= _as_ids(GenerationConfig.from_pretrained(path).eos_token_id)
    except OSError:
        pass  # no generation_config.json
    tokenizer = None
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    text_config = config.get_text_config(decoder=True)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        eos_token_ids=frozenset(eos),
        context_length=int(getattr(text_config, "max_position_embeddings", 4096)),
        vocab_size=int(text_config.vocab_size),
        model_type=str(config.model_type),
        architectures=list(config.architectures or [type(model).__name__]),
    )


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    return sorted(path.glob("*.safetensors"))


def weight_targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every name a weight update may use -> the live tensor (or view) it writes.

    The HF checkpoint names (``slime.sync.hf_layout.checkpoint_views``: one tensor per expert
    for transformers' fused MoE experts) plus ``model.state_dict()``'s own names.
    """
    state = model.state_dict()
    return {**checkpoint_views(state), **state}


def read_hf_weights(model_path: str | Path, model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Read the safetensors of ``model_path`` and check them against ``model``'s weights.

    Names are an HF checkpoint's (``weight_targets``: per-expert tensors of an MoE model are
    accepted and land in the fused in-memory parameters).

    Returns:
        name -> tensor for every checkpoint name present on disk.

    Raises:
        ValueError: missing directory or files, unknown or missing names, or shape mismatches;
            the message names the path and the first offending tensors.
    """
    from safetensors.torch import load_file

    path = Path(model_path)
    if not path.is_dir():
        raise ValueError(f"Failed to update weights: {path} is not a directory")
    files = _safetensors_files(path)
    if not files:
        raise ValueError(f"Failed to update weights: no *.safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        check_safetensors_file(file)
        tensors.update(load_file(file))
    targets = weight_targets(model)
    expected = {name: t.shape for name, t in targets.items()}
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if model.config.tie_word_embeddings else set()
    unknown = sorted(set(tensors) - set(expected))
    checkpoint = checkpoint_views(model.state_dict())  # a complete checkpoint has every one of these names
    missing = sorted(set(checkpoint) - set(tensors) - tied)
    wrong = sorted(n for n in tensors.keys() & expected.keys() if tensors[n].shape != expected[n])
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} unexpected tensors (e.g. {unknown[:3]})")
    if missing:
        problems.append(f"{len(missing)} missing tensors (e.g. {missing[:3]})")
    if wrong:
        n = wrong[0]
        problems.append(
            f"{len(wrong)} shape mismatches (e.g. {n}: file {tuple(tensors[n].shape)} vs model {tuple(expected[n])})"
        )
    if problems:
        raise ValueError(f"Failed to update weights from {path}: " + "; ".join(problems))
    return {n: t for n, t in tensors.items() if n in expected}


@torch.no_grad()
def copy_weights_(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checked tensors into the live model in place (dtype converted to the model's).

    Names as ``weight_targets``: a per-expert checkpoint tensor writes its slice of the fused parameter.
    """
    targets = weight_targets(model)
    for name, tensor in tensors.items():
        targets[name].copy_(tensor)
