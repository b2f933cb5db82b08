"""GymVectorCollector's batches are TorchRL's Collector's, bit for bit.

From environments built alike (``make_env``, one seed), one policy and one torch
random state, several consecutive batches of both collectors hold the same keys,
shapes, dtypes, dim names and values: on CartPole (terminations, staggered and
simultaneous truncations, one env), Pendulum with a Gaussian actor, MinAtar's
boolean grids with its conv net, float64 observations (DoubleToFloat), reward
scaling, a shared-trunk actor, and policies that draw random numbers outside the
collectors' exploration context. Its observations are also checked against a
plain gymnasium vector env replaying its actions; its state resumes its own
batches and either collector's; it refuses what it does not reproduce; and the
trainer runs with ``collector.backend=lean`` as with ``single``.
"""

import shutil
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from builders import (
    close_trainer,
    gym_config,
    resume_small_trainer,
    small_trainer,
)
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Categorical, Composite, OneHot
from torchrl.envs import (
    DoubleToFloat,
    GymWrapper,
    InitTracker,
    RewardScaling,
    RewardSum,
)

from torchrl_acer.modules.models import (
    gaussian_actor_sdn,
    minatar_actor_critic,
    mlp_actor_critic,
)
from torchrl_acer.trainers.hooks import PolicyVersion
from torchrl_acer.training.env_state import (
    collector_state_dict,
    load_collector_state_dict,
    restart_episodes,
)
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import make_collector
from torchrl_acer.training.gym_collector import GymVectorCollector

SEED = 3


class RandomOneHot(nn.Module):
    """Draws actions with torch's generator whatever the exploration type."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, observation):
        index = torch.randint(self.n, observation.shape[:-1])
        return nn.functional.one_hot(index, self.n)


class SpecifiedRandomPolicy(TensorDictModuleBase):
    """The same, writing its draw too, with a complete spec naming both outputs:
    TorchRL's Collector then does not run it when it is built."""

    in_keys = ["observation"]
    out_keys = ["action", "draw"]

    def __init__(self, n):
        super().__init__()
        self.net = RandomOneHot(n)
        self.spec = Composite(action=OneHot(n), draw=Categorical(n))

    def forward(self, td):
        action = self.net(td.get("observation"))
        td.set("action", action)
        td.set("draw", action.argmax(-1))
        return td


def float64_observations(env):
    return gym.wrappers.DtypeObservation(env, np.float64)


def discrete_actor(env, shared=False):
    spec = env.action_spec[(0,) * env.batch_dims]
    obs_dim = env.observation_spec["observation"].shape[-1]
    return mlp_actor_critic(
        obs_dim, 2, num_cells=[16], shared=shared, action_spec=spec
    )[0]


CASES = {
    # name: (make_env arguments, reward scale, policy, batches of [num_envs, T])
    "cartpole": ({"num_envs": 3}, None, discrete_actor, (3, 30)),
    "cartpole_truncated_scaled": (
        {"num_envs": 4, "max_episode_steps": 12},
        0.5,
        lambda env: discrete_actor(env, shared=True),
        (3, 20),
    ),
    "cartpole_one_env": ({"num_envs": 1}, None, discrete_actor, (3, 25)),
    "pendulum": (
        {
            "env_id": "Pendulum-v1",
            "num_envs": 2,
            "max_episode_steps": 8,
            "wrappers": (gym.wrappers.ClipAction,),
        },
        0.1,
        lambda env: gaussian_actor_sdn(3, 1, num_cells=[16])[0],
        (3, 10),
    ),
    # float64 observations, as MuJoCo's: make_env adds DoubleToFloat
    "cartpole_float64": (
        {"num_envs": 3, "wrappers": (float64_observations,)},
        None,
        discrete_actor,
        (2, 20),
    ),
    "minatar_breakout": (
        {"env_id": "MinAtar/Breakout-v1", "num_envs": 3},
        None,
        lambda env: minatar_actor_critic(4, 3)[0],
        (2, 20),
    ),
    "random_policy": (
        {"num_envs": 3},
        None,
        lambda env: TensorDictModule(RandomOneHot(2), ["observation"], ["action"]),
        (2, 15),
    ),
    "random_policy_with_spec": (
        {"num_envs": 3},
        None,
        lambda env: SpecifiedRandomPolicy(2),
        (2, 15),
    ),
}


