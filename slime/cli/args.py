"""The slime-compatible flags of ``slime train``, and how each lands on a typed config field.

``FLAGS`` (the table, in ``slime/cli/flags.py``, re-exported here) is the whole CLI surface of
``slime train``; ``tests/test_cli_args.py`` pins it, so a new flag is a deliberate change. Flags that
THUDM/slime has keep slime's spelling. This module turns the table into a parser and a validated config.
"""

from __future__ import annotations

import argparse
import logging
import re
from typing import Any

import msgspec

from slime.cli.flags import FLAGS  # the table itself (slime/cli/flags.py), re-exported
from slime.config import Config
from slime.config.loop import LoopConfig
from slime.engines.fleet.groups import RESERVED_ROUTER_FLAGS, RESERVED_SERVER_FLAGS
from slime.errors import ConfigError

_log = logging.getLogger(__name__)

ConfigTree = dict[str, Any]
"""The config as JSON builtins (``msgspec.to_builtins(Config)``): sections of JSON values, so ``Any``."""

__all__ = ["FLAGS", "build_parser", "config_from_args", "split_passthrough", "RESERVED_PASSTHROUGH"]


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="slime train", allow_abbrev=False)
    docs = None
    for flag, (path, kwargs) in FLAGS.items():
        if "help" not in kwargs:
            docs = docs if docs is not None else _config_docs()
            kwargs = {**kwargs, "help": _help_from_config(path, docs)}
        if kwargs.get("type") in (int, float):  # the allowed values, as Config.validate checks them
            kwargs = {**kwargs, "help": f"{kwargs['help']}; allowed {_range_of(path)}".lstrip("; ")}
        parser.add_argument(flag, dest=flag[2:].replace("-", "_"), default=None, **kwargs)
    # THUDM/slime flags with no field here: checked against --hf-checkpoint, or logged no-ops (slime/cli/compat.py)
    from slime.cli.compat import add_compat_flags

    add_compat_flags(parser)
    return parser


def _range_of(path: str) -> str:
    """The declared range of the numeric field at ``path`` in words (``slime.config._base.Range``), e.g. ``in [1, 1024]``."""
    from slime.config._base import field_ranges

    *sections, key = path.split(".")
    owner: Any = Config()
    for name in sections:
        owner = getattr(owner, name)
    rng = field_ranges(type(owner))[key][0]
    return rng.describe().replace("%", "%%") if rng is not None else "any number"


def _config_docs() -> dict[tuple[str, str], str]:
    """``{(class name, field): docstring}`` of the ``slime/config/`` modules: the string under each field."""
    import ast
    import pkgutil
    from pathlib import Path

    from slime import config as config_package

    docs: dict[tuple[str, str], str] = {}
    sources = [
        Path(config_package.__path__[0], f"{m.name}.py").read_text()
        for m in pkgutil.iter_modules(config_package.__path__)
    ]
    for node in (n for source in sources for n in ast.parse(source).body):
        if isinstance(node, ast.ClassDef):
            body = node.body
            for field, doc in zip(body, body[1:]):
                if (
                    isinstance(field, ast.AnnAssign)
                    and isinstance(field.target, ast.Name)
                    and isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)
                ):
                    docs[(node.name, field.target.id)] = " ".join(doc.value.value.split())
    return docs


def _help_from_config(path: str, docs: dict[tuple[str, str], str]) -> str:
    """Help text of a flag without one: its config field's docstring (first sentence) and default."""
    *sections, key = path.split(".")
    owner = Config()
    for name in sections:
        owner = getattr(owner, name)
    doc = docs.get((type(owner).__name__, key), "")
    doc = doc.split(". ")[0].rstrip(".") if doc else ""
    doc = re.sub(r"\s*\(``--[a-z0-9-]+``\)", "", doc).replace("``", "")  # the flag naming itself
    default = getattr(owner, key, None)
    shown = "" if default is None or isinstance(default, bool) else f" (default: {default})"
    return (doc + shown).strip().replace("%", "%%")  # argparse %-formats help strings


