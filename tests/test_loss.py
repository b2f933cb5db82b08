import math
import re

import pytest
import torch
from builders import (
    discrete_actor_critic,
    random_batch,
    table_actor_critic,
    table_batch,
)
from reference import acer_discrete_reference
from tensordict import TensorDict
from torchrl.objectives import SoftUpdate

from torchrl_acer import ACERLoss, RetraceEstimator
from torchrl_acer.objectives.trust_region import project

DONES = [(0, 2)]
TERMINATIONS = [(1, 4)]


def table_setup(
    B=2, T=6, A=3, *, delta=1.0, space="logits", reduction="mean", seed=0, **kwargs
):
    batch, ids, S = table_batch(
        B, T, A, dones=DONES, terminations=TERMINATIONS, seed=seed
    )
    actor, critic, policy, q = table_actor_critic(S, A, seed=seed)
    loss = ACERLoss(
        actor,
        critic,
        trust_region_delta=delta,
        trust_region_space=space,
        reduction=reduction,
        **kwargs,
    )
    loss.make_value_estimator(gamma=0.9)
    # an averaged policy away from the current one, so that the KL gradient is not 0
    with torch.no_grad():
        loss.target_actor_network_params.apply(
            lambda p: p.add_(torch.randn_like(p) * 1.5)
        )
    return loss, batch, ids, policy, q


def reference_grads(loss, batch, ids, *, delta, space, reduction):
    avg = loss.target_actor_network_params
    avg_table = next(iter(avg.values(True, True))).T
    return acer_discrete_reference(
        loss.actor_network_params.flatten_keys()["module.0.module.weight"].T,
        loss.critic_network_params.flatten_keys()["module.weight"].T,
        avg_table,
        ids[0],
        ids[1],
        batch["action"],
        batch["logits"],
        batch["action_log_prob"],
        batch["next", "reward"][..., 0],
        batch["next", "done"][..., 0],
        batch["next", "terminated"][..., 0],
        gamma=0.9,
        ratio_clip=float(loss.ratio_clip),
        entropy_coeff=float(loss.entropy_coeff),
        critic_coeff=float(loss.critic_coeff),
        delta=delta,
        space=space,
        reduction=reduction,
    )


def backward_total(loss, batch):
    out = loss(batch)
    total = out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]
    if total.ndim:
        total = total.sum()
    total.backward()
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("space", ["logits", "log_probs", "probs"])
@pytest.mark.parametrize("delta", [None, 0.05])
def test_gradients_match_plain_reference(delta, space, reduction):
    loss, batch, ids, policy, q = table_setup(
        delta=delta, space=space, reduction=reduction, ratio_clip=1.5
    )
    backward_total(loss, batch)
    grad_L, grad_Q = reference_grads(
        loss, batch, ids, delta=delta, space=space, reduction=reduction
    )
    torch.testing.assert_close(policy.weight.grad.T, grad_L, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(q.weight.grad.T, grad_Q, rtol=1e-9, atol=1e-12)
    if delta is not None:
        # the comparison is only meaningful if the projection was active somewhere
        # and idle somewhere else
        active = loss.trust_region_stats["active_fraction"]
        assert 0 < active < 1


def test_trust_region_changes_the_gradient():
    grads = []
    for delta in (None, 0.05):
        loss, batch, _, policy, _ = table_setup(delta=delta)
        backward_total(loss, batch)
        grads.append(policy.weight.grad.clone())
    assert (grads[0] - grads[1]).abs().max() > 1e-3


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_trust_region_bounds_every_step(reduction):
    B, T = 2, 6
    delta = 0.05
    loss, batch, ids, policy, _ = table_setup(
        delta=delta, reduction=reduction, B=B, T=T
    )
    out = loss(batch)
    total = out["loss_objective"] + out["loss_entropy"]
    if reduction == "none":
        assert total.shape == (B, T)
        total = total.sum()  # the convention the hook assumes for "none"
    total.backward()
    n = B * T if reduction == "mean" else 1
    # the gradient at the logits of s_t is column state_ids[b, t] of the weight grad
    z = -n * policy.weight.grad.T[ids[0]]  # [B, T, A], the projected ascent step
    avg_table = next(iter(loss.target_actor_network_params.values(True, True))).T
    logits = policy.weight.detach().T[ids[0]]
    k = logits.softmax(-1) - avg_table[ids[0]].softmax(-1)
    k_dot_z = (k * z).sum(-1)
    assert (k_dot_z <= delta + 1e-10).all()
    # active steps sit exactly on the boundary
    active = (k_dot_z - delta).abs() < 1e-10
    assert active.any() and not active.all()
    torch.testing.assert_close(
        loss.trust_region_stats["active_fraction"],
        active.double().mean(),
    )


def test_trust_region_mean_reduction_is_per_step_not_batch_mean():
    """The projection is the same for a batch and its duplicate (DI-engine's
    batch-mean projection would loosen as the batch grows)."""
    loss, batch, ids, policy, _ = table_setup(delta=0.05)
    backward_total(loss, batch)
    one = policy.weight.grad.clone()
    active_one = loss.trust_region_stats["active_fraction"]
    policy.weight.grad = None
    loss.critic_network_params.apply(lambda p: setattr(p, "grad", None))
    doubled = torch.cat([batch, batch], 0)
    backward_total(loss, doubled)
    # every state appears twice, each step still bounded: mean gradient unchanged
    torch.testing.assert_close(policy.weight.grad, one, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss.trust_region_stats["active_fraction"], active_one)


def test_infinite_delta_equals_no_trust_region():
    grads = []
    for delta in (None, math.inf):
        loss, batch, _, policy, q = table_setup(delta=delta)
        backward_total(loss, batch)
        grads.append((policy.weight.grad.clone(), q.weight.grad.clone()))
    # equal up to the rounding of the hook's scale-and-unscale
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-14, atol=1e-16)


