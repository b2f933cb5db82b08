"""Actor and critic networks for discrete ACER, built from TorchRL modules.

Each builder returns ``(actor, critic)``: a :class:`~torchrl.modules.ProbabilisticActor`
over logits that stores its log-probability (``return_log_prob=True``, what the
loss reads back as the behaviour policy), and a critic writing one Q value per
action under ``"action_value"``. With a shared trunk they come from an
:class:`~torchrl.modules.ActorValueOperator`, and :class:`~torchrl_acer.ACERLoss`
runs the trunk once per update.
"""

from __future__ import annotations

import math

import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import distributions as D
from torch import nn
from torchrl.data import OneHot
from torchrl.modules import (
    MLP,
    ActorValueOperator,
    GRUModule,
    LSTMModule,
    OneHotCategorical,
    ProbabilisticActor,
)

from torchrl_acer.modules.actors import CategoricalActor

__all__ = [
    "atari_actor_critic",
    "gaussian_actor_sdn",
    "minatar_actor_critic",
    "mlp_actor_critic",
    "recurrent_core",
    "recurrent_primer",
]


def _actor_critic(trunk, trunk_out, num_actions, action_spec, obs_key):
    """Wraps a trunk and two linear heads, shared through an ActorValueOperator.
    ``trunk`` is an ``nn.Module`` on ``obs_key``, or a TensorDict module writing
    ``"hidden"``."""
    one_hot = action_spec is None or isinstance(action_spec, OneHot)
    if isinstance(trunk, TensorDictModuleBase):
        common = trunk
    else:
        common = TensorDictModule(trunk, [obs_key], ["hidden"])
    policy_head = ProbabilisticActor(
        TensorDictModule(nn.Linear(trunk_out, num_actions), ["hidden"], ["logits"]),
        in_keys=["logits"],
        spec=action_spec,
        distribution_class=OneHotCategorical if one_hot else D.Categorical,
        return_log_prob=True,
    )
    q_head = TensorDictModule(
        nn.Linear(trunk_out, num_actions), ["hidden"], ["action_value"]
    )
    op = ActorValueOperator(common, policy_head, q_head)
    return op.get_policy_operator(), op.get_value_operator()


def mlp_actor_critic(
    obs_dim: int,
    num_actions: int,
    *,
    num_cells=(64, 64),
    shared: bool = False,
    activation: str = "relu",
    action_spec=None,
    obs_key="observation",
    recurrent: str | None = None,
    recurrent_size: int | None = None,
):
    """MLPs for vector observations.

    With ``shared=False`` (default) the policy and the critic are separate MLPs;
    with ``shared=True`` they share all hidden layers and differ by their last
    linear layer. ``activation`` is ``"relu"`` (default) or ``"tanh"`` (about 15
    times slower than ReLU on the 2-core CPUs this was measured on, where it
    dominated small networks' time).

    With ``recurrent="lstm"`` or ``"gru"`` the hidden layers are followed by a
    recurrent core of ``recurrent_size`` units (default: the last hidden layer's
    width, see :func:`recurrent_core`), and the policy and the critic share all of
    it (``shared`` is implied): the critic must run with the state the policy
    stored while acting.
    """
    activations = {"relu": nn.ReLU, "tanh": nn.Tanh}
    if activation not in activations:
        raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}")
    activation_class = activations[activation]
    num_cells = list(num_cells)
    if recurrent is not None or shared:
        # all hidden layers shared, then (recurrent) a core shared too
        trunk, trunk_out = (
            MLP(
                in_features=obs_dim,
                out_features=num_cells[-1],
                num_cells=num_cells[:-1],
                activation_class=activation_class,
                activate_last_layer=True,
            ),
            num_cells[-1],
        )
        if recurrent is not None:
            trunk, trunk_out = recurrent_core(
                TensorDictModule(trunk, [obs_key], ["embed"]),
                trunk_out,
                recurrent,
                recurrent_size,
            )
        return _actor_critic(trunk, trunk_out, num_actions, action_spec, obs_key)
    one_hot = action_spec is None or isinstance(action_spec, OneHot)

    def mlp():
        return MLP(
            in_features=obs_dim,
            out_features=num_actions,
            num_cells=num_cells,
            activation_class=activation_class,
        )

    # samples with plain tensors when collecting (same draws as ProbabilisticActor)
    actor = CategoricalActor(
        TensorDictModule(mlp(), [obs_key], ["logits"]),
        in_keys=["logits"],
        spec=action_spec,
        distribution_class=OneHotCategorical if one_hot else D.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictModule(mlp(), [obs_key], ["action_value"])
    return actor, critic


class _BatchedConv(nn.Module):
    """A conv stack over ``[*batch, C, H, W]`` inputs (``[*batch, H, W, C]`` if
    ``channels_last``), cast to float and divided by ``scale`` if given.

    Observations stay small in replay (uint8 frames, boolean grids) and are
    converted here, per batch.
    """

    def __init__(self, layers: nn.Sequential, scale: float | None, channels_last=False):
        super().__init__()
        self.layers = layers
        self.scale = scale
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[:-3]
        x = x.reshape(-1, *x.shape[-3:])
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        x = x.float()
        if self.scale is not None:
            x = x / self.scale
        return self.layers(x).reshape(*batch, -1)


def atari_actor_critic(num_actions: int, *, frames: int = 4, action_spec=None):
    """The DQN (Nature) conv trunk on ``[*B, frames, 84, 84]`` uint8 frames, shared
    by a policy head and a Q head, as in OpenAI baselines' ACER."""
    layers = nn.Sequential(
        nn.Conv2d(frames, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
    )
    return _actor_critic(
        _BatchedConv(layers, 255.0), 512, num_actions, action_spec, "pixels"
    )


def minatar_actor_critic(
    in_channels: int,
    num_actions: int,
    *,
    action_spec=None,
    obs_key="observation",
    recurrent: str | None = None,
    recurrent_size: int | None = None,
):
    """The MinAtar paper's small conv net (16 3x3 filters, 128 hidden units) on
    ``[*B, 10, 10, C]`` boolean grids (as MinAtar's gymnasium envs return them),
    shared by a policy head and a Q head; with ``recurrent="lstm"`` or ``"gru"``,
    followed by a recurrent core (see :func:`recurrent_core`)."""
    layers = nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, 128),
        nn.ReLU(),
    )
    conv = _BatchedConv(layers, None, channels_last=True)
    if recurrent is not None:
        trunk, trunk_out = recurrent_core(
            TensorDictModule(conv, [obs_key], ["embed"]), 128, recurrent, recurrent_size
        )
        return _actor_critic(trunk, trunk_out, num_actions, action_spec, obs_key)
    return _actor_critic(conv, 128, num_actions, action_spec, obs_key)