def build_env(kwargs, scale=None, seed=SEED):
    kwargs = dict(kwargs)
    env = make_env(kwargs.pop("env_id", "CartPole-v1"), seed=seed, **kwargs)
    if scale is not None:
        env.append_transform(RewardScaling(loc=0.0, scale=scale))
    return env


def torchrl_collector(env, policy, frames):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Collector(
            env,
            policy,
            frames_per_batch=frames,
            total_frames=-1,
            storing_device="cpu",
            auto_register_policy_transforms=False,
        )


def lean_collector(env, policy, frames):
    return GymVectorCollector(env, policy, frames_per_batch=frames)


def collect(make, case, batches=None, torch_seed=11):
    env_kwargs, scale, make_policy, (n_batches, T) = CASES[case]
    env = build_env(env_kwargs, scale)
    torch.manual_seed(0)
    policy = make_policy(env)
    torch.manual_seed(torch_seed)
    collector = make(env, policy, env_kwargs["num_envs"] * T)
    iterator = iter(collector)
    out = [next(iterator) for _ in range(batches or n_batches)]
    collector.shutdown()
    return out


def assert_batches_equal(expected, got):
    assert got.batch_size == expected.batch_size
    assert got.names == expected.names == [None, "time"]
    keys = set(expected.keys(True, True))
    assert set(got.keys(True, True)) == keys
    for key in keys:
        a, b = expected.get(key), got.get(key)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), key
        assert torch.equal(a, b), f"{key}: {(a != b).nonzero()[:5].tolist()}"


@pytest.mark.parametrize("case", list(CASES))
def test_batches_equal_torchrl_collectors(case):
    expected = collect(torchrl_collector, case)
    got = collect(lean_collector, case)
    for want, have in zip(expected, got, strict=True):
        assert_batches_equal(want, have)
    # the paths that matter happened: episodes ended (by a time limit where one
    # is set, for some copies at a time and for all at once)
    batch = torch.cat(got, dim=1)
    done = batch["next", "done"].squeeze(-1)
    assert done.any()
    if case == "cartpole_truncated_scaled":
        truncated = batch["next", "truncated"].squeeze(-1)
        assert (truncated.any(0) & ~done.all(0)).any()
    if case in ("pendulum", "cartpole_one_env"):
        assert done.all(0).any()  # every copy ended in one step: a full reset


def test_batches_equal_torchrl_collectors_on_a_bare_gym_wrapper():
    # GymWrapper over a vector env, no transform added: its TransformedEnv holds
    # GymWrapper's auto-reset transform alone, not a Compose
    def bare_env():
        env = GymWrapper(
            gym.vector.SyncVectorEnv(
                [lambda: gym.make("CartPole-v1")] * 2,
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            )
        )
        env.set_seed(SEED)
        return env

    batches = []
    for make in (torchrl_collector, lean_collector):
        env = bare_env()
        torch.manual_seed(0)
        policy = discrete_actor(env)
        torch.manual_seed(11)
        collector = make(env, policy, 2 * 20)
        iterator = iter(collector)
        batches.append([next(iterator) for _ in range(2)])
        collector.shutdown()
    for want, have in zip(*batches, strict=True):
        assert_batches_equal(want, have)


