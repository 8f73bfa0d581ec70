"""The algorithm fields of TrainConfig are validated at start, and each error names its flag."""

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.errors import ConfigError


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--eps-clip-c", "1.0"], "--eps-clip-c"),  # dual clip needs c > 1
        (["--behav-imp-weight-cap", "0.9"], "--behav-imp-weight-cap"),  # a cap <= 1 drops on-policy tokens
        (["--mis-lower-bound", "3", "--mis-upper-bound", "2"], "--mis-lower-bound"),
        (["--gamma", "1.5"], "--gamma"),
        (["--lambd", "-0.1"], "--lambd"),
        (["--value-clip", "0"], "--value-clip"),
        (["--kl-loss-coef", "-1"], "--kl-loss-coef"),
        (["--use-tis", "--mis-level", "token"], "--use-tis / --mis-level / --use-decoupled-ppo"),
        (["--use-tis", "--use-decoupled-ppo"], "--use-tis / --mis-level / --use-decoupled-ppo"),
    ],
)
def test_bad_algorithm_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError, match=flag):
        config_from_args(build_parser().parse_args(argv + ["--global-batch-size", "128"]))


def test_slime_style_algorithm_flags_build_a_config():
    argv = (
        "--advantage-estimator ppo --gamma 0.99 --lambd 0.95 --critic-lr 1e-6 --use-kl-loss --kl-loss-type low_var_kl "
    )
    argv += "--kl-loss-coef 0.01 --mis-level geometric --mis-lower-bound 0.9 --mis-upper-bound 1.1 --eps-clip-c 3"
    t = config_from_args(build_parser().parse_args(argv.split() + ["--global-batch-size", "128"])).train
    assert (t.advantage_estimator, t.gamma, t.lambd, t.critic_lr, t.use_kl_loss, t.kl_loss_type) == (
        "ppo",
        0.99,
        0.95,
        1e-6,
        True,
        "low_var_kl",
    )
    assert (t.mis_level, t.mis_lower_bound, t.mis_upper_bound, t.eps_clip_c) == ("geometric", 0.9, 1.1, 3.0)
