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

A field's check is a :class:`Check` in its metadata (:func:`checked`), so that
:func:`check_values` also checks plain mappings against a config's fields, or
against a table of checks: the example scripts check their config files'
sections with it (:mod:`torchrl_acer.training.example_config`).

Upstream these join ``torchrl/trainers/algorithms/configs/objectives.py``,
``trainers.py`` and ``modules.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torchrl.trainers.algorithms.configs.envs import EnvConfig
from torchrl.trainers.algorithms.configs.modules import ModelConfig
from torchrl.trainers.algorithms.configs.objectives import LossConfig
from torchrl.trainers.algorithms.configs.trainers import TrainerConfig

__all__ = [
    "ACERLossConfig",
    "ACERTrainerConfig",
    "CategoricalActorConfig",
    "Check",
    "VectorGymEnvConfig",
    "check_values",
    "checked",
    "field_checks",
    "register_configs",
]


class Check(NamedTuple):
    """What a config field must hold."""

    expect: str  # as the refusal says it: "an integer >= 1"
    test: Callable[[Any], bool]  # the whole test, type included (bools are no numbers)
    null: str | None = None  # what null means, where null is allowed


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int, null: str | None = None) -> Check:
    return Check(f"an integer >= {low}", lambda v: _int(v) and v >= low, null)


def finite(expect: str, test, null: str | None = None) -> Check:
    return Check(
        f"a finite number {expect}",
        lambda v: _number(v) and math.isfinite(v) and test(v),
        null,
    )


def positive(expect: str = "a number > 0", null: str | None = None) -> Check:
    """A number above 0, infinity included."""
    return Check(expect, lambda v: _number(v) and v > 0, null)


def one_of(*choices, null: str | None = None) -> Check:
    names = [repr(c) for c in choices]
    expect = " or ".join([", ".join(names[:-1]), names[-1]])
    return Check(expect, lambda v: v in choices, null)


BOOL = Check("true or false", lambda v: isinstance(v, bool))


def checked(check: Check, default: Any = dataclasses.MISSING, **kwargs):
    """A dataclass field whose values :func:`check_values` checks with ``check``."""
    return field(default=default, metadata={"check": check}, **kwargs)


def field_checks(config: type) -> dict[str, Check]:
    """``{field: its Check}`` for the checked fields of the dataclass ``config``."""
    fields = dataclasses.fields(config)
    return {f.name: f.metadata["check"] for f in fields if "check" in f.metadata}


def check_values(
    checks: type | Mapping[str, Check], values: Mapping, prefix: str = ""
) -> None:
    """Check ``values`` against ``checks``.

    ``checks`` is ``{name: Check}``, or a dataclass whose fields carry them
    (:func:`field_checks`). Raises ``ValueError`` for the first entry its check
    refuses, naming ``prefix`` + the name, the value and what it must be; entries
    ``values`` lacks are skipped.
    """
    if isinstance(checks, type):
        checks = field_checks(checks)
    for name, check in checks.items():
        if name not in values:
            continue
        value, key = values[name], prefix + name
        if value is None:
            if check.null is None:
                raise ValueError(f"{key}=null must be {check.expect}")
            continue
        if not check.test(value):
            shown = str(value).lower() if isinstance(value, bool) else repr(value)
            or_null = f", or null ({check.null})" if check.null else ""
            raise ValueError(f"{key}={shown} must be {check.expect}{or_null}")


