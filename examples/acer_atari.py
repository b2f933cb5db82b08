"""ACER on Atari (ALE/<Game>-v5), with OpenAI baselines' ACER settings.

    python examples/acer_atari.py                           # ALE/Pong-v5
    python examples/acer_atari.py env.name=ALE/Breakout-v5 collector.total_frames=1_000_000

Settings are in ``config_atari.yaml``; steps count agent steps (4 frames each).
The games run with the DeepMind preprocessing in the ALE's vector environment
(:func:`torchrl_acer.training.atari.make_atari_env`); the loss trains on rewards clipped to
their sign, with a lost life ending the training episode, while scores and
evaluation use real games. The DQN conv trunk feeds a policy head and a Q head.
Replay stores each 84x84 frame once (:class:`torchrl_acer.FrameStackReplayBuffer`).
The training loop is :class:`torchrl_acer.training.trainer.ACERTrainer`.
"""

import hydra
from omegaconf import DictConfig

from torchrl_acer.modules.models import atari_actor_critic
from torchrl_acer.training.atari import make_atari_env
from torchrl_acer.training.experiment import Experiment, run
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer


@hydra.main(config_path=".", config_name="config_atari", version_base="1.3")
def main(cfg: DictConfig) -> None:
    def make_env(num_envs, seed, training_signals=True):
        return make_atari_env(
            cfg.env.name,
            num_envs=num_envs,
            seed=seed,
            repeat_action_probability=cfg.env.repeat_action_probability,
            num_threads=cfg.env.num_threads,
            training_signals=training_signals,
        )

    def make_eval_env(num_envs, seed):
        return make_env(num_envs, seed, training_signals=False)

    def make_models(env):
        action_spec = env.action_spec[0]
        return atari_actor_critic(action_spec.shape[-1], action_spec=action_spec)

    def make_replay(capacity_steps, T, batch_segments):
        num_envs = cfg.env.num_envs
        return FrameStackReplayBuffer(
            num_envs, capacity_steps // num_envs, T, batch_segments
        )

    experiment = Experiment(
        make_env,
        make_eval_env,
        make_models,
        make_replay=make_replay,
        # rewards clipped to their sign; a lost life ends the training episode
        loss_keys={
            "reward": "reward_clipped",
            "done": "train_done",
            "terminated": "train_terminated",
        },
    )
    run(cfg, experiment)


if __name__ == "__main__":
    main()
