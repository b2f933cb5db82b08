"""Continuous ACER beyond tests/upstream/ (which checks the Gaussian gradients with
the dueling critic against the plain reference, and Q_opc): the plain-Q critic's
gradients, the Gaussian trust region, bandits, the model builders and refused inputs
(the MuJoCo example: tests/training/test_continuous_examples.py).
"""

import math

import pytest
import torch
from builders import (
    bandit_loss,
    gaussian_setup,
    gaussian_table_batch,
    make_loss,
    move_average,
    replay_draws,
    table_gaussian_sdn,
)
from reference import (
    assert_same_grads,
    check_gaussian_policy_against_reference,
    plain_mlp,
)
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor

from torchrl_acer import ACERLoss, RetraceEstimator
from torchrl_acer.modules.models import gaussian_actor_sdn
from torchrl_acer.modules.sdn import PlainQCritic, StochasticDuelingNetwork

DONES = [(0, 2)]
TERMINATIONS = [(1, 3)]


@pytest.mark.parametrize("fixed_scale", [None, 0.4])
@pytest.mark.parametrize("delta", [None, 0.02])
def test_plain_q_gradients_match_plain_reference(delta, fixed_scale):
    """ACER without the dueling network: Q~ = Q, V(s) = mean_i Q(s, u_i), no V
    term in the critic loss."""
    B, T, d = 2, 5, 2
    batch, ids, S = gaussian_table_batch(
        B, T, d, dones=DONES, terminations=TERMINATIONS
    )
    actor, critic, policy, _, q = table_gaussian_sdn(
        S, d, fixed_scale=fixed_scale, dueling=False
    )
    # V's draws: u_i = loc + scale * c_i, the same c_i at every state
    c = torch.randn(3, d, dtype=torch.float64)
    critic.value_network.noise = lambda loc: c.view(3, *[1] * (loc.ndim - 1), d).expand(
        3, *loc.shape
    )
    loss = make_loss(
        actor, critic, ratio_clip=1.2, trust_region_delta=delta, entropy_coeff=0.05
    )
    move_average(loss, 0.7)
    noise = torch.randn(1, B, T, d, dtype=torch.float64)  # a' alone
    replay_draws(loss, noise)

    q_ref = [p.detach().clone().requires_grad_() for p in q.parameters()]
    q_fn = plain_mlp(q, q_ref, torch.eye(S, dtype=torch.float64))
    loc_table = policy.loc.weight.detach().T
    sigma = (
        policy.log_scale.detach().exp()
        if fixed_scale is None
        else torch.full((d,), fixed_scale, dtype=torch.float64)
    )

    def value(s):
        return sum(q_fn(s, loc_table[s] + sigma * c[i]) for i in range(3)) / 3

    critic_loss = check_gaussian_policy_against_reference(
        loss,
        batch,
        ids,
        policy,
        noise,
        value,
        q_fn,
        fixed_scale=fixed_scale,
        delta=delta,
        dueling=False,
    )
    critic_loss.backward()
    assert_same_grads(q.parameters(), q_ref)


def test_plain_q_critic_outputs_q_and_its_sampled_mean():
    q = TensorDictModule(
        MLP(in_features=3 + 2, out_features=1, num_cells=[8]),
        ["observation", "action"],
        ["q"],
    )
    critic = PlainQCritic(q, num_samples=4)
    td = TensorDict(
        {
            "observation": torch.randn(6, 3),
            "action": torch.randn(6, 2),
            "loc": torch.randn(6, 2),
            "scale": torch.rand(6, 2) + 0.1,
        },
        [6],
    )
    torch.manual_seed(0)
    out = critic(td.clone())
    torch.testing.assert_close(out["action_value"], q(td.clone())["q"])
    torch.manual_seed(0)
    u = td["loc"] + td["scale"] * torch.randn(4, 6, 2)
    draws = td.select("observation").expand(4, 6).clone().set("action", u)
    torch.testing.assert_close(out["state_value"], q(draws)["q"].mean(0))
    # Q's parameters are registered once, under the action-value network
    assert len(list(critic.parameters())) == len(list(q.parameters()))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gaussian_trust_region_bounds_every_step(reduction):
    B, T, delta, sigma = 2, 5, 0.02, 0.4
    loss, batch, ids, policy, *_ = gaussian_setup(
        fixed_scale=sigma, delta=delta, reduction=reduction, B=B, T=T
    )
    out = loss(batch)
    (out["loss_objective"] + out["loss_entropy"]).backward()
    n = B * T if reduction == "mean" else 1
    z = -n * policy.loc.weight.grad.T[ids[0]]
    avg = loss.target_actor_network_params.flatten_keys(".")
    avg_loc = avg["module.0.module.loc.weight"].T[ids[0]]
    loc = policy.loc.weight.detach().T[ids[0]]
    k = (loc - avg_loc) / sigma**2
    k_dot_z = (k * z).sum(-1)
    assert (k_dot_z <= delta + 1e-9).all()
    active = (k_dot_z - delta).abs() < 1e-9
    assert active.any() and not active.all()


