"""``--eval-config PATH``: THUDM/slime's YAML of eval datasets, mapped onto this slime's eval flags.

The file (slime's ``examples/eval_multi_task/multi_task.yaml``)::

    eval:
      defaults:                 # optional; each key overrides its flag below
        n_samples_per_eval_prompt: 16
        max_response_len: 16384
        top_p: 0.7
      datasets:                 # one or more; name and path required
        - name: aime
          path: /root/aime-2024/aime-2024.jsonl
          rm_type: deepscaler

``datasets`` become ``--eval-prompt-data name path ...`` pairs (reported as ``eval/<name>/...``).
``defaults`` set the eval flags, as in slime (a default wins over the flag):
``n_samples_per_eval_prompt`` -> ``--n-samples-per-eval-prompt``, ``temperature`` ->
``--eval-temperature``, ``top_p`` -> ``--eval-top-p``, ``top_k`` -> ``--eval-top-k``,
``max_response_len`` -> ``--eval-max-response-len``. ``input_key``, ``label_key``,
``metadata_key``, ``tool_key`` and ``rm_type`` are those of the run's own flags here.

This slime evaluates every dataset with one setting: a key given on a dataset (or a ``defaults``
key of the second group) must equal the run's value, else one error names the file, the dataset
and the key. Unknown keys are errors too (nothing is dropped in silence).
"""

from __future__ import annotations

from typing import Any

from slime.errors import ConfigError
from slime.yaml_file import read_yaml

__all__ = ["apply_eval_config"]

# YAML key -> (config tree path, its flag)
SAMPLING_KEYS = {
    "n_samples_per_eval_prompt": ("rollout.n_samples_per_eval_prompt", "--n-samples-per-eval-prompt"),
    "temperature": ("rollout.eval_temperature", "--eval-temperature"),
    "top_p": ("rollout.eval_top_p", "--eval-top-p"),
    "top_k": ("rollout.eval_top_k", "--eval-top-k"),
    "max_response_len": ("rollout.eval_max_response_len", "--eval-max-response-len"),
}
RUN_KEYS = {  # shared with the training data and reward here: must match the run's
    "input_key": ("data.input_key", "--input-key"),
    "label_key": ("data.label_key", "--label-key"),
    "metadata_key": ("data.metadata_key", "--metadata-key"),
    "tool_key": ("data.tool_key", "--tool-key"),
    "rm_type": ("rollout.rm_type", "--rm-type"),
}
KEYS = {**SAMPLING_KEYS, **RUN_KEYS}


# eval fields whose None means the rollout's value (RolloutConfig.resolved_eval_*)
FALLBACK = {
    "eval_top_p": "rollout_top_p",
    "eval_top_k": "rollout_top_k",
    "eval_max_response_len": "rollout_max_response_len",
}


def _get(tree: dict[str, Any], path: str) -> Any:
    section, leaf = path.split(".")
    value = tree[section][leaf]
    return tree[section][FALLBACK[leaf]] if value is None and leaf in FALLBACK else value


def apply_eval_config(path: str, tree: dict[str, Any]) -> None:
    """Read ``path`` (module docstring) and set ``tree`` (``msgspec.to_builtins(Config)``) in place:
    ``data.eval_prompt_data`` and the eval sampling fields of ``defaults``.

    Raises:
        ConfigError: unreadable file or bad YAML; no ``eval.datasets``; a dataset without
            ``name``/``path``; an unknown key; a per-dataset value other than the run's (naming
            the file, the dataset and the key); ``--eval-prompt-data`` given as well.
    """
    where = f"--eval-config {path}"
    raw = read_yaml(path, where)
    ev = raw.get("eval") if isinstance(raw, dict) else None
    datasets = ev.get("datasets") if isinstance(ev, dict) else None
    if not isinstance(ev, dict) or not isinstance(datasets, list) or not datasets:
        raise ConfigError(f"{where}: expected 'eval: datasets:' with a list of {{name, path, ...}} entries")
    if unknown := set(ev) - {"defaults", "datasets"}:
        raise ConfigError(f"{where}: eval.{sorted(unknown)[0]}: unknown key (known: defaults, datasets)")
    if tree["data"]["eval_prompt_data"] is not None:
        raise ConfigError(f"{where} with --eval-prompt-data: give the eval datasets one way")
    defaults = ev.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{where}: eval.defaults: expected a mapping, got {type(defaults).__name__}")
    _check_keys(defaults, f"{where}: eval.defaults")
    for key, value in defaults.items():
        if key in SAMPLING_KEYS:  # slime: a default wins over the flag
            section, leaf = SAMPLING_KEYS[key][0].split(".")
            tree[section][leaf] = value
    pairs: list[str] = []
    for i, entry in enumerate(datasets):
        at = f"{where}: eval.datasets[{i}]"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("path"), str)
        ):
            raise ConfigError(f"{at}: each dataset needs a 'name' and a 'path' (strings)")
        at += f" ({entry['name']})"
        rest = {k: v for k, v in entry.items() if k not in ("name", "path")}
        _check_keys(rest, at)
        for key, value in {**{k: v for k, v in defaults.items() if k in RUN_KEYS}, **rest}.items():
            field, flag = KEYS[key]
            run = _get(tree, field)
            if value != run:
                hint = (
                    "give one value for all datasets in eval.defaults"
                    if key in SAMPLING_KEYS
                    else f"it is the run's {flag} here"
                )
                raise ConfigError(
                    f"{at}: {key} = {value!r}, but this slime evaluates every dataset with the run's "
                    f"{flag} ({run!r}); per-dataset {key} is not supported: {hint}"
                )
        pairs += [entry["name"], entry["path"]]
    tree["data"]["eval_prompt_data"] = pairs


def _check_keys(mapping: dict[str, Any], at: str) -> None:
    if unknown := [k for k in mapping if k not in KEYS]:
        raise ConfigError(f"{at}: {unknown[0]}: a key this slime cannot honour (known: name, path, {', '.join(KEYS)})")
