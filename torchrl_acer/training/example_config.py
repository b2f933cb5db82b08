"""The example scripts' config files, each setting with its check.

``examples/config_*.yaml`` (with ``run/default.yaml``): a section per dataclass of
:class:`ExampleConfig`, checked by :func:`check_example_config` with the checks of
:mod:`torchrl_acer.trainers.configs` (the loss's section is
:class:`~torchrl_acer.trainers.configs.ACERLossConfig`'s fields); a key a file
lacks is skipped (each example has its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torchrl_acer.trainers.configs import (
    ABOVE_0,
    ALPHA,
    AT_LEAST_0,
    BOOL,
    CLIP_NORM,
    ACERLossConfig,
    Check,
    _int,
    check_values,
    checked,
    finite,
    integer,
    one_of,
)

__all__ = ["ExampleConfig", "check_example_config"]


def _text(expect: str, null: str | None = None) -> Check:
    return Check(expect, lambda v: isinstance(v, str), null)


def _list_of(expect: str, test, null: str | None = None) -> Check:
    # a YAML list reaches the check as an omegaconf ListConfig: a Sequence
    return Check(
        expect,
        lambda v: isinstance(v, Sequence) and not isinstance(v, str) and test(v),
        null,
    )


def _distinct_indices(v) -> bool:
    return len(v) > 0 and all(_int(i) and i >= 0 for i in v) and len(set(v)) == len(v)


@dataclass
class _EnvSettings:
    name: str = checked(_text("a gymnasium id (a string)"))
    num_envs: int = checked(integer(1))
    parallel: bool = checked(BOOL)
    max_episode_steps: int = checked(integer(1, null="the env's own time limit"))
    repeat_action_probability: float = checked(
        finite("in [0, 1]", lambda v: 0 <= v <= 1)
    )
    num_threads: int = checked(integer(0))  # the ALE's; 0: its own choice
    reward_scale: float = checked(ABOVE_0)
    observation_indices: list = checked(
        _list_of(
            "a list of distinct integers >= 0",
            _distinct_indices,
            null="the whole observation",
        )
    )


@dataclass
class _CollectorSettings:
    T: int = checked(integer(1))
    total_frames: int = checked(integer(1))
    backend: str = checked(one_of("auto", "single", "lean", "multiprocess", "ray"))
    num_workers: int = checked(integer(1))
    sync: bool = checked(BOOL)
    weight_update_interval: int = checked(integer(1))
    max_policy_lag: int = checked(integer(0, null="no bound"))
    worker_start_timeout: float = checked(ABOVE_0)


@dataclass
class _RaySettings:
    address: str = checked(
        _text(
            "a Ray address (a string: auto, host:port, ray://...)",
            null="a local Ray started by the run",
        )
    )
    num_cpus: int = checked(integer(1, null="all of this machine's"))


@dataclass
class _ModelSettings:
    num_cells: list = checked(
        _list_of(
            "a list of integers >= 1", lambda v: all(_int(n) and n >= 1 for n in v)
        )
    )
    activation: str = checked(one_of("relu", "tanh"))
    shared: bool = checked(BOOL)
    fixed_scale: float = checked(finite("> 0", lambda v: v > 0, null="a learned scale"))
    initial_scale: float = checked(ABOVE_0)
    num_samples: int = checked(integer(1))
    bound_mean: bool = checked(BOOL)
    dueling: bool = checked(BOOL)
    recurrent: str = checked(one_of("lstm", "gru", null="feed-forward"))
    recurrent_size: int = checked(integer(1))


@dataclass
class _LossSettings(ACERLossConfig):
    alpha: float = checked(ALPHA, 0.99)  # the trainer's averaged policy


@dataclass
class _OptimSettings:
    name: str = checked(one_of("adam", "rmsprop"))
    lr: float = checked(ABOVE_0)
    eps: float = checked(AT_LEAST_0)
    decay: float = checked(finite("in [0, 1)", lambda v: 0 <= v < 1))
    max_grad_norm: float = checked(CLIP_NORM)


@dataclass
class _ReplaySettings:
    ratio: float = checked(AT_LEAST_0)
    on_policy_updates: bool = checked(BOOL)
    start: int = checked(integer(0))
    capacity: int = checked(integer(1))
    batch_segments: int = checked(integer(1, null="env.num_envs segments"))


@dataclass
class _EvalSettings:
    interval: int = checked(integer(1, null="evaluate at the end only"))
    episodes: int = checked(integer(1))
    max_steps: int = checked(integer(1))


@dataclass
class _LoggerSettings:
    backend: str = checked(
        Check(
            "csv, tensorboard or wandb",
            lambda v: v in ("csv", "tensorboard", "wandb", ""),
            null="no logger",
        )
    )
    run_dir: str = checked(_text("a path", null="runs/<env>/seed<seed>-<time>"))
    log_interval: int = checked(integer(1))
    progress_bar: bool = checked(BOOL)


@dataclass
class _CheckpointSettings:
    interval: int = checked(integer(1, null="at the end only"))
    every_minutes: float = checked(finite("> 0", lambda v: v > 0, null="none"))


@dataclass
class _HealthSettings:
    check: bool = checked(BOOL)
    max_nonfinite_in_a_row: int = checked(integer(1))


def _section(settings: type):
    return field(default=None, metadata={"section": settings})


@dataclass
class ExampleConfig:
    """The settings of the example scripts' config files, each with its check."""

    env: _EnvSettings = _section(_EnvSettings)
    collector: _CollectorSettings = _section(_CollectorSettings)
    ray: _RaySettings = _section(_RaySettings)
    model: _ModelSettings = _section(_ModelSettings)
    loss: _LossSettings = _section(_LossSettings)
    optim: _OptimSettings = _section(_OptimSettings)
    replay: _ReplaySettings = _section(_ReplaySettings)
    eval: _EvalSettings = _section(_EvalSettings)
    logger: _LoggerSettings = _section(_LoggerSettings)
    checkpoint: _CheckpointSettings = _section(_CheckpointSettings)
    health: _HealthSettings = _section(_HealthSettings)
    resume: str = checked(_text("a checkpoint path", null="a new run"), None)
    resume_allow_config_change: list = checked(
        _list_of(
            "a list of settings (dotted keys or patterns)",
            lambda v: all(isinstance(k, str) for k in v),
            null="none",
        ),
        None,
    )
    resume_force: bool = checked(BOOL, False)
    seed: int = checked(integer(0), 0)
    threads: int = checked(integer(1, null="torch's default"), None)
    device: str = checked(_text("cpu, cuda, cuda:N or auto"), "cpu")
    compile: bool = checked(BOOL, False)


def check_example_config(cfg: Mapping) -> None:
    """Checks an example script's config (:class:`ExampleConfig`), raising
    ``ValueError`` naming the first setting refused (``loss.gamma``), its value
    and what it must be."""
    for f in dataclasses.fields(ExampleConfig):
        settings = f.metadata.get("section")
        if settings is not None and cfg.get(f.name) is not None:
            check_values(settings, cfg[f.name], prefix=f"{f.name}.")
    check_values(ExampleConfig, cfg)
