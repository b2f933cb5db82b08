"""From a Hydra config to a running :class:`~torchrl_acer.training.trainer.ACERTrainer`.

The examples (``examples/acer_*.py``) choose an environment and networks; this
module builds everything else from the config the same way for all of them: the
collector, the loss, the optimizer, the replay buffer, the evaluator, the logger,
checkpoints and resume, and the summary printed at the end.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torchrl.collectors import Collector
from torchrl.record.loggers import get_logger

from torchrl_acer.objectives.acer import ACERLoss
from torchrl_acer.training.trainer import (
    ACERTrainer,
    GreedyEvaluator,
    make_segment_replay_buffer,
)

__all__ = ["Experiment", "check_config", "run"]


@dataclass
class Experiment:
    """What an example provides: environments and networks for its task.

    Attributes:
        make_env: ``make_env(num_envs, seed) -> EnvBase``, a batched environment.
        make_eval_env: the same for evaluation (real episodes, no training-only
            signals such as life loss).
        make_models: ``make_models(env) -> (actor, critic)``.
        make_replay: ``make_replay(capacity_steps, T, batch_segments)``; defaults
            to :func:`~torchrl_acer.training.trainer.make_segment_replay_buffer`.
        loss_keys: keys for ``ACERLoss.set_keys`` (e.g. a clipped reward).
    """

    make_env: Callable[[int, int], Any]
    make_eval_env: Callable[[int, int], Any]
    make_models: Callable[[Any], tuple[Any, Any]]
    make_replay: Callable[[int, int, int], Any] = make_segment_replay_buffer
    loss_keys: dict = field(default_factory=dict)


def check_config(cfg: DictConfig) -> None:
    """Fails at start, naming the setting, for values that cannot work."""

    def need(condition, message):
        if not condition:
            raise ValueError(f"bad config: {message}")

    need(cfg.env.num_envs >= 1, f"env.num_envs={cfg.env.num_envs} must be >= 1")
    need(cfg.collector.T >= 1, f"collector.T={cfg.collector.T} must be >= 1")
    need(
        cfg.collector.total_frames > 0,
        f"collector.total_frames={cfg.collector.total_frames} must be positive",
    )
    need(cfg.replay.ratio >= 0, f"replay.ratio={cfg.replay.ratio} must be >= 0")
    need(
        cfg.replay.get("on_policy_updates", True) or cfg.replay.ratio > 0,
        "replay.on_policy_updates=false needs replay.ratio > 0",
    )
    need(cfg.replay.start >= 0, f"replay.start={cfg.replay.start} must be >= 0")
    if cfg.replay.ratio > 0:
        need(
            cfg.replay.capacity >= cfg.collector.T,
            f"replay.capacity={cfg.replay.capacity} steps is shorter than one "
            f"segment of collector.T={cfg.collector.T} steps",
        )
        need(
            cfg.replay.start <= cfg.replay.capacity,
            f"replay.start={cfg.replay.start} exceeds replay.capacity="
            f"{cfg.replay.capacity}: replay would never start",
        )
    need(0 < cfg.loss.gamma <= 1, f"loss.gamma={cfg.loss.gamma} must be in (0, 1]")
    need(0 <= cfg.loss.alpha < 1, f"loss.alpha={cfg.loss.alpha} must be in [0, 1)")
    need(
        cfg.optim.name in ("adam", "rmsprop"),
        f"optim.name={cfg.optim.name!r} must be 'adam' or 'rmsprop'",
    )
    need(cfg.optim.lr > 0, f"optim.lr={cfg.optim.lr} must be positive")
    need(
        cfg.logger.backend in ("csv", "tensorboard", "wandb", None, ""),
        f"logger.backend={cfg.logger.backend!r} must be csv, tensorboard or wandb",
    )
    need(
        cfg.eval.interval is None or cfg.eval.interval > 0,
        f"eval.interval={cfg.eval.interval} must be positive or null",
    )
    need(cfg.eval.episodes >= 1, f"eval.episodes={cfg.eval.episodes} must be >= 1")


def run_dir_for(cfg: DictConfig) -> Path:
    if cfg.logger.run_dir:
        return Path(cfg.logger.run_dir)
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / env / f"seed{cfg.seed}-{stamp}"


def make_optimizer(cfg, params):
    if cfg.optim.name == "adam":
        return torch.optim.Adam(params, lr=cfg.optim.lr, eps=cfg.optim.eps)
    return torch.optim.RMSprop(
        params, lr=cfg.optim.lr, alpha=cfg.optim.decay, eps=cfg.optim.eps
    )


def build(cfg: DictConfig, experiment: Experiment, run_dir: Path) -> ACERTrainer:
    """Builds the trainer (and everything it drives) from ``cfg``."""
    check_config(cfg)
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    env = experiment.make_env(cfg.env.num_envs, cfg.seed)
    actor, critic = experiment.make_models(env)
    loss = ACERLoss(
        actor,
        critic,
        ratio_clip=cfg.loss.ratio_clip,
        trust_region_delta=cfg.loss.trust_region_delta,
        trust_region_space=cfg.loss.trust_region_space,
        entropy_coeff=cfg.loss.entropy_coeff,
        critic_coeff=cfg.loss.critic_coeff,
    )
    loss.make_value_estimator(gamma=cfg.loss.gamma, lmbda=1.0, c_thresh=1.0)
    if experiment.loss_keys:
        loss.set_keys(**experiment.loss_keys)
    T, num_envs = cfg.collector.T, cfg.env.num_envs
    collector = Collector(
        env,
        actor,
        frames_per_batch=T * num_envs,
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    replay = None
    if cfg.replay.ratio > 0:
        replay = experiment.make_replay(
            cfg.replay.capacity, T, cfg.replay.batch_segments or num_envs
        )
    evaluator = GreedyEvaluator(
        experiment.make_eval_env(cfg.eval.episodes, cfg.seed + 10_000),
        actor,
        max_steps=cfg.eval.max_steps,
    )
    logger = None
    if cfg.logger.backend:
        logger = get_logger(
            cfg.logger.backend,
            logger_name=str(run_dir),
            experiment_name="logs",
        )
    return ACERTrainer(
        collector=collector,
        loss_module=loss,
        optimizer=make_optimizer(cfg, loss.parameters()),
        total_frames=cfg.collector.total_frames,
        replay_buffer=replay,
        replay_ratio=cfg.replay.ratio,
        on_policy_updates=cfg.replay.get("on_policy_updates", True),
        replay_start=cfg.replay.start,
        target_eps=cfg.loss.alpha,
        max_grad_norm=cfg.optim.max_grad_norm,
        evaluator=evaluator,
        eval_interval=cfg.eval.interval,
        logger=logger,
        log_interval=cfg.logger.log_interval,
        checkpoint_dir=run_dir / "checkpoints",
        checkpoint_interval=cfg.checkpoint.interval,
        progress_bar=cfg.logger.progress_bar,
        seed=cfg.seed,
    )


def run(cfg: DictConfig, experiment: Experiment) -> ACERTrainer:
    """Trains as ``cfg`` says, resuming from ``cfg.resume`` if set, and prints
    the final greedy evaluation and where the logs, the plot and the checkpoint
    are."""
    run_dir = Path(cfg.resume).parent.parent if cfg.resume else run_dir_for(cfg)
    trainer = build(cfg, experiment, run_dir)
    if cfg.resume:
        trainer.load_checkpoint(cfg.resume)
        print(f"resumed from {cfg.resume} at {trainer.frames} frames")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    try:
        trainer.train()
    finally:
        trainer.close()
    if trainer.interrupted:
        print(
            f"interrupted at {trainer.frames} frames; checkpoint written to "
            f"{trainer.last_checkpoint}\nresume with: resume={trainer.last_checkpoint}"
        )
        sys.exit(130)
    summary = {
        "frames": trainer.frames,
        "updates": trainer.updates,
        "final_eval": trainer.last_eval,
        "run_dir": str(run_dir),
        "checkpoint": str(trainer.last_checkpoint),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"final greedy evaluation ({cfg.eval.episodes} episodes) after "
        f"{trainer.frames} env steps: mean return {trainer.last_eval['reward']:.1f} "
        f"(min {trainer.last_eval['reward_min']:.1f}, "
        f"max {trainer.last_eval['reward_max']:.1f})"
    )
    if cfg.logger.backend == "csv":
        from torchrl_acer.training.plot import plot_runs

        plot = plot_runs([run_dir], run_dir / "eval_reward.png", title=cfg.env.name)
        print(f"logs: {run_dir / 'logs'}\nplot: {plot}")
    print(f"checkpoint: {trainer.last_checkpoint}")
    return trainer
