# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Continuous-action ACER (Wang et al. 2017, section 5) on MuJoCo tasks.

The paper's continuous setting: fully off-policy updates (every update trains
on replayed segments of T = 50 steps), a Gaussian policy with a fixed scale, a
stochastic dueling network as critic, traces min(1, rho^(1/d)) and a trust
region around an averaged policy (decay 0.995).
"""

from __future__ import annotations

import hydra
import torch
import torch.optim
from omegaconf import DictConfig
from torchrl import torchrl_logger
from torchrl._utils import get_available_device
from torchrl.collectors import Collector
from torchrl.envs import ExplorationType, set_exploration_type
from torchrl.record.loggers import generate_exp_name, get_logger
from torchrl.trainers import LogScalar
from utils_mujoco import eval_model, make_acer_models, make_env

from torchrl_acer.objectives import ACERLoss
from torchrl_acer.trainers.acer import ACERTrainer, make_segment_replay_buffer


@hydra.main(config_path="", config_name="config_mujoco", version_base="1.3")
def main(cfg: DictConfig):
    device = (
        torch.device(cfg.loss.device) if cfg.loss.device else get_available_device()
    )
    frames_per_batch = cfg.env.num_envs * cfg.collector.segment_length

    # Create models (check utils_mujoco.py)
    actor, critic = make_acer_models(cfg, device=device)

    # Create the loss: with a Gaussian policy and a stochastic dueling network,
    # ACERLoss follows the paper's continuous variant (Q_opc in the policy
    # gradient, one sampled action for the bias correction)
    loss_module = ACERLoss(
        actor_network=actor,
        critic_network=critic,
        ratio_clip=cfg.loss.ratio_clip,
        trust_region_delta=cfg.loss.trust_region_delta,
        entropy_coeff=cfg.loss.entropy_coeff,
        critic_coeff=cfg.loss.critic_coeff,
        loss_critic_type=cfg.loss.loss_critic_type,
    )
    # Retrace with lambda = 1 and traces clipped at 1
    loss_module.make_value_estimator(gamma=cfg.loss.gamma)

    # Create optimizer
    optim = torch.optim.Adam(
        loss_module.parameters(), lr=cfg.optim.lr, eps=cfg.optim.eps
    )

    # Create replay: whole segments of T steps, sampled batch_segments at a time
    replay_buffer = make_segment_replay_buffer(
        cfg.replay.capacity, cfg.collector.segment_length, cfg.replay.batch_segments
    )

    # Create logger
    logger = None
    if cfg.logger.backend:
        exp_name = generate_exp_name(
            "ACER", f"{cfg.logger.exp_name}_{cfg.env.env_name}"
        )
        logger = get_logger(
            cfg.logger.backend,
            logger_name="acer",
            experiment_name=exp_name,
            wandb_kwargs={
                "config": dict(cfg),
                "project": cfg.logger.project_name,
                "group": cfg.logger.group_name,
            },
        )

    # Create test environment
    test_env = make_env(cfg.env.env_name)
    test_env.set_seed(0)
    test_env.eval()

    # Create collector: [num_envs, T] batches holding the behaviour policy's
    # loc, scale and log-probabilities. Envs step on the CPU and the replay
    # lives in host memory; the trainer moves each batch to the loss's device.
    collector = Collector(
        create_env_fn=make_env(cfg.env.env_name, cfg.env.num_envs),
        policy=actor,
        frames_per_batch=frames_per_batch,
        total_frames=cfg.collector.total_frames,
        env_device="cpu",
        policy_device=device,
        storing_device="cpu",
        auto_register_policy_transforms=False,
    )

    # Create trainer: no update on the fresh batch (on_policy_updates=False),
    # Poisson(replay.ratio) updates on replayed segments once replay.start steps
    # are stored; the averaged policy follows after every optimizer step
    trainer = ACERTrainer(
        collector=collector,
        total_frames=cfg.collector.total_frames,
        loss_module=loss_module,
        optimizer=optim,
        replay_buffer=replay_buffer,
        replay_ratio=cfg.replay.ratio,
        replay_start=cfg.replay.start,
        on_policy_updates=False,
        alpha=cfg.loss.alpha,
        clip_norm=cfg.optim.max_grad_norm,
        logger=logger,
        log_interval=cfg.logger.log_interval,
        seed=cfg.env.seed,
    )

    # Training logs: the step reward, and the returns and lengths of the
    # episodes that ended in the batch
    LogScalar(("next", "reward"), "train/step_reward").register(trainer)

    def log_train_episodes(batch):
        done = batch["next", "done"]
        if not done.any():
            return None
        return {
            "train/reward": batch["next", "episode_reward"][done].mean().item(),
            "train/episode_length": batch["next", "step_count"][done]
            .float()
            .mean()
            .item(),
            "log_pbar": True,
        }

    trainer.register_op("pre_steps_log", log_train_episodes)

    # Deterministic evaluation (the policy's mean) every test_interval frames
    # and at the end of training
    next_test = cfg.logger.test_interval

    def evaluate():
        nonlocal next_test
        frames = trainer.collected_frames
        if frames < min(next_test, cfg.collector.total_frames):
            return
        while next_test <= frames:
            next_test += cfg.logger.test_interval
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            test_reward = eval_model(
                actor, test_env, num_episodes=cfg.logger.num_test_episodes
            )
        torchrl_logger.info(f"frames {frames}: test reward {test_reward:.1f}")
        if logger is not None:
            logger.log_scalar("test/reward", test_reward, step=frames)

    trainer.register_op("post_steps", evaluate)

    trainer.train()
    if not test_env.is_closed:
        test_env.close()


if __name__ == "__main__":
    main()
