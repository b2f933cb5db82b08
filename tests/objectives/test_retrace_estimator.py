"""RetraceEstimator beyond tests/upstream/test_retrace_upstream.py (which checks it
against the per-step reference, on truncations, keys, dimensions, parameters and
the registry): the networks' calls, collector and replay-buffer batches, and
refused inputs.
"""

import re

import pytest
import torch
from builders import CallCounter, discrete_actor_critic, random_batch
from reference import retrace_per_step_reference
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs import GymEnv, SerialEnv

from torchrl_acer import RetraceEstimator


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
    G, v = retrace_per_step_reference(actor.double(), critic.double(), batch, gamma=0.9)
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
    G, v = retrace_per_step_reference(
        actor.double(), critic.double(), sample, gamma=0.9
    )
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
