"""ACERLoss beyond tests/upstream/test_acer_upstream.py (which checks the gradients
against the plain references, the trust region's per-step bound, the bandit's
unbiasedness and the loss module's contract): the trust region's effect, the
truncation's variance, shared trunks, torch.compile and refused inputs.
"""

import math
import re

import pytest
import torch
import torchrl.modules
from builders import (
    BANDIT_MU_LOGITS,
    backward,
    bandit_per_action_gradients,
    discrete_actor_critic,
    discrete_setup,
    random_batch,
)
from torchrl.modules import ProbabilisticActor

from torchrl_acer import ACERLoss
from torchrl_acer.objectives.trust_region import project


def test_trust_region_changes_the_gradient():
    grads = []
    for delta in (None, 0.05):
        loss, batch, _, policy, _ = discrete_setup(delta=delta)
        backward(loss, batch)
        grads.append(policy.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() > 1e-3


def test_infinite_delta_equals_no_trust_region():
    grads = []
    for delta in (None, math.inf):
        loss, batch, _, policy, q = discrete_setup(delta=delta)
        backward(loss, batch)
        grads.append((policy.weight.grad.clone(), q.weight.grad.clone()))
    # equal up to the rounding of the hook's scale-and-unscale
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-14, atol=1e-16)


def test_project_closed_form():
    g = torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    z, coef, *_ = project(g, k, 1.0)
    # row 0: k.g = 3 > 1: z = g - (2 / 2) k; row 1: k.g = .5 <= 1; row 2: k = 0
    expected = torch.tensor([[0.0, 1.0], [0.5, -1.0], [3.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(z, expected)
    torch.testing.assert_close(coef[:, 0], torch.tensor([1.0, 0.0, 0.0]).double())
    assert ((k * z).sum(-1) <= 1.0 + 1e-12).all()


def test_small_delta_keeps_policy_closer_to_average():
    """SGD on the policy terms: with a small delta the policy drifts less from the
    averaged policy (kept fixed here) than without a trust region."""

    def kl_after_sgd(delta):
        actor, critic = discrete_actor_critic(seed=3)
        loss = ACERLoss(actor, critic, trust_region_delta=delta, entropy_coeff=0.0)
        loss.make_value_estimator(gamma=0.9)
        data = random_batch(8, 10, seed=4)
        opt = torch.optim.SGD(loss.actor_network_params.values(True, True), lr=0.5)
        for _ in range(30):
            opt.zero_grad()
            out = loss(data)
            (out["loss_objective"] + out["loss_entropy"]).backward()
            opt.step()
        return loss(data)["kl_avg"].item()

    unconstrained = kl_after_sgd(None)
    constrained = kl_after_sgd(0.01)
    assert unconstrained > 0.05
    assert constrained < 0.5 * unconstrained


CLIPS = (math.inf, 10.0, 2.0, 1.0, 0.5)


def test_truncation_variance_drops_as_c_falls():
    mu = BANDIT_MU_LOGITS.softmax(-1)
    variances = []
    for c in CLIPS:
        g = bandit_per_action_gradients(c)
        variances.append((mu @ (g - mu @ g).pow(2).sum(-1)).item())
    assert variances == sorted(set(variances), reverse=True), variances


class TestGradientRouting:
    def grads(self, loss):
        def collect(params):
            return {
                k: (v.grad is not None and v.grad.abs().sum().item() > 0)
                for k, v in params.flatten_keys(".").items()
                if isinstance(v, torch.nn.Parameter)
            }

        return collect(loss.actor_network_params), collect(loss.critic_network_params)

    def run(self, loss, terms):
        data = random_batch(3, 5, dones=[(0, 1)])
        out = loss(data)
        sum(out[t] for t in terms).backward()
        return self.grads(loss)

    @pytest.mark.parametrize("separate_losses", [False, True])
    def test_shared_trunk(self, separate_losses):
        actor, critic = discrete_actor_critic(shared=True)
        loss = ACERLoss(actor, critic, separate_losses=separate_losses)
        actor_g, critic_g = self.run(loss, ["loss_critic"])
        trunk = {k: v for k, v in actor_g.items() if k.startswith("module.0.")}
        head = {k: v for k, v in actor_g.items() if not k.startswith("module.0.")}
        assert trunk and not any(head.values())
        # the trunk learns from the critic unless the losses are separate
        assert all(trunk.values()) is (not separate_losses)
        if not separate_losses:
            assert any(critic_g.values())


def test_shared_trunk_runs_once_per_update():
    from builders import CallCounter

    B, T = 3, 5
    actor, critic = discrete_actor_critic(shared=True)
    trunk = CallCounter(critic.module[0].module)
    loss = ACERLoss(actor, critic)
    loss(random_batch(B, T))
    # one call on the B (T + 1) window, one for the averaged policy on B T (no grad)
    assert trunk.sizes == [B * (T + 1), B * T]


def test_shared_trunk_of_a_critic_built_from_a_dict_runs_once():
    """A TensorDictSequential built from an OrderedDict iterates names, not modules:
    its shared trunk is still found and run once."""
    from collections import OrderedDict

    from builders import CallCounter
    from tensordict.nn import TensorDictSequential

    B, T = 3, 5
    actor, critic = discrete_actor_critic(shared=True)
    trunk_module, q_head = critic.module[0], critic.module[1]
    critic = TensorDictSequential(OrderedDict(trunk=trunk_module, q=q_head))
    trunk = CallCounter(trunk_module.module)
    ACERLoss(actor, critic)(random_batch(B, T))
    assert trunk.sizes == [B * (T + 1), B * T]


def test_shared_trunk_loss_equals_unshared_loss():
    actor, critic = discrete_actor_critic(shared=True)
    data = random_batch(3, 5, dones=[(1, 2)])
    loss = ACERLoss(actor, critic)
    out = loss(data)
    # the same networks, with the critic not recognised as sharing (its own copy)
    import copy

    critic_copy = copy.deepcopy(critic)
    loss2 = ACERLoss(actor, critic_copy)
    out2 = loss2(data)
    for key in ("loss_objective", "loss_critic", "loss_entropy", "kl_avg"):
        torch.testing.assert_close(out[key], out2[key])


@pytest.mark.parametrize(
    "backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_compile(backend):
    """torch.compile runs the loss, hook included (with the value checks on, the
    graph breaks where they read back; without them it is one graph, see
    test_loss_overhead.py)."""
    actor, critic = discrete_actor_critic()
    data = random_batch(3, 5, dones=[(0, 1)])
    loss = ACERLoss(actor, critic, trust_region_delta=0.01)
    with torch.no_grad():
        loss.target_actor_network_params.apply(lambda p: p.add_(torch.randn_like(p)))

    def run(fn):
        for p in loss.parameters():
            p.grad = None
        out = fn(data)
        (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()
        grads = [p.grad.clone() for p in loss.parameters()]
        return out, grads, loss.trust_region_stats.clone()

    expected = run(loss)
    got = run(torch.compile(loss, backend=backend))
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(got[0][key], expected[0][key])
    torch.testing.assert_close(got[1], expected[1])
    assert expected[2]["active_fraction"] > 0
    torch.testing.assert_close(got[2], expected[2])


class TestBadInput:
    def setup_method(self):
        actor, critic = discrete_actor_critic()
        self.loss = ACERLoss(actor, critic)

    def test_action_out_of_range(self):
        data = random_batch(2, 4)
        data["action"][1, 2] = -1
        with pytest.raises(ValueError, match="action -1 at index"):
            self.loss(data)

    def test_missing_behaviour_logits(self):
        data = random_batch(2, 4)
        del data["logits"]
        with pytest.raises(KeyError, match=re.escape("no entry 'logits'")):
            self.loss(data)

    def test_behaviour_logits_shape(self):
        data = random_batch(2, 4)
        data.set("logits", torch.zeros(2, 4, 3, dtype=torch.float64))
        with pytest.raises(
            ValueError,
            match=re.escape("'logits' have shape (2, 4, 3), expected (2, 4, 4)"),
        ):
            self.loss(data)

    @pytest.mark.parametrize("name", ["MaskedCategorical", "MaskedOneHotCategorical"])
    def test_masked_categorical_is_refused(self, name):
        # the loss reads the logits alone: the action mask would be silently ignored
        actor, critic = discrete_actor_critic()
        masked = ProbabilisticActor(
            actor.module[0],
            in_keys={"logits": "logits", "mask": "action_mask"},
            distribution_class=getattr(torchrl.modules, name),
            return_log_prob=True,
        )
        with pytest.raises(TypeError, match=f"{name} is not supported"):
            ACERLoss(masked, critic)

    def test_reward_shape(self):
        data = random_batch(2, 4)
        data.set(("next", "reward"), torch.zeros(2, 4, 2, dtype=torch.float64))
        with pytest.raises(ValueError, match=re.escape("reward') has shape (2, 4, 2)")):
            self.loss(data)