#: the recurrent cores ``recurrent_core`` builds, by name
RECURRENT_CORES = {"lstm": LSTMModule, "gru": GRUModule}


def recurrent_core(
    encoder: TensorDictModule, encoder_out: int, kind: str, size: int | None = None
) -> tuple[TensorDictSequential, int]:
    """``encoder`` (writing ``"embed"``) followed by a one-layer TorchRL
    :class:`~torchrl.modules.LSTMModule` (``kind="lstm"``) or
    :class:`~torchrl.modules.GRUModule` (``"gru"``) of ``size`` units (default
    ``encoder_out``) writing ``"core"``, and ``"hidden"``, the concatenation of
    ``"embed"`` and ``"core"`` that the heads read; returns it and the width of
    ``"hidden"`` (``encoder_out + size``).

    Why the skip connection: the core's outputs are bounded in (-1, 1), so linear
    heads on them alone need large weights to reach action values of a hundred or
    more (CartPole's), and Adam grows weights slowly. On CartPole-v1 with full
    observations an LSTM without it evaluated at 9 after 20k env steps and 106
    after 60k (feed-forward: 500 at about 25k); with it, 431 after 20k.

    The core reads its state from ``"recurrent_state_h"`` and
    ``"recurrent_state_c"`` (LSTM) or ``"recurrent_state"`` (GRU), ``[*B, 1, size]``,
    and resets it where ``"is_init"`` is set: the environment needs TorchRL's
    :class:`~torchrl.envs.InitTracker` and the core's
    ``make_tensordict_primer()`` (see ``examples/utils_gym.py``)."""
    size = size or encoder_out
    core = _core(kind, encoder_out, size)
    skip = TensorDictModule(_Concat(), ["embed", "core"], ["hidden"])
    return TensorDictSequential(encoder, core, skip), encoder_out + size


class _Concat(nn.Module):
    """Its inputs concatenated on the last dimension (a module, so that policies
    holding it pickle into collector processes)."""

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.cat(tensors, -1)


