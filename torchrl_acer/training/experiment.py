"""The plumbing the example scripts share around the pieces they build.

Each example (``examples/acer_*.py``) builds its environment, networks, loss,
optimizer, collector, replay, evaluator and logger in the open and hands them to
:class:`~torchrl_acer.training.trainer.ACERTrainer`. What is the same for all of
them lives here: the config checks, the device, the run directory, the optimizer
choice, resume, and the summary printed at the end.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from torchrl_acer.training.trainer import ACERTrainer

__all__ = [
    "check_config",
    "final_summary",
    "get_device",
    "make_optimizer",
    "resume",
    "run_dir_for",
    "save_config",
]


def get_device(name: str) -> torch.device:
    """The device the config's ``device`` names: ``cpu``, ``cuda`` (or ``cuda:N``),
    or ``auto`` (CUDA when available, else the CPU)."""
    name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not re.fullmatch(r"cuda(:\d+)?", name):
        raise ValueError(f"bad config: device={name!r} must be cpu, cuda or auto")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"bad config: device={name!r} but CUDA is not available "
            f"(device=auto falls back to the CPU)"
        )
    return torch.device(name)


def check_config(cfg: DictConfig) -> None:
    """Fails at start, naming the setting, for values that cannot work."""

    def need(condition, message):
        if not condition:
            raise ValueError(f"bad config: {message}")

    get_device(cfg.device)
    need(
        isinstance(cfg.compile, bool),
        f"compile={cfg.compile!r} must be true or false",
    )
    need(cfg.env.num_envs >= 1, f"env.num_envs={cfg.env.num_envs} must be >= 1")
    need(cfg.collector.T >= 1, f"collector.T={cfg.collector.T} must be >= 1")
    need(
        cfg.collector.total_frames > 0,
        f"collector.total_frames={cfg.collector.total_frames} must be positive",
    )
    need(cfg.replay.ratio >= 0, f"replay.ratio={cfg.replay.ratio} must be >= 0")
    need(
        cfg.replay.on_policy_updates or cfg.replay.ratio > 0,
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
    """Where the run writes its logs, checkpoints, config and summary: the resumed
    checkpoint's run, else ``logger.run_dir``, else ``runs/<env>/seed<seed>-<time>``.
    Nothing is created yet."""
    if cfg.resume:
        return Path(cfg.resume).parent.parent
    if cfg.logger.run_dir:
        return Path(cfg.logger.run_dir)
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / env / f"seed{cfg.seed}-{stamp}"


def make_optimizer(optim: DictConfig, params) -> torch.optim.Optimizer:
    """Adam or RMSProp as the config's ``optim`` section says."""
    if optim.name == "adam":
        return torch.optim.Adam(params, lr=optim.lr, eps=optim.eps)
    return torch.optim.RMSprop(params, lr=optim.lr, alpha=optim.decay, eps=optim.eps)


def resume(trainer: ACERTrainer, checkpoint: str | Path) -> None:
    """Restores ``trainer`` from ``checkpoint`` and says where it resumes."""
    trainer.load_checkpoint(checkpoint)
    print(f"resumed from {checkpoint} at {trainer.frames} frames")


def save_config(cfg: DictConfig, run_dir: Path) -> None:
    """Creates ``run_dir`` and writes the resolved config there."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))


def final_summary(trainer: ACERTrainer, cfg: DictConfig, run_dir: Path) -> None:
    """After training: writes ``summary.json`` and prints the final greedy
    evaluation and where the logs, the plot and the checkpoint are. A run stopped
    with Ctrl-C prints how to resume it instead and exits with status 130."""
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