# Pass-through flags (THUDM/slime's convention): ``--sglang-X ...`` -> ``sglang.launch_server --X ...``,
# ``--router-X ...`` -> ``sglang_router.launch_router --X ...``, unless the flag is in FLAGS above.
PASSTHROUGH_PREFIXES = ("--sglang-", "--router-")
RESERVED_PASSTHROUGH = {
    **{f"--sglang-{name}": use for name, use in RESERVED_SERVER_FLAGS.items()},
    **{f"--router-{name}": use for name, use in RESERVED_ROUTER_FLAGS.items()},
}
"""Pass-through flags slime sets itself, with what to use instead."""
_NOT_SGLANG = ("--sglang-router-", "--sglang-server-concurrency")  # THUDM/slime's own flags, not SGLang's


def split_passthrough(argv: list[str]) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """Split ``argv`` into slime's flags, ``--sglang-*`` and ``--router-*`` pass-through flags.

    A pass-through flag keeps every following token up to the next ``--`` token as its values, so
    bare flags stay bare and ``-1`` is a value. Example: ``["--sglang-mem-fraction-static", "0.7",
    "--sglang-enable-memory-saver", "--lr", "1e-6"]`` -> ``(["--lr", "1e-6"], ("--mem-fraction-static",
    "0.7", "--enable-memory-saver"), ())``.

    Raises:
        ConfigError: a flag that slime sets itself (``RESERVED_PASSTHROUGH``), or one of THUDM/slime's
            own ``--sglang-router-*`` flags that this slime does not have.
    """
    rest: list[str] = []
    out: dict[str, list[str]] = {p: [] for p in PASSTHROUGH_PREFIXES}
    i = 0
    while i < len(argv):
        token = argv[i]
        flag = token.split("=", 1)[0]
        prefix = next((p for p in PASSTHROUGH_PREFIXES if flag.startswith(p)), None)
        i += 1
        if prefix is None or flag in FLAGS:
            rest.append(token)
            continue
        if flag in RESERVED_PASSTHROUGH:
            raise ConfigError(f"{flag}: slime sets this itself; use {RESERVED_PASSTHROUGH[flag]}")
        if flag.startswith(_NOT_SGLANG):
            raise ConfigError(
                f"{flag}: a THUDM/slime flag that this slime does not support (it is not passed to SGLang)"
            )
        if len(flag) == len(prefix):
            raise ConfigError(f"{token!r}: a pass-through flag needs a name after {prefix}")
        values = []
        while "=" not in token and i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        out[prefix] += ["--" + token[len(prefix) :], *values]
    return rest, tuple(out["--sglang-"]), tuple(out["--router-"])


