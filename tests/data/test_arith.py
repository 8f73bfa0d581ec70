"""Tests for slime/data/arith.py: problem generation, splits, answer extraction and reward."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from slime.data import arith
from slime.types import Sample


def test_make_problem_is_deterministic_for_a_seed():
    a = [arith.make_problem(random.Random(7)) for _ in range(3)]
    b = [arith.make_problem(random.Random(7)) for _ in range(3)]
    assert a == b
    rng = random.Random(7)
    assert len({arith.make_problem(rng) for _ in range(50)}) > 40


def test_solution_is_running_sums_ending_in_the_label():
    rng = random.Random(0)
    for _ in range(500):
        prompt, label, solution = arith.make_problem(rng)
        terms = [int(t) for t in prompt.rstrip("=").split("+")]
        assert arith.MIN_TERMS <= len(terms) <= arith.MAX_TERMS
        assert all(0 <= t < 10**arith.MAX_DIGITS for t in terms)
        assert label == str(sum(terms))
        *steps, final = solution.split(";")
        assert final == f"#{label}" and len(steps) == len(terms) - 1
        total = terms[0]
        for step, term in zip(steps, terms[1:]):
            assert step == f"{total}+{term}={total + term}"
            total += term
        assert 8 <= len(solution) <= arith.MAX_RESPONSE_CHARS


def test_response_lengths_vary_widely():
    rng = random.Random(1)
    lengths = {len(arith.make_problem(rng)[2]) for _ in range(2000)}
    assert min(lengths) <= 10 and max(lengths) >= 40


def test_generate_dataset_is_deterministic_and_extends_with_n():
    rows = arith.generate_dataset(100, seed=3, split="train")
    assert rows == arith.generate_dataset(100, seed=3, split="train")
    assert arith.generate_dataset(150, seed=3, split="train")[:100] == rows
    assert rows != arith.generate_dataset(100, seed=4, split="train")
    assert all(set(r) == {"prompt", "label"} for r in rows)


def test_train_and_eval_splits_share_no_prompt_even_with_the_same_seed():
    train = {r["prompt"] for r in arith.generate_dataset(3000, seed=0, split="train")}
    evals = {r["prompt"] for r in arith.generate_dataset(500, seed=0, split="eval")}
    assert train and evals and not train & evals
    assert all(arith.split_of(p) == "eval" for p in evals)


def test_generate_dataset_rejects_an_unknown_split():
    with pytest.raises(ValueError, match="split"):
        arith.generate_dataset(1, seed=0, split="test")


def test_write_jsonl_round_trips(tmp_path):
    rows = arith.generate_dataset(5, seed=0, split="eval")
    path = tmp_path / "sub" / "eval.jsonl"
    arith.write_jsonl(rows, path)
    assert arith.read_jsonl(path) == rows


@pytest.mark.parametrize(
    "text, answer",
    [
        ("47+385=432;432+9=441;#441", "441"),
        ("47+385=432;432+9=441;#441<eos>", "441"),
        ("#441 \n", "441"),
        ("3+4=7;#7<eos><pad><pad>", "7"),
        ("47+385=432;432+9=441;", None),  # no answer marker
        ("#44;#441", None),  # hedging with two answers
        ("#4413+1", None),  # ran on past the answer
        ("#", None),
        ("", None),
        ("<eos>", None),
    ],
)
def test_extract_answer(text, answer):
    assert arith.extract_answer(text) == answer


@pytest.mark.parametrize(
    "text, label, expected",
    [
        ("47+385=432;432+9=441;#441", "441", 1.0),
        ("47+385=432;432+9=440;#440", "441", 0.0),
        ("#0441", "441", 0.0),
        ("441", "441", 0.0),
        ("", "441", 0.0),
    ],
)
def test_score(text, label, expected):
    assert arith.score(text, label) == expected


async def test_reward_scores_the_response_against_the_label_and_records_evidence():
    right = Sample(prompt_ids=[1], prompt="47+385+9=", response="47+385=432;432+9=441;#441", label="441")
    wrong = Sample(prompt_ids=[1], prompt="47+385+9=", response="47+385=432;432+9=442;#442", label="441")
    assert await arith.reward(right) == 1.0
    assert await arith.reward(wrong) == 0.0
    assert wrong.evidence["arith"] == {"extracted_answer": "442", "label": "441"}


async def test_reward_without_a_label_raises():
    with pytest.raises(ValueError, match="no label"):
        await arith.reward(Sample(prompt_ids=[1], response="#1"))


def test_eval_prompts_use_only_the_tokenizer_alphabet():
    from slime.data.tokenizer import ALPHABET

    rng = random.Random(2)
    for _ in range(200):
        prompt, _, solution = arith.make_problem(rng)
        assert re.fullmatch(f"[{re.escape(ALPHABET)}]+", prompt + solution)


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core machine: more threads only spin (50x slower under load)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_hf_generate_batched_greedy_matches_an_uncached_one_by_one_loop(one_torch_thread):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = Path(arith.__file__).parent / "assets" / "arith-warmstart"
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    rows = arith.generate_dataset(5, seed=0, split="eval")
    fast = arith.hf_generate(model, tokenizer, [r["prompt"] for r in rows], batch_size=3)
    for row, text in zip(rows, fast):
        ids = tokenizer(row["prompt"])["input_ids"]
        num_prompt_ids = len(ids)
        with torch.no_grad():
            for _ in range(arith.MAX_RESPONSE_CHARS + 2):
                next_id = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                if next_id == tokenizer.eos_token_id:
                    break
                ids.append(next_id)
        assert text == tokenizer.decode(ids[num_prompt_ids:])
    assert 0.0 <= arith.evaluate_hf_model(model, tokenizer, rows, temperature=1.0, num_samples=2) <= 1.0
