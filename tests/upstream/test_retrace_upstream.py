"""Retrace(lambda): the functional form and the value estimator.

The functional form is compared with plain loops over time written from the
equations (the sum definition and the backward recursion of Munos et al. 2016),
with TorchRL's TD(lambda) and TD(0) returns where Retrace reduces to them, and
through autograd; the estimator is compared with a reference that evaluates the
networks at every step on its own.
"""

from __future__ import annotations

import math

import pytest
import torch

# Self-contained but for the helpers below, which tools/upstream_patch.py gathers
# into test/objectives/_acer_common.py upstream (and drops this comment with the
# imports, importing them from there).
from builders import (
    discrete_actor_critic,
    gaussian_table_batch,
    random_batch,
    retrace,
    retrace_inputs,
    table_gaussian_sdn,
)
from reference import (
    retrace_backward_loop,
    retrace_per_step_reference,
    retrace_sum_definition,
)
from tensordict import TensorDict
from torchrl.objectives.utils import default_value_kwargs
from torchrl.objectives.value.functional import (
    td0_return_estimate,
    td_lambda_return_estimate,
)

from torchrl_acer import RetraceEstimator
from torchrl_acer.objectives._value_estimators import ValueEstimators


class TestRetraceFunctional:
    @pytest.mark.parametrize("c_thresh", [1.0, 0.5, 2.0])
    @pytest.mark.parametrize("lmbda", [1.0, 0.8])
    def test_matches_the_sum_definition(self, lmbda, c_thresh):
        x = retrace_inputs(3, 9, 2, seed=1)
        expected = retrace_sum_definition(0.9, lmbda, **x, c_thresh=c_thresh)
        got = retrace(0.9, lmbda, x, c_thresh=c_thresh)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)

    # T > 32: the scan form (and, with 300 rows, large batches)
    @pytest.mark.parametrize(
        "B, T",
        [
            *((B, T) for B in (5, 300) for T in (1, 2, 7, 64, 100, 1000)),
            (300, 500),
        ],
    )
    def test_matches_the_backward_loop(self, B, T):
        x = retrace_inputs(B, T, 1, seed=T)
        torch.testing.assert_close(
            retrace(0.97, 1.0, x),
            retrace_backward_loop(0.97, 1.0, **x),
            rtol=1e-12,
            atol=1e-12,
        )

    @pytest.mark.parametrize("with_dones", [False, True])
    @pytest.mark.parametrize("lmbda", [1.0, 0.9])
    def test_on_policy_equals_td_lambda(self, with_dones, lmbda):
        """With pi == mu and Q(s_{t+1}, a_{t+1}) == V(s'_t), Retrace is TD(lambda)."""
        x = retrace_inputs(4, 30, 1, p_done=0.15 if with_dones else 0.0, seed=3)
        x["log_mu"] = x["log_pi"].clone()
        # inside an episode Q(s_{t+1}, a_{t+1}) = V(s'_t); after a done it is unused
        not_done = ~x["done"][..., :-1, :]
        x["q"][..., 1:, :] = torch.where(
            not_done, x["next_v"][..., :-1, :], x["q"][..., 1:, :]
        )
        expected = td_lambda_return_estimate(
            0.95, lmbda, x["next_v"], x["reward"], x["done"], x["terminated"]
        )
        torch.testing.assert_close(
            retrace(0.95, lmbda, x), expected, rtol=0, atol=1e-12
        )
        if with_dones:
            assert (x["done"] & ~x["terminated"]).any() and x["terminated"].any()

    def test_lambda_zero_equals_td0(self):
        """With lambda = 0, Retrace is the one-step expected SARSA target."""
        x = retrace_inputs(3, 12, 2, seed=4)
        expected = x["reward"] + 0.9 * (~x["terminated"]).double() * x["next_v"]
        torch.testing.assert_close(retrace(0.9, 0.0, x), expected, rtol=0, atol=1e-12)
        # TorchRL's TD(0), with a discount exact in float32 as well, whatever
        # TorchRL computes it in
        expected = td0_return_estimate(
            0.5, x["next_v"], x["reward"], x["terminated"], done=x["done"]
        )
        torch.testing.assert_close(retrace(0.5, 0.0, x), expected, rtol=0, atol=1e-12)

    def test_truncation_bootstraps_and_termination_does_not(self):
        x = retrace_inputs(1, 6, 1, p_done=0.0, seed=6)
        x["log_mu"] = x["log_pi"].clone()
        t = 2
        x["done"][0, t, 0] = True
        truncated = retrace(0.9, 1.0, x)
        x["terminated"][0, t, 0] = True
        terminated = retrace(0.9, 1.0, x)
        r, v = x["reward"][0, t, 0], x["next_v"][0, t, 0]
        torch.testing.assert_close(truncated[0, t, 0], r + 0.9 * v)
        torch.testing.assert_close(terminated[0, t, 0], r)
        # nothing after the done reaches the steps before it
        later = {k: v.clone() for k, v in x.items()}
        later["reward"][0, t + 1 :] += 100.0
        later["q"][0, t + 1 :] -= 50.0
        torch.testing.assert_close(
            retrace(0.9, 1.0, later)[0, : t + 1], terminated[0, : t + 1]
        )

    def test_ratios_above_c_thresh_saturate(self):
        x = retrace_inputs(2, 10, 1, p_done=0.0, seed=5)
        x["log_mu"] = x["log_pi"]  # every ratio is exactly 1 = c_thresh
        at_one = retrace(0.9, 1.0, x)
        x["log_mu"] = x["log_pi"] - 3.0  # every ratio is e^3
        torch.testing.assert_close(retrace(0.9, 1.0, x), at_one, rtol=0, atol=1e-12)
        x["log_mu"] = x["log_pi"] - 30.0  # every ratio is e^30
        torch.testing.assert_close(retrace(0.9, 1.0, x), at_one, rtol=0, atol=1e-12)
        # with no threshold the large ratios count, and the trace explodes
        unclipped = retrace(0.9, 1.0, x, c_thresh=math.inf)
        assert (unclipped - at_one).abs().max() > 1e6

    def test_per_step_gamma_and_lambda(self):
        x = retrace_inputs(2, 7, 1, seed=11)
        g = torch.Generator().manual_seed(0)
        gamma = 0.5 + 0.5 * torch.rand(2, 7, 1, generator=g, dtype=torch.float64)
        lmbda = torch.rand(2, 7, 1, generator=g, dtype=torch.float64)
        c = lmbda * torch.clamp((x["log_pi"] - x["log_mu"]).exp(), max=1.0)
        keep, cont = (~x["terminated"]).double(), (~x["done"]).double()
        expected = torch.empty_like(x["q"])
        G = x["reward"][:, -1] + gamma[:, -1] * keep[:, -1] * x["next_v"][:, -1]
        expected[:, -1] = G
        for t in range(5, -1, -1):
            G = x["reward"][:, t] + gamma[:, t] * keep[:, t] * (
                x["next_v"][:, t] + cont[:, t] * c[:, t + 1] * (G - x["q"][:, t + 1])
            )
            expected[:, t] = G
        torch.testing.assert_close(
            retrace(gamma, lmbda, x), expected, rtol=1e-12, atol=1e-12
        )

    # (700, 200) and (2048, 64) take the scan form, not the matrix one
    @pytest.mark.parametrize("B, T", [(2, 13), (700, 200), (2048, 64)])
    def test_gradients_flow_like_the_loop(self, B, T):
        x = retrace_inputs(B, T, 1, seed=12)
        weights = torch.randn(B, T, 1, dtype=torch.float64)

        def loop(gamma, lmbda, x):
            return retrace_backward_loop(gamma, lmbda, **x)

        grads = []
        for fn in (retrace, loop):
            leaves = {k: x[k].clone().requires_grad_() for k in ("q", "next_v")}
            (fn(0.9, 1.0, {**x, **leaves}) * weights).sum().backward()
            grads.append([leaves[k].grad for k in ("q", "next_v")])
        torch.testing.assert_close(grads[0], grads[1])

    @pytest.mark.parametrize("time_dim", [0, 1, -3])
    def test_time_dim(self, time_dim):
        x = retrace_inputs(3, 11, 2, seed=8)
        expected = retrace(0.9, 1.0, x)
        moved = {k: v.movedim(-2, time_dim) for k, v in x.items()}
        got = retrace(0.9, 1.0, moved, time_dim=time_dim)
        torch.testing.assert_close(got, expected.movedim(-2, time_dim), rtol=0, atol=0)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_dtype_is_kept(self, dtype):
        x = retrace_inputs(2, 5, 1, dtype=dtype, seed=9)
        assert retrace(0.9, 1.0, x).dtype == dtype
        # tensor hyper-parameters of another dtype do not promote the result
        gamma = torch.tensor(0.9, dtype=torch.float64)
        assert retrace(gamma, 1.0, x).dtype == dtype
        lmbda = torch.tensor(1.0, dtype=torch.float32)
        assert retrace(gamma, lmbda, x).dtype == dtype

    def test_shape_mismatch_is_refused(self):
        x = retrace_inputs(2, 5, 1, seed=13)
        x["reward"] = x["reward"][..., 0]
        with pytest.raises(ValueError, match=r"reward.*\(2, 5\)"):
            retrace(0.9, 1.0, x)
        x = retrace_inputs(2, 5, 1, seed=13)
        with pytest.raises(ValueError, match="gamma, lmbda and c_thresh"):
            retrace(torch.ones(3), 1.0, x)