def test_small_delta_keeps_gaussian_policy_closer_to_average():
    def kl_after_sgd(delta):
        loss, batch, *_ = gaussian_setup(delta=delta, seed=3)
        loss.entropy_coeff.zero_()
        params = list(loss.actor_network_params.values(True, True))
        opt = torch.optim.SGD(params, lr=0.3)
        for _ in range(30):
            opt.zero_grad()
            out = loss(batch)
            (out["loss_objective"] + out["loss_entropy"]).backward()
            opt.step()
        return loss(batch)["kl_avg"].item()

    initial = gaussian_setup(delta=None, seed=3)
    baseline = initial[0](initial[1])["kl_avg"].item()
    unconstrained, constrained = kl_after_sgd(None), kl_after_sgd(0.005)
    assert abs(unconstrained - baseline) > 0.1
    assert abs(constrained - baseline) < 0.5 * abs(unconstrained - baseline)


def test_dueling_network_is_consistent_with_the_policy():
    """E_{a ~ pi} E_u Q~(s, a) = V(s), by Monte Carlo."""
    torch.manual_seed(0)
    value = TensorDictModule(
        MLP(in_features=3, out_features=1, num_cells=[16]),
        ["observation"],
        ["state_value"],
    )
    advantage = TensorDictModule(
        MLP(in_features=5, out_features=1, num_cells=[16]),
        ["observation", "action"],
        ["advantage"],
    )
    sdn = StochasticDuelingNetwork(value, advantage, num_samples=5)
    K = 200_000
    obs = torch.randn(3).expand(K, 3)
    loc, scale = torch.tensor([0.3, -0.2]), torch.tensor([0.5, 0.8])
    action = loc + scale * torch.randn(K, 2)
    td = TensorDict(
        {
            "observation": obs,
            "action": action,
            "loc": loc.expand(K, 2),
            "scale": scale.expand(K, 2),
        },
        [K],
    )
    with torch.no_grad():
        q = sdn(td)["action_value"]
        v = td["state_value"][0]
    stderr = q.std() / math.sqrt(K)
    assert (q.mean() - v).abs() < 5 * stderr
    # and it is not trivially so: Q~ varies with the action
    assert q.std() > 0.01


BANDIT_TARGET = 0.7  # Q(a) = -(a - 0.7)^2


class _Index(nn.Module):
    """loc = table[index]: one row per sample, so each row's gradient is that
    sample's."""

    def __init__(self, n, value):
        super().__init__()
        self.table = nn.Parameter(torch.full((n, 1), value, dtype=torch.float64))

    def forward(self, index):
        loc = self.table[index.long().squeeze(-1)]
        return loc, torch.full_like(loc, 0.4)


