"""Environments and networks for ``acer_atari.py``."""

from __future__ import annotations

from omegaconf import DictConfig

from torchrl_acer.modules.models import atari_actor_critic
from torchrl_acer.training.atari import make_atari_env

# The loss trains on rewards clipped to their sign, with a lost life ending the
# training episode (entries written by the environment's AtariTrainingSignals).
TRAINING_KEYS = {
    "reward": "reward_clipped",
    "done": "train_done",
    "terminated": "train_terminated",
}


def make_env(cfg: DictConfig, num_envs: int, seed: int, training_signals=True):
    """``num_envs`` games of ``cfg.env.name`` with the DeepMind preprocessing, in the
    ALE's vector environment (on the CPU). ``training_signals=False`` for
    evaluation: real games, no clipped rewards or life-loss episode ends."""
    return make_atari_env(
        cfg.env.name,
        num_envs=num_envs,
        seed=seed,
        repeat_action_probability=cfg.env.repeat_action_probability,
        num_threads=cfg.env.num_threads,
        training_signals=training_signals,
    )


def make_models(env):
    """``(actor, critic)``: the DQN conv trunk shared by a policy head and a Q head."""
    action_spec = env.action_spec[0]
    return atari_actor_critic(action_spec.shape[-1], action_spec=action_spec)
