"""Environments the networks cannot take are refused at build time, naming the space;
the ones built name their device."""

import pytest
import torch

from torchrl_acer.training.envs import make_env


@pytest.mark.parametrize(
    "env_id, space", [("Blackjack-v1", "Tuple"), ("FrozenLake-v1", "Discrete")]
)
def test_observation_space_that_is_not_a_box_is_named(env_id, space):
    with pytest.raises(ValueError, match=f"observation space {space}"):
        make_env(env_id, num_envs=2)


def test_continuous_task_for_a_discrete_policy_points_to_the_mujoco_example():
    with pytest.raises(ValueError, match="Box.*acer_mujoco.py"):
        make_env("Pendulum-v1", num_envs=2, action_space="discrete")


def test_discrete_task_for_a_gaussian_policy_points_to_the_gym_example():
    with pytest.raises(ValueError, match="Discrete.*acer_gym.py"):
        make_env("CartPole-v1", num_envs=2, action_space="continuous")


@pytest.mark.parametrize(
    "env_id, kind", [("CartPole-v1", "discrete"), ("Pendulum-v1", "continuous")]
)
def test_matching_spaces_build(env_id, kind):
    env = make_env(env_id, num_envs=2, action_space=kind)
    assert env.batch_size == (2,)
    env.close()


def test_action_space_is_checked_before_wrappers_that_assume_it():
    # ClipAction asserts a Box action space: the refusal must come first
    import gymnasium as gym

    with pytest.raises(ValueError, match="Discrete.*acer_gym.py"):
        make_env(
            "CartPole-v1",
            num_envs=2,
            action_space="continuous",
            wrappers=(gym.wrappers.ClipAction,),
        )


def test_selected_observation_entries_are_the_kept_ones():
    """CartPole without its velocities: entries 0 and 2 of what the same env
    without the wrapper observes, step after step, resets included."""
    import functools

    import torch

    from torchrl_acer.training.envs import SelectObservation

    kept = make_env(
        "CartPole-v1",
        num_envs=2,
        seed=5,
        wrappers=[functools.partial(SelectObservation, indices=[0, 2])],
    )
    full = make_env("CartPole-v1", num_envs=2, seed=5)
    actions = torch.nn.functional.one_hot(torch.tensor([0, 1]), 2)
    a, b = kept.reset(), full.reset()
    assert a["observation"].shape == (2, 2)
    for _ in range(40):  # long enough for episodes to end
        assert torch.equal(a["observation"], b["observation"][:, [0, 2]])
        a["action"], b["action"] = actions, actions
        a, b = kept.step_and_maybe_reset(a)[1], full.step_and_maybe_reset(b)[1]


@pytest.mark.parametrize("indices", [[4], [0, 0], []])
def test_bad_observation_indices_are_named(indices):
    import functools

    from torchrl_acer.training.envs import SelectObservation

    with pytest.raises(ValueError, match="observation_indices"):
        make_env(
            "CartPole-v1",
            wrappers=[functools.partial(SelectObservation, indices=indices)],
        )


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_primer_declares_the_cores_state(kind):
    from tensordict.nn import TensorDictModule
    from torch import nn

    from torchrl_acer.modules.models import recurrent_core, recurrent_primer

    trunk, _ = recurrent_core(
        TensorDictModule(nn.Linear(3, 5), ["x"], ["embed"]), 5, kind, 7
    )
    core = trunk[1]  # encoder, core, skip concatenation
    assert recurrent_primer(kind, 7).primers == core.make_tensordict_primer().primers


