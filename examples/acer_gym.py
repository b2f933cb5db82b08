"""ACER on gymnasium tasks with vector observations, and on MinAtar.

    python examples/acer_gym.py                                # CartPole-v1
    python examples/acer_gym.py env.name=Acrobot-v1 seed=3
    python examples/acer_gym.py env.name=MinAtar/Breakout-v1 collector.total_frames=1_000_000
    python examples/acer_gym.py resume=runs/CartPole-v1/seed0-.../checkpoints/last.pt

Settings are in ``config_gym.yaml``. Vector observations get MLPs; MinAtar's
10x10xC grids get the MinAtar paper's small conv net with a policy head and a Q
head. The training loop is :class:`torchrl_acer.training.trainer.ACERTrainer`, built from
the config by :func:`torchrl_acer.training.experiment.run`.
"""

import hydra
from omegaconf import DictConfig

from torchrl_acer.modules.models import minatar_actor_critic, mlp_actor_critic
from torchrl_acer.training.envs import is_minatar, make_env
from torchrl_acer.training.experiment import Experiment, run


@hydra.main(config_path=".", config_name="config_gym", version_base="1.3")
def main(cfg: DictConfig) -> None:
    def make_train_env(num_envs, seed):
        return make_env(
            cfg.env.name,
            num_envs=num_envs,
            parallel=cfg.env.parallel,
            seed=seed,
            max_episode_steps=cfg.env.max_episode_steps,
        )

    def make_models(env):
        obs_shape = env.observation_spec["observation"].shape[env.batch_dims :]
        num_actions = env.action_spec.shape[-1]
        action_spec = env.action_spec[(0,) * env.batch_dims]
        if is_minatar(cfg.env.name):
            return minatar_actor_critic(
                obs_shape[-1], num_actions, action_spec=action_spec
            )
        return mlp_actor_critic(
            obs_shape[-1],
            num_actions,
            num_cells=cfg.model.num_cells,
            shared=cfg.model.shared,
            activation=cfg.model.activation,
            action_spec=action_spec,
        )

    run(cfg, Experiment(make_train_env, make_train_env, make_models))


if __name__ == "__main__":
    main()
