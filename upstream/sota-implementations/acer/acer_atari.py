# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""ACER on Atari (Wang et al. 2017, "Sample Efficient Actor-Critic with
Experience Replay"), with the paper's and OpenAI baselines' Atari settings.

Each collected batch of ``num_envs x T`` steps gets one on-policy update, is
stored in replay as ``num_envs`` segments of ``T`` steps, and is followed by
Poisson(``replay.ratio``) updates on batches of replayed segments. The
averaged policy of the trust region follows the policy after every update.
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
from utils_atari import eval_model, make_acer_models, make_parallel_env

from torchrl_acer.objectives import ACERLoss
from torchrl_acer.trainers.acer import ACERTrainer, make_segment_replay_buffer


@hydra.main(config_path="", config_name="config_atari", version_base="1.3")
def main(cfg: DictConfig):
    device = (
        torch.device(cfg.loss.device) if cfg.loss.device else get_available_device()
    )

    # Frames count game frames; the collector, the segments and the replay
    # count agent steps (ALE v5 repeats each action for 4 frames).
    frame_skip = 4
    total_steps = cfg.collector.total_frames // frame_skip
    frames_per_batch = cfg.env.num_envs * cfg.collector.segment_length

    # Create models (check utils_atari.py)
    actor, critic = make_acer_models(
        cfg.env.env_name, device=device, gym_backend=cfg.env.backend
    )

    # Create the loss: truncated importance sampling with bias correction, the
    # Retrace critic target and the trust region around the averaged policy
    loss_module = ACERLoss(
        actor_network=actor,
        critic_network=critic,
        ratio_clip=cfg.loss.ratio_clip,
        trust_region_delta=cfg.loss.trust_region_delta,
        trust_region_space=cfg.loss.trust_region_space,
        entropy_coeff=cfg.loss.entropy_coeff,
        critic_coeff=cfg.loss.critic_coeff,
        loss_critic_type=cfg.loss.loss_critic_type,
    )
    # Retrace with lambda = 1 and traces clipped at 1, as in the paper
    loss_module.make_value_estimator(gamma=cfg.loss.gamma)
    # A lost life stops the bootstrap (see utils_atari.make_base_env)
    loss_module.set_keys(terminated="end-of-life")

    # Create optimizer: RMSProp with a shared statistic, as the paper's agents
    optim = torch.optim.RMSprop(
        loss_module.parameters(),
        lr=cfg.optim.lr,
        alpha=cfg.optim.alpha,
        eps=cfg.optim.eps,
    )

    # Create replay: whole segments of T steps, sampled batch_segments at a
    # time. Observations are stored as stacks of 4 uint8 frames.
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

    # Create test environment: real games, no clipped rewards or life losses
    test_env = make_parallel_env(
        cfg.env.env_name,
        num_envs=1,
        gym_backend=cfg.env.backend,
        repeat_action_probability=cfg.env.repeat_action_probability,
        max_steps=cfg.env.max_episode_steps,
        is_test=True,
    )
    test_env.set_seed(0)
    test_env.eval()

    # Create collector: [num_envs, T] batches that hold the behaviour policy's
    # logits and log-probabilities. Envs step on the CPU and the replay lives
    # in host memory; the trainer moves each batch to the loss's device.
    collector = Collector(
        create_env_fn=make_parallel_env(
            cfg.env.env_name,
            num_envs=cfg.env.num_envs,
            gym_backend=cfg.env.backend,
            repeat_action_probability=cfg.env.repeat_action_probability,
            max_steps=cfg.env.max_episode_steps,
        ),
        policy=actor,
        frames_per_batch=frames_per_batch,
        total_frames=total_steps,
        env_device="cpu",
        policy_device=device,
        storing_device="cpu",
        auto_register_policy_transforms=False,
    )

    # Create trainer: ACER's update schedule, the averaged policy (SoftUpdate
    # after every optimizer step) and the gradient-norm clip
    trainer = ACERTrainer(
        collector=collector,
        total_frames=cfg.collector.total_frames,
        frame_skip=frame_skip,
        loss_module=loss_module,
        optimizer=optim,
        replay_buffer=replay_buffer,
        replay_ratio=cfg.replay.ratio,
        replay_start=cfg.replay.start,
        on_policy_updates=True,
        alpha=cfg.loss.alpha,
        clip_norm=cfg.optim.max_grad_norm,
        logger=logger,
        log_interval=cfg.logger.log_interval,
        seed=cfg.env.seed,
    )

    # Training logs: the clipped reward the loss trains on, and the scores and
    # lengths of the games that ended in the batch
    LogScalar(("next", "reward"), "train/clipped_reward").register(trainer)

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

    # Greedy evaluation every test_interval frames and at the end of training
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
                actor,
                test_env,
                num_episodes=cfg.logger.num_test_episodes,
                max_steps=cfg.env.max_episode_steps,
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
