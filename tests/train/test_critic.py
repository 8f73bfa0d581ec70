"""The critic: clipped value loss and explained variance by hand, and the value model's layout."""

import pytest
import torch

from slime.train.critic import ValueModel, explained_variance, value_loss


def test_clipped_value_loss_matches_hand_computed_example():
    # value_clip 0.2, one sample of two tokens:
    #   token 0: V 1.5, V_old 1.0, R 2.0: clipped V = 1.0 + 0.2 = 1.2; (1.5 - 2)^2 = 0.25, (1.2 - 2)^2 = 0.64 -> 0.64
    #            (the clipped branch is active and constant in V: no gradient)
    #   token 1: V 0, V_old 0, R 0.5: both branches (0 - 0.5)^2 = 0.25
    # seq_mean = (0.64 + 0.25) / 2 = 0.445; clipfrac 1/2; d loss / d V_1 = 2 * (0 - 0.5) / 2 = -0.5
    values = torch.tensor([[1.5, 0.0]], requires_grad=True)
    loss, metrics = value_loss(
        values, torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.5]]), torch.ones(1, 2), value_clip=0.2
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.445) and metrics["value_clipfrac"] == 0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.5]]))


def test_explained_variance_by_hand():
    # returns [1, 2, 3] (var 2/3), values [1, 2, 2]: residual [0, 0, 1] (var 2/9) -> 1 - (2/9) / (2/3) = 2/3
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert explained_variance(
        torch.tensor([1.0, 2.0, 3.0, 50.0]), torch.tensor([1.0, 2.0, 2.0, -50.0]), mask
    ) == pytest.approx(2 / 3)
    assert explained_variance(torch.tensor([1.0, 2.0, 3.0, 0.0]), torch.zeros(4), mask) == pytest.approx(0.0)


def test_value_model_starts_at_zero_and_lines_up_with_logprob_positions(tiny_model_dir):
    critic = ValueModel.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[5, 9, 2, 33, 17], [7, 1, 22, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    values = critic(ids, mask)
    assert values.shape == (2, 4) and torch.equal(values, torch.zeros(2, 4))
    torch.nn.init.ones_(critic.value_head.weight)
    with torch.no_grad():
        values = critic(ids, mask)
        alone = critic(ids[1:, :3], mask[1:, :3])
    assert torch.equal(values[1, 2:], torch.zeros(2))  # targets are padding
    torch.testing.assert_close(values[1, :2], alone[0], atol=1e-5, rtol=0)  # padding does not change values
