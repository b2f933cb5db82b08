import re

import pytest
import torch
from builders import CallCounter, discrete_actor_critic, random_batch
from reference import retrace_sum_definition
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymEnv, SerialEnv
from torchrl.objectives.utils import build_value_estimator

from torchrl_acer import ACERValueEstimators, RetraceEstimator


def plain_reference(actor, critic, data, gamma=0.99, lmbda=1.0, c_thresh=1.0):
    """Evaluates the networks on each s_t and each real s'_t separately (2T calls per
    row), then applies the sum definition of Retrace. Expects [B, T] data."""
    actor, critic = actor.double(), critic.double()
    data = data.apply(lambda x: x.double() if x.is_floating_point() else x)

    def policy_and_q(obs):
        td = TensorDict({"observation": obs}, [])
        logits = actor.get_dist_params(td.clone())["logits"]
        q = critic(td.clone())["action_value"]
        return torch.log_softmax(logits, -1), q

    B, T = data.batch_size
    shape = (B, T, 1)
    log_pi, q_taken, v, next_v = (
        torch.zeros(shape, dtype=torch.float64) for _ in "1234"
    )
    action = data["action"]
    if action.ndim == 3:  # one-hot
        action = action.argmax(-1)
    with torch.no_grad():
        for b in range(B):
            for t in range(T):
                a = action[b, t]
                lp, q = policy_and_q(data["observation"][b, t])
                log_pi[b, t, 0] = lp[a]
                q_taken[b, t, 0] = q[a]
                v[b, t, 0] = (lp.exp() * q).sum()
                lp_next, q_next = policy_and_q(data["next", "observation"][b, t])
                next_v[b, t, 0] = (lp_next.exp() * q_next).sum()
    log_mu = data["action_log_prob"].unsqueeze(-1).double()
    G = retrace_sum_definition(
        gamma,
        lmbda,
        log_pi,
        log_mu,
        q_taken,
        next_v,
        data["next", "reward"].double(),
        data["next", "done"],
        data["next", "terminated"],
        c_thresh=c_thresh,
    )
    return G, v


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("one_hot", [False, True])
def test_estimator_matches_plain_reference_with_mid_row_resets(shared, one_hot):
    actor, critic = discrete_actor_critic(shared=shared, one_hot=one_hot)
    data = random_batch(
        3, 7, one_hot=one_hot, dones=[(0, 2), (2, 6)], terminations=[(1, 3), (2, 1)]
    )
    G, v = plain_reference(actor, critic, data, gamma=0.9, lmbda=0.95, c_thresh=1.3)
    est = RetraceEstimator(
        gamma=0.9, lmbda=0.95, c_thresh=1.3, actor_network=actor, value_network=critic
    )
    out = est(data.clone())
    torch.testing.assert_close(out["value_target"], G, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out["state_value"], v, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out["advantage"], G - v, rtol=1e-10, atol=1e-10)
    # the stored behaviour logits are left untouched
    torch.testing.assert_close(out["logits"], data["logits"])


def test_truncation_bootstraps_from_the_real_next_observation():
    actor, critic = discrete_actor_critic()
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    data = random_batch(1, 6, dones=[(0, 2)])
    G = est(data.clone())["value_target"]
    # moving the reset observation that follows the truncation changes G at t=2 only
    # through Q(s_3, a_3)'s own target, never through V(s'_2)
    moved = data.clone()
    moved["observation"][0, 3] += 5.0
    moved["next", "observation"][0, 2] = data["next", "observation"][0, 2]
    G_moved = est(moved)["value_target"]
    torch.testing.assert_close(G_moved[0, :3], G[0, :3])
    # moving the real next observation does change it
    moved["next", "observation"][0, 2] += 5.0
    assert not torch.allclose(est(moved)["value_target"][0, 2], G[0, 2])


