"""Writing a model as an HF directory atomically, for weight sync and checkpoints.

A reader (an engine loading new weights) must never see a half-written directory, so the model
is written into a temporary sibling and renamed into place. Not covered: optimizer state, the
critic and the reference model (a resumed run starts them fresh).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading

from transformers import PreTrainedModel

__all__ = ["TOKENIZER_FILES", "save_hf_dir", "copy_source_files", "swap_into_place"]

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files copied from the source model directory into every ``save_hf_dir`` output, when present."""


def save_hf_dir(model: PreTrainedModel, out_dir: str, *, source_dir: str, lock: threading.Lock | None = None) -> str:
    """Write ``model`` as an HF model directory at ``out_dir``, atomically; return its absolute path.

    Writes config.json, generation_config.json and model.safetensors (transformers 5 always
    writes safetensors) into a temporary sibling directory, copies ``TOKENIZER_FILES`` from
    ``source_dir`` when present, then renames it to ``out_dir``. When ``out_dir`` already exists
    it is moved aside first and deleted after, so for that moment ``out_dir`` is absent.

    Args:
        model: the model to save.
        out_dir: target directory; its parent is created.
        source_dir: the directory the model was loaded from (tokenizer files).
        lock: held while the weights are read, so a concurrent train step cannot tear them.
    """
    out = os.path.abspath(out_dir)
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        with lock if lock is not None else contextlib.nullcontext():
            model.save_pretrained(tmp)
        copy_source_files(source_dir, tmp, TOKENIZER_FILES, overwrite=False)
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def copy_source_files(source_dir: str, dest_dir: str, names: tuple[str, ...], *, overwrite: bool = True) -> None:
    """Copy the files ``names`` that exist in ``source_dir`` into ``dest_dir``."""
    for fname in names:
        src, dst = os.path.join(source_dir, fname), os.path.join(dest_dir, fname)
        if os.path.isfile(src) and (overwrite or not os.path.exists(dst)):
            shutil.copy2(src, dst)


def swap_into_place(tmp: str, out: str) -> None:
    """Rename the finished directory ``tmp`` to ``out``; an existing ``out`` is moved aside first
    and deleted after (so for that moment ``out`` is absent, but never half-written)."""
    parent, name = os.path.split(out)
    if os.path.exists(out):
        trash = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
        os.rename(out, os.path.join(trash, name))
        os.rename(tmp, out)
        shutil.rmtree(trash)
    else:
        os.rename(tmp, out)
