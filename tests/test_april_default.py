"""Issue 30: APRIL's default over-provisioning is 2x the batch (the paper's), not a fixed 32 groups."""

from slime.cli.args import build_parser, config_from_args


def _loop(*argv: str):
    return config_from_args(build_parser().parse_args(["--global-batch-size", "64", *argv])).loop


def test_april_keeps_twice_the_batch_in_flight_by_default():
    assert _loop("--partial-rollout", "--rollout-batch-size", "8").over_sampling_batch_size == 16
    assert _loop("--rollout-mode", "april", "--rollout-batch-size", "32").over_sampling_batch_size == 64
    assert (
        _loop(
            "--partial-rollout", "--rollout-batch-size", "8", "--over-sampling-batch-size", "32"
        ).over_sampling_batch_size
        == 32
    )


def test_the_other_modes_keep_their_default():
    assert _loop("--rollout-mode", "async", "--rollout-batch-size", "8").over_sampling_batch_size == 32
    assert (
        _loop(
            "--rollout-batch-size", "64", "--n-samples-per-prompt", "2", "--global-batch-size", "128"
        ).over_sampling_batch_size
        == 64
    )
