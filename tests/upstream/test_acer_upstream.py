"""ACERLoss: gradients against a plain step-by-step reference, the trust region's
per-step bound, unbiased truncation with bias correction, and the loss module's
contract (keys, reductions, state, the averaged policy, the value estimator).
"""

from __future__ import annotations

import math

import pytest
import torch

# Self-contained but for the helpers below, which tools/upstream_patch.py inlines
# into the upstream copy of this module (and drops this comment with the imports).
from builders import (
    discrete_actor_critic,
    gaussian_table_batch,
    random_batch,
    table_actor_critic,
    table_batch,
    table_gaussian_sdn,
)
from reference import acer_discrete_reference, acer_gaussian_reference
from tensordict import TensorDict
from torch import nn
from torchrl.objectives import SoftUpdate
from torchrl.testing import get_default_devices

from torchrl_acer import ACERLoss, RetraceEstimator

DONES = [(0, 2)]
TERMINATIONS = [(1, 4)]
SPACES = ("logits", "log_probs", "probs")  # what the trust region projects


def make_loss(actor, critic, *, gamma=0.9, **kwargs):
    """An ACER loss with its averaged policy kept by ``SoftUpdate``."""
    loss = ACERLoss(actor, critic, **kwargs)
    loss.make_value_estimator(gamma=gamma)
    SoftUpdate(loss, eps=0.99)
    return loss


def move_average(loss, scale, seed=0):
    """Moves the averaged policy away from the policy (so that the KL gradient of
    the trust region is not zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        loss.target_actor_network_params.apply(
            lambda p: p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
        )


def average_table(loss):
    """The averaged policy's table (one row per state) of a table actor."""
    return next(iter(loss.target_actor_network_params.values(True, True))).T


def discrete_setup(*, delta, space="logits", reduction="mean", B=2, T=6, A=3):
    batch, ids, S = table_batch(B, T, A, dones=DONES, terminations=TERMINATIONS)
    actor, critic, policy, q = table_actor_critic(S, A)
    loss = make_loss(
        actor,
        critic,
        trust_region_delta=delta,
        trust_region_space=space,
        reduction=reduction,
        ratio_clip=1.5,
    )
    move_average(loss, 1.5)
    return loss, batch, ids, policy, q


def backward(loss, batch, terms=("loss_objective", "loss_entropy", "loss_critic")):
    out = loss(batch)
    total = sum(out[t] for t in terms)
    (total.sum() if total.ndim else total).backward()
    return out


def plain_mlp(mlp, weights, eye):
    """``f(s, action)``: the MLP ``mlp`` (Linear and tanh layers) on
    ``[one_hot(s), action]``, written out with ``weights`` (copies of its
    parameters, in order)."""
    linears = [m for m in mlp if isinstance(m, nn.Linear)]

    def f(s, action):
        x = torch.cat([eye[s], action])
        for i, (w, b) in enumerate(zip(weights[::2], weights[1::2], strict=True)):
            x = nn.functional.linear(x, w, b)
            if i < len(linears) - 1:
                x = torch.tanh(x)
        return x[0]

    return f