class _GaussianHead(nn.Module):
    """Mean from an MLP, optionally squashed into the action bounds; scale fixed
    (a constant) or learned (state-independent)."""

    def __init__(
        self,
        mlp: nn.Module,
        action_dim: int,
        scale: float | None,
        loc_bounds: tuple[torch.Tensor, torch.Tensor] | None,
        initial_scale: float = 1.0,
    ):
        super().__init__()
        self.mlp = mlp
        self.fixed_scale = scale
        if scale is None:
            if not initial_scale > 0:
                raise ValueError(f"initial_scale must be > 0, got {initial_scale}")
            self.log_scale = nn.Parameter(
                torch.full((action_dim,), math.log(initial_scale))
            )
        self.bounded = loc_bounds is not None
        if self.bounded:
            low, high = (
                torch.as_tensor(b, dtype=torch.get_default_dtype()).expand(action_dim)
                for b in loc_bounds
            )
            # high - low overflows for the +-float-max bounds of an unbounded spec
            # (gymnasium's ClipAction leaves one): read the task's own bounds then
            if not bool((high > low).all() and torch.isfinite(high - low).all()):
                raise ValueError(
                    f"loc_bounds must be finite with high > low, got low={low.tolist()} "
                    f"and high={high.tolist()}"
                )
            self.register_buffer("loc_center", (high + low) / 2)
            self.register_buffer("loc_half_range", (high - low) / 2)

    def forward(self, observation):
        loc = self.mlp(observation)
        if self.bounded:
            loc = self.loc_center + self.loc_half_range * loc.tanh()
        if self.fixed_scale is not None:
            return loc, torch.full_like(loc, self.fixed_scale)
        return loc, self.log_scale.exp().expand_as(loc)


def gaussian_actor_sdn(
    obs_dim: int,
    action_dim: int,
    *,
    num_cells=(256, 256),
    fixed_scale: float | None = 0.3,
    initial_scale: float = 1.0,
    num_samples: int = 5,
    loc_bounds: tuple | None = None,
    dueling: bool = True,
    action_spec=None,
    obs_key="observation",
):
    """A Gaussian policy and a stochastic dueling network (ReLU MLPs).

    The policy's mean comes from an MLP; its scale is ``fixed_scale`` (the paper's
    continuous ACER uses 0.3) or, with ``fixed_scale=None``, a learned
    state-independent scale starting at ``initial_scale`` (then part of the trust
    region's statistics). Actions
    are not squashed: bound them in the environment, so log-probabilities stay
    exact. ``loc_bounds=(low, high)`` (the action bounds) squashes the *mean* into
    them with a tanh: beyond the bounds the clipped environment cannot tell actions
    apart, and an unbounded mean drifts there without limit (on Pendulum-v1 it
    reached hundreds against bounds of 2, and returns collapsed). The Gaussian
    itself stays unsquashed. The critic is
    :class:`~torchrl_acer.modules.sdn.StochasticDuelingNetwork` with ``V(s)`` and
    ``A(s, a)`` MLPs and ``num_samples`` baseline draws; with ``dueling=False`` it
    is a :class:`~torchrl_acer.modules.sdn.PlainQCritic` (a ``Q(s, a)`` MLP, ``V`` from
    ``num_samples`` draws), the paper's ablation without the dueling network.
    """
    from torchrl.modules import IndependentNormal

    from torchrl_acer.modules.sdn import PlainQCritic, StochasticDuelingNetwork

    def mlp(in_features, out_features):
        return MLP(
            in_features=in_features,
            out_features=out_features,
            num_cells=list(num_cells),
            activation_class=nn.ReLU,
        )

    head = _GaussianHead(
        mlp(obs_dim, action_dim), action_dim, fixed_scale, loc_bounds, initial_scale
    )
    actor = ProbabilisticActor(
        TensorDictModule(head, [obs_key], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        spec=action_spec,
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    # torchrl's MLP concatenates its inputs: A(s, a) (or Q(s, a)) on [s, a]
    if not dueling:
        q = TensorDictModule(mlp(obs_dim + action_dim, 1), [obs_key, "action"], ["q"])
        return actor, PlainQCritic(q, num_samples=num_samples)
    value = TensorDictModule(mlp(obs_dim, 1), [obs_key], ["state_value"])
    advantage = TensorDictModule(
        mlp(obs_dim + action_dim, 1), [obs_key, "action"], ["advantage"]
    )
    critic = StochasticDuelingNetwork(value, advantage, num_samples=num_samples)
    return actor, critic


def recurrent_primer(kind: str, size: int):
    """The :class:`~torchrl.envs.TensorDictPrimer` that gives an environment the
    hidden-state entries of :func:`recurrent_core`'s ``kind`` core of ``size``
    units (zeros at reset; the collector then carries the core's
    ``("next", state)`` outputs), from the core's own ``make_tensordict_primer``."""
    return _core(kind, 1, size).make_tensordict_primer()


def _core(kind: str, input_size: int, size: int):
    """The ``kind`` core :func:`recurrent_core` uses, reading ``"embed"``."""
    if kind not in RECURRENT_CORES:
        raise ValueError(
            f"model.recurrent must be one of {sorted(RECURRENT_CORES)} or null, "
            f"got {kind!r}"
        )
    return RECURRENT_CORES[kind](
        input_size=input_size, hidden_size=size, in_key="embed", out_key="core"
    )
