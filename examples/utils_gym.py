"""Environments and networks for ``acer_gym.py``: gymnasium vector tasks and MinAtar."""

from __future__ import annotations

from omegaconf import DictConfig

from torchrl_acer.modules.models import minatar_actor_critic, mlp_actor_critic
from torchrl_acer.training.envs import is_minatar
from torchrl_acer.training.envs import make_env as make_gym_env


def make_env(cfg: DictConfig, num_envs: int, seed: int):
    """``num_envs`` copies of ``cfg.env.name`` stepped as one batched env (on the CPU),
    with each episode's return under ``("next", "episode_reward")``."""
    return make_gym_env(
        cfg.env.name,
        num_envs=num_envs,
        parallel=cfg.env.parallel,
        seed=seed,
        max_episode_steps=cfg.env.max_episode_steps,
        action_space="discrete",
    )


def make_models(cfg: DictConfig, env):
    """``(actor, critic)``: MLPs on vector observations, or the MinAtar paper's small
    conv net shared by a policy head and a Q head on MinAtar's 10x10xC grids."""
    obs_shape = env.observation_spec["observation"].shape[env.batch_dims :]
    num_actions = env.action_spec.shape[-1]
    action_spec = env.action_spec[(0,) * env.batch_dims]
    if is_minatar(cfg.env.name):
        return minatar_actor_critic(obs_shape[-1], num_actions, action_spec=action_spec)
    return mlp_actor_critic(
        obs_shape[-1],
        num_actions,
        num_cells=cfg.model.num_cells,
        shared=cfg.model.shared,
        activation=cfg.model.activation,
        action_spec=action_spec,
    )
