"""Environments the networks cannot take are refused at build time, naming the space."""

import pytest

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
