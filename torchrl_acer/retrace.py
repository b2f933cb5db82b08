"""RetraceEstimator: the Retrace(lambda) target as a TorchRL value estimator."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
from tensordict import TensorDictBase
from tensordict.nn import composite_lp_aggregate, dispatch
from tensordict.utils import NestedKey
from torch import distributions as D
from torchrl.objectives.utils import register_value_estimator
from torchrl.objectives.value import ValueEstimatorBase

from torchrl_acer._checks import (
    action_index,
    as_step_tensor,
    check_finite_log_prob,
    get_entry,
)
from torchrl_acer._window import (
    ObservationWindow,
    PolicyCriticEvaluator,
    transition_in_keys,
)
from torchrl_acer.functional import retrace_lambda_return_estimate

__all__ = ["ACERValueEstimators", "RetraceEstimator"]


class ACERValueEstimators(Enum):
    """Value estimators this package adds to TorchRL's registry.

    ``make_value_estimator("retrace", ...)`` and
    ``make_value_estimator(ACERValueEstimators.Retrace, ...)`` both select
    :class:`RetraceEstimator`.
    """

    Retrace = "Retrace(lambda)"


@register_value_estimator(
    ACERValueEstimators.Retrace,
    default_kwargs={"gamma": 0.99, "lmbda": 1.0, "c_thresh": 1.0},
)
class RetraceEstimator(ValueEstimatorBase):
    r"""Retrace(:math:`\lambda`) target for a discrete policy and a Q critic.

    Munos et al., "Safe and Efficient Off-Policy Reinforcement Learning" (NeurIPS
    2016, https://arxiv.org/abs/1606.02647), the critic target of ACER (Wang et al.,
    ICLR 2017, https://arxiv.org/abs/1611.01224). For a ``[*B, T]`` batch collected
    by a behaviour policy :math:`\mu`, with :math:`\pi` the current policy,
    :math:`Q` the critic and :math:`V(s) = \sum_a \pi(a|s) Q(s, a)`:

    .. math::

        G_t = r_t + \gamma (1 - \mathrm{terminated}_t) \big[V(s'_t)
              + (1 - \mathrm{done}_t) c_{t+1} (G_{t+1} - Q(s_{t+1}, a_{t+1}))\big],
        \qquad c_t = \lambda \min\Big(\bar c, \frac{\pi(a_t|s_t)}{\mu(a_t|s_t)}\Big)

    and :math:`G_{T-1} = r_{T-1} + \gamma (1 - \mathrm{terminated}_{T-1}) V(s'_{T-1})`.
    The stored action :math:`a_t` is scored under :math:`\pi` (not a fresh or a mode
    action). A truncated step (``done`` and not ``terminated``: a time limit, or the
    end of a slice from :class:`~torchrl.data.replay_buffers.SliceSampler`) is
    bootstrapped from :math:`V` at its real next observation, never through a reset.

    Each network is called once per forward, on the ``T + 1`` observations of every
    row (the ``T`` observations and the last next observation) plus the next
    observation of each mid-row truncation, rather than on ``2 T`` observations
    (this relies on ``("next", obs)[t] == obs[t + 1]`` inside an episode, as
    collectors and replay buffers produce it; multi-step returns break it).

    The functional form is :func:`~torchrl_acer.retrace_lambda_return_estimate`.

    Keyword Args:
        gamma (scalar): discount.
        actor_network (ProbabilisticTensorDictSequential): the policy :math:`\pi`, a
            categorical distribution over ``"logits"`` (``Categorical`` with action
            indices, or ``OneHotCategorical`` with one-hot actions).
        critic_network (TensorDictModule): the critic, writing one value per action
            under the ``action_value`` key. A critic that shares its leading modules
            with the actor (TorchRL's ``ActorValueOperator``) has them run once.
        lmbda (scalar): trace decay :math:`\lambda`. Defaults to ``1.0`` (ACER).
        c_thresh (scalar): trace truncation :math:`\bar c`. Defaults to ``1.0``.
        differentiable (bool): if ``True``, gradients flow through the networks into
            the outputs. Defaults to ``False``.
        check_values (bool): if ``True`` (default), check that the behaviour
            log-probabilities are finite and the actions in range, and raise
            ``ValueError`` otherwise. These checks reduce over the batch and read
            the result back (a device synchronisation on GPU, a few microseconds on
            CPU); pass ``False`` in hot loops once the data pipeline is trusted. Key
            and shape checks read only metadata and always run.
        time_dim (int, optional): the time dimension of inputs; defaults to the
            dimension named ``"time"``, else the last one.
        device (torch.device, optional): device of the hyper-parameter buffers.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> from torch.distributions import Categorical
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 4), ["observation"], ["logits"]),
        ...     in_keys=["logits"], distribution_class=Categorical)
        >>> critic = TensorDictModule(
        ...     torch.nn.Linear(3, 4), ["observation"], ["action_value"])
        >>> estimator = RetraceEstimator(
        ...     gamma=0.99, actor_network=actor, critic_network=critic)
        >>> B, T = 2, 5
        >>> data = TensorDict({
        ...     "observation": torch.randn(B, T, 3),
        ...     "action": torch.randint(4, (B, T)),
        ...     "action_log_prob": torch.full((B, T), -1.386),
        ...     ("next", "observation"): torch.randn(B, T, 3),
        ...     ("next", "reward"): torch.randn(B, T, 1),
        ...     ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
        ... }, [B, T])
        >>> data = estimator(data)
        >>> data["value_target"].shape, data["advantage"].shape, data["state_value"].shape
        (torch.Size([2, 5, 1]), torch.Size([2, 5, 1]), torch.Size([2, 5, 1]))
    """

    @dataclass
    class _AcceptedKeys:
        """Configurable tensordict keys (``set_keys(name=key)``, nested keys allowed).

        Attributes:
            advantage (NestedKey): written, :math:`G_t - V(s_t)`. Defaults to
                ``"advantage"``.
            value_target (NestedKey): written, :math:`G_t`. Defaults to
                ``"value_target"``.
            value (NestedKey): written, :math:`V(s_t)`. Defaults to ``"state_value"``.
            action_value (NestedKey): the critic's output, one value per action.
                Defaults to ``"action_value"``.
            action (NestedKey): the stored action. Defaults to ``"action"``.
            reward (NestedKey): read under ``"next"``. Defaults to ``"reward"``.
            done (NestedKey): read under ``"next"``. Defaults to ``"done"``.
            terminated (NestedKey): read under ``"next"``. Defaults to
                ``"terminated"``.
            sample_log_prob (NestedKey): the behaviour policy's log-probability of
                the stored action. Defaults to ``"action_log_prob"`` (or
                ``"sample_log_prob"`` under ``set_composite_lp_aggregate(True)``).
        """

        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "state_value"
        action_value: NestedKey = "action_value"
        action: NestedKey = "action"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        sample_log_prob: NestedKey | None = None

        def __post_init__(self):
            if self.sample_log_prob is None:
                self.sample_log_prob = (
                    "sample_log_prob"
                    if composite_lp_aggregate(nowarn=True)
                    else "action_log_prob"
                )

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys

    @classmethod
    def for_loss(cls, loss_module, **hyperparams):
        """Builds the estimator on a loss's ``actor_network`` and ``critic_network``."""
        hyperparams.setdefault("actor_network", loss_module.actor_network)
        critic = hyperparams.pop("value_network", None)
        hyperparams.setdefault("critic_network", critic or loss_module.critic_network)
        return cls(**hyperparams)

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        actor_network,
        critic_network,
        lmbda: float | torch.Tensor = 1.0,
        c_thresh: float | torch.Tensor = 1.0,
        differentiable: bool = False,
        check_values: bool = True,
        time_dim: int | None = None,
        device: torch.device | None = None,
    ):
        super().__init__(
            value_network=None, differentiable=differentiable, device=device
        )
        self.evaluator = PolicyCriticEvaluator(actor_network, critic_network, "logits")
        self.__dict__["actor_network"] = actor_network
        self.__dict__["critic_network"] = critic_network
        for name, value in (("gamma", gamma), ("lmbda", lmbda), ("c_thresh", c_thresh)):
            # float64 buffers: the target is computed in the data's dtype, and a
            # float32 0.99 would cap float64 data at float32 precision
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value, dtype=torch.float64)
            self.register_buffer(name, value.to(self._device))
        self.check_values = check_values
        self.time_dim = time_dim
        dist_class = self.evaluator.distribution_class
        self.one_hot = isinstance(dist_class, type) and issubclass(
            dist_class, D.OneHotCategorical
        )
        if not self.one_hot and not (
            isinstance(dist_class, type) and issubclass(dist_class, D.Categorical)
        ):
            raise TypeError(
                f"RetraceEstimator needs a categorical policy (Categorical or "
                f"OneHotCategorical), got {dist_class}"
            )
        # TorchRL's OneHotCategorical subclasses Categorical: test it by name too
        self.one_hot = self.one_hot or "OneHot" in dist_class.__name__

    def set_keys(self, **kwargs) -> None:
        value = kwargs.get("action_value")
        out_keys = getattr(self.critic_network, "out_keys", None)
        if value is not None and out_keys is not None:
            from tensordict.utils import unravel_key

            if unravel_key(value) not in out_keys:
                raise KeyError(
                    f"action_value key {value!r} is not an output of the critic, "
                    f"whose out_keys are {out_keys}"
                )
        super().set_keys(**kwargs)

    @property
    def in_keys(self):
        return transition_in_keys(self.evaluator.in_keys, self.tensor_keys)

    @property
    def out_keys(self):
        keys = self.tensor_keys
        return [keys.advantage, keys.value_target, keys.value]

    @dispatch
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        params: TensorDictBase | None = None,
        target_params: TensorDictBase | None = None,
        actor_params: TensorDictBase | None = None,
        time_dim: int | None = None,
    ) -> TensorDictBase:
        """Writes the Retrace target, the advantage and :math:`V(s_t)` into ``tensordict``.

        Args:
            tensordict: a ``[*B, T]`` batch.

        Keyword Args:
            params: critic parameters to use instead of the module's own.
            target_params: not supported (Retrace evaluates :math:`Q` and
                :math:`V(s')` with the same critic); passing it raises.
            actor_params: policy parameters to use instead of the module's own.
            time_dim: overrides the estimator's ``time_dim``.
        """
        if target_params is not None:
            raise ValueError(
                "RetraceEstimator uses the same critic for Q(s, a) and V(s'); "
                "target_params is not supported"
            )
        if tensordict.batch_dims < 1:
            raise ValueError(
                "RetraceEstimator expects a [*B, T] tensordict, got batch_size "
                f"{tuple(tensordict.batch_size)}"
            )
        time_dim = self._get_time_dim(time_dim, tensordict)
        last = tensordict.ndim - 1
        data = tensordict if time_dim == last else tensordict.transpose(time_dim, last)
        with torch.set_grad_enabled(self.differentiable and torch.is_grad_enabled()):
            steps = self.evaluate(data, actor_params=actor_params, critic_params=params)
            log_probs = steps.logits.log_softmax(-1)
            value = state_value(log_probs.exp(), steps.q)
            value_target = self.value_estimate(
                data,
                log_pi=taken(log_probs, steps.action),
                action_value=steps.action_value,
                next_state_value=steps.next_state_value,
            )
        outputs = {
            self.tensor_keys.value_target: value_target,
            self.tensor_keys.advantage: value_target - value,
            self.tensor_keys.value: value,
        }
        for key, value in outputs.items():
            if time_dim != last:
                value = value.transpose(time_dim, last)
            tensordict.set(key, value)
        return tensordict

    def evaluate(
        self,
        data: TensorDictBase,
        *,
        actor_params: TensorDictBase | None = None,
        critic_params: TensorDictBase | None = None,
        detach_shared: bool = False,
    ) -> DiscreteSteps:
        """Runs the networks once over ``data`` (``[*B, T]``, time last).

        Returns the per-step quantities Retrace and ACER need, see
        :class:`DiscreteSteps`.
        """
        owner = type(self).__name__
        done, terminated = self.done_flags(data)
        window = ObservationWindow(
            data, self.evaluator.in_keys, done=done, terminated=terminated, owner=owner
        )
        logits, q = self.evaluator(
            window.inputs,
            action_value_key=self.tensor_keys.action_value,
            actor_params=actor_params,
            critic_params=critic_params,
            detach_shared=detach_shared,
        )
        if q.shape != logits.shape:
            raise ValueError(
                f"{owner}: the critic's {self.tensor_keys.action_value!r} has shape "
                f"{tuple(q.shape)} where the policy's logits have {tuple(logits.shape)}"
                f"; the critic must output one value per action"
            )
        action = action_index(
            get_entry(data, self.tensor_keys.action, owner, "the stored action"),
            data.batch_size,
            logits.shape[-1],
            one_hot=self.one_hot,
            owner=owner,
            check_values=self.check_values,
        )
        return DiscreteSteps(window, logits, q, action)

    def done_flags(self, data: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``(done, terminated)`` as ``[*B, T]`` booleans."""
        owner = type(self).__name__
        flags = []
        for name in ("done", "terminated"):
            key = ("next", getattr(self.tensor_keys, name))
            value = get_entry(data, key, owner, f"the {name} flag after each step")
            flags.append(
                as_step_tensor(value, data.batch_size, str(key), owner)
                .squeeze(-1)
                .bool()
            )
        return flags[0], flags[1]

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        *,
        log_pi: torch.Tensor,
        action_value: torch.Tensor,
        next_state_value: torch.Tensor,
    ) -> torch.Tensor:
        """The Retrace target from network outputs already computed.

        Args:
            tensordict: the ``[*B, T]`` batch, time last, holding rewards, done
                flags and the behaviour log-probabilities.

        Keyword Args:
            log_pi: :math:`\\log\\pi(a_t|s_t)`, ``[*B, T, 1]``.
            action_value: :math:`Q(s_t, a_t)`, ``[*B, T, 1]``.
            next_state_value: :math:`V(s'_t)`, ``[*B, T, 1]``.
        """
        owner = type(self).__name__
        keys = self.tensor_keys
        batch = tensordict.batch_size

        def step_entry(key, what):
            value = get_entry(tensordict, key, owner, what)
            return as_step_tensor(value, batch, str(key), owner)

        log_mu = step_entry(
            keys.sample_log_prob,
            "the behaviour policy's log-probability of the stored action",
        )
        if self.check_values:
            check_finite_log_prob(log_mu, repr(keys.sample_log_prob), owner)
        reward = step_entry(("next", keys.reward), "the reward of each step")
        done, terminated = self.done_flags(tensordict)
        return retrace_lambda_return_estimate(
            self.gamma,
            self.lmbda,
            log_pi,
            log_mu,
            action_value,
            next_state_value,
            reward,
            done.unsqueeze(-1),
            terminated.unsqueeze(-1),
            time_dim=-2,
            c_thresh=self.c_thresh,
        )


class DiscreteSteps:
    """Per-step network outputs of a ``[*B, T]`` window (time last).

    Built from the flat outputs of one call of each network.

    Attributes:
        logits: the policy's logits at ``s_t``, ``[*B, T, A]``, in the graph.
        q: :math:`Q(s_t, \\cdot)`, ``[*B, T, A]``, in the graph.
        action: stored action indices, ``[*B, T]``.
        action_value: :math:`Q(s_t, a_t)`, ``[*B, T, 1]``, in the graph.
        next_state_value: :math:`V(s'_t) = \\sum_a \\pi(a|s'_t) Q(s'_t, a)` at the
            real next observation, ``[*B, T, 1]``, in the graph.
    """

    def __init__(self, window, logits, q, action):
        self.window = window
        self.logits, next_logits = window.split(logits)
        self.q, next_q = window.split(q)
        self.next_state_value = state_value(next_logits.softmax(-1), next_q)
        self.action = action
        self.action_value = taken(self.q, action)


def state_value(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """:math:`V(s) = \\sum_a \\pi(a|s) Q(s, a)`, keeping a trailing singleton dim."""
    return (probs * q).sum(-1, keepdim=True)


def taken(per_action: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The entry of the taken action: ``[*B, T, A]`` and ``[*B, T]`` to ``[*B, T, 1]``."""
    return per_action.gather(-1, action.unsqueeze(-1))
