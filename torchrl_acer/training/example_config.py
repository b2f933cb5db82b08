"""The example scripts' config files, each setting with its check.

``examples/config_*.yaml`` (with ``run/default.yaml``): a table of checks per
section (:data:`SECTIONS`) and for the settings outside them (:data:`TOP_LEVEL`),
checked by :func:`check_example_config` with the checks of
:mod:`torchrl_acer.trainers.configs` (the loss's section is
:class:`~torchrl_acer.trainers.configs.ACERLossConfig`'s fields); a key a file
lacks is skipped (each example has its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    field_checks,
    finite,
    integer,
    one_of,
)

__all__ = ["SECTIONS", "TOP_LEVEL", "check_example_config"]


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


#: The settings of each section of the example scripts' config files, with their
#: checks (``{section: {key: Check}}``).
SECTIONS: dict[str, dict[str, Check]] = {
    "env": {
        "name": _text("a gymnasium id (a string)"),
        "num_envs": integer(1),
        "parallel": BOOL,
        "max_episode_steps": integer(1, null="the env's own time limit"),
        "repeat_action_probability": finite("in [0, 1]", lambda v: 0 <= v <= 1),
        "num_threads": integer(0),  # the ALE's; 0: its own choice
        "reward_scale": ABOVE_0,
        "observation_indices": _list_of(
            "a list of distinct integers >= 0",
            _distinct_indices,
            null="the whole observation",
        ),
    },
    "collector": {
        "T": integer(1),
        "total_frames": integer(1),
        "backend": one_of("auto", "single", "lean", "multiprocess", "ray"),
        "num_workers": integer(1),
        "sync": BOOL,
        "weight_update_interval": integer(1),
        "max_policy_lag": integer(0, null="no bound"),
        "worker_start_timeout": ABOVE_0,
    },
    "ray": {
        "address": _text(
            "a Ray address (a string: auto, host:port, ray://...)",
            null="a local Ray started by the run",
        ),
        "num_cpus": integer(1, null="all of this machine's"),
    },
    "model": {
        "num_cells": _list_of(
            "a list of integers >= 1", lambda v: all(_int(n) and n >= 1 for n in v)
        ),
        "activation": one_of("relu", "tanh"),
        "shared": BOOL,
        "fixed_scale": finite("> 0", lambda v: v > 0, null="a learned scale"),
        "initial_scale": ABOVE_0,
        "num_samples": integer(1),
        "bound_mean": BOOL,
        "dueling": BOOL,
        "recurrent": one_of("lstm", "gru", null="feed-forward"),
        "recurrent_size": integer(1),
    },
    # the loss's arguments, and the trainer's averaged policy
    "loss": {**field_checks(ACERLossConfig), "alpha": ALPHA},
    "optim": {
        "name": one_of("adam", "rmsprop"),
        "lr": ABOVE_0,
        "schedule": one_of("constant", "linear"),
        "eps": AT_LEAST_0,
        "decay": finite("in [0, 1)", lambda v: 0 <= v < 1),
        "max_grad_norm": CLIP_NORM,
    },
    "replay": {
        "ratio": AT_LEAST_0,
        "on_policy_updates": BOOL,
        "start": integer(0),
        "capacity": integer(1),
        "batch_segments": integer(1, null="env.num_envs segments"),
    },
    "eval": {
        "interval": integer(1, null="evaluate at the end only"),
        "episodes": integer(1),
        "max_steps": integer(1),
    },
    "logger": {
        "backend": Check(
            "csv, tensorboard or wandb",
            lambda v: v in ("csv", "tensorboard", "wandb", ""),
            null="no logger",
        ),
        "run_dir": _text("a path", null="runs/<env>/seed<seed>-<time>"),
        "log_interval": integer(1),
        "progress_bar": BOOL,
    },
    "checkpoint": {
        "interval": integer(1, null="at the end only"),
        "every_minutes": finite("> 0", lambda v: v > 0, null="none"),
    },
    "health": {
        "check": BOOL,
        "max_nonfinite_in_a_row": integer(1),
    },
}

#: The settings outside the sections, with their checks.
TOP_LEVEL: dict[str, Check] = {
    "resume": _text("a checkpoint path", null="a new run"),
    "resume_allow_config_change": _list_of(
        "a list of settings (dotted keys or patterns)",
        lambda v: all(isinstance(k, str) for k in v),
        null="none",
    ),
    "resume_force": BOOL,
    "seed": integer(0),
    "threads": integer(1, null="torch's default"),
    "device": _text("cpu, cuda, cuda:N or auto"),
    "compile": BOOL,
}


def check_example_config(cfg: Mapping) -> None:
    """Checks an example script's config (:data:`SECTIONS`, :data:`TOP_LEVEL`),
    raising ``ValueError`` naming the first setting refused (``loss.gamma``), its
    value and what it must be."""
    for section, checks in SECTIONS.items():
        if cfg.get(section) is not None:
            check_values(checks, cfg[section], prefix=f"{section}.")
    check_values(TOP_LEVEL, cfg)
