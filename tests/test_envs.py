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
