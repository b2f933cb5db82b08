r"""The stochastic dueling network: ACER's critic for continuous actions.

Wang et al. 2017, section 5.1. From a state value head :math:`V(s)` and an
advantage head :math:`A(s, a)`,

.. math::

    \tilde Q(s, a) = V(s) + A(s, a) - \frac1n \sum_{i=1}^n A(s, u_i),
    \qquad u_i \sim \pi(\cdot|s),

so that :math:`E_{a \sim \pi} E_u \tilde Q(s, a) = V(s)`: the network estimates
both values consistently with the current policy while training on
:math:`Q` targets alone.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from tensordict.utils import NestedKey, unravel_key

__all__ = ["PlainQCritic", "SampledStateValue", "StochasticDuelingNetwork"]


def _standard_normal(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(n, *like.shape, dtype=like.dtype, device=like.device)


def _draw(loc, scale, noise):
    """Actions ``loc + scale * noise`` (``[n, *B, d]``).

    No gradient flows into the policy.
    """
    return (loc.detach() + scale.detach() * noise).detach()


class StochasticDuelingNetwork(TensorDictModuleBase):
    r""":math:`V(s)` and :math:`\tilde Q(s, a)` from a value and an advantage head.

    Args:
        value_network (TensorDictModule): reads the observation, writes
            :math:`V(s)` under ``value_key``.
        advantage_network (TensorDictModule): reads the observation and an action,
            writes :math:`A(s, a)` (one value) under its single out key.

    Keyword Args:
        num_samples (int): ``n``, the policy samples of the baseline. Defaults to 5.
        action_key (NestedKey): the action the advantage network reads. Defaults to
            ``"action"``.
        loc_key, scale_key (NestedKey): the policy's Gaussian parameters at ``s``,
            read to draw :math:`u_i`. Default to ``"loc"`` and ``"scale"``.
        value_key (NestedKey): where :math:`V(s)` is written. Defaults to
            ``"state_value"``.
        action_value_key (NestedKey): where :math:`\tilde Q(s, a)` is written.
            Defaults to ``"action_value"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MLP
        >>> value = TensorDictModule(
        ...     MLP(in_features=3, out_features=1, num_cells=[16]),
        ...     ["observation"], ["state_value"])
        >>> advantage = TensorDictModule(
        ...     MLP(in_features=3 + 2, out_features=1, num_cells=[16]),
        ...     ["observation", "action"], ["advantage"])
        >>> sdn = StochasticDuelingNetwork(value, advantage)
        >>> td = TensorDict({
        ...     "observation": torch.randn(4, 3), "action": torch.randn(4, 2),
        ...     "loc": torch.zeros(4, 2), "scale": torch.ones(4, 2)}, [4])
        >>> sdn(td)["action_value"].shape
        torch.Size([4, 1])
    """

    def __init__(
        self,
        value_network: TensorDictModule,
        advantage_network: TensorDictModule,
        *,
        num_samples: int = 5,
        action_key: NestedKey = "action",
        loc_key: NestedKey = "loc",
        scale_key: NestedKey = "scale",
        value_key: NestedKey = "state_value",
        action_value_key: NestedKey = "action_value",
    ):
        super().__init__()
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if len(advantage_network.out_keys) != 1:
            raise ValueError(
                "advantage_network must write one entry, A(s, a); it writes "
                f"{advantage_network.out_keys}"
            )
        # (a PlainQCritic's sampled V names its out key once built)
        value_out = [unravel_key(k) for k in value_network.out_keys]
        if value_out and unravel_key(value_key) not in value_out:
            raise ValueError(
                f"value_network must write V(s) under value_key {value_key!r}; it "
                f"writes {value_network.out_keys} (pass value_key=...)"
            )
        if action_key not in advantage_network.in_keys:
            raise ValueError(
                f"advantage_network must read the action {action_key!r}; it reads "
                f"{advantage_network.in_keys}"
            )
        self.value_network = value_network
        self.advantage_network = advantage_network
        self.num_samples = num_samples
        self.action_key = action_key
        self.loc_key = loc_key
        self.scale_key = scale_key
        self.value_key = value_key
        self.action_value_key = action_value_key
        self.advantage_key = advantage_network.out_keys[0]
        obs_keys = [
            key
            for key in (*value_network.in_keys, *advantage_network.in_keys)
            if key != action_key
        ]
        self.observation_keys = list(dict.fromkeys(obs_keys))
        self.in_keys = [*self.observation_keys, action_key, loc_key, scale_key]
        self.out_keys = [value_key, action_value_key]

    #: whether ``Q~`` is the dueling composition (with the ``V`` term in ACER's
    #: critic loss) or the advantage network's output itself (:class:`PlainQCritic`)
    dueling = True

    def state_value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """:math:`V(s)`, ``[*B, 1]``."""
        return self.value_network(tensordict.copy()).get(self.value_key)

    def advantages(
        self, observations: TensorDictBase, actions: torch.Tensor
    ) -> torch.Tensor:
        """:math:`A(s, a_j)` for ``m`` actions per state in one call.

        Args:
            observations: ``[*B]``, the observation entries.
            actions: ``[m, *B, d]``.

        Returns:
            ``[m, *B, 1]``.
        """
        # the observations expanded to [m, *B], each row with its actions
        data = observations.select(*self.observation_keys)
        data = data.expand(actions.shape[0], *data.batch_size).clone(False)
        data.set(self.action_key, actions)
        return self.advantage_network(data).get(self.advantage_key)

    def sample_baseline_actions(
        self, loc: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        r"""Draws ``n`` actions :math:`u_i \sim \pi(\cdot|s)`, ``[n, *B, d]``.

        No gradient flows into the policy through them.
        """
        return _draw(loc, scale, _standard_normal(self.num_samples, loc))

    def dueling_action_value(
        self,
        observations: TensorDictBase,
        value: torch.Tensor,
        action: torch.Tensor,
        loc: torch.Tensor,
        scale: torch.Tensor,
    ) -> torch.Tensor:
        r""":math:`\tilde Q(s, a) = V(s) + A(s, a) - \frac1n \sum_i A(s, u_i)`.

        With fresh :math:`u_i \sim \pi`, given :math:`V(s)` (``[*B, 1]``); ``action``,
        ``loc`` and ``scale`` are ``[*B, d]``. Returns ``[*B, 1]``. Without the
        dueling architecture (:class:`PlainQCritic`), :math:`Q(s, a)` itself:
        ``value``, ``loc`` and ``scale`` are unused.
        """
        actions = action.unsqueeze(0)
        if not self.dueling:
            return self.advantages(observations, actions)[0]
        actions = torch.cat([actions, self.sample_baseline_actions(loc, scale)], 0)
        advantages = self.advantages(observations, actions)
        return value + advantages[0] - advantages[1:].mean(0)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        value = self.state_value(tensordict)
        q = self.dueling_action_value(
            tensordict,
            value,
            tensordict.get(self.action_key),
            tensordict.get(self.loc_key),
            tensordict.get(self.scale_key),
        )
        tensordict.set(self.value_key, value)
        tensordict.set(self.action_value_key, q)
        return tensordict


class SampledStateValue(TensorDictModuleBase):
    r""":math:`V(s)` of a plain :math:`Q` critic, by Monte Carlo.

    :math:`V(s) = \frac1n \sum_i Q(s, u_i)`, :math:`u_i \sim \pi(\cdot|s)`, with
    the :class:`PlainQCritic`'s own :math:`Q` (its "advantage" network, through
    :meth:`~StochasticDuelingNetwork.advantages`).

    Reads the observation entries and the policy's ``loc`` and ``scale`` at
    :math:`s` (written by the actor in the same tensordict: they are not in
    :attr:`in_keys`, which name what must come from the data), writes
    :math:`V(s)` under ``value_key``. The draws carry no gradient into the policy.
    ``critic`` is referenced, not registered: this module is its value network.
    """

    def __init__(self, critic):
        super().__init__()
        self._critic = (critic,)  # a tuple: not a submodule
        # set by the critic once built: its observation keys and value key
        self.in_keys, self.out_keys = [], []

    def noise(self, loc: torch.Tensor) -> torch.Tensor:
        """Standard normal draws, ``[n, *loc.shape]`` (a seam for tests)."""
        return _standard_normal(self._critic[0].num_samples, loc)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        critic = self._critic[0]
        loc = tensordict.get(critic.loc_key)
        draws = _draw(loc, tensordict.get(critic.scale_key), self.noise(loc))
        q = critic.advantages(tensordict, draws)
        tensordict.set(self.out_keys[0], q.mean(0))
        return tensordict


class PlainQCritic(StochasticDuelingNetwork):
    r"""ACER's continuous critic without the dueling architecture.

    A plain :math:`Q(s, a)` network, with :math:`V(s) = \frac1n \sum_i Q(s, u_i)` by
    Monte Carlo (:class:`SampledStateValue`): the paper's section 6.1 ablation.

    It keeps :class:`StochasticDuelingNetwork`'s interface, with
    :math:`\tilde Q(s, a) = Q(s, a)` (the "advantage" network is :math:`Q`), so
    :class:`~torchrl_acer.ACERLoss` and :class:`~torchrl_acer.RetraceEstimator`
    take it unchanged; the loss then trains :math:`Q` alone (no :math:`V` term:
    :math:`V` has no parameters of its own).

    Args:
        q_network (TensorDictModule): reads the observation and an action, writes
            :math:`Q(s, a)` (one value) under its single out key.

    Keyword Args:
        num_samples (int): ``n``, the draws of :math:`V`. Defaults to 5.
        action_key, loc_key, scale_key, value_key, action_value_key: as for
            :class:`StochasticDuelingNetwork`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MLP
        >>> q = TensorDictModule(
        ...     MLP(in_features=3 + 2, out_features=1, num_cells=[16]),
        ...     ["observation", "action"], ["q"])
        >>> critic = PlainQCritic(q)
        >>> td = TensorDict({
        ...     "observation": torch.randn(4, 3), "action": torch.randn(4, 2),
        ...     "loc": torch.zeros(4, 2), "scale": torch.ones(4, 2)}, [4])
        >>> out = critic(td)
        >>> torch.equal(out["action_value"], q(td.clone())["q"])
        True
    """

    dueling = False

    def __init__(
        self,
        q_network: TensorDictModule,
        *,
        num_samples: int = 5,
        action_value_key: NestedKey = "action_value",
        **keys: NestedKey,
    ):
        # keys: action_key, loc_key, scale_key, value_key
        value = SampledStateValue(self)
        super().__init__(
            value,
            q_network,
            num_samples=num_samples,
            action_value_key=action_value_key,
            **keys,
        )
        # V reads what Q reads but the action
        value.in_keys, value.out_keys = list(self.observation_keys), [self.value_key]
