"""Tests for slime/data/calc.py (the tool-calling task), its driver wiring and the shipped warm start."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from slime.data import calc
from slime.rollout.tools.calculator import evaluate as calculator
from slime.rollout.tools.parse import parse_tool_calls
from slime.types import Sample

WARMSTART_DIR = Path(calc.__file__).parent / "assets" / "calc-warmstart"


def test_problems_are_seeded_and_their_label_is_what_the_calculator_says():
    assert [calc.make_problem(random.Random(3)) for _ in range(3)] == [
        calc.make_problem(random.Random(3)) for _ in range(3)
    ]
    rng = random.Random(0)
    for _ in range(500):
        expression, label = calc.make_problem(rng)
        factors = expression.split("*")
        assert calc.MIN_FACTORS <= len(factors) <= calc.MAX_FACTORS
        assert all(re.fullmatch(r"[1-9]\d*", f) and calc.MIN_DIGITS <= len(f) <= calc.MAX_DIGITS for f in factors)
        assert label == calculator(expression)


def test_train_and_eval_splits_are_disjoint_and_deterministic():
    train = calc.generate_dataset(3000, seed=0, split="train")
    evals = calc.generate_dataset(300, seed=0, split="eval")
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in evals}
    assert calc.generate_dataset(100, seed=0, split="eval") == evals[:100]
    assert calc.generate_dataset(50, seed=1, split="train") != train[:50]
    assert all(calc.split_of(r["prompt"]) == "eval" for r in evals)
    with pytest.raises(ValueError, match="split"):
        calc.generate_dataset(1, seed=0, split="test")


def test_conversations_call_the_tool_with_the_expression_or_answer_directly():
    tool = calc.conversation("347*82*19", "540626", use_tool=True)
    assert [m["role"] for m in tool] == ["user", "assistant", "tool", "assistant"]
    [call] = parse_tool_calls(tool[1]["content"])
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "347*82*19"}, None)
    assert tool[2]["content"] == "540626" and tool[3]["content"] == "#540626"
    assert calc.conversation("12+34", "46", use_tool=False) == [
        {"role": "user", "content": "12+34"},
        {"role": "assistant", "content": "#46"},
    ]


@pytest.mark.parametrize(
    "text, answer",
    [
        ("#540626", "540626"),
        (" #540626\n", "540626"),
        ("so #46", "46"),
        ("#30;#359", None),
        ("#", None),
        ("540626", None),
        (calc.tool_call_text("1+1"), None),
        (None, None),
    ],
)
def test_extract_answer(text, answer):
    assert calc.extract_answer(text) == answer


def _multiturn_sample(messages, phase="done", label="46"):
    return Sample(prompt_ids=[1], label=label, metadata={"multiturn": {"messages": messages, "phase": phase}})


async def test_reward_reads_the_final_assistant_message_of_the_multiturn_state():
    messages = calc.conversation("12+34", "46", use_tool=True)
    sample = _multiturn_sample(messages)
    sample.evidence["tool_calls"] = [{"name": "calculator"}]
    assert await calc.reward(sample) == 1.0
    assert sample.evidence["calc"] == {"extracted_answer": "46", "label": "46", "tool_calls": 1}
    assert await calc.reward(_multiturn_sample(messages, label="47")) == 0.0
    # cut by the length budget after the tool result, or stopped on a tool call: no final answer
    assert await calc.reward(_multiturn_sample(messages[:3], phase="done")) == 0.0
    assert await calc.reward(_multiturn_sample(messages[:2], phase="done")) == 0.0
    assert await calc.reward(_multiturn_sample(messages, phase="tools")) == 0.0


async def test_reward_falls_back_to_the_response_text_and_needs_a_label():
    sample = Sample(
        prompt_ids=[1],
        label="46",
        response=calc.tool_call_text("12+34") + "\ntool\n<tool_response>46</tool_response>\nassistant\n#46\n",
    )
    assert await calc.reward(sample) == 1.0
    assert await calc.reward(Sample(prompt_ids=[1], label="46", response="#46")) == 1.0
    assert await calc.reward(Sample(prompt_ids=[1], label="46", response="#45")) == 0.0
    with pytest.raises(ValueError, match="no label"):
        await calc.reward(Sample(prompt_ids=[1], response="#46"))


def test_builtin_task_flag_selects_the_calc_rows_and_reward():
    from slime.cli.args import build_parser, config_from_args
    from slime.loop.inputs import load_prompts, reward_function

    args = [
        "--builtin-task",
        "calc",
        "--num-eval-prompts",
        "20",
        "--rollout-batch-size",
        "4",
        "--global-batch-size",
        "32",
    ]
    config = config_from_args(build_parser().parse_args(args))
    assert config.data.builtin_task == "calc"
    train, evals = load_prompts(config.data, seed=config.seed)
    assert len(train) == 20000 and len(evals) == 20
    assert [(r.prompt, r.label) for r in evals] == [
        (r["prompt"], r["label"]) for r in calc.generate_dataset(20, seed=0, split="eval")
    ]
    assert reward_function(config.rollout, builtin=config.data.builtin_task) is calc.reward
    default = config_from_args(build_parser().parse_args(args[2:]))
    assert (
        default.data.builtin_task == "arith"
        and reward_function(default.rollout, builtin=default.data.builtin_task) is not calc.reward
    )


def test_shipped_checkpoint_loads_with_its_chat_template_and_fits_the_task():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.data.tokenizer import IM_END, build_chat_tokenizer

    tok = AutoTokenizer.from_pretrained(WARMSTART_DIR)
    model = AutoModelForCausalLM.from_pretrained(WARMSTART_DIR)
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok) == len(build_chat_tokenizer())
    assert tok.eos_token == IM_END and model.config.eos_token_id == tok.eos_token_id
    messages = calc.conversation("9999*9999*9999", "999700029999", use_tool=True)
    ids = tok.apply_chat_template(
        messages, tools=[{"type": "function", "function": {"name": "calculator"}}], tokenize=True, return_dict=False
    )
    assert len(ids) <= model.config.max_position_embeddings  # the longest problem fits
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok)) and torch.isfinite(logits).all()
    size_mb = sum(f.stat().st_size for f in WARMSTART_DIR.iterdir()) / 1e6
    assert size_mb <= 12


@pytest.mark.parametrize("use_tool", [True, False])
def test_sft_rows_of_calc_conversations_train_each_assistant_text_and_its_im_end(tmp_path, use_tool):
    # the rows scripts/make_tool_warmstart.py hands to `slime train --loss-type sft_loss`
    import json

    from slime.data.sft import load_sft_file
    from slime.data.tokenizer import build_chat_tokenizer
    from slime.rollout.tools.calculator import calculator_tool

    tok = build_chat_tokenizer()
    messages = calc.conversation("347*82*19", "540626", use_tool=use_tool)
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"messages": messages, "tools": [calculator_tool().schema]}) + "\n")
    (example,), num_bad = load_sft_file(path, tokenizer=tok, input_key="messages", tool_key="tools")
    assert num_bad == 0
    trained = [t for t, m in zip(example.input_ids, example.loss_mask) if m]
    expected = []
    for m in messages:
        if m["role"] == "assistant":
            expected += tok.encode(m["content"], add_special_tokens=False) + [tok.eos_token_id]
    assert trained == expected
    text = tok.decode(example.input_ids)
    assert "calculator" in text.split("<|im_end|>")[0]  # the tool schema reached the template's system turn
    # the first trained token comes right after the first assistant header
    first = example.loss_mask.index(1)
    assert tok.decode(example.input_ids[:first]).endswith("<|im_start|>assistant\n")