class TestCueRecall:
    """The memory task of the recurrent benchmark: its rules, played by hand."""

    def play(self, env, policy, seed):
        obs, _ = env.reset(seed=seed)
        cue, observations, rewards = obs[0], [obs], []
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(cue))
            observations.append(obs)
            rewards.append(reward)
            done = terminated or truncated
        return cue, observations, rewards, terminated

    @pytest.mark.parametrize("delay", [1, 4])
    def test_naming_the_cue_earns_one_and_the_other_action_minus_one(self, delay):
        from torchrl_acer.training.cue_recall import CueRecallEnv

        env = CueRecallEnv(delay=delay)
        cues = set()
        for seed in range(8):
            right = self.play(env, lambda cue: int(cue > 0), seed)
            wrong = self.play(env, lambda cue: int(cue < 0), seed)
            cue, observations, rewards, terminated = right
            cues.add(float(cue))
            assert terminated and len(rewards) == delay + 1
            assert rewards == [0.0] * delay + [1.0]
            assert wrong[2] == [0.0] * delay + [-1.0]
            # the cue on the first observation only, the decision flag on the last
            assert [float(o[0]) for o in observations[: delay + 1]] == [cue] + [
                0.0
            ] * delay
            assert [float(o[1]) for o in observations[: delay + 1]] == [0.0] * delay + [
                1.0
            ]
        assert cues == {-1.0, 1.0}

    def test_actions_before_the_decision_change_nothing(self):
        from torchrl_acer.training.cue_recall import CueRecallEnv

        env = CueRecallEnv(delay=3)
        env.reset(seed=0)
        firsts = [env.step(a)[:3] for a in (0, 1, 1)]
        env.reset(seed=0)
        seconds = [env.step(a)[:3] for a in (1, 0, 0)]
        for (o1, r1, d1), (o2, r2, d2) in zip(firsts, seconds, strict=True):
            assert (o1 == o2).all() and r1 == r2 == 0.0 and not d1 and not d2

    def test_registered_id_builds_as_a_torchrl_env(self):
        from torchrl_acer.training.cue_recall import ENV_ID

        env = make_env(ENV_ID, num_envs=2, action_space="discrete", seed=0)
        td = env.rollout(16, break_when_any_done=False)
        assert td["observation"].shape == (2, 16, 2)
        assert td["next", "reward"].abs().sum() > 0

    def test_a_bad_delay_is_named(self):
        from torchrl_acer.training.cue_recall import CueRecallEnv

        with pytest.raises(ValueError, match="delay"):
            CueRecallEnv(delay=0)


class _GridTask:
    """A task observing 4x5 float grids, with two actions."""

    @staticmethod
    def make():
        import gymnasium as gym
        import numpy as np

        class Grid(gym.Env):
            observation_space = gym.spaces.Box(0.0, 1.0, (4, 5), np.float32)
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return self.observation_space.sample(), {}

            def step(self, action):
                return self.observation_space.sample(), 0.0, False, False, {}

        return Grid()


def test_observations_other_than_float_vectors_are_refused_naming_the_shape():
    import gymnasium as gym

    from torchrl_acer.training.envs import check_vector_observation
    from torchrl_acer.training.refusal import ConfigError

    if "GridObs-v0" not in gym.registry:
        gym.register("GridObs-v0", entry_point=_GridTask.make)
    env = make_env("GridObs-v0", num_envs=2)
    with pytest.raises(
        ConfigError,
        match=r"env.name='GridObs-v0' observes float32 arrays of shape \(4, 5\); "
        r"MLPs take vectors",
    ):
        check_vector_observation(env, "GridObs-v0", takes="MLPs take vectors")
    env.close()
    env = make_env("CartPole-v1", num_envs=2)
    check_vector_observation(env, "CartPole-v1", takes="MLPs take vectors")
    env.close()


@pytest.mark.parametrize(
    "script, env_id, module, shape",
    [
        ("acer_gym.py", "ALE/Pong-v5", "ale_py", "uint8 arrays of shape (210, 160, 3)"),
        (
            "acer_mujoco.py",
            "CarRacing-v3",
            "Box2D",
            "uint8 arrays of shape (96, 96, 3)",
        ),
    ],
)
def test_the_examples_refuse_observations_their_networks_cannot_take(
    tmp_path, script, env_id, module, shape
):
    """Before: the first step failed inside the collector (``mat1 and mat2 must
    have the same dtype``), with a traceback."""
    pytest.importorskip(module)
    from builders import run_example

    run = tmp_path / "run"
    out = run_example(
        script,
        f"env.name={env_id}",
        "env.num_envs=1",
        "eval.episodes=1",
        f"logger.run_dir={run}",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    message = out.stderr.strip().splitlines()[-1]  # after the ALE's banner
    assert message.startswith(f"env.name={env_id!r} observes {shape}; "), message
    assert "take float vectors" in message and "Traceback" not in out.stderr
    # refused before training: nothing to resume, no checkpoint written
    assert "resume" not in (out.stdout + out.stderr).lower()
    assert not (run / "checkpoints").exists()


def test_the_env_names_its_device_so_a_gpu_policys_actions_come_back():
    """TorchRL's Collector moves the policy's outputs to ``env.device`` before a
    step, and nowhere when the env names none (GymWrapper's default): a policy on a
    GPU then handed CUDA tensors to this CPU env, which failed at its first partial
    reset (found by bench/gpu_check.sh on a lent H200)."""
    env = make_env("CartPole-v1", num_envs=2)
    assert env.device == torch.device("cpu")
    env.close()
