"""Continuous-action ACER (paper section 5) on Box-action gymnasium tasks.

    python examples/acer_mujoco.py                        # HalfCheetah-v5 (mujoco extra)
    python examples/acer_mujoco.py env.name=Pendulum-v1   # no MuJoCo needed

Settings are in ``config_mujoco.yaml``: the paper's continuous ACER (fully
off-policy, T = 50, averaged-policy decay 0.995, c = 5) with a fixed policy scale
of 0.1 and a trust-region bound of 2 (with the paper's scale 0.3, HalfCheetah-v5
learned more slowly and ended lower; with a bound of 1 it ended a little lower, by
less than the spread between seeds).
The policy is a Gaussian MLP whose mean is squashed into the action bounds
(``model.bound_mean``; the Gaussian itself is not squashed), the critic a stochastic dueling network
(:class:`torchrl_acer.StochasticDuelingNetwork`); actions are clipped to the
action bounds by the environment, so the policy's log-probabilities stay exact.
The training loop is :class:`torchrl_acer.training.trainer.ACERTrainer`.
"""

import gymnasium as gym
import hydra
from omegaconf import DictConfig

from torchrl_acer.modules.models import gaussian_actor_sdn
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import Experiment, run


@hydra.main(config_path=".", config_name="config_mujoco", version_base="1.3")
def main(cfg: DictConfig) -> None:
    def make_train_env(num_envs, seed):
        return make_env(
            cfg.env.name,
            num_envs=num_envs,
            parallel=cfg.env.parallel,
            seed=seed,
            max_episode_steps=cfg.env.max_episode_steps,
            # the policy's Gaussian is unbounded; the environment clips its actions
            wrappers=(gym.wrappers.ClipAction,),
        )

    def make_models(env):
        obs_dim = env.observation_spec["observation"].shape[-1]
        action_dim = env.action_spec.shape[-1]
        loc_bounds = None
        if cfg.model.bound_mean:
            # the mean inside the action bounds (the Gaussian stays unsquashed); read
            # from the task itself: the clipping wrapper widens the env's spec
            probe = gym.make(cfg.env.name)
            loc_bounds = (probe.action_space.low, probe.action_space.high)
            probe.close()
        return gaussian_actor_sdn(
            obs_dim,
            action_dim,
            num_cells=cfg.model.num_cells,
            fixed_scale=cfg.model.fixed_scale,
            num_samples=cfg.model.num_samples,
            loc_bounds=loc_bounds,
            dueling=cfg.model.dueling,
        )

    run(cfg, Experiment(make_train_env, make_train_env, make_models))


if __name__ == "__main__":
    main()
