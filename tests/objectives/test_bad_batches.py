"""Corrupted or malformed batches get a clear error from the loss and the estimator,
naming the entry, instead of NaN losses, a silent change of the math, or an error
from deep inside torch."""

import pytest
import torch
from builders import discrete_actor_critic, random_batch
from tensordict import TensorDict

from torchrl_acer import ACERLoss, RetraceEstimator
from torchrl_acer.modules.models import gaussian_actor_sdn


def discrete_loss(dtype=torch.float64, check_values=True):
    actor, critic = discrete_actor_critic(dtype=dtype)
    loss = ACERLoss(actor, critic)
    loss.make_value_estimator(gamma=0.9, check_values=check_values)
    return loss


def estimator(dtype=torch.float64):
    actor, critic = discrete_actor_critic(dtype=dtype)
    return RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)


def gaussian_batch_and_loss():
    torch.manual_seed(0)
    actor, critic = gaussian_actor_sdn(3, 2, num_cells=[8], fixed_scale=0.3)
    B, T = 2, 4
    loc = torch.randn(B, T, 2)
    action = loc + 0.3 * torch.randn(B, T, 2)
    data = TensorDict(
        {
            "observation": torch.randn(B, T, 3),
            "action": action,
            "loc": loc,
            "scale": torch.full((B, T, 2), 0.3),
            "action_log_prob": torch.distributions.Normal(loc, 0.3)
            .log_prob(action)
            .sum(-1),
            ("next", "observation"): torch.randn(B, T, 3),
            ("next", "reward"): torch.randn(B, T, 1),
            ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
            ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
        },
        [B, T],
    )
    loss = ACERLoss(actor, critic)
    loss.make_value_estimator(gamma=0.9)
    return loss, data


class TestNonFinite:
    def test_nan_behaviour_logits_are_refused(self):
        # they would make every ratio NaN and switch the bias correction off
        data = random_batch(2, 5)
        data["logits"][1, 2, 0] = float("nan")
        with pytest.raises(ValueError, match="'logits' holds 1 non-finite"):
            discrete_loss()(data)

    def test_value_checks_can_be_turned_off(self):
        # the documented hot-loop setting: no read-back, no error
        data = random_batch(2, 5)
        data["logits"][1, 2, 0] = float("nan")
        discrete_loss(check_values=False)(data)

    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    def test_non_finite_reward_is_refused_by_loss_and_estimator(self, bad):
        data = random_batch(2, 5)
        data["next", "reward"][0, 3] = bad
        with pytest.raises(
            ValueError, match=r"\('next', 'reward'\) holds 1 non-finite"
        ):
            discrete_loss()(data.clone())
        with pytest.raises(
            ValueError, match=r"\('next', 'reward'\) holds 1 non-finite"
        ):
            estimator()(data.clone())

    def test_nan_behaviour_loc_is_refused(self):
        loss, data = gaussian_batch_and_loss()
        loss(data.clone())  # the clean batch passes
        data["loc"][0, 1, 1] = float("nan")
        with pytest.raises(ValueError, match="'loc' holds 1 non-finite"):
            loss(data)

    def test_non_positive_behaviour_scale_is_refused(self):
        loss, data = gaussian_batch_and_loss()
        data["scale"][1, 0, 0] = 0.0
        with pytest.raises(ValueError, match="behaviour scale 'scale'"):
            loss(data)


class TestEmpty:
    @pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
    def test_empty_batch_is_refused(self, shape):
        data = random_batch(3, 5)[: shape[0], : shape[1]]
        assert 0 in data.batch_size
        with pytest.raises(ValueError, match="empty batch"):
            discrete_loss()(data.clone())
        with pytest.raises(ValueError, match="empty batch"):
            estimator()(data.clone())


class TestDtype:
    @pytest.mark.parametrize("data_dtype", [torch.float64, torch.float16])
    def test_data_dtype_that_is_not_the_networks_is_named(self, data_dtype):
        data = random_batch(2, 5, dtype=data_dtype)
        with pytest.raises(ValueError, match=r"'observation': torch\.float"):
            discrete_loss(dtype=torch.float32)(data.clone())
        with pytest.raises(ValueError, match="DoubleToFloat"):
            estimator(dtype=torch.float32)(data.clone())