@pytest.mark.parametrize(
    "dones, terminations, extra",
    [([], [], 0), ([], [(0, 1), (1, 3)], 0), ([(0, 1), (1, 2), (1, 5)], [], 2)],
)
@pytest.mark.parametrize("shared", [False, True])
def test_networks_see_T_plus_1_observations_per_row(dones, terminations, extra, shared):
    B, T = 2, 6
    actor, critic = discrete_actor_critic(shared=shared)
    if shared:
        counters = [CallCounter(critic.module[0].module)]  # the trunk
    else:
        counters = [CallCounter(actor.module[0].module), CallCounter(critic.module)]
    est = RetraceEstimator(
        gamma=0.9, actor_network=actor, value_network=critic, shifted=True
    )
    est(random_batch(B, T, dones=dones, terminations=terminations))
    for counter in counters:
        assert counter.sizes == [B * (T + 1) + extra]


def test_shared_trunk_matches_separate_networks():
    actor, critic = discrete_actor_critic(shared=True)
    data = random_batch(2, 5, dones=[(1, 1)])
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    G, v = plain_reference(actor, critic, data, gamma=0.9)
    out = est(data)
    torch.testing.assert_close(out["value_target"], G)
    torch.testing.assert_close(out["state_value"], v)


def test_leading_batch_dims_and_time_dim():
    actor, critic = discrete_actor_critic()
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    data = random_batch(6, 5, dones=[(1, 2)], terminations=[(4, 0)])
    expected = est(data.clone())["value_target"]
    # [2, 3, T]
    nested = est(data.clone().reshape(2, 3, 5))["value_target"]
    torch.testing.assert_close(nested, expected.reshape(2, 3, 5, 1))
    # time first, given explicitly or by the dimension's name
    time_first = data.clone().transpose(0, 1)
    out = est(time_first.clone(), time_dim=0)["value_target"]
    torch.testing.assert_close(out, expected.transpose(0, 1))
    named = time_first.clone()
    named.names = ["time", None]
    torch.testing.assert_close(est(named)["value_target"], expected.transpose(0, 1))
    est_t0 = RetraceEstimator(
        gamma=0.9, actor_network=actor, value_network=critic, time_dim=0
    )
    torch.testing.assert_close(
        est_t0(time_first)["value_target"], expected.transpose(0, 1)
    )


def test_nested_keys():
    actor, critic = discrete_actor_critic()
    data = random_batch(2, 4)
    data["behaviour", "lp"] = data.pop("action_log_prob")
    data["next", "env", "r"] = data["next"].pop("reward")
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    est.set_keys(
        sample_log_prob=("behaviour", "lp"),
        reward=("env", "r"),
        value_target=("acer", "G"),
        advantage=("acer", "adv"),
        value=("acer", "V"),
    )
    out = est(data)
    assert set(out["acer"].keys()) == {"G", "adv", "V"}
    with pytest.raises(KeyError, match="not an output of the critic"):
        est.set_keys(action_value="q_values")


def test_functional_params_are_used():
    actor, critic = discrete_actor_critic()
    data = random_batch(2, 4)
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    _, other_critic = discrete_actor_critic(seed=1)
    other_actor, _ = discrete_actor_critic(seed=2)
    out = est(
        data.clone(),
        params=TensorDict.from_module(other_critic),
        actor_params=TensorDict.from_module(other_actor),
    )
    other = RetraceEstimator(
        gamma=0.9, actor_network=other_actor, value_network=other_critic
    )
    torch.testing.assert_close(out["value_target"], other(data)["value_target"])
    # the estimator's own modules keep their parameters
    assert not torch.allclose(est(data)["value_target"], out["value_target"])


def test_registered_by_name_and_for_loss():
    actor, critic = discrete_actor_critic()

    class FakeLoss:
        actor_network = actor
        critic_network = critic

    for name in ("retrace", "Retrace", ACERValueEstimators.Retrace):
        est = build_value_estimator(FakeLoss(), name, gamma=0.5)
        assert isinstance(est, RetraceEstimator)
        assert est.gamma.item() == 0.5 and est.lmbda.item() == 1.0
        assert est.c_thresh.item() == 1.0


def make_collector_batch(num_envs, T, max_episode_steps):
    def make_env():
        return GymEnv("CartPole-v1", max_episode_steps=max_episode_steps)

    actor, critic = discrete_actor_critic(obs_dim=4, num_actions=2, one_hot=True)
    actor = actor.float()
    critic = critic.float()
    env = SerialEnv(num_envs, make_env) if num_envs > 1 else make_env()
    env.set_seed(0)
    collector = Collector(
        env,
        actor,
        frames_per_batch=num_envs * T,
        total_frames=num_envs * T,
        auto_register_policy_transforms=False,
    )
    batch = next(iter(collector))
    collector.shutdown()
    return actor, critic, batch