class _Checked:
    """Checks a config dataclass's fields when it is built."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_values(type(self), vars(self), prefix=f"{type(self).__name__}: ")


# checks the library configs share with the example scripts' config files
GAMMA = finite("in (0, 1]", lambda v: 0 < v <= 1)
ALPHA = finite("in [0, 1)", lambda v: 0 <= v < 1)
AT_LEAST_0 = finite(">= 0", lambda v: v >= 0)
ABOVE_0 = finite("> 0", lambda v: v > 0)
CLIP_NORM = positive(null="no clipping")


@dataclass
class CategoricalActorConfig(_Checked, ModelConfig):
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

    network: Any = checked(Check("a network config", lambda v: True), None)
    in_keys: Any = field(default_factory=lambda: ["observation"])
    one_hot: bool = checked(BOOL, False)
    return_log_prob: bool = checked(BOOL, True)
    _target_: str = "torchrl_acer.trainers.configs._make_categorical_actor"
    _partial_: bool = False


def _built(node):
    """``node`` built, if it is a config node Hydra left unbuilt."""
    if hasattr(node, "_target_"):
        from hydra.utils import instantiate

        return instantiate(node)
    return node


def _make_categorical_actor(*, network, in_keys, one_hot, return_log_prob, **kwargs):
    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor

    kwargs.pop("out_keys", None)  # the action, the log-probability: fixed
    shared = kwargs.pop("shared", False)
    actor = ProbabilisticActor(
        TensorDictModule(_built(network), list(in_keys), ["logits"]),
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
class VectorGymEnvConfig(_Checked, EnvConfig):
    """``num_envs`` copies of a gymnasium task stepped together, in this process
    unless ``parallel``: :func:`torchrl_acer.training.envs.make_env`, with each
    episode's return under ``("next", "episode_reward")``. TorchRL's ``GymEnv``
    with ``num_envs`` runs gymnasium's ``AsyncVectorEnv``, one process per copy,
    which for a task as cheap as CartPole costs more than it steps.
    """

    env_id: str = "CartPole-v1"
    num_envs: int = checked(integer(1), 8)
    parallel: bool = checked(BOOL, False)
    seed: int | None = checked(integer(0, null="unseeded"), None)
    max_episode_steps: int | None = checked(
        integer(1, null="the env's own time limit"), None
    )
    _target_: str = "torchrl_acer.training.envs.make_env"


@dataclass
class ACERLossConfig(_Checked, LossConfig):
    """Hydra configuration for :class:`~torchrl_acer.ACERLoss` and its estimator.

    Every argument of ``ACERLoss.__init__`` is a field; ``gamma``, ``lmbda``,
    ``c_thresh`` and ``check_values`` go to ``make_value_estimator`` (the loss
    rejects them). The defaults are the paper's discrete settings.
    """

    actor_network: Any = None
    critic_network: Any = None
    ratio_clip: float = checked(positive("a number > 0 (inf: no truncation)"), 10.0)
    trust_region_delta: float | None = checked(positive(null="no trust region"), 1.0)
    trust_region_space: str = checked(one_of("logits", "log_probs", "probs"), "logits")
    entropy_coeff: float = checked(AT_LEAST_0, 0.01)
    critic_coeff: float | None = checked(
        finite(">= 0", lambda v: v >= 0, null="no critic term"), 0.25
    )
    loss_critic_type: str = checked(one_of("l1", "l2", "smooth_l1"), "l2")
    separate_losses: bool = checked(BOOL, False)
    reduction: str | None = checked(one_of("none", "mean", "sum", null="mean"), None)
    recurrent_state: str = checked(one_of("stored", "zero"), "stored")
    burn_in: int = checked(integer(0), 0)
    gamma: float = checked(GAMMA, 0.99)
    lmbda: float = checked(GAMMA, 1.0)
    c_thresh: float = checked(ABOVE_0, 1.0)
    check_values: bool = checked(BOOL, True)
    _target_: str = "torchrl_acer.trainers.configs._make_acer_loss"


# the arguments of ACERLoss.make_value_estimator among ACERLossConfig's fields
_ESTIMATOR_FIELDS = ("gamma", "lmbda", "c_thresh", "check_values")


def _make_acer_loss(**kwargs):
    from torchrl_acer.objectives import ACERLoss

    estimator = {name: kwargs.pop(name) for name in _ESTIMATOR_FIELDS}
    kwargs.pop("_partial_", None)
    kwargs.pop("_target_", None)  # a config's own fields (make_loss passes them)
    for name in ("actor_network", "critic_network"):
        kwargs[name] = _built(kwargs[name])
    loss = ACERLoss(**kwargs)
    loss.make_value_estimator(**estimator)
    return loss


@dataclass
class ACERTrainerConfig(_Checked, TrainerConfig):
    """Hydra configuration for :class:`~torchrl_acer.trainers.ACERTrainer`.

    Every argument of ``ACERTrainer.__init__`` is a field, and ``hooks``: a list
    of :class:`~torchrl.trainers.TrainerHookBase` configs registered on the
    trainer (logging, evaluation, the guards of :mod:`torchrl_acer.trainers.hooks`).
    """

    collector: Any = None
    total_frames: int | None = checked(integer(1, null="the collector's"), None)
    loss_module: Any = None
    optimizer: Any = None
    replay_buffer: Any = None
    replay_ratio: float = checked(AT_LEAST_0, 4.0)
    replay_start: int = checked(integer(0), 0)
    on_policy_updates: bool = checked(BOOL, True)
    alpha: float = checked(ALPHA, 0.99)
    target_net_updater: Any = None
    weight_update_interval: int = checked(integer(1), 1)
    logger: Any = None
    clip_grad_norm: bool = checked(BOOL, True)
    clip_norm: float | None = checked(CLIP_NORM, 10.0)
    progress_bar: bool = checked(BOOL, True)
    seed: int | None = checked(integer(0, null="unseeded"), None)
    save_trainer_interval: int = checked(integer(1), 10000)
    log_interval: int = checked(integer(1), 10000)
    save_trainer_file: Any = None
    checkpoint: Any = None
    checkpoint_rotation: Any = None
    log_timings: bool = False
    auto_log_optim_steps: bool = True
    frame_skip: int = checked(integer(1), 1)
    hooks: list[Any] | None = None
    _target_: str = "torchrl_acer.trainers.configs._make_acer_trainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.on_policy_updates or self.replay_ratio > 0):
            raise ValueError(
                "ACERTrainerConfig: on_policy_updates=false must be true when "
                "replay_ratio is 0 (nothing would train)"
            )


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
