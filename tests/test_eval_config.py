"""--eval-config: THUDM/slime's YAML of eval datasets onto the eval flags (slime.eval_config)."""

from __future__ import annotations

import re

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.errors import ConfigError

MULTI_TASK = """\
eval:
  defaults:
    n_samples_per_eval_prompt: 16
    max_response_len: 16384
    top_p: 0.7
  datasets:
    - name: aime
      path: /root/aime-2024/aime-2024.jsonl
      rm_type: deepscaler
    - name: math500
      path: /root/math500.jsonl
      rm_type: deepscaler
      input_key: prompt
"""


def _config(tmp_path, text: str, *flags: str):
    (tmp_path / "eval.yaml").write_text(text)
    return config_from_args(build_parser().parse_args(["--eval-config", str(tmp_path / "eval.yaml"), *flags]))


def test_datasets_become_named_eval_sets_and_defaults_set_the_eval_flags(tmp_path):
    config = _config(
        tmp_path, MULTI_TASK, "--rm-type", "deepscaler", "--eval-top-p", "0.9", "--eval-temperature", "0.6"
    )
    assert config.data.eval_datasets == (
        ("aime", "/root/aime-2024/aime-2024.jsonl"),
        ("math500", "/root/math500.jsonl"),
    )
    r = config.rollout
    assert (r.n_samples_per_eval_prompt, r.eval_max_response_len, r.eval_top_p) == (
        16,
        16384,
        0.7,
    )  # a default wins, as in slime
    assert r.eval_temperature == 0.6  # not in the file: the flag's


def test_a_per_dataset_value_this_slime_cannot_honour_is_one_error_naming_it(tmp_path):
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "eval.datasets[0] (aime): rm_type = 'deepscaler', but this slime evaluates every dataset with the run's --rm-type ('math')"
        ),
    ):
        _config(tmp_path, MULTI_TASK, "--rm-type", "math")
    per_dataset = MULTI_TASK.replace("      input_key: prompt\n", "      top_p: 0.95\n")
    with pytest.raises(ConfigError, match=re.escape("eval.datasets[1] (math500): top_p = 0.95, but this slime")):
        _config(tmp_path, per_dataset, "--rm-type", "deepscaler")
    same = MULTI_TASK.replace("      input_key: prompt\n", "      top_k: 20\n")  # --eval-top-k unset: the rollout's
    assert _config(tmp_path, same, "--rm-type", "deepscaler", "--rollout-top-k", "20").rollout.resolved_eval_top_k == 20
    with pytest.raises(
        ConfigError, match=re.escape("eval.datasets[0] (aime): metadata_overrides: a key this slime cannot honour")
    ):
        _config(
            tmp_path, MULTI_TASK.replace("      rm_type: deepscaler\n", "      metadata_overrides: {split: test}\n", 1)
        )


@pytest.mark.parametrize(
    "text, flags, message",
    [
        ("eval: {}\n", (), "expected 'eval: datasets:'"),
        ("eval:\n  datasets:\n    - path: a.jsonl\n", (), "eval.datasets[0]: each dataset needs a 'name' and a 'path'"),
        (
            "eval:\n  datasets: [{name: a, path: a.jsonl}]\n",
            ("--eval-prompt-data", "b", "b.jsonl"),
            "with --eval-prompt-data",
        ),
        ("eval: [\n", (), "not valid YAML"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(tmp_path, text, flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        _config(tmp_path, text, *flags)
    assert str(tmp_path / "eval.yaml") in str(err.value)
