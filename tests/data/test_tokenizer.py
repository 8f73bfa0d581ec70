"""Tests for slime/data/tokenizer.py and the shipped warm-start checkpoint's tokenizer and config."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from slime.data import arith
from slime.data.tokenizer import ALPHABET, build_tokenizer

WARMSTART_DIR = Path(arith.__file__).parent / "assets" / "arith-warmstart"


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory) -> PreTrainedTokenizerFast:
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


def test_saved_tokenizer_loads_as_fast_with_its_special_tokens(saved_tokenizer):
    tok = saved_tokenizer
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == 4 + len(ALPHABET)


def test_encode_prepends_bos_and_never_appends_eos(saved_tokenizer):
    ids = saved_tokenizer("47+385+9=")["input_ids"]
    assert ids[0] == saved_tokenizer.bos_token_id
    assert saved_tokenizer.eos_token_id not in ids
    assert len(ids) == 1 + len("47+385+9=")
    assert saved_tokenizer("47+9=", add_special_tokens=False)["input_ids"] == [8, 11, 14, 13, 15]


def test_every_character_is_one_token(saved_tokenizer):
    ids = saved_tokenizer(ALPHABET, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(ALPHABET) == len(set(ids))


def test_decode_round_trips_task_text_without_spaces(saved_tokenizer):
    rng = random.Random(0)
    for _ in range(200):
        prompt, _, solution = arith.make_problem(rng)
        text = prompt + solution
        with_bos = saved_tokenizer(text)["input_ids"]
        assert saved_tokenizer.decode(with_bos, skip_special_tokens=True) == text
        plain = saved_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert saved_tokenizer.decode(plain) == text
    eos = saved_tokenizer.eos_token_id
    assert saved_tokenizer.decode(saved_tokenizer.encode("#441", add_special_tokens=False) + [eos]) == "#441<eos>"


def test_in_memory_and_saved_tokenizers_agree(saved_tokenizer):
    tok = build_tokenizer()
    text = "123+45+6=123+45=168;168+6=174;#174"
    assert tok(text)["input_ids"] == saved_tokenizer(text)["input_ids"]


def test_shipped_checkpoint_loads_and_its_config_matches_the_tokenizer():
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = AutoTokenizer.from_pretrained(WARMSTART_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARMSTART_DIR)
    gen = GenerationConfig.from_pretrained(WARMSTART_DIR)
    assert model.config.model_type == "llama"
    assert model.config.eos_token_id == gen.eos_token_id == tok.eos_token_id
    assert model.config.pad_token_id == gen.pad_token_id == tok.pad_token_id
    assert model.config.bos_token_id == gen.bos_token_id == tok.bos_token_id
    assert model.config.vocab_size == len(tok)
    size_mb = sum(f.stat().st_size for f in WARMSTART_DIR.iterdir()) / 1e6
    assert size_mb <= 20


def test_chat_tokenizer_saves_with_its_template_and_round_trips_text_and_markers(tmp_path):
    from slime.data.tokenizer import (
        CHAT_ALPHABET,
        CHAT_SPECIAL_TOKENS,
        CHAT_TEMPLATE,
        CHAT_TOOL_TOKENS,
        IM_END,
        build_chat_tokenizer,
    )

    build_chat_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == IM_END
    assert len(tok) == len(CHAT_SPECIAL_TOKENS) + len(CHAT_TOOL_TOKENS) + len(CHAT_ALPHABET)
    assert len(tok.encode(CHAT_ALPHABET)) == len(CHAT_ALPHABET)  # one token per character, newline included
    text = '<|im_start|>user\n{"a": [1, 2]} ~x<|im_end|>\n<tool_call>{}</tool_call><tool_response>7</tool_response>'
    ids = tok.encode(text)
    assert ids == build_chat_tokenizer().encode(text) == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == 'user\n{"a": [1, 2]} ~x\n<tool_call>{}</tool_call><tool_response>7</tool_response>'
    )