def test_observations_match_a_plain_gymnasium_replay():
    """An independent reference: gymnasium's own vector env, reset with the seed
    then once more (make_env, then the collector), stepped with the recorded
    actions (and reset whole when every copy ended, as TorchRL does)."""
    n, max_steps = 4, 15
    env = make_env("CartPole-v1", num_envs=n, seed=SEED, max_episode_steps=max_steps)
    torch.manual_seed(0)
    collector = GymVectorCollector(env, discrete_actor(env), frames_per_batch=n * 40)
    batch = next(iter(collector))
    collector.shutdown()

    vec = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=max_steps)] * n,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    cartpole = vec.envs[0].unwrapped
    theta_max = cartpole.theta_threshold_radians
    vec.reset(seed=SEED)
    obs, _ = vec.reset()
    returns = np.zeros(n)
    ended = 0
    for t in range(batch.shape[1]):
        step = batch[:, t]
        np.testing.assert_array_equal(step["observation"].numpy(), obs)
        np.testing.assert_array_equal(step["episode_reward"].squeeze(-1), returns)
        action = step["action"].argmax(-1).numpy()
        obs, reward, terminated, truncated, info = vec.step(action)
        done = terminated | truncated
        final = obs.copy()
        for i in np.flatnonzero(done):
            final[i] = info["final_obs"][i]
            # the true last state: a termination left CartPole's bounds
            x, theta = final[i][0], final[i][2]
            outside = abs(x) > cartpole.x_threshold or abs(theta) > theta_max
            assert terminated[i] == outside
            assert not np.array_equal(final[i], obs[i])
            ended += 1
        nxt = step["next"]
        np.testing.assert_array_equal(nxt["observation"].numpy(), final)
        np.testing.assert_array_equal(nxt["reward"].squeeze(-1).numpy(), reward)
        np.testing.assert_array_equal(nxt["terminated"].squeeze(-1), terminated)
        np.testing.assert_array_equal(nxt["truncated"].squeeze(-1), truncated)
        returns = returns + reward
        np.testing.assert_array_equal(nxt["episode_reward"].squeeze(-1), returns)
        returns[done] = 0
        if done.all():
            obs, _ = vec.reset()
    assert ended >= n and batch["next", "truncated"].any()
    # a new trajectory id for every episode, in the order the copies end
    ids = batch["collector", "traj_ids"]
    assert (ids[:, 0] == torch.arange(n)).all()
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[:, 1:] = batch["next", "done"].squeeze(-1)[:, :-1]
    new = ids[starts]
    assert sorted(new.tolist()) == list(range(n, n + len(new)))
    assert ((ids[:, 1:] != ids[:, :-1]) == starts[:, 1:]).all()


@pytest.mark.parametrize(
    "saver, loader",
    [("lean", "lean"), ("torchrl", "lean"), ("lean", "torchrl")],
)
def test_a_restored_collector_continues_the_batches(saver, loader):
    """k batches, the state saved, one more batch; a collector built afresh on
    an environment seeded elsewhere, given the state (and the torch random state
    of the moment), collects the same batch."""
    make = {"lean": lean_collector, "torchrl": torchrl_collector}
    env_kwargs = {"num_envs": 3, "max_episode_steps": 12}
    frames = 3 * 20
    env = build_env(env_kwargs)
    torch.manual_seed(0)
    policy = discrete_actor(env)
    original = make[saver](env, policy, frames)
    iterator = iter(original)
    for _ in range(2):
        next(iterator)
    state = collector_state_dict(original)
    assert state["saved"] and state["frames"] == 2 * frames
    rng = torch.get_rng_state()
    expected = next(iterator)
    original.shutdown()

    torch.manual_seed(99)
    fresh = make[loader](build_env(env_kwargs, seed=SEED + 100), policy, frames)
    load_collector_state_dict(fresh, state)
    torch.set_rng_state(rng)
    got = next(iter(fresh))
    fresh.shutdown()
    # what a TorchRL Collector carries besides (the last step's policy outputs)
    # is not part of a batch; everything else is
    assert_batches_equal(expected, got)
    assert int(got["collector", "traj_ids"].min()) > 0
    assert (got["episode_reward"][:, 0] > 0).any()  # episodes went on