class TestACER:
    @pytest.mark.parametrize(
        "delta, space, reduction",
        [
            *((delta, space, "mean") for delta in (None, 0.05) for space in SPACES),
            (0.05, "logits", "sum"),
        ],
    )
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

    @pytest.mark.parametrize("fixed_scale", [None, 0.4])
    @pytest.mark.parametrize("delta", [None, 0.02])
    def test_gaussian_gradients_match_reference(self, delta, fixed_scale):
        B, T, d = 2, 5, 2
        batch, ids, S = gaussian_table_batch(
            B, T, d, dones=DONES, terminations=[(1, 3)]
        )
        actor, critic, policy, v, a = table_gaussian_sdn(S, d, fixed_scale=fixed_scale)
        loss = make_loss(
            actor, critic, ratio_clip=1.2, trust_region_delta=delta, entropy_coeff=0.05
        )
        move_average(loss, 0.7)
        # the draws a'_t (bias correction) and u_i (dueling baseline), replayed
        noise = torch.randn(1 + critic.num_samples, B, T, d, dtype=torch.float64)
        loss._action_noise = lambda loc, n: noise
        backward(loss, batch)

        avg = loss.target_actor_network_params.flatten_keys(".")
        avg_scale = (
            avg["module.0.module.log_scale"].exp()
            if fixed_scale is None
            else torch.full((d,), fixed_scale, dtype=torch.float64)
        )
        v_ref = v.weight.detach().clone().requires_grad_()
        a_ref = [p.detach().clone().requires_grad_() for p in a.parameters()]
        grad_loc, grad_log_scale, critic_loss = acer_gaussian_reference(
            policy.loc.weight.T,
            None if fixed_scale is not None else policy.log_scale,
            fixed_scale,
            v_ref[0],
            plain_mlp(a, a_ref, torch.eye(S, dtype=torch.float64)),
            avg["module.0.module.loc.weight"].T,
            avg_scale,
            ids[0],
            ids[1],
            batch["action"],
            batch["loc"],
            batch["scale"],
            batch["action_log_prob"],
            batch["next", "reward"][..., 0],
            batch["next", "done"][..., 0],
            batch["next", "terminated"][..., 0],
            noise,
            gamma=0.9,
            ratio_clip=1.2,
            entropy_coeff=0.05,
            critic_coeff=float(loss.critic_coeff),
            delta=delta,
        )
        torch.testing.assert_close(
            policy.loc.weight.grad.T, grad_loc, rtol=1e-9, atol=1e-12
        )
        if fixed_scale is None:
            torch.testing.assert_close(
                policy.log_scale.grad, grad_log_scale, rtol=1e-9, atol=1e-12
            )
        critic_loss.backward()
        for ours, ref in zip([v.weight, *a.parameters()], [v_ref, *a_ref], strict=True):
            torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-9, atol=1e-12)

    @pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
    def test_trust_region_bounds_every_step(self, reduction):
        B, T, delta = 2, 6, 0.05
        loss, batch, ids, policy, _ = discrete_setup(delta=delta, reduction=reduction)
        # "none": the hook assumes the per-step losses are summed
        backward(loss, batch, ("loss_objective", "loss_entropy"))
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
        policy.weight.grad = q.weight.grad = None
        backward(loss, torch.cat([batch, batch], 0))
        torch.testing.assert_close(policy.weight.grad, once, rtol=1e-10, atol=1e-12)

    @pytest.mark.parametrize("ratio_clip", [math.inf, 10.0, 1.0, 0.5])
    def test_truncation_with_bias_correction_is_unbiased(self, ratio_clip):
        """On a one-step bandit with an exact critic, the expectation of the policy
        gradient under the behaviour policy is the true gradient, whatever c."""
        q_values = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
        pi_logits = torch.tensor([0.2, -1.0, 0.5, 1.5], dtype=torch.float64)
        mu_logits = torch.tensor([1.5, 0.0, -2.0, 0.3], dtype=torch.float64)
        A = 4
        actor, critic, policy, q = table_actor_critic(A, A)
        with torch.no_grad():
            policy.weight.copy_(pi_logits[:, None].expand(A, A))
            q.weight.copy_(q_values[:, None].expand(A, A))
        loss = make_loss(
            actor,
            critic,
            ratio_clip=ratio_clip,
            trust_region_delta=None,
            entropy_coeff=0.0,
            reduction="sum",
        )
        # one sample per action, each in its own state (its own table column)
        action = torch.arange(A)[:, None]
        eye = torch.eye(A, dtype=torch.float64)[:, None]
        ones = torch.ones(A, 1, 1, dtype=torch.bool)
        batch = TensorDict(
            {
                "observation": eye,
                "action": action,
                "logits": mu_logits.expand(A, 1, A),
                "action_log_prob": mu_logits.log_softmax(-1)[action],
                ("next", "observation"): eye,
                ("next", "reward"): q_values[action][..., None],
                ("next", "done"): ones,
                ("next", "terminated"): ones,
            },
            [A, 1],
        )
        loss(batch)["loss_objective"].backward()
        per_action = -policy.weight.grad.T  # row a: the ascent direction if mu drew a
        pi = pi_logits.softmax(-1)
        true_gradient = pi * (q_values - (pi * q_values).sum())
        torch.testing.assert_close(
            mu_logits.softmax(-1) @ per_action, true_gradient, rtol=1e-12, atol=1e-12
        )

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

    def test_state_dict_round_trip(self):
        actor, critic = discrete_actor_critic(seed=0)
        loss = make_loss(actor, critic, gamma=0.95)
        move_average(loss, 0.5)
        other_actor, other_critic = discrete_actor_critic(seed=1)
        other = make_loss(other_actor, other_critic, gamma=0.99)
        other.load_state_dict(loss.state_dict())
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
        # the collector's mask drops padded steps from the reduction
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1, 3:] = False
        data["collector", "mask"] = mask
        masked = make_loss(actor, critic)(data)
        for key in ("loss_objective", "loss_critic"):
            torch.testing.assert_close(masked[key], outs["none"][key][mask].mean())

    def test_time_dim(self):
        actor, critic = discrete_actor_critic()
        data = random_batch(3, 5, dones=[(2, 1)])
        loss = make_loss(actor, critic, reduction="none")
        expected = loss(data)["loss_objective"]
        loss.make_value_estimator(gamma=0.9, time_dim=0)
        got = loss(data.transpose(0, 1))["loss_objective"]
        torch.testing.assert_close(got, expected.T)

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
        for name, key in defaults.items():
            assert getattr(loss.tensor_keys, name) == key
        with pytest.raises(ValueError):
            loss.set_keys(not_a_key="x")
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
        with pytest.raises(NotImplementedError):
            loss.make_value_estimator("gae")

    def test_reset_parameters_recursive(self):
        actor, critic = discrete_actor_critic()
        loss = make_loss(actor, critic)
        names = (
            "actor_network_params",
            "critic_network_params",
            "target_actor_network_params",
        )
        with torch.no_grad():
            for name in names:
                getattr(loss, name).apply(lambda p: p.add_(1000.0))
        before = {name: getattr(loss, name).clone() for name in names}
        loss.reset_parameters_recursive()
        for name in names:
            for key, value in getattr(loss, name).items(True, True):
                assert (value != before[name][key]).any(), (name, key)

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
