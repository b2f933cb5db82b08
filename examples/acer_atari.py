"""ACER on Atari (ALE/<Game>-v5), with OpenAI baselines' ACER settings.

    python examples/acer_atari.py                           # ALE/Pong-v5
    python examples/acer_atari.py env.name=ALE/Breakout-v5 collector.total_frames=1_000_000

Settings are in ``config_atari.yaml`` (with the run settings all examples share in
``run/default.yaml``); steps count agent steps (4 frames each).
The environments, networks and replay are in ``utils_atari.py``.
The games run with the DeepMind preprocessing in the ALE's vector environment
(:func:`torchrl_acer.training.atari.make_atari_env`); the loss trains on rewards clipped to
their sign, with a lost life ending the training episode, while scores and
evaluation use real games. The DQN conv trunk feeds a policy head and a Q head.
Replay stores each 84x84 frame once (:class:`torchrl_acer.FrameStackReplayBuffer`).

The script builds each piece in turn (environment, networks, loss, optimizer,
collector, replay, evaluator, logger) and hands them to
:class:`torchrl_acer.trainers.ACERTrainer`, TorchRL's ``Trainer`` wired for ACER's
loop. What all examples add around it (checkpoints, the guards, evaluation and
logs as trainer hooks; the run directory, resume and the final summary) is
:mod:`torchrl_acer.training.experiment`'s ``make_trainer`` and ``train``.
"""

import functools

import hydra
from omegaconf import DictConfig
from utils_atari import TRAINING_KEYS, make_env, make_models

from torchrl_acer.training.experiment import (
    make_collector,
    make_evaluator,
    make_logger,
    make_loss,
    make_optimizer,
    make_replay,
    make_trainer,
    setup,
    train,
)
from torchrl_acer.training.refusal import report_refusals


@hydra.main(config_path=".", config_name="config_atari", version_base="1.3")
@report_refusals  # a refusal ends with its message alone (HYDRA_FULL_ERROR=1: traceback)
def main(cfg: DictConfig) -> None:
    # -- config checked (refusing values that cannot work, naming the setting), run
    # directory (logs, checkpoints, config.yaml, summary.json), device (networks,
    # loss, optimizer; envs on the CPU), threads and seed
    run_dir, device = setup(cfg)

    # -- environment: num_envs games, with the training signals the loss reads -------
    env = make_env(cfg, cfg.env.num_envs, seed=cfg.seed)

    # -- models: the DQN conv trunk, shared by the policy (actor) and the Q critic ---
    actor, critic = make_models(env)
    actor, critic = actor.to(device), critic.to(device)

    # -- loss: ACER's policy, critic and entropy terms, Retrace targets --------------
    loss = make_loss(cfg.loss, actor, critic)
    loss.set_keys(**TRAINING_KEYS)  # clipped rewards; a lost life ends the episode
    if cfg.compile:
        loss.compile()  # its forward only: parameters and checkpoints stay as they are

    # -- optimizer (the trainer keeps the averaged policy: SoftUpdate, loss.alpha) ---
    optimizer = make_optimizer(cfg.optim, loss.parameters())

    # -- collector: [num_envs, T] batches, with the behaviour log-probabilities ------
    # collector.backend: this process, or num_workers processes or Ray actors, each
    # stepping num_envs envs with a copy of the policy the trainer keeps updated
    collector = make_collector(
        cfg, functools.partial(make_env, cfg), actor, device=device, env=env
    )

    # -- replay: segments of T steps, each frame stored once (replay.ratio 0: none) -
    replay = make_replay(cfg, frame_stacks=True)

    # -- evaluator (greedy policy, one real game per env) and logger -----------------
    evaluator = make_evaluator(
        cfg, functools.partial(make_env, cfg, training_signals=False), actor
    )
    logger = make_logger(cfg.logger.backend, run_dir)  # csv: step,value rows

    # -- the loop: ACERTrainer with the run settings' hooks (checkpoints, guards,
    # evaluation, logs), then the final summary: summary.json, the last greedy
    # evaluation, the plot
    trainer = make_trainer(
        cfg,
        run_dir,
        collector=collector,
        loss=loss,
        optimizer=optimizer,
        replay=replay,
        evaluator=evaluator,
        logger=logger,
    )
    train(trainer, cfg, run_dir)


if __name__ == "__main__":
    main()
