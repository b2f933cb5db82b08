"""ACERLoss: gradients against a plain step-by-step reference, the trust region's
per-step bound, unbiased truncation with bias correction, and the loss module's
contract (keys, reductions, state, the averaged policy, the value estimator).
"""

from __future__ import annotations

import math

import pytest
import torch
from _objectives_common import LossModuleTestBase

# Self-contained but for the helpers below, which tools/upstream_patch.py gathers
# into test/objectives/_acer_common.py upstream (and drops this comment with the
# imports, importing them from there).
from builders import (
    BANDIT_MU_LOGITS,
    BANDIT_PI_LOGITS,
    BANDIT_Q,
    average_table,
    backward,
    bandit_per_action_gradients,
    discrete_actor_critic,
    discrete_setup,
    gaussian_setup,
    make_loss,
    move_average,
    random_batch,
)
from reference import (
    acer_discrete_reference,
    assert_same_grads,
    check_gaussian_policy_against_reference,
    plain_mlp,
)
from torchrl.objectives import SoftUpdate
from torchrl.objectives.utils import build_value_estimator
from torchrl.testing import get_default_devices

from torchrl_acer import ACERLoss, RetraceEstimator
from torchrl_acer.objectives._value_estimators import ValueEstimators

SPACES = ("logits", "log_probs", "probs")  # what the trust region projects


class TestACER(LossModuleTestBase):
    @pytest.mark.parametrize("reduction", ["mean", "sum"])
    @pytest.mark.parametrize("space", SPACES)
    @pytest.mark.parametrize("delta", [None, 0.05])
    def test_discrete_gradients_match_reference(self, delta, space, reduction):
        loss, batch, ids, policy, q = discrete_setup(
            delta=delta, space=space, reduction=reduction
        )
        backward(loss, batch)
        grad_logits, grad_q = acer_discrete_reference(
            policy.weight.T,
            q.weight.T,
            average_table(loss),
            ids[0],
            ids[1],
            batch["action"],
            batch["logits"],
            batch["action_log_prob"],
            batch["next", "reward"][..., 0],
            batch["next", "done"][..., 0],
            batch["next", "terminated"][..., 0],
            gamma=0.9,
            ratio_clip=1.5,
            entropy_coeff=float(loss.entropy_coeff),
            critic_coeff=float(loss.critic_coeff),
            delta=delta,
            space=space,
            reduction=reduction,
        )
        torch.testing.assert_close(
            policy.weight.grad.T, grad_logits, rtol=1e-9, atol=1e-12
        )
        torch.testing.assert_close(q.weight.grad.T, grad_q, rtol=1e-9, atol=1e-12)
        if delta is not None:
            # meaningful only if the projection was active at some steps only
            assert 0 < loss.trust_region_stats["active_fraction"] < 1

    @pytest.mark.parametrize("reduction", ["mean", "sum"])
    @pytest.mark.parametrize("fixed_scale", [None, 0.4])
    @pytest.mark.parametrize("delta", [None, 0.02])
    def test_gaussian_gradients_match_reference(self, delta, fixed_scale, reduction):
        loss, batch, ids, policy, v, a, noise = gaussian_setup(
            fixed_scale=fixed_scale, delta=delta, reduction=reduction
        )
        v_ref = v.weight.detach().clone().requires_grad_()
        a_ref = [p.detach().clone().requires_grad_() for p in a.parameters()]
        eye = torch.eye(v.weight.shape[1], dtype=torch.float64)
        critic_loss = check_gaussian_policy_against_reference(
            loss,
            batch,
            ids,
            policy,
            noise,
            v_ref[0],
            plain_mlp(a, a_ref, eye),
            fixed_scale=fixed_scale,
            delta=delta,
            reduction=reduction,
        )
        critic_loss.backward()
        assert_same_grads([v.weight, *a.parameters()], [v_ref, *a_ref])
        if delta is not None:
            # meaningful only if the projection was active at some steps only
            assert 0 < loss.trust_region_stats["active_fraction"] < 1

    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    def test_trust_region_bounds_every_step(self, reduction):
        B, T, delta = 2, 6, 0.05
        loss, batch, ids, policy, _ = discrete_setup(delta=delta, reduction=reduction)
        # "none": the hook assumes the per-step losses are summed
        out = backward(loss, batch, ("loss_objective", "loss_entropy"))
        if reduction == "none":
            assert (out["loss_objective"] + out["loss_entropy"]).shape == (B, T)
        n = B * T if reduction == "mean" else 1
        # the gradient at the logits of s_t is the weight's column state_ids[b, t]
        step = -n * policy.weight.grad.T[ids[0]]  # the projected ascent step
        logits = policy.weight.detach().T[ids[0]]
        k = logits.softmax(-1) - average_table(loss)[ids[0]].softmax(-1)
        k_dot_step = (k * step).sum(-1)
        assert (k_dot_step <= delta + 1e-10).all()
        active = (k_dot_step - delta).abs() < 1e-10  # on the boundary
        assert active.any() and not active.all()
        torch.testing.assert_close(
            loss.trust_region_stats["active_fraction"], active.double().mean()
        )

    def test_trust_region_is_per_step_not_per_batch(self):
        """Duplicating the batch leaves the mean gradient unchanged: every step is
        bounded on its own (projecting the batch-mean gradient would loosen the
        bound as the batch grows)."""
        loss, batch, _, policy, q = discrete_setup(delta=0.05)
        backward(loss, batch)
        once = policy.weight.grad.clone()
        active_once = loss.trust_region_stats["active_fraction"]
        policy.weight.grad = q.weight.grad = None
        backward(loss, torch.cat([batch, batch], 0))
        torch.testing.assert_close(policy.weight.grad, once, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            loss.trust_region_stats["active_fraction"], active_once
        )

    @pytest.mark.parametrize("ratio_clip", [math.inf, 10.0, 2.0, 1.0, 0.5])
    def test_truncation_with_bias_correction_is_unbiased(self, ratio_clip):
        """On a one-step bandit with an exact critic, the expectation of the policy
        gradient under the behaviour policy is the true gradient, whatever c."""
        per_action = bandit_per_action_gradients(ratio_clip)  # row a: mu drew a
        pi, mu = BANDIT_PI_LOGITS.softmax(-1), BANDIT_MU_LOGITS.softmax(-1)
        true_gradient = pi * (BANDIT_Q - (pi * BANDIT_Q).sum())
        # the expectation over the behaviour policy is exact...
        torch.testing.assert_close(
            mu @ per_action, true_gradient, rtol=1e-12, atol=1e-12
        )
        # ...and a Monte-Carlo average over sampled actions agrees within 5
        # standard errors
        n = 200_000
        counts = torch.bincount(
            torch.distributions.Categorical(probs=mu).sample((n,)), minlength=4
        ).double()
        mc_mean = counts / n @ per_action
        stderr = ((mu @ per_action**2 - (mu @ per_action) ** 2) / n).sqrt()
        assert ((mc_mean - true_gradient).abs() <= 5 * stderr + 1e-12).all()
        if math.isinf(ratio_clip):
            # c = inf is plain importance sampling: no correction term
            v = (pi * BANDIT_Q).sum()
            plain_is = torch.stack(
                [
                    pi[a] / mu[a] * (BANDIT_Q[a] - v) * (torch.eye(4)[a].double() - pi)
                    for a in range(4)
                ]
            )
            torch.testing.assert_close(per_action, plain_is, rtol=1e-12, atol=1e-12)

    def test_each_term_reaches_its_own_network(self):
        actor, critic = discrete_actor_critic()
        loss = make_loss(actor, critic)
        data = random_batch(3, 5, dones=[(0, 1)])

        def touched(module):
            return [
                p.grad is not None and bool(p.grad.any()) for p in module.parameters()
            ]

        backward(loss, data, ("loss_objective", "loss_entropy"))
        assert all(touched(actor)) and not any(touched(critic))
        loss.zero_grad()
        actor.zero_grad()
        critic.zero_grad()
        backward(loss, data, ("loss_critic",))
        assert not any(touched(actor)) and all(touched(critic))
        for p in loss.target_actor_network_params.values(True, True):
            assert not p.requires_grad and p.grad is None

    def test_soft_update_keeps_the_averaged_policy(self):
        actor, critic = discrete_actor_critic()
        loss = ACERLoss(actor, critic)
        updater = SoftUpdate(loss, eps=0.99)
        before = loss.target_actor_network_params.clone()
        with torch.no_grad():
            loss.actor_network_params.apply(lambda p: p.add_(1.0))
        updater.step()
        for key, value in loss.target_actor_network_params.items(True, True):
            torch.testing.assert_close(value, before[key] + 0.01)
        # the critic has no averaged copy
        assert "target_critic_network_params" not in dict(loss.named_children())

    def test_state_dict_round_trip(self):
        actor, critic = discrete_actor_critic(seed=0)
        loss = make_loss(actor, critic, gamma=0.95)
        move_average(loss, 0.5)
        other_actor, other_critic = discrete_actor_critic(seed=1)
        other = make_loss(other_actor, other_critic, gamma=0.99)
        other.load_state_dict(loss.state_dict())
        for name in (
            "actor_network_params",
            "critic_network_params",
            "target_actor_network_params",
        ):
            for key, value in getattr(loss, name).items(True, True):
                torch.testing.assert_close(getattr(other, name)[key], value)
        assert other.value_estimator.gamma.item() == 0.95
        data = random_batch(2, 4)
        out, other_out = loss(data), other(data)
        for key in ("loss_objective", "loss_critic", "loss_entropy", "kl_avg"):
            torch.testing.assert_close(other_out[key], out[key])
        assert out["kl_avg"] > 0

    def test_reductions_and_mask(self):
        actor, critic = discrete_actor_critic()
        data = random_batch(3, 5)
        outs = {
            r: make_loss(actor, critic, reduction=r)(data)
            for r in ("none", "mean", "sum")
        }
        assert outs["none"]["loss_objective"].shape == (3, 5)
        for key in ("loss_objective", "loss_critic", "loss_entropy"):
            torch.testing.assert_close(outs["mean"][key], outs["none"][key].mean())
            torch.testing.assert_close(outs["sum"][key], outs["none"][key].sum())
        for key in ("entropy", "kl_avg", "rho_mean", "rho_clip_fraction"):
            assert outs["mean"][key].shape == () and not outs["mean"][key].requires_grad
        # a fresh loss: averaged policy == policy
        assert outs["mean"]["kl_avg"].abs() < 1e-12
        # the collector's mask drops padded steps from the reduction
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1, 3:] = False
        data["collector", "mask"] = mask
        masked = make_loss(actor, critic)(data)
        for key in ("loss_objective", "loss_critic"):
            torch.testing.assert_close(masked[key], outs["none"][key][mask].mean())

    def test_time_dim_and_keyword_call(self):
        actor, critic = discrete_actor_critic()
        data = random_batch(3, 5, dones=[(2, 1)])
        loss = make_loss(actor, critic, reduction="none")
        expected = loss(data)["loss_objective"]
        loss.make_value_estimator(gamma=0.9, time_dim=0)
        got = loss(data.transpose(0, 1))["loss_objective"]
        torch.testing.assert_close(got, expected.T)
        # a keyword call, as TorchRL's losses take one
        loss = make_loss(actor, critic)
        loss.select_out_keys("loss_objective", "loss_critic")
        kwargs = {
            "_".join(k) if isinstance(k, tuple) else k: data.get(k)
            for k in loss.in_keys
        }
        objective, _ = loss(**kwargs)
        torch.testing.assert_close(objective, loss(data)["loss_objective"])

    def test_keys(self):
        actor, critic = discrete_actor_critic()
        loss = make_loss(actor, critic)
        defaults = {
            "action": "action",
            "sample_log_prob": "action_log_prob",
            "behavior_logits": "logits",
            "reward": "reward",
            "done": "done",
            "terminated": "terminated",
            "value_target": "value_target",
            "advantage": "advantage",
        }
        self.tensordict_keys_test(loss, default_keys=defaults)
        data = random_batch(2, 4)
        expected = loss(data)["loss_objective"]
        data["behaviour", "logits"] = data.pop("logits")
        data["behaviour", "lp"] = data.pop("action_log_prob")
        data["next", "env", "r"] = data["next"].pop("reward")
        loss.set_keys(
            behavior_logits=("behaviour", "logits"),
            sample_log_prob=("behaviour", "lp"),
            reward=("env", "r"),
        )
        # the estimator's keys are forwarded to it
        assert loss.value_estimator.tensor_keys.sample_log_prob == ("behaviour", "lp")
        torch.testing.assert_close(loss(data)["loss_objective"], expected)
        assert ("behaviour", "lp") in loss.in_keys

    def test_value_estimator(self):
        actor, critic = discrete_actor_critic()
        loss = ACERLoss(actor, critic)
        assert isinstance(loss.value_estimator, RetraceEstimator)
        assert loss.value_estimator.gamma.item() == pytest.approx(0.99)
        loss.make_value_estimator("retrace", gamma=0.5, c_thresh=2.0)
        assert loss.value_estimator.gamma.item() == 0.5
        assert loss.value_estimator.c_thresh.item() == 2.0
        with pytest.raises(
            NotImplementedError, match="not implemented for loss ACERLoss"
        ):
            loss.make_value_estimator("gae")

    def test_registered_retrace_estimator(self):
        actor, critic = discrete_actor_critic()
        loss = ACERLoss(actor, critic)
        for name in ("retrace", "Retrace", ValueEstimators.Retrace):
            estimator = build_value_estimator(loss, name, gamma=0.5)
            assert isinstance(estimator, RetraceEstimator)
            assert estimator.gamma.item() == 0.5
            assert estimator.lmbda.item() == 1.0 and estimator.c_thresh.item() == 1.0
        # the loss's make_value_estimator takes the enum member and fills in the
        # defaults it does not get
        loss.make_value_estimator(ValueEstimators.Retrace, lmbda=0.5)
        assert loss.value_type is ValueEstimators.Retrace
        estimator = loss.value_estimator
        assert isinstance(estimator, RetraceEstimator) and estimator.shifted
        assert estimator.gamma.item() == 0.99 and estimator.lmbda.item() == 0.5
        with pytest.raises(NotImplementedError, match="Retrace"):
            loss.make_value_estimator("gae")

    def test_reset_parameters_recursive(self):
        actor, critic = discrete_actor_critic()
        # the networks, the critic and the averaged policy's copy
        self.reset_parameters_recursive_test(make_loss(actor, critic))

    @pytest.mark.parametrize("device", get_default_devices())
    def test_device(self, device):
        actor, critic = discrete_actor_critic(dtype=torch.float32)
        loss = make_loss(actor.to(device), critic.to(device), trust_region_delta=0.1)
        data = random_batch(3, 5, dones=[(0, 1)], dtype=torch.float32).to(device)
        out = backward(loss, data)
        assert out["loss_objective"].device == device
        for p in loss.actor_network_params.values(True, True):
            assert p.grad is not None and torch.isfinite(p.grad).all()

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"trust_region_space": "kl"},
            {"trust_region_delta": 0.0},
            {"ratio_clip": -1.0},
            {"reduction": "max"},
            {"loss_critic_type": "huber"},
        ],
    )
    def test_bad_arguments(self, kwargs):
        actor, critic = discrete_actor_critic()
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            ACERLoss(actor, critic, **kwargs)
