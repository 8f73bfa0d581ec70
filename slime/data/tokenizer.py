"""A character-level tokenizer for the built-in arithmetic task, built with the ``tokenizers`` library.

Every character of the task alphabet (digits, ``+ = ; #``) is one token; special tokens are
``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2) and ``<unk>`` (3). Encoding with special tokens
prepends ``<bos>`` and never appends ``<eos>`` (the model must learn to stop), so a prompt's ids are
exactly what the engine is sent. A ``Fuse`` decoder joins tokens without spaces, so
``decode(encode(text), skip_special_tokens=True) == text`` for any text over the alphabet.

Example::

    tok = build_tokenizer("/tmp/tok")
    tok("47+9=")["input_ids"]        # [1, 8, 11, 14, 13, 15]  (<bos> 4 7 + 9 =)
    tok.decode([8, 11, 14, 13, 2])   # "47+9<eos>"

Not covered: characters outside the alphabet map to ``<unk>`` and do not round-trip.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

__all__ = ["PAD_TOKEN", "BOS_TOKEN", "EOS_TOKEN", "UNK_TOKEN", "SPECIAL_TOKENS", "ALPHABET", "build_tokenizer"]

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""In id order: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3."""

ALPHABET = "0123456789+=;#"
"""The task's characters, one token each, ids 4.. in this order."""


def _vocab() -> dict[str, int]:
    tokens = list(SPECIAL_TOKENS) + list(ALPHABET)
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer and, when ``out_dir`` is given, save it there.

    The saved directory loads with ``transformers.AutoTokenizer.from_pretrained(out_dir)`` as a
    ``PreTrainedTokenizerFast`` with the same special tokens and behaviour.

    Args:
        out_dir: where to write ``tokenizer.json``, ``tokenizer_config.json`` and
            ``special_tokens_map.json``; None builds it in memory only.

    Returns:
        The tokenizer (padding side left, as batched generation needs).
    """
    vocab = _vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One token per character; special tokens are matched before this runs.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=128,
    )
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer
