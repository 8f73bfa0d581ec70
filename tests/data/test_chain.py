"""The long-tailed addition-chain task (slime.data.chain)."""

import argparse
import random
import statistics

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.data import arith, chain


def _lengths(n: int = 5000) -> list[int]:
    rng = random.Random(0)
    return sorted(len(chain.make_problem(rng)[2]) for _ in range(n))


def test_response_lengths_are_long_tailed():
    lengths = _lengths()
    median, p99 = statistics.median(lengths), lengths[int(0.99 * len(lengths))]
    assert p99 / median >= 5, (median, p99)  # arith's worked solutions: about 2x
    assert max(lengths) <= chain.MAX_RESPONSE_CHARS


def test_arith_lengths_are_not_long_tailed_for_contrast():
    rng = random.Random(0)
    lengths = sorted(len(arith.make_problem(rng)[2]) for _ in range(5000))
    assert lengths[int(0.99 * len(lengths))] / statistics.median(lengths) < 3


def test_solution_is_right_and_scored_by_arith_reward():
    for prompt, label, solution in (chain.make_problem(random.Random(s)) for s in range(200)):
        terms = [int(t) for t in prompt.rstrip("=").split("+")]
        assert str(sum(terms)) == label
        assert solution.count(";") == len(terms) - 1
        assert chain.score(solution + "<eos>", label) == 1.0


def test_splits_disjoint_and_deterministic():
    train = chain.generate_dataset(300, seed=1, split="train")
    evals = chain.generate_dataset(100, seed=0, split="eval")
    assert train == chain.generate_dataset(300, seed=1, split="train")
    long = {r["prompt"] for r in train if r["prompt"].count("+") >= 4}
    assert long and not long & {r["prompt"] for r in evals}  # short sums repeat across splits only by hash bucket
    assert all(arith.split_of(r["prompt"]) == "eval" for r in evals)


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(ValueError, match="max_terms must be >= 2"):
        chain.term_weights(1)
    with pytest.raises(ValueError, match="split must be"):
        chain.generate_dataset(1, seed=0, split="test")


def test_cli_writes_train_and_eval(tmp_path):
    assert (
        chain.main(
            ["--out", str(tmp_path), "--num-train", "5", "--num-eval", "3", "--max-terms", "20", "--max-digits", "2"]
        )
        == 0
    )
    assert len(chain.read_jsonl(tmp_path / "train.jsonl")) == 5 and len(chain.read_jsonl(tmp_path / "eval.jsonl")) == 3


def test_builtin_task_name_is_accepted():
    ns = build_parser(argparse.ArgumentParser()).parse_args(["--builtin-task", "chain"])
    assert config_from_args(ns).data.builtin_task == "chain"