def test_refuses_what_it_does_not_reproduce():
    def refuses(env, policy, match):
        with pytest.raises(ValueError, match=match):
            GymVectorCollector(env, policy, frames_per_batch=4)
        env.close()

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    policy = discrete_actor(env)
    env.append_transform(InitTracker())
    refuses(env, policy, "transform InitTracker.*TorchRL's Collector")

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    reads_state = TensorDictModule(
        lambda obs, h: obs, ["observation", "recurrent_state"], ["action"]
    )
    refuses(env, reads_state, "reads 'recurrent_state'.*no recurrent state")

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    refuses(env, lambda td: td, "needs a TensorDict module")

    # DoubleToFloat after the reward transforms would cast episode_reward too
    env = GymWrapper(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make("CartPole-v1")] * 2,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    )
    env.append_transform(RewardSum())
    env.append_transform(DoubleToFloat())
    refuses(env, policy, "DoubleToFloat before the reward transforms")

    single = GymWrapper(gym.make("CartPole-v1"))
    refuses(single, policy, "got GymWrapper around .*TorchRL's Collector")

    next_step = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2,
        autoreset_mode=gym.vector.AutoresetMode.DISABLED,
    )
    refuses(GymWrapper(next_step), policy, "autoreset_mode=SAME_STEP")


def test_trainer_with_lean_backend_trains_as_with_single(tmp_path):
    """The trainer, from the example's config with collector.backend=lean, ends
    where it ends with the single backend: same parameters, same replay; and
    resumed from the single backend's checkpoint, it goes on as single does."""
    runs = {}
    for backend in ("single", "lean"):
        trainer = small_trainer(
            tmp_path / backend,
            **{"collector.backend": backend, "collector.total_frames": 60},
        )
        assert isinstance(trainer.collector, GymVectorCollector) == (backend == "lean")
        # it acts with the learner's own policy: no weights to push
        assert not any(isinstance(m, PolicyVersion) for m in trainer._modules.values())
        trainer.train()
        close_trainer(trainer)
        runs[backend] = trainer
    single, lean = runs["single"], runs["lean"]
    assert lean.collected_frames == single.collected_frames == 60
    assert lean._optim_count == single._optim_count
    mine, theirs = single.loss_module.state_dict(), lean.loss_module.state_dict()
    for key, value in mine.items():
        assert torch.equal(value, theirs[key]), key
    a, b = single.schedule.replay_buffer, lean.schedule.replay_buffer
    assert len(a) == len(b) > 0
    assert (a.storage[: len(a)] == b.storage[: len(b)]).all()
    assert lean.evaluation.last == single.evaluation.last

    resumed = {}
    for backend in ("single", "lean"):
        # a copy of the single backend's run for each (a run directory takes
        # checkpoints of its own run only)
        run_dir = tmp_path / f"resumed_{backend}"
        shutil.copytree(tmp_path / "single", run_dir)
        trainer = resume_small_trainer(
            run_dir,
            seed=7,  # everything it builds starts elsewhere
            resume_allow_config_change=["seed"],
            **{"collector.backend": backend, "collector.total_frames": 80},
        )
        assert (
            trainer.environments[0]
            .notes[0]
            .startswith("training environments: state restored")
        )
        trainer.train()
        close_trainer(trainer)
        resumed[backend] = trainer.loss_module.state_dict()
    for key, value in resumed["single"].items():
        assert torch.equal(value, resumed["lean"][key]), key
    assert any(not torch.equal(v, mine[k]) for k, v in resumed["lean"].items())