def bandit_gradients(ratio_clip, n=40_000, seed=0):
    """Per-sample ascent gradients at the mean of a one-step bandit."""
    torch.manual_seed(seed)
    table = _Index(n, 0.0)
    actor = ProbabilisticActor(
        TensorDictModule(table, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    sigma = 0.4
    # exact value and advantage of Q(a) = -(a - a*)^2 under pi = N(0, sigma^2)
    v_exact = -(BANDIT_TARGET**2 + sigma**2)

    class V(nn.Module):
        def forward(self, index):
            return torch.full_like(index, v_exact)

    class A(nn.Module):
        def forward(self, index, action):
            return -((action - BANDIT_TARGET) ** 2) - v_exact

    critic = StochasticDuelingNetwork(
        TensorDictModule(V(), ["observation"], ["state_value"]),
        TensorDictModule(A(), ["observation", "action"], ["advantage"]),
        num_samples=5,
    )
    loss = bandit_loss(actor, critic, ratio_clip)
    mu_loc, mu_scale = 0.5, 0.4  # the behaviour policy is off by 1.25 sigma
    action = mu_loc + mu_scale * torch.randn(n, 1, 1, dtype=torch.float64)
    index = torch.arange(n, dtype=torch.float64)[:, None, None]
    log_mu = torch.distributions.Normal(mu_loc, mu_scale).log_prob(action).sum(-1)
    batch = TensorDict(
        {
            "observation": index,
            "action": action,
            "loc": torch.full((n, 1, 1), mu_loc, dtype=torch.float64),
            "scale": torch.full((n, 1, 1), mu_scale, dtype=torch.float64),
            "action_log_prob": log_mu,
            ("next", "observation"): index,
            ("next", "reward"): -((action - BANDIT_TARGET) ** 2),
            ("next", "done"): torch.ones(n, 1, 1, dtype=torch.bool),
            ("next", "terminated"): torch.ones(n, 1, 1, dtype=torch.bool),
        },
        [n, 1],
    )
    loss(batch)["loss_objective"].backward()
    return -table.table.grad[:, 0]


@pytest.mark.parametrize("ratio_clip", [math.inf, 5.0, 1.0, 0.5])
def test_gaussian_truncation_with_bias_correction_is_unbiased(ratio_clip):
    g = bandit_gradients(ratio_clip)
    # d/dmu E_{a ~ N(mu, sigma^2)} [-(a - a*)^2] at mu = 0
    expected = 2 * BANDIT_TARGET
    stderr = g.std() / math.sqrt(len(g))
    assert abs(g.mean() - expected) < 5 * stderr, (g.mean(), expected, stderr)


def test_gaussian_truncation_reduces_variance():
    variances = {c: bandit_gradients(c).var().item() for c in (math.inf, 5.0, 1.0)}
    assert variances[math.inf] > variances[5.0] > variances[1.0], variances


@pytest.mark.parametrize("dueling", [True, False], ids=["sdn", "plain_q"])
def test_gaussian_actor_sdn_builds_the_critic_asked_for(dueling):
    _, critic = gaussian_actor_sdn(3, 2, num_cells=[8], dueling=dueling)
    assert isinstance(critic, StochasticDuelingNetwork)
    assert isinstance(critic, PlainQCritic) is not dueling


def test_bounded_mean_stays_in_the_action_bounds_and_log_probs_stay_exact():
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    actor, _ = gaussian_actor_sdn(3, 2, num_cells=[8], loc_bounds=(low, high))
    with torch.no_grad():  # push the MLP's raw output far past the bounds
        actor.module[0].module.mlp[-1].bias.copy_(torch.tensor([1e3, -1e3]))
    td = actor(TensorDict({"observation": torch.randn(64, 3)}, [64]))
    loc, scale = td["loc"], td["scale"]
    assert (loc >= low).all() and (loc <= high).all()
    torch.testing.assert_close(loc, torch.tensor([2.0, 0.0]).expand_as(loc))
    # the Gaussian is not squashed: the stored log-prob is N(loc, scale)'s
    expected = torch.distributions.Normal(loc, scale).log_prob(td["action"]).sum(-1)
    torch.testing.assert_close(td["action_log_prob"], expected)
    # in between, the mean is the bounds' centre plus the half range times tanh
    raw = torch.tensor([0.3, -0.7])
    with torch.no_grad():
        actor.module[0].module.mlp[-1].weight.zero_()
        actor.module[0].module.mlp[-1].bias.copy_(raw)
    loc = actor(TensorDict({"observation": torch.randn(4, 3)}, [4]))["loc"]
    expected = torch.stack([2.0 * raw[0].tanh(), 0.5 + 0.5 * raw[1].tanh()])
    torch.testing.assert_close(loc, expected.expand_as(loc))


@pytest.mark.parametrize(
    "bounds",
    [(1.0, -1.0), (-float("inf"), 1.0), (-3.4e38, 3.4e38)],
    ids=["reversed", "infinite", "float_max"],
)
def test_bad_mean_bounds_are_refused(bounds):
    with pytest.raises(ValueError, match="loc_bounds must be finite with high > low"):
        gaussian_actor_sdn(3, 1, num_cells=[8], loc_bounds=bounds)


def test_learned_scale_starts_at_initial_scale_and_learns():
    actor, _ = gaussian_actor_sdn(
        3, 2, num_cells=[8], fixed_scale=None, initial_scale=0.1
    )
    td = actor(TensorDict(observation=torch.randn(4, 3), batch_size=[4]))
    torch.testing.assert_close(td["scale"], torch.full((4, 2), 0.1))
    # a state-independent parameter, moved by the loss like any other
    (log_scale,) = [p for n, p in actor.named_parameters() if n.endswith("log_scale")]
    td["scale"].sum().backward()
    assert log_scale.grad is not None and bool((log_scale.grad != 0).all())


@pytest.mark.parametrize("initial_scale", [0.0, -0.1])
def test_non_positive_initial_scale_is_refused(initial_scale):
    with pytest.raises(ValueError, match="initial_scale must be > 0"):
        gaussian_actor_sdn(
            3, 1, num_cells=[8], fixed_scale=None, initial_scale=initial_scale
        )


class TestBadInput:
    def test_value_network_writing_another_key_is_refused(self):
        # V(s) is read under the dueling network's value_key
        value = TensorDictModule(nn.Linear(3, 1), ["observation"], ["v"])
        advantage = TensorDictModule(
            nn.Linear(5, 1), ["observation", "action"], ["advantage"]
        )
        with pytest.raises(ValueError, match="value_key 'state_value'"):
            StochasticDuelingNetwork(value, advantage)
        sdn = StochasticDuelingNetwork(value, advantage, value_key="v")
        assert sdn.out_keys == ["v", "action_value"]

    def test_plain_q_critic_reading_other_policy_keys_is_refused(self):
        # its V draws from the policy's loc and scale, read where the actor
        # writes them
        batch, _, S = gaussian_table_batch(2, 5, 2, dones=DONES)
        actor, *_ = table_gaussian_sdn(S, 2)
        nested = ProbabilisticActor(
            TensorDictModule(
                actor.module[0].module, ["observation"], [("p", "loc"), ("p", "scale")]
            ),
            in_keys={"loc": ("p", "loc"), "scale": ("p", "scale")},
            distribution_class=IndependentNormal,
            return_log_prob=True,
        )
        mlp = MLP(in_features=S + 2, out_features=1, num_cells=[8]).double()
        q = TensorDictModule(mlp, ["observation", "action"], ["q"])
        with pytest.raises(ValueError, match=r"pass loc_key=\('p', 'loc'\)"):
            ACERLoss(nested, PlainQCritic(q))
        critic = PlainQCritic(q, loc_key=("p", "loc"), scale_key=("p", "scale"))
        batch["p", "loc"] = batch.pop("loc")
        batch["p", "scale"] = batch.pop("scale")
        assert torch.isfinite(ACERLoss(nested, critic)(batch)["loss_critic"])

    @pytest.mark.parametrize("space", ["log_probs", "probs"])
    def test_categorical_trust_region_space_is_refused(self, space):
        # it would be silently ignored: the Gaussian projection acts on loc, scale
        actor, critic = gaussian_actor_sdn(3, 2, num_cells=[8])
        with pytest.raises(ValueError, match=f"trust_region_space='{space}'"):
            ACERLoss(actor, critic, trust_region_space=space)

    def test_wrong_action_dimension(self):
        loss, batch, *_ = gaussian_setup()
        batch.set("action", torch.zeros(2, 5, 3, dtype=torch.float64))
        with pytest.raises(
            ValueError, match=r"action has shape \(2, 5, 3\), expected \(2, 5, 2\)"
        ):
            loss(batch)

    def test_nan_scale(self):
        actor, critic, policy, *_ = table_gaussian_sdn(14, 2)
        loss = ACERLoss(actor, critic)
        batch, *_ = gaussian_table_batch(
            2, 5, 2, dones=DONES, terminations=TERMINATIONS
        )
        with torch.no_grad():
            policy.log_scale.fill_(float("nan"))
        with pytest.raises(
            ValueError, match="scale holds values that are not positive"
        ):
            loss(batch)

    def test_squashed_policies_are_refused(self):
        from torchrl.modules import TanhNormal

        actor = ProbabilisticActor(
            TensorDictModule(nn.Linear(3, 2), ["observation"], ["loc"]),
            in_keys=["loc", "scale"],
            distribution_class=TanhNormal,
        )
        with pytest.raises(TypeError, match="bound actions in the environment"):
            RetraceEstimator(
                gamma=0.9, actor_network=actor, value_network=nn.Linear(1, 1)
            )

    def test_gaussian_policy_needs_dueling_critic(self):
        actor, _ = gaussian_actor_sdn(3, 2, num_cells=[8])
        critic = TensorDictModule(nn.Linear(3, 2), ["observation"], ["action_value"])
        with pytest.raises(TypeError, match="StochasticDuelingNetwork"):
            ACERLoss(actor, critic)


def test_advantage_network_reading_an_entry_of_its_own():
    """An advantage network may read an observation entry that neither the actor
    nor the value network reads: the loss lists it in its in_keys and reads it."""
    B, T, d = 2, 5, 2
    batch, _, S = gaussian_table_batch(B, T, d, dones=DONES, terminations=TERMINATIONS)
    goal = torch.randn(B, T, 3, dtype=torch.float64)
    batch.set("goal", goal)
    batch.set(("next", "goal"), goal.roll(-1, 1))
    actor, _, _, v, _ = table_gaussian_sdn(S, d)
    a = MLP(in_features=S + 3 + d, out_features=1, num_cells=[8]).double()
    critic = StochasticDuelingNetwork(
        TensorDictModule(v, ["observation"], ["state_value"]),
        TensorDictModule(a, ["observation", "goal", "action"], ["advantage"]),
        num_samples=3,
    )
    loss = make_loss(actor, critic)
    assert "goal" in loss.in_keys and ("next", "goal") in loss.in_keys
    out = loss(batch)
    out["loss_critic"].backward()
    assert a[0].weight.grad[:, S : S + 3].abs().sum() > 0  # the goal's columns