def config_from_args(
    ns: argparse.Namespace,
    base: Config | None = None,
    *,
    sglang_args: tuple[str, ...] = (),
    router_args: tuple[str, ...] = (),
) -> Config:
    """Build a validated ``Config`` from parsed flags (and ``split_passthrough``'s pass-through
    flags, when given); unset flags keep ``base``'s values.

    Raises:
        ConfigError: two flags that set one field to different values (``--partial-rollout`` with
            ``--rollout-mode sync``: "pick one"), ``--builtin-task`` with ``--prompt-data``, or what
            ``Config.validate`` / ``Config.check_reward_given`` refuse.
    """
    tree = msgspec.to_builtins(base or Config())
    if sglang_args or router_args:
        tree["engine"]["sglang_args"], tree["engine"]["router_args"] = list(sglang_args), list(router_args)
    given: dict[str, tuple[str, Any]] = {}  # config path -> (flag, value) of the flag that set it
    for flag, (path, _) in FLAGS.items():
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is None or value is False and "=" in path:
            continue
        shown = flag if "=" in path else f"{flag} {value}"
        if "=" in path:
            path, const = path.split("=", 1)
            value = const
        if (
            path in given and given[path][1] != value
        ):  # two flags of one field (--partial-rollout is --rollout-mode april)
            other, other_value = given[path]
            raise ConfigError(f"{other} and {shown}: pick one (both set {path}, to {other_value!r} and {value!r})")
        given[path] = (shown, value)
        _set(tree, path, value)
    if getattr(ns, "builtin_task", None) is not None and tree["data"]["prompt_data"] is not None:
        raise ConfigError(
            f"--builtin-task {ns.builtin_task} and --prompt-data {tree['data']['prompt_data']}: pick one (--builtin-task is the "
            f"data and reward used without --prompt-data; to score your rows with its reward pass --rm-type {ns.builtin_task})"
        )
    if getattr(ns, "eval_config", None) is not None:  # after the flags: its defaults win over them, as in slime
        from slime.eval_config import apply_eval_config

        apply_eval_config(ns.eval_config, tree)
    apply_slime_opd(tree)
    _routed_experts_server_flag(tree)
    _eval_samples_at_rollout_temperature(tree, given_temperature=getattr(ns, "eval_temperature", None) is not None)
    if getattr(ns, "micro_batch_size", None) is None:  # default: at most the global batch
        tree["train"]["micro_batch_size"] = min(tree["train"]["micro_batch_size"], tree["train"]["global_batch_size"])
    if base is None:  # a resumed run keeps its own
        _mode_defaults(ns, tree["loop"])
    try:
        config = msgspec.convert(tree, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    config.validate().check_reward_given()
    return config


def _mode_defaults(ns: argparse.Namespace, loop: dict[str, Any]) -> None:
    """Fill in ``loop`` (the tree's loop section) the defaults that follow the mode, where no flag gave them:
    ``--over-sampling-batch-size`` (``LoopConfig.default_over_sampling``) and ``--max-staleness``
    (``LoopConfig.default_max_staleness``)."""
    defaults = LoopConfig(mode=loop["mode"], rollout_batch_size=loop["rollout_batch_size"])
    if getattr(ns, "over_sampling_batch_size", None) is None:
        loop["over_sampling_batch_size"] = defaults.default_over_sampling()
    if getattr(ns, "max_staleness", None) is None:
        loop["max_staleness"] = defaults.default_max_staleness()


def apply_slime_opd(tree: ConfigTree) -> None:
    """Map THUDM/slime's on-policy-distillation flags (``examples/on_policy_distillation/run-qwen3-8B-opd.sh``)
    onto ``--use-opd`` in ``tree`` (``msgspec.to_builtins(Config)``), in place, one INFO line each.

    - ``--advantage-estimator on_policy_distillation`` (advantage = teacher minus student logprob per
      token) is ``--use-opd --opd-only`` here (``-opd_kl_coef * (old_logp - teacher_logp)``, coef 1.0
      by default, as slime's).
    - The example's teacher is a server that its ``--custom-rm-path ...on_policy_distillation.reward_func``
      asks for logprobs at ``--rm-url http://HOST:PORT/generate``; given no teacher flag, that server
      becomes ``--opd-teacher-addrs http://HOST:PORT`` and the reward function is dropped (the teacher
      is scored by ``slime.rollout.opd``; the task reward is the run's ``--rm-type`` / default).
    - ``--custom-reward-post-process-path``: with ``--use-opd`` a no-op (the example's function only
      moves the teacher's logprobs out of the reward payload).

    Raises:
        ConfigError: ``on_policy_distillation`` with no teacher (naming the flags to give), or
            ``--custom-reward-post-process-path`` without ``--use-opd`` (a general reward post-process
            hook does not exist here).
    """
    train = tree["train"]
    if train["advantage_estimator"] == "on_policy_distillation":
        _opd_estimator_as_use_opd(train, tree["engine"], tree["rollout"])
    hook = train["custom_reward_post_process_path"]
    if hook is not None:
        if not train["use_opd"]:
            raise ConfigError(
                f"--custom-reward-post-process-path {hook}: only THUDM/slime's on-policy-distillation hook is "
                "accepted, with --use-opd or --advantage-estimator on_policy_distillation, where it is a no-op; "
                "a general reward post-process hook does not exist here"
            )
        _log.info(
            "--custom-reward-post-process-path %s: no-op here: with --use-opd the teacher's logprobs are fetched and "
            "attached by slime.rollout.opd (slime's example hook only moves them out of the reward payload)",
            hook,
        )


def _opd_estimator_as_use_opd(train: ConfigTree, engine: ConfigTree, rollout: ConfigTree) -> None:
    """``--advantage-estimator on_policy_distillation`` as ``--use-opd --opd-only``, its teacher found (see
    ``apply_slime_opd``); the three config sections (JSON builtins) are changed in place."""
    from urllib.parse import urlsplit

    train.update(advantage_estimator="grpo", use_opd=True, opd_only=True)
    _log.info(
        "--advantage-estimator on_policy_distillation: here --use-opd --opd-only (advantage per token = "
        "-opd_kl_coef * (logp - teacher_logp), --opd-kl-coef %s)",
        train["opd_kl_coef"],
    )
    teacher_given = engine["opd_teacher_load"] or engine["opd_teacher_addrs"] or engine["sglang_config"]
    rm = rollout["custom_rm_path"] or ""
    if not teacher_given and rm.endswith("on_policy_distillation.reward_func") and rollout["rm_url"]:
        url = urlsplit(rollout["rm_url"])
        engine["opd_teacher_addrs"] = [f"{url.scheme}://{url.netloc}"]
        rollout.update(custom_rm_path=None, rm_url=None)
        _log.info(
            "--custom-rm-path %s --rm-url %s: the example's teacher query; here the teacher is "
            "--opd-teacher-addrs %s, scored by slime.rollout.opd",
            rm,
            url.geturl(),
            engine["opd_teacher_addrs"][0],
        )
    elif not teacher_given:
        raise ConfigError(
            "--advantage-estimator on_policy_distillation needs a teacher: --opd-teacher-addrs HOST:PORT (a running "
            "server), --opd-teacher-load HF_DIR, or a 'teacher' group in --sglang-config"
        )


def _eval_samples_at_rollout_temperature(tree: ConfigTree, *, given_temperature: bool) -> None:
    """``--n-samples-per-eval-prompt K`` (K > 1) without ``--eval-temperature``: the eval samples at
    ``--rollout-temperature``, as THUDM/slime's eval does (its ``run-qwen3-4B.sh`` sets 16 samples and no
    temperature); one INFO line. Greedy eval (0, the default here) would give K equal samples. A given
    ``--eval-temperature 0`` with K > 1 stays an error (``Config.check_run_modes``)."""
    rollout = tree["rollout"]
    if given_temperature or rollout["n_samples_per_eval_prompt"] <= 1 or rollout["eval_temperature"] != 0:
        return
    rollout["eval_temperature"] = rollout["rollout_temperature"]
    _log.info(
        "--n-samples-per-eval-prompt %d without --eval-temperature: eval samples at --rollout-temperature %s "
        "(as THUDM/slime's eval; greedy samples would all be the same)",
        rollout["n_samples_per_eval_prompt"],
        rollout["rollout_temperature"],
    )


def _routed_experts_server_flag(tree: ConfigTree) -> None:
    """``--use-rollout-routing-replay`` with SGLang servers that slime launches: add ``--enable-return-routed-experts``
    to their flags (``engine.sglang_args``) unless given (``--sglang-enable-return-routed-experts``); one INFO line.
    External servers must have been started with it (the client names the flag when routes are missing)."""
    from slime.config import EngineConfig
    from slime.engines.fleet.plan import backend_of

    engine = tree["engine"]
    flag = "--enable-return-routed-experts"
    if not tree["rollout"]["use_rollout_routing_replay"] or flag in engine["sglang_args"]:
        return
    if backend_of(msgspec.convert(engine, EngineConfig)) == "sglang":
        engine["sglang_args"] = [*engine["sglang_args"], flag]
        _log.info("--use-rollout-routing-replay: the SGLang servers slime launches get %s", flag)


def _set(tree: ConfigTree, path: str, value: object) -> None:
    *parents, leaf = path.split(".")
    node = tree
    for p in parents:
        node = node[p]
    node[leaf] = list(value) if isinstance(value, tuple) else value