def test_policy_weights_update_in_place():
    env = make_env("CartPole-v1", num_envs=2, seed=0)
    torch.manual_seed(0)
    policy = discrete_actor(env)
    collector = GymVectorCollector(env, policy, frames_per_batch=4)
    other = discrete_actor(env)
    before = TensorDict.from_module(policy).clone()
    collector.update_policy_weights_()  # the policy is the learner's own
    assert (TensorDict.from_module(policy) == before).all()
    collector.update_policy_weights_(TensorDict.from_module(other))
    assert (TensorDict.from_module(policy) == TensorDict.from_module(other)).all()
    collector.shutdown()


def test_restarted_episodes_are_torchrls():
    """Where a checkpoint holds no environment state, the trainer seeds and
    resets the collector (``restart_episodes``): both collectors then start the
    same episodes, with the same fresh trajectory ids."""
    batches = {}
    for name, make in (("torchrl", torchrl_collector), ("lean", lean_collector)):
        env = build_env({"num_envs": 3})
        torch.manual_seed(0)
        collector = make(env, discrete_actor(env), 3 * 10)
        iterator = iter(collector)
        next(iterator)
        restart_episodes(collector, 1234)
        torch.manual_seed(5)
        batches[name] = next(iterator)
        collector.shutdown()
    assert_batches_equal(batches["torchrl"], batches["lean"])
    reference = make_env("CartPole-v1", num_envs=3, seed=1234)
    first = batches["lean"]["observation"][:, 0]
    assert torch.equal(first, reference.reset()["observation"])
    assert (batches["lean"]["collector", "traj_ids"][:, 0] >= 3).all()
    reference.close()


def test_auto_backend_is_lean_where_it_reproduces_single(tmp_path, capsys):
    """``collector.backend=auto`` (the gym example's default) collects with
    GymVectorCollector where it reproduces TorchRL's Collector and with the
    Collector elsewhere, saying why; ``lean`` refuses instead."""
    trainer = small_trainer(tmp_path / "feed_forward", **{"collector.backend": "auto"})
    assert isinstance(trainer.collector, GymVectorCollector)
    close_trainer(trainer)
    recurrent = {"model.recurrent": "lstm", "model.recurrent_size": 8}
    trainer = small_trainer(
        tmp_path / "lstm", **{"collector.backend": "auto", **recurrent}
    )
    assert type(trainer.collector) is Collector
    close_trainer(trainer)
    assert (
        "collector.backend=auto: TorchRL's Collector, since GymVectorCollector "
        "does not reproduce the transform InitTracker"
    ) in capsys.readouterr().out
    with pytest.raises(ValueError, match="transform InitTracker"):
        small_trainer(tmp_path / "lean", **{"collector.backend": "lean", **recurrent})


def test_auto_backend_raises_what_the_policy_raises(capsys):
    """``auto`` falls back to TorchRL's Collector on a refusal only: a policy that
    fails on the first observation fails the same way, with no fallback."""
    cfg = gym_config({}, **{"collector.backend": "auto", "env.num_envs": 2})
    env = make_env("CartPole-v1", num_envs=2, seed=0)

    def broken(observation):
        raise ValueError("broken policy")

    policy = TensorDictModule(broken, ["observation"], ["action"])
    with pytest.raises(ValueError, match="broken policy"):
        make_collector(cfg, None, policy, device=None, env=env)
    assert "TorchRL's Collector" not in capsys.readouterr().out
    env.close()


def test_auto_backend_collects_torchrls_serial_env_with_its_collector(capsys):
    # a SerialEnv not started yet forwards attribute lookups to copies it has not
    # built: the refusal names it, and auto falls back to TorchRL's Collector
    from torchrl.envs import GymEnv, SerialEnv

    cfg = gym_config({}, **{"collector.backend": "auto", "env.num_envs": 2})
    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    policy = discrete_actor(env)
    collector = make_collector(cfg, None, policy, device=None, env=env)
    assert type(collector) is Collector
    assert "GymVectorCollector steps a gymnasium vector env in TorchRL's " in (
        capsys.readouterr().out
    )
    assert next(iter(collector)).shape == (2, cfg.collector.T)
    collector.shutdown()