class TestRetraceEstimator:
    @pytest.mark.parametrize("shifted", [False, True])
    @pytest.mark.parametrize("shared", [False, True])
    @pytest.mark.parametrize("one_hot", [False, True])
    def test_matches_per_step_reference(self, one_hot, shared, shifted):
        actor, critic = discrete_actor_critic(shared=shared, one_hot=one_hot)
        data = random_batch(
            3,
            7,
            one_hot=one_hot,
            dones=[(0, 2), (2, 6)],
            terminations=[(1, 3), (2, 1)],
        )
        G, v = retrace_per_step_reference(
            actor, critic, data, gamma=0.9, lmbda=0.95, c_thresh=1.3
        )
        estimator = RetraceEstimator(
            gamma=0.9,
            lmbda=0.95,
            c_thresh=1.3,
            actor_network=actor,
            value_network=critic,
            shifted=shifted,
        )
        out = estimator(data.clone())
        torch.testing.assert_close(out["value_target"], G, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(out["state_value"], v, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(out["advantage"], G - v, rtol=1e-10, atol=1e-10)
        # the stored behaviour logits are left untouched
        torch.testing.assert_close(out["logits"], data["logits"])

    @pytest.mark.parametrize("shifted", [False, True])
    def test_truncation_bootstraps_from_the_real_next_observation(self, shifted):
        actor, critic = discrete_actor_critic()
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic, shifted=shifted
        )
        data = random_batch(1, 6, dones=[(0, 2)])
        G = estimator(data.clone())["value_target"]
        # the reset observation after the truncation reaches G_2 only through
        # Q(s_3, a_3)'s own target, never as V(s'_2)
        moved = data.clone()
        moved["observation"][0, 3] += 5.0
        torch.testing.assert_close(estimator(moved)["value_target"][0, :3], G[0, :3])
        moved["next", "observation"][0, 2] += 5.0
        assert not torch.allclose(estimator(moved)["value_target"][0, 2], G[0, 2])

    def test_leading_dims_and_time_dim(self):
        actor, critic = discrete_actor_critic()
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic
        )
        data = random_batch(6, 5, dones=[(1, 2)], terminations=[(4, 0)])
        expected = estimator(data.clone())["value_target"]
        nested = estimator(data.clone().reshape(2, 3, 5))["value_target"]
        torch.testing.assert_close(nested, expected.reshape(2, 3, 5, 1))
        # time first: given by the call, by the dimension's name, or at construction
        time_first = data.clone().transpose(0, 1)
        got = estimator(time_first.clone(), time_dim=0)["value_target"]
        torch.testing.assert_close(got, expected.transpose(0, 1))
        named = time_first.clone()
        named.names = ["time", None]
        got = estimator(named)["value_target"]
        torch.testing.assert_close(got, expected.transpose(0, 1))
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic, time_dim=0
        )
        got = estimator(time_first)["value_target"]
        torch.testing.assert_close(got, expected.transpose(0, 1))

    @pytest.mark.parametrize("dueling", [True, False], ids=["sdn", "plain_q"])
    def test_gaussian_q_opc_ignores_the_behaviour_policy(self, dueling):
        """Q_ret's traces are min(1, rho^(1/d)); Q_opc is the same recursion with
        every trace 1, so it does not depend on the behaviour policy, and on-policy
        (rho = 1) the two are equal."""
        batch, _, S = gaussian_table_batch(2, 6, 2, dones=[(0, 2)])
        actor, critic, *_ = table_gaussian_sdn(S, 2, dueling=dueling)
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic
        )
        with torch.no_grad():
            on_policy = actor(batch.clone())  # the policy's actions and log-probs
        outs = []
        # then a behaviour policy that made the taken actions 10x less likely
        for shift in (0.0, math.log(10.0)):
            data = on_policy.clone()
            data["action_log_prob"] = data["action_log_prob"] + shift
            torch.manual_seed(0)  # the critic's draws
            outs.append(estimator(data))
        torch.testing.assert_close(outs[0]["value_target"], outs[0]["value_target_opc"])
        torch.testing.assert_close(
            outs[0]["value_target_opc"], outs[1]["value_target_opc"]
        )
        assert not torch.allclose(outs[0]["value_target"], outs[1]["value_target"])

    def test_differentiable(self):
        actor, critic = discrete_actor_critic()
        data = random_batch(2, 4)
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic
        )
        assert not estimator(data.clone())["value_target"].requires_grad
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic, differentiable=True
        )
        data["next", "reward"].requires_grad_()
        out = estimator(data)
        assert out["value_target"].requires_grad

    def test_set_keys(self):
        actor, critic = discrete_actor_critic()
        data = random_batch(2, 4)
        data["behaviour", "lp"] = data.pop("action_log_prob")
        data["next", "env", "r"] = data["next"].pop("reward")
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic
        )
        estimator.set_keys(
            sample_log_prob=("behaviour", "lp"),
            reward=("env", "r"),
            value_target=("acer", "G"),
            advantage=("acer", "adv"),
            value=("acer", "V"),
        )
        out = estimator(data)
        assert set(out["acer"].keys()) == {"G", "adv", "V"}
        with pytest.raises(KeyError, match="not_a_key"):
            estimator.set_keys(not_a_key="x")
        with pytest.raises(KeyError, match="not an output of the critic"):
            estimator.set_keys(action_value="q_values")

    def test_functional_params(self):
        actor, critic = discrete_actor_critic()
        other_actor, _ = discrete_actor_critic(seed=2)
        _, other_critic = discrete_actor_critic(seed=1)
        data = random_batch(2, 4)
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic
        )
        out = estimator(
            data.clone(),
            params=TensorDict.from_module(other_critic),
            actor_params=TensorDict.from_module(other_actor),
        )
        other = RetraceEstimator(
            gamma=0.9, actor_network=other_actor, value_network=other_critic
        )
        torch.testing.assert_close(out["value_target"], other(data)["value_target"])
        # the estimator's own modules keep their parameters
        assert not torch.allclose(estimator(data)["value_target"], out["value_target"])

    def test_registered_defaults(self):
        assert default_value_kwargs(ValueEstimators.Retrace) == {
            "gamma": 0.99,
            "lmbda": 1.0,
            "c_thresh": 1.0,
            "shifted": True,
        }

    def test_target_params_are_refused(self):
        actor, critic = discrete_actor_critic()
        estimator = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic
        )
        with pytest.raises(ValueError, match="target_params"):
            estimator(random_batch(2, 4), target_params=TensorDict())
