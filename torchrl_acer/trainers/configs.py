"""Hydra configs for ACER, in the form of ``torchrl.trainers.algorithms.configs``.

:class:`ACERLossConfig` (group ``loss``, name ``acer``), :class:`ACERTrainerConfig`
(group ``trainer``, name ``acer``), :class:`CategoricalActorConfig` (group
``model``, name ``categorical_actor``: TorchRL's model configs have no categorical
policy) and :class:`VectorGymEnvConfig` (group ``env``, name ``gym_vector``) are
registered with Hydra's ConfigStore by :func:`register_configs`,
next to TorchRL's own groups, so that a config file composes them with TorchRL's
``env``, ``collector``, ``network``, ``optimizer`` and ``logger`` entries. Each
checks its values when built: a value of the wrong type or out of range fails at
start, naming the field, its value and what it must be.

Upstream these join ``torchrl/trainers/algorithms/configs/objectives.py``,
``trainers.py`` and ``modules.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torchrl.trainers.algorithms.configs.envs import EnvConfig
from torchrl.trainers.algorithms.configs.modules import ModelConfig
from torchrl.trainers.algorithms.configs.objectives import LossConfig
from torchrl.trainers.algorithms.configs.trainers import TrainerConfig

__all__ = [
    "ACERLossConfig",
    "ACERTrainerConfig",
    "CategoricalActorConfig",
    "VectorGymEnvConfig",
    "register_configs",
]


def _check(config, name: str, ok: bool, expect: str) -> None:
    if not ok:
        value = getattr(config, name)
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        raise ValueError(f"{type(config).__name__}: {name}={shown} must be {expect}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value) -> bool:
    return _number(value) and math.isfinite(value)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _none_or(value, test) -> bool:
    return value is None or test(value)


@dataclass
class CategoricalActorConfig(ModelConfig):
    """A categorical policy: a :class:`~torchrl.modules.ProbabilisticActor` over
    the ``logits`` a network writes, with the log-probability of its action; the
    action an index, or one-hot (``one_hot``, as TorchRL's gym envs take it).

    Example:
        >>> from hydra.utils import instantiate
        >>> from torchrl.trainers.algorithms.configs.modules import MLPConfig
        >>> cfg = CategoricalActorConfig(
        ...     network=MLPConfig(in_features=4, out_features=2, num_cells=[8]))
        >>> actor = instantiate(cfg)
        >>> type(actor).__name__
        'ProbabilisticActor'
    """

    network: Any = None
    in_keys: Any = field(default_factory=lambda: ["observation"])
    one_hot: bool = False
    return_log_prob: bool = True
    _target_: str = "torchrl_acer.trainers.configs._make_categorical_actor"
    _partial_: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self, "network", self.network is not None, "a network config")


def _make_categorical_actor(*, network, in_keys, one_hot, return_log_prob, **kwargs):
    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor

    if hasattr(network, "_target_"):  # a config node Hydra left unbuilt
        from hydra.utils import instantiate

        network = instantiate(network)
    kwargs.pop("out_keys", None)  # the action, the log-probability: fixed
    shared = kwargs.pop("shared", False)
    actor = ProbabilisticActor(
        TensorDictModule(network, list(in_keys), ["logits"]),
        in_keys=["logits"],
        distribution_class=(
            torch.distributions.OneHotCategorical
            if one_hot
            else torch.distributions.Categorical
        ),
        return_log_prob=return_log_prob,
        **kwargs,
    )
    # as TorchRL's model configs do: weights in shared memory for worker processes
    return actor.share_memory() if shared else actor


@dataclass
class VectorGymEnvConfig(EnvConfig):
    """``num_envs`` copies of a gymnasium task stepped together, in this process
    unless ``parallel``: :func:`torchrl_acer.training.envs.make_env`, with each
    episode's return under ``("next", "episode_reward")``. TorchRL's ``GymEnv``
    with ``num_envs`` runs gymnasium's ``AsyncVectorEnv``, one process per copy,
    which for a task as cheap as CartPole costs more than it steps.
    """

    env_id: str = "CartPole-v1"
    num_envs: int = 8
    parallel: bool = False
    seed: int | None = None
    max_episode_steps: int | None = None
    _target_: str = "torchrl_acer.training.envs.make_env"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            self, "num_envs", _int(self.num_envs) and self.num_envs >= 1, "an int >= 1"
        )


@dataclass
class ACERLossConfig(LossConfig):
    """Hydra configuration for :class:`~torchrl_acer.ACERLoss` and its estimator.

    Every argument of ``ACERLoss.__init__`` is a field; ``gamma``, ``lmbda``,
    ``c_thresh`` and ``check_values`` go to ``make_value_estimator`` (the loss
    rejects them). The defaults are the paper's discrete settings.
    """

    actor_network: Any = None
    critic_network: Any = None
    ratio_clip: float = 10.0
    trust_region_delta: float | None = 1.0
    trust_region_space: str = "logits"
    entropy_coeff: float = 0.01
    critic_coeff: float | None = 0.25
    loss_critic_type: str = "l2"
    separate_losses: bool = False
    reduction: str | None = None
    recurrent_state: str = "stored"
    burn_in: int = 0
    gamma: float = 0.99
    lmbda: float = 1.0
    c_thresh: float = 1.0
    check_values: bool = True
    _target_: str = "torchrl_acer.trainers.configs._make_acer_loss"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            self,
            "ratio_clip",
            _number(self.ratio_clip) and self.ratio_clip > 0,
            "a number > 0 (inf: no truncation)",
        )
        _check(
            self,
            "trust_region_delta",
            _none_or(self.trust_region_delta, lambda v: _number(v) and v > 0),
            "a number > 0, or None (no trust region)",
        )
        _check(
            self,
            "trust_region_space",
            self.trust_region_space in ("logits", "log_probs", "probs"),
            "'logits', 'log_probs' or 'probs'",
        )
        _check(
            self,
            "entropy_coeff",
            _finite(self.entropy_coeff) and self.entropy_coeff >= 0,
            "a finite number >= 0",
        )
        _check(
            self,
            "critic_coeff",
            _none_or(self.critic_coeff, lambda v: _finite(v) and v >= 0),
            "a finite number >= 0, or None (no critic term)",
        )
        _check(
            self,
            "loss_critic_type",
            self.loss_critic_type in ("l1", "l2", "smooth_l1"),
            "'l1', 'l2' or 'smooth_l1'",
        )
        _check(
            self,
            "reduction",
            self.reduction in (None, "none", "mean", "sum"),
            "'none', 'mean', 'sum' or None (mean)",
        )
        _check(
            self,
            "recurrent_state",
            self.recurrent_state in ("stored", "zero"),
            "'stored' or 'zero'",
        )
        _check(self, "burn_in", _int(self.burn_in) and self.burn_in >= 0, "an int >= 0")
        for name in ("gamma", "lmbda"):
            value = getattr(self, name)
            _check(self, name, _finite(value) and 0 < value <= 1, "in (0, 1]")
        _check(
            self,
            "c_thresh",
            _finite(self.c_thresh) and self.c_thresh > 0,
            "a finite number > 0",
        )
        for name in ("separate_losses", "check_values"):
            _check(self, name, isinstance(getattr(self, name), bool), "true or false")


def _make_acer_loss(**kwargs):
    from torchrl_acer.objectives import ACERLoss

    estimator = {
        name: kwargs.pop(name)
        for name in ("gamma", "lmbda", "c_thresh", "check_values")
    }
    kwargs.pop("_partial_", None)
    for name in ("actor_network", "critic_network"):
        if hasattr(kwargs[name], "_target_"):
            from hydra.utils import instantiate

            kwargs[name] = instantiate(kwargs[name])
    loss = ACERLoss(**kwargs)
    loss.make_value_estimator(**estimator)
    return loss


@dataclass
class ACERTrainerConfig(TrainerConfig):
    """Hydra configuration for :class:`~torchrl_acer.trainers.ACERTrainer`.

    Every argument of ``ACERTrainer.__init__`` is a field, and ``hooks``: a list
    of :class:`~torchrl.trainers.TrainerHookBase` configs registered on the
    trainer (logging, evaluation, the guards of :mod:`torchrl_acer.trainers.hooks`).
    """

    collector: Any = None
    total_frames: int | None = None
    loss_module: Any = None
    optimizer: Any = None
    replay_buffer: Any = None
    replay_ratio: float = 4.0
    replay_start: int = 0
    on_policy_updates: bool = True
    alpha: float = 0.99
    target_net_updater: Any = None
    weight_update_interval: int = 1
    logger: Any = None
    clip_grad_norm: bool = True
    clip_norm: float | None = 10.0
    progress_bar: bool = True
    seed: int | None = None
    save_trainer_interval: int = 10000
    log_interval: int = 10000
    save_trainer_file: Any = None
    checkpoint: Any = None
    checkpoint_rotation: Any = None
    log_timings: bool = False
    auto_log_optim_steps: bool = True
    frame_skip: int = 1
    hooks: list[Any] | None = None
    _target_: str = "torchrl_acer.trainers.configs._make_acer_trainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            self,
            "total_frames",
            _none_or(self.total_frames, lambda v: _int(v) and v >= 1),
            "an int >= 1, or None (the collector's)",
        )
        _check(
            self,
            "replay_ratio",
            _finite(self.replay_ratio) and self.replay_ratio >= 0,
            "a finite number >= 0",
        )
        _check(
            self,
            "replay_start",
            _int(self.replay_start) and self.replay_start >= 0,
            "an int >= 0",
        )
        _check(
            self,
            "on_policy_updates",
            isinstance(self.on_policy_updates, bool),
            "true or false",
        )
        _check(
            self,
            "on_policy_updates",
            self.on_policy_updates or self.replay_ratio > 0,
            "true when replay_ratio is 0 (nothing would train)",
        )
        _check(self, "alpha", _finite(self.alpha) and 0 <= self.alpha < 1, "in [0, 1)")
        _check(
            self,
            "weight_update_interval",
            _int(self.weight_update_interval) and self.weight_update_interval >= 1,
            "an int >= 1",
        )
        _check(
            self,
            "clip_norm",
            _none_or(self.clip_norm, lambda v: _number(v) and v > 0),
            "a number > 0, or None (no clipping)",
        )
        _check(
            self,
            "seed",
            _none_or(self.seed, lambda v: _int(v) and v >= 0),
            "an int >= 0",
        )
        for name in ("save_trainer_interval", "log_interval", "frame_skip"):
            value = getattr(self, name)
            _check(self, name, _int(value) and value >= 1, "an int >= 1")


def _make_acer_trainer(**kwargs):
    import torch
    from torchrl.collectors import BaseCollector
    from torchrl.objectives.utils import TargetNetUpdater
    from torchrl.trainers.algorithms.configs.trainers import _register_trainer_hooks

    from torchrl_acer.trainers.acer import ACERTrainer

    kwargs.pop("_partial_", None)
    hooks = kwargs.pop("hooks", None)
    # partial configs (``_partial_: true``) are completed here, as TorchRL's
    # trainer factories do: the optimizer and the averaged policy need the loss
    if not isinstance(kwargs["collector"], BaseCollector):
        kwargs["collector"] = kwargs["collector"]()
    loss = kwargs["loss_module"]
    if not isinstance(kwargs["optimizer"], torch.optim.Optimizer):
        kwargs["optimizer"] = kwargs["optimizer"](params=loss.parameters())
    updater = kwargs["target_net_updater"]
    if updater is not None and not isinstance(updater, TargetNetUpdater):
        kwargs["target_net_updater"] = updater(loss)
    if kwargs["total_frames"] is None:
        kwargs["total_frames"] = kwargs["collector"].total_frames
    trainer = ACERTrainer(**kwargs)
    _register_trainer_hooks(trainer, hooks)
    return trainer


def register_configs() -> None:
    """Stores the configs in Hydra's ConfigStore (``loss/acer``, ``trainer/acer``,
    ``model/categorical_actor``, ``env/gym_vector``), next to TorchRL's."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group="loss", name="acer", node=ACERLossConfig)
    cs.store(group="trainer", name="acer", node=ACERTrainerConfig)
    cs.store(group="model", name="categorical_actor", node=CategoricalActorConfig)
    cs.store(group="env", name="gym_vector", node=VectorGymEnvConfig)