def test_project_closed_form():
    g = torch.tensor([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    z, coef = project(g, k, 1.0)
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


BANDIT_Q = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
BANDIT_PI_LOGITS = torch.tensor([0.2, -1.0, 0.5, 1.5], dtype=torch.float64)
BANDIT_MU_LOGITS = torch.tensor([1.5, 0.0, -2.0, 0.3], dtype=torch.float64)
CLIPS = (math.inf, 10.0, 2.0, 1.0, 0.5)


def bandit_per_action_gradients(ratio_clip):
    """Ascent direction at the logits of a one-step bandit, for each sampled action.

    Row ``a`` is the gradient of J when the behaviour policy sampled ``a``. The
    critic knows Q exactly and the episode ends after one step, so G = Q(a). Each
    action is its own sample (and its own table column) in one batch.
    """
    A = 4
    actor, critic, policy, q = table_actor_critic(A, A)
    with torch.no_grad():
        policy.weight.copy_(BANDIT_PI_LOGITS[:, None].expand(A, A))
        q.weight.copy_(BANDIT_Q[:, None].expand(A, A))
    loss = ACERLoss(
        actor,
        critic,
        ratio_clip=ratio_clip,
        trust_region_delta=None,
        entropy_coeff=0.0,
        reduction="sum",
    )
    loss.make_value_estimator(gamma=0.9)
    action = torch.arange(A)[:, None]
    eye = torch.eye(A, dtype=torch.float64)[:, None]
    batch = TensorDict(
        {
            "observation": eye,
            "action": action,
            "logits": BANDIT_MU_LOGITS.expand(A, 1, A),
            "action_log_prob": BANDIT_MU_LOGITS.log_softmax(-1)[action],
            ("next", "observation"): eye,
            ("next", "reward"): BANDIT_Q[action][..., None],
            ("next", "done"): torch.ones(A, 1, 1, dtype=torch.bool),
            ("next", "terminated"): torch.ones(A, 1, 1, dtype=torch.bool),
        },
        [A, 1],
    )
    loss(batch)["loss_objective"].backward()
    return -policy.weight.grad.T  # [sampled action, logit]


def bandit_true_gradient():
    pi = BANDIT_PI_LOGITS.softmax(-1)
    v = (pi * BANDIT_Q).sum()
    return pi * (BANDIT_Q - v)  # d/dlogits of sum_a pi(a) Q(a)


@pytest.mark.parametrize("ratio_clip", CLIPS)
def test_truncation_with_bias_correction_is_unbiased(ratio_clip):
    g = bandit_per_action_gradients(ratio_clip)
    mu = BANDIT_MU_LOGITS.softmax(-1)
    expected = bandit_true_gradient()
    # the expectation over the behaviour policy is exact...
    torch.testing.assert_close(mu @ g, expected, rtol=1e-12, atol=1e-12)
    # ...and a Monte-Carlo average over sampled actions agrees within 5 standard errors
    n = 200_000
    counts = torch.bincount(
        torch.distributions.Categorical(probs=mu).sample((n,)), minlength=4
    ).double()
    mc_mean = counts / n @ g
    stderr = ((mu @ g**2 - (mu @ g) ** 2) / n).sqrt()
    assert ((mc_mean - expected).abs() <= 5 * stderr + 1e-12).all()
    if math.isinf(ratio_clip):
        # c = inf is plain importance sampling: no correction term
        pi = BANDIT_PI_LOGITS.softmax(-1)
        v = (pi * BANDIT_Q).sum()
        plain_is = torch.stack(
            [
                pi[a] / mu[a] * (BANDIT_Q[a] - v) * (torch.eye(4)[a].double() - pi)
                for a in range(4)
            ]
        )
        torch.testing.assert_close(g, plain_is, rtol=1e-12, atol=1e-12)


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

    def test_policy_terms_reach_only_the_actor(self):
        actor, critic = discrete_actor_critic()
        loss = ACERLoss(actor, critic)
        actor_g, critic_g = self.run(loss, ["loss_objective", "loss_entropy"])
        assert all(actor_g.values()) and not any(critic_g.values())

    def test_critic_term_reaches_only_the_critic(self):
        actor, critic = discrete_actor_critic()
        loss = ACERLoss(actor, critic)
        actor_g, critic_g = self.run(loss, ["loss_critic"])
        assert not any(actor_g.values()) and all(critic_g.values())

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

    def test_target_params_never_get_gradients(self):
        actor, critic = discrete_actor_critic()
        loss = ACERLoss(actor, critic)
        self.run(loss, ["loss_objective", "loss_entropy", "loss_critic"])
        for p in loss.target_actor_network_params.values(True, True):
            assert not p.requires_grad and p.grad is None


def test_shared_trunk_runs_once_per_update():
    from builders import CallCounter

    B, T = 3, 5
    actor, critic = discrete_actor_critic(shared=True)
    trunk = CallCounter(critic.module[0].module)
    loss = ACERLoss(actor, critic)
    loss(random_batch(B, T))
    # one call on the B (T + 1) window, one for the averaged policy on B T (no grad)
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


def test_soft_update_keeps_the_averaged_policy():
    actor, critic = discrete_actor_critic()
    loss = ACERLoss(actor, critic)
    updater = SoftUpdate(loss, eps=0.99)
    before = loss.target_actor_network_params.clone()
    with torch.no_grad():
        loss.actor_network_params.apply(lambda p: p.add_(1.0))
    updater.step()
    after = loss.target_actor_network_params
    for key, value in after.items(True, True):
        torch.testing.assert_close(value, 0.99 * before[key] + 0.01 * (before[key] + 1))
    # the critic has no averaged copy
    assert "target_critic_network_params" not in dict(loss.named_children())


def test_state_dict_round_trip():
    actor, critic = discrete_actor_critic(seed=0)
    loss = ACERLoss(actor, critic).make_value_estimator(gamma=0.95)
    with torch.no_grad():
        loss.target_actor_network_params.apply(lambda p: p.mul_(0.5))
    state = loss.state_dict()
    actor2, critic2 = discrete_actor_critic(seed=1)
    loss2 = ACERLoss(actor2, critic2).make_value_estimator(gamma=0.99)
    loss2.load_state_dict(state)
    for name in (
        "actor_network_params",
        "critic_network_params",
        "target_actor_network_params",
    ):
        a, b = getattr(loss, name), getattr(loss2, name)
        for key, value in a.items(True, True):
            torch.testing.assert_close(b[key], value)
    assert loss2.value_estimator.gamma.item() == 0.95
    data = random_batch(2, 4)
    for key in ("loss_objective", "loss_critic", "kl_avg"):
        torch.testing.assert_close(loss(data)[key], loss2(data)[key])


def test_outputs_and_reductions():
    actor, critic = discrete_actor_critic()
    data = random_batch(3, 5)
    outs = {}
    for reduction in ("none", "mean", "sum"):
        loss = ACERLoss(actor, critic, reduction=reduction)
        outs[reduction] = loss(data)
    assert outs["none"]["loss_objective"].shape == (3, 5)
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(outs["mean"][key], outs["none"][key].mean())
        torch.testing.assert_close(outs["sum"][key], outs["none"][key].sum())
    out = outs["mean"]
    for key in ("entropy", "kl_avg", "rho_mean", "rho_clip_fraction"):
        assert out[key].shape == () and not out[key].requires_grad
    # a fresh loss: averaged policy == policy
    assert out["kl_avg"].abs() < 1e-12


def test_collector_mask_is_honoured():
    actor, critic = discrete_actor_critic()
    data = random_batch(3, 5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    data["collector", "mask"] = mask
    loss = ACERLoss(actor, critic)
    masked = loss(data)
    per_step = ACERLoss(actor, critic, reduction="none")(data)
    for key in ("loss_objective", "loss_critic"):
        torch.testing.assert_close(masked[key], per_step[key][mask].mean())


def test_time_dim_and_keyword_call():
    actor, critic = discrete_actor_critic()
    data = random_batch(3, 5, dones=[(2, 1)])
    loss = ACERLoss(actor, critic, reduction="none")
    out = loss(data)
    loss.make_value_estimator(gamma=0.99, time_dim=0)
    out_t = loss(data.transpose(0, 1))
    torch.testing.assert_close(out_t["loss_objective"], out["loss_objective"].T)
    # keyword call, as TorchRL losses support
    loss = ACERLoss(actor, critic)
    loss.select_out_keys("loss_objective", "loss_critic")
    kwargs = {
        "_".join(k) if isinstance(k, tuple) else k: data.get(k) for k in loss.in_keys
    }
    objective, critic_loss = loss(**kwargs)
    torch.testing.assert_close(objective, loss(data)["loss_objective"])


def test_nested_keys():
    actor, critic = discrete_actor_critic()
    data = random_batch(2, 4)
    data["behaviour", "logits"] = data.pop("logits")
    data["behaviour", "lp"] = data.pop("action_log_prob")
    loss = ACERLoss(actor, critic)
    loss.set_keys(
        behavior_logits=("behaviour", "logits"), sample_log_prob=("behaviour", "lp")
    )
    out = loss(data)
    assert torch.isfinite(out["loss_objective"])


def test_value_estimator_by_name():
    actor, critic = discrete_actor_critic()
    loss = ACERLoss(actor, critic)
    assert isinstance(loss.value_estimator, RetraceEstimator)
    assert loss.value_estimator.gamma.item() == pytest.approx(0.99)
    loss.make_value_estimator("retrace", gamma=0.5, c_thresh=2.0)
    assert loss.value_estimator.gamma.item() == 0.5
    assert loss.value_estimator.c_thresh.item() == 2.0
    with pytest.raises(NotImplementedError, match="not implemented for loss ACERLoss"):
        loss.make_value_estimator("gae")


@pytest.mark.parametrize(
    "backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_compile(backend):
    """torch.compile runs the loss, hook included (with graph breaks at the
    data-dependent parts: the mid-row truncation gather and the value checks)."""
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

    def test_reward_shape(self):
        data = random_batch(2, 4)
        data.set(("next", "reward"), torch.zeros(2, 4, 2, dtype=torch.float64))
        with pytest.raises(ValueError, match=re.escape("reward') has shape (2, 4, 2)")):
            self.loss(data)

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"trust_region_space": "kl"}, "trust_region_space"),
            ({"trust_region_delta": 0.0}, "trust_region_delta"),
            ({"ratio_clip": -1.0}, "ratio_clip"),
            ({"reduction": "max"}, "reduction"),
            ({"loss_critic_type": "huber"}, "loss_critic_type"),
        ],
    )
    def test_bad_arguments(self, kwargs, match):
        actor, critic = discrete_actor_critic()
        with pytest.raises(ValueError, match=match):
            ACERLoss(actor, critic, **kwargs)
