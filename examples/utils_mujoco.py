"""Environments and networks for ``acer_mujoco.py``: Box-action gymnasium tasks."""

from __future__ import annotations

import gymnasium as gym
from omegaconf import DictConfig

from torchrl_acer.modules.models import gaussian_actor_sdn
from torchrl_acer.training.envs import check_vector_observation
from torchrl_acer.training.envs import make_env as make_gym_env


def make_env(cfg: DictConfig, num_envs: int, seed: int):
    """``num_envs`` copies of ``cfg.env.name`` as one batched env (on the CPU); each
    copy clips its actions to the action bounds, since the policy's Gaussian is
    unbounded (so its log-probabilities stay exact)."""
    return make_gym_env(
        cfg.env.name,
        num_envs=num_envs,
        parallel=cfg.env.parallel,
        seed=seed,
        max_episode_steps=cfg.env.max_episode_steps,
        action_space="continuous",
        wrappers=(gym.wrappers.ClipAction,),
    )


def make_models(cfg: DictConfig, env):
    """``(actor, critic)``: a Gaussian MLP policy, its mean squashed into the action
    bounds if ``cfg.model.bound_mean``, and a stochastic dueling network (or, with
    ``cfg.model.dueling=false``, a plain Q critic)."""
    check_vector_observation(
        env, cfg.env.name, takes="this example's MLPs take float vectors"
    )
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_dim = env.action_spec.shape[-1]
    loc_bounds = None
    if cfg.model.bound_mean:
        # read from the task itself: the clipping wrapper widens the env's spec
        probe = gym.make(cfg.env.name)
        loc_bounds = (probe.action_space.low, probe.action_space.high)
        probe.close()
    return gaussian_actor_sdn(
        obs_dim,
        action_dim,
        num_cells=cfg.model.num_cells,
        fixed_scale=cfg.model.fixed_scale,
        initial_scale=cfg.model.get("initial_scale", 1.0),
        num_samples=cfg.model.num_samples,
        loc_bounds=loc_bounds,
        dueling=cfg.model.dueling,
    )
