"""Continuous-action ACER (paper section 5) on Box-action gymnasium tasks.

    python examples/acer_mujoco.py                        # HalfCheetah-v5 (mujoco extra)
    python examples/acer_mujoco.py env.name=Pendulum-v1   # no MuJoCo needed

Settings are in ``config_mujoco.yaml`` (with the run settings all examples share in
``run/default.yaml``): the paper's continuous ACER (fully
off-policy, T = 50, averaged-policy decay 0.995, c = 5) with a fixed policy scale
of 0.1 and a trust-region bound of 2 (with the paper's scale 0.3, HalfCheetah-v5
learned more slowly and ended lower; with a bound of 1 it ended a little lower, by
less than the spread between seeds). The environments and networks are in
``utils_mujoco.py``.
The policy is a Gaussian MLP whose mean is squashed into the action bounds
(``model.bound_mean``; the Gaussian itself is not squashed), the critic a stochastic dueling network
(:class:`torchrl_acer.StochasticDuelingNetwork`); actions are clipped to the
action bounds by the environment, so the policy's log-probabilities stay exact.

The script builds each piece in turn (environment, networks, loss, averaged policy
and optimizer, collector, replay, evaluator, logger) and hands them to
:class:`torchrl_acer.training.trainer.ACERTrainer`, which runs ACER's loop and
writes the logs and checkpoints. The run directory, resume and the final summary
are shared with the other examples (:mod:`torchrl_acer.training.experiment`).
"""

import functools

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torchrl.objectives import SoftUpdate
from utils_mujoco import make_env, make_models

from torchrl_acer.training.experiment import (
    check_config,
    final_summary,
    frames_to_run,
    get_device,
    lock_run_dir,
    make_collector,
    make_logger,
    make_loss,
    make_optimizer,
    quiet_torchrl_info,
    resume,
    run_dir_for,
    save_config,
)
from torchrl_acer.training.refusal import report_refusals
from torchrl_acer.training.trainer import (
    ACERTrainer,
    GreedyEvaluator,
    make_segment_replay_buffer,
)


@hydra.main(config_path=".", config_name="config_mujoco", version_base="1.3")
@report_refusals  # a refusal ends with its message alone (HYDRA_FULL_ERROR=1: traceback)
def main(cfg: DictConfig) -> None:
    # -- config: refuse values that cannot work, naming the setting ------------------
    quiet_torchrl_info()  # TorchRL's INFO lines off (RL_LOGGING_LEVEL=INFO: on)
    check_config(cfg)
    run_dir = run_dir_for(cfg)  # logs, checkpoints, config.yaml, summary.json
    lock_run_dir(run_dir)  # a second process on this run stops here, touching nothing

    # -- device, seeds, threads ------------------------------------------------------
    device = get_device(cfg.device)  # networks, loss and optimizer; envs on the CPU
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)

    # -- environment: num_envs copies stepped together -------------------------------
    env = make_env(cfg, cfg.env.num_envs, seed=cfg.seed)

    # -- models: the Gaussian policy (actor) and the dueling critic ------------------
    actor, critic = make_models(cfg, env)
    actor, critic = actor.to(device), critic.to(device)

    # -- loss: ACER's policy, critic and entropy terms, Retrace targets --------------
    loss = make_loss(cfg.loss, actor, critic)
    if cfg.compile:
        loss.compile()  # its forward only: parameters and checkpoints stay as they are

    # -- averaged policy and optimizer -----------------------------------------------
    # after each optimizer step, theta_avg <- alpha theta_avg + (1 - alpha) theta
    target_updater = SoftUpdate(loss, eps=cfg.loss.alpha)
    optimizer = make_optimizer(cfg.optim, loss.parameters())

    # -- collector: [num_envs, T] batches, with the behaviour log-probabilities ------
    # collector.backend: this process, or num_workers processes or Ray actors, each
    # stepping num_envs envs with a copy of the policy the trainer keeps updated
    collector = make_collector(
        cfg, functools.partial(make_env, cfg), actor, device=device, env=env
    )

    # -- replay: segments of T steps -------------------------------------------------
    replay = None
    if cfg.replay.ratio > 0:
        replay = make_segment_replay_buffer(
            cfg.replay.capacity,
            cfg.collector.T,
            cfg.replay.batch_segments or cfg.env.num_envs,
        )

    # -- evaluator (greedy policy, one episode per env) and logger -------------------
    evaluator = GreedyEvaluator(
        make_env(cfg, cfg.eval.episodes, seed=cfg.seed + 10_000),
        actor,
        max_steps=cfg.eval.max_steps,
    )
    logger = make_logger(cfg.logger.backend, run_dir)  # csv: step,value rows

    # -- the loop: ACER's replay schedule, evaluation, logs, checkpoints -------------
    trainer = ACERTrainer(
        collector=collector,
        loss_module=loss,
        optimizer=optimizer,
        target_updater=target_updater,
        total_frames=frames_to_run(cfg),  # whole batches (a note if rounded)
        replay_buffer=replay,
        replay_ratio=cfg.replay.ratio,
        on_policy_updates=cfg.replay.on_policy_updates,
        replay_start=cfg.replay.start,
        max_grad_norm=cfg.optim.max_grad_norm,
        evaluator=evaluator,
        eval_interval=cfg.eval.interval,
        logger=logger,
        log_interval=cfg.logger.log_interval,
        checkpoint_dir=run_dir / "checkpoints",
        checkpoint_interval=cfg.checkpoint.interval,
        checkpoint_every_minutes=cfg.checkpoint.every_minutes,
        progress_bar=cfg.logger.progress_bar,
        seed=cfg.seed,
        check_health=cfg.health.check,  # skip and count non-finite updates
        max_nonfinite_in_a_row=cfg.health.max_nonfinite_in_a_row,
        config=OmegaConf.to_container(cfg, resolve=True),  # in each checkpoint
        weight_update_interval=cfg.collector.weight_update_interval,
        max_policy_lag=cfg.collector.max_policy_lag,  # drop batches staler than this
    )
    if cfg.resume:
        resume(trainer, cfg.resume)
    save_config(cfg, run_dir)
    try:
        trainer.train()
    finally:
        trainer.close()

    # -- final summary: summary.json, the last greedy evaluation, the plot -----------
    final_summary(trainer, cfg, run_dir)


if __name__ == "__main__":
    main()