def test_on_collector_batch_with_truncations():
    actor, critic, batch = make_collector_batch(2, 30, max_episode_steps=9)
    assert batch.batch_size == (2, 30) and batch.names == [None, "time"]
    done, term = batch["next", "done"], batch["next", "terminated"]
    assert (done & ~term)[:, :-1].any()  # mid-row truncations are exercised
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    out = est(batch.clone())
    G, v = plain_reference(actor.double(), critic.double(), batch, gamma=0.9)
    torch.testing.assert_close(out["value_target"].double(), G, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["state_value"].double(), v, rtol=1e-5, atol=1e-5)


def test_on_slice_sampler_batch():
    actor, critic, batch = make_collector_batch(1, 200, max_episode_steps=500)
    T, num_slices = 8, 4
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(1000),
        sampler=SliceSampler(
            slice_len=T, traj_key=("collector", "traj_ids"), strict_length=True
        ),
        batch_size=T * num_slices,
    )
    rb.extend(batch)
    torch.manual_seed(0)
    sample = rb.sample().reshape(num_slices, -1)
    # slice ends are marked done and truncated (not terminated), so they bootstrap
    assert sample["next", "truncated"][:, -1].all()
    assert sample["next", "done"][:, -1].all()
    est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
    out = est(sample.clone())
    G, v = plain_reference(actor.double(), critic.double(), sample, gamma=0.9)
    torch.testing.assert_close(out["value_target"].double(), G, rtol=1e-5, atol=1e-5)
    last = sample[:, -1]
    # the last step bootstraps from V(s'_{T-1}) unless the episode really ended there
    assert not last["next", "terminated"].all()


class TestBadInput:
    def setup_method(self):
        self.actor, self.critic = discrete_actor_critic()
        self.est = RetraceEstimator(
            gamma=0.9, actor_network=self.actor, value_network=self.critic
        )

    @pytest.mark.parametrize(
        "key",
        [
            "action_log_prob",
            "action",
            "observation",
            ("next", "reward"),
            ("next", "done"),
            ("next", "terminated"),
            ("next", "observation"),
        ],
    )
    def test_missing_key_is_named(self, key):
        data = random_batch(2, 4)
        del data[key]
        with pytest.raises(KeyError, match=re.escape(f"no entry {key!r}")):
            self.est(data)

    def test_shape_mismatch_names_tensor_and_shapes(self):
        data = random_batch(2, 4)
        data.set("action_log_prob", torch.zeros(2, 4, 3, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"action_log_prob.*\(2, 4, 3\).*\(2, 4\)"):
            self.est(data)
        data = random_batch(2, 4)
        data.set("action", torch.zeros(2, 4, 2, dtype=torch.long))
        with pytest.raises(ValueError, match=r"action has shape \(2, 4, 2\)"):
            self.est(data)

    def test_critic_output_not_per_action(self):
        from tensordict.nn import TensorDictModule

        critic = TensorDictModule(
            torch.nn.Linear(3, 1).double(), ["observation"], ["action_value"]
        )
        est = RetraceEstimator(
            gamma=0.9, actor_network=self.actor, value_network=critic
        )
        with pytest.raises(ValueError, match="one value per action"):
            est(random_batch(2, 4))

    @pytest.mark.parametrize("bad", [float("-inf"), float("nan")])
    def test_non_finite_behaviour_log_prob(self, bad):
        data = random_batch(2, 4)
        data["action_log_prob"][1, 2] = bad
        with pytest.raises(ValueError, match=r"action_log_prob.*index \(1, 2"):
            self.est(data)
        # the check can be switched off for hot loops
        self.est.check_values = False
        self.est(data)

    def test_action_out_of_range(self):
        data = random_batch(2, 4)
        data["action"][0, 1] = 7
        with pytest.raises(ValueError, match="action 7 .* out of range for the 4"):
            self.est(data)

    def test_target_params_rejected(self):
        with pytest.raises(ValueError, match="target_params"):
            self.est(random_batch(2, 4), target_params=TensorDict())
