"""Environments and networks for ``acer_gym.py``: gymnasium vector tasks and MinAtar."""

from __future__ import annotations

import functools

from omegaconf import DictConfig
from torchrl.envs import InitTracker, RewardScaling

from torchrl_acer.modules.models import (
    minatar_actor_critic,
    mlp_actor_critic,
    recurrent_primer,
)
from torchrl_acer.training.envs import (
    SelectObservation,
    check_vector_observation,
    is_minatar,
)
from torchrl_acer.training.envs import make_env as make_gym_env


def make_env(cfg: DictConfig, num_envs: int, seed: int):
    """``num_envs`` copies of ``cfg.env.name`` stepped as one batched env (on the CPU),
    with each episode's return under ``("next", "episode_reward")``; only the
    observation entries ``env.observation_indices`` if set; rewards multiplied by
    ``env.reward_scale`` after the return is summed (logged returns stay the task's);
    with a recurrent model, ``is_init`` flags (``InitTracker``) and the core's
    hidden-state entries."""
    indices = cfg.env.get("observation_indices")
    wrappers = (
        []
        if indices is None
        else [functools.partial(SelectObservation, indices=list(indices))]
    )
    env = make_gym_env(
        cfg.env.name,
        num_envs=num_envs,
        parallel=cfg.env.parallel,
        seed=seed,
        max_episode_steps=cfg.env.max_episode_steps,
        action_space="discrete",
        wrappers=wrappers,
    )
    reward_scale = cfg.env.get("reward_scale", 1.0)
    if reward_scale != 1.0:
        # after make_gym_env's RewardSum: "episode_reward" sums the unscaled rewards
        env.append_transform(RewardScaling(loc=0.0, scale=reward_scale))
    recurrent = cfg.model.get("recurrent")
    if recurrent is not None:
        env.append_transform(InitTracker())
        env.append_transform(recurrent_primer(recurrent, cfg.model.recurrent_size))
    return env


def make_models(cfg: DictConfig, env):
    """``(actor, critic)``: MLPs on vector observations, or the MinAtar paper's small
    conv net shared by a policy head and a Q head on MinAtar's 10x10xC grids."""
    if not is_minatar(cfg.env.name):
        check_vector_observation(
            env,
            cfg.env.name,
            takes="this example's MLPs take float vectors, its conv net MinAtar's "
            "10x10xC grids (env.name=MinAtar/...); for Atari games use "
            "examples/acer_atari.py",
        )
    obs_shape = env.observation_spec["observation"].shape[env.batch_dims :]
    num_actions = env.action_spec.shape[-1]
    action_spec = env.action_spec[(0,) * env.batch_dims]
    recurrent = {
        "recurrent": cfg.model.get("recurrent"),
        "recurrent_size": cfg.model.get("recurrent_size"),
    }
    if is_minatar(cfg.env.name):
        return minatar_actor_critic(
            obs_shape[-1], num_actions, action_spec=action_spec, **recurrent
        )
    return mlp_actor_critic(
        obs_shape[-1],
        num_actions,
        num_cells=cfg.model.num_cells,
        shared=cfg.model.shared,
        activation=cfg.model.activation,
        action_spec=action_spec,
        **recurrent,
    )
