r"""RetraceEstimator: the Retrace(lambda) target as a TorchRL value estimator.

Also how the estimator (and :class:`~torchrl_acer.ACERLoss`) run the policy and the
critic once over a ``[*B, T]`` batch: feed-forward networks on the flat observations
of an :class:`ObservationWindow`, networks holding TorchRL's ``LSTMModule`` /
``GRUModule`` over the rows of a :class:`SequenceWindow` (:class:`RecurrentEvaluator`),
and the input checks the estimator and the loss share.
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from dataclasses import dataclass, replace

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
    composite_lp_aggregate,
    dispatch,
    set_skip_existing,
    skip_existing,
)
from tensordict.utils import NestedKey, unravel_key
from torch import distributions as D
from torchrl._utils import is_compiling
from torchrl.modules import (
    GRUModule,
    IndependentNormal,
    LSTMModule,
    MaskedCategorical,
    set_recurrent_mode,
)
from torchrl.objectives.utils import register_value_estimator
from torchrl.objectives.value.advantages import ValueEstimatorBase

from torchrl_acer.modules.sdn import StochasticDuelingNetwork
from torchrl_acer.objectives._value_estimators import ValueEstimators
from torchrl_acer.objectives.value.functional import retrace_lambda_return_estimate

__all__ = ["RetraceEstimator"]


@register_value_estimator(
    ValueEstimators.Retrace,
    # ACER's data (collector batches, replayed segments) has s'_t == s_{t+1} inside
    # episodes, so the loss's estimator runs the networks on the shifted window
    default_kwargs={"gamma": 0.99, "lmbda": 1.0, "c_thresh": 1.0, "shifted": True},
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

    Each network is called once per forward: with ``shifted=True`` on the ``T + 1``
    observations of every row and the next observation of each mid-row truncation
    (this relies on ``("next", obs)[t] == obs[t + 1]`` inside an episode, as
    collectors and replay buffers produce it), with ``shifted=False`` (the default,
    as in TorchRL) on the ``T`` observations and the ``T`` next observations.

    **Gaussian policies** (paper section 5; the critic is a
    :class:`~torchrl_acer.StochasticDuelingNetwork`): :math:`V` comes from its value
    head, :math:`Q` of the taken action is :math:`\tilde Q`, the traces are
    :math:`\lambda \min(\bar c, \rho_t^{1/d})` for ``d``-dimensional actions, and
    :math:`Q_{opc}` (every trace 1) is also written, under ``value_target_opc``.
    **Recurrent networks** run each row as one sequence (see
    :class:`~torchrl_acer.ACERLoss`); with ``burn_in=k`` the steps ``k .. T-1``
    get the targets of the whole segment, the burn-in steps ``NaN``.

    The functional form is :func:`~torchrl_acer.retrace_lambda_return_estimate`.

    Keyword Args:
        gamma (scalar): discount.
        actor_network (ProbabilisticTensorDictSequential): the policy :math:`\pi`, a
            categorical distribution over ``"logits"`` (``Categorical`` with action
            indices, or ``OneHotCategorical`` with one-hot actions), or a Gaussian.
        value_network (TensorDictModule): the critic: for a categorical policy one
            value per action under the ``action_value`` key (leading modules it
            shares with the actor, as in TorchRL's ``ActorValueOperator``, run
            once), for a Gaussian one a :class:`~torchrl_acer.StochasticDuelingNetwork`.
        lmbda (scalar): trace decay :math:`\lambda`. Defaults to ``1.0`` (ACER).
        c_thresh (scalar): trace truncation :math:`\bar c`. Defaults to ``1.0``.
        differentiable (bool): if ``True``, the outputs carry gradients to the
            data (rewards, observations), never to the parameters of the networks
            (TorchRL's meaning). Defaults to ``False``.
        shifted (bool): the shifted window above. Defaults to ``False``;
            ``ACERLoss``'s default estimator uses ``True``.
        skip_existing (bool, optional): if ``True``, the critic is not run where
            the input already holds its output at ``s_t`` and under ``"next"``
            (the policy always runs; in :class:`~torchrl_acer.ACERLoss` the critic
            runs too, its term trains it). ``None`` (default) follows
            :func:`tensordict.nn.skip_existing`.
        check_values (bool): if ``True`` (default), raise ``ValueError`` naming
            the entry where a reward or a behaviour log-probability is not finite
            or an action is out of range. These checks read a reduction back (a
            device synchronisation on GPU); pass ``False`` in hot loops once the
            data pipeline is trusted. Key and shape checks always run.
        time_dim (int, optional): the time dimension of inputs; defaults to the
            dimension named ``"time"``, else the last one.
        device (torch.device, optional): device of the hyper-parameter buffers.
        recurrent_state (str): with recurrent networks, ``"stored"`` (default) or
            ``"zero"``: the state a segment starts from.
        burn_in (int): with recurrent networks, the steps at the start of each
            segment that only warm the state (their targets are ``NaN``).

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
        ...     gamma=0.99, actor_network=actor, value_network=critic)
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

        Each defaults to its own name, except ``value`` (``"state_value"``) and
        ``sample_log_prob`` (``"action_log_prob"``, or ``"sample_log_prob"`` under
        ``set_composite_lp_aggregate(True)``).

        Attributes:
            advantage (NestedKey): written, :math:`G_t - V(s_t)`.
            value_target (NestedKey): written, :math:`G_t`.
            value (NestedKey): written, :math:`V(s_t)`.
            action_value (NestedKey): the critic's output, one value per action.
            action (NestedKey): the stored action.
            reward (NestedKey): read under ``"next"``.
            done (NestedKey): read under ``"next"``.
            terminated (NestedKey): read under ``"next"``.
            sample_log_prob (NestedKey): the behaviour log-probability of the action.
            value_target_opc (NestedKey): written for Gaussian policies, :math:`Q_{opc}`.
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
        value_target_opc: NestedKey = "value_target_opc"

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
        """TorchRL's, with the loss's ``actor_network`` too."""
        hyperparams.setdefault("actor_network", loss_module.actor_network)
        return super().for_loss(loss_module, **hyperparams)

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        actor_network,
        value_network,
        lmbda: float | torch.Tensor = 1.0,
        c_thresh: float | torch.Tensor = 1.0,
        differentiable: bool = False,
        shifted: bool = False,
        skip_existing: bool | None = None,
        check_values: bool = True,
        time_dim: int | None = None,
        device: torch.device | None = None,
        recurrent_state: str = "stored",
        burn_in: int = 0,
    ):
        super().__init__(
            value_network=value_network,
            differentiable=differentiable,
            shifted=shifted,
            skip_existing=skip_existing,
            device=device,
        )
        self.family = policy_family(actor_network)
        gaussian = self.family == "gaussian"
        if gaussian and not isinstance(value_network, StochasticDuelingNetwork):
            raise TypeError(
                "a Gaussian policy needs a StochasticDuelingNetwork critic "
                f"(V and A heads) as value_network, got {type(value_network).__name__}"
            )
        self.evaluator = make_evaluator(
            actor_network, value_network, self.family, recurrent_state, burn_in
        )
        if gaussian and not value_network.dueling:
            # a plain Q critic's V draws from the policy's statistics, which it
            # reads where the actor writes them
            for name, key in self.evaluator.dist_param_keys.items():
                own = getattr(value_network, f"{name}_key")
                if unravel_key(own) != unravel_key(key):
                    raise ValueError(
                        f"the {type(value_network).__name__} reads the policy's "
                        f"{name} under {own!r}, but the actor writes it under "
                        f"{key!r}; pass {name}_key={key!r} to the critic"
                    )
        self.__dict__["actor_network"] = actor_network
        for name, value in (("gamma", gamma), ("lmbda", lmbda), ("c_thresh", c_thresh)):
            # float64 buffers: the target is computed in the data's dtype, and a
            # float32 0.99 would cap float64 data at float32 precision
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value, dtype=torch.float64)
            self.register_buffer(name, value.to(self._device))
        self.check_values = check_values
        self.time_dim = time_dim

    def set_keys(self, **kwargs) -> None:
        value = kwargs.get("action_value")
        out_keys = getattr(self.value_network, "out_keys", None)
        # a Gaussian policy's dueling network has keys of its own
        gaussian = getattr(self, "family", None) == "gaussian"
        if not (gaussian or value is None or out_keys is None):
            if unravel_key(value) not in out_keys:
                raise KeyError(
                    f"action_value key {value!r} is not an output of the critic, "
                    f"whose out_keys are {out_keys}"
                )
        # V(s) is computed from the policy and Q, not read from the critic, so the
        # base class's check of "value" against the critic's out_keys does not apply
        state_value = kwargs.pop("value", None)
        super().set_keys(**kwargs)
        if state_value is not None:
            if not isinstance(state_value, (str, tuple)):
                raise ValueError(
                    f"key name must be a NestedKey (str or tuple of str), got "
                    f"{type(state_value).__name__} for 'value'"
                )
            self._tensor_keys = replace(
                self.tensor_keys, value=unravel_key(state_value)
            )

    @property
    def in_keys(self):
        return self.evaluator.transition_in_keys(self.tensor_keys)

    @property
    def out_keys(self):
        # as TorchRL's estimators: what a keyword call returns. The state value
        # (and Q_opc for Gaussian policies) are written to the tensordict too.
        return [self.tensor_keys.advantage, self.tensor_keys.value_target]

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

        ``params`` and ``actor_params`` replace the critic's and the policy's own
        parameters; ``target_params`` is not supported (Retrace evaluates :math:`Q`
        and :math:`V(s')` with the same critic).
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
        if self.differentiable:
            # gradients reach the data, never the networks' parameters
            actor_params = _detached(actor_params, self.actor_network)
            params = _detached(params, self.value_network)
        keys = self.tensor_keys
        with torch.set_grad_enabled(self.differentiable and torch.is_grad_enabled()):
            steps = evaluate(
                self, data, actor_params=actor_params, critic_params=params
            )
            data, prefix = steps.data, steps.prefix
            if self.family == "gaussian":
                sdn = self.value_network
                # the window's observations are flat: [*B, T] entries go in flattened
                with self.evaluator.params_context(params, sdn):
                    q_taken = sdn.dueling_action_value(
                        steps.observations,
                        *(
                            x.flatten(0, -2)
                            for x in (steps.value, steps.action, steps.loc, steps.scale)
                        ),
                    ).unflatten(0, steps.loc.shape[:-1])
                log_pi = gaussian_log_prob(steps.loc, steps.scale, steps.action)
                value = steps.value
                target, opc = self.targets(data, steps, log_pi, q_taken)
                outputs = {keys.value_target: target, keys.value_target_opc: opc}
            else:
                log_probs = steps.logits.log_softmax(-1)
                value = state_value(log_probs.exp(), steps.q)
                log_pi = taken(log_probs, steps.action)
                target, _ = self.targets(data, steps, log_pi, steps.action_value)
                outputs = {keys.value_target: target}
        outputs.update({keys.advantage: target - value, keys.value: value})
        for key, value in outputs.items():
            if prefix is not None:
                # burn-in steps get no target: NaN, so that no use of them passes
                shape = (*prefix.batch_size, *value.shape[last + 1 :])
                value = torch.cat([value.new_full(shape, math.nan), value], last)
            if time_dim != last:
                value = value.transpose(time_dim, last)
            tensordict.set(key, value)
        return tensordict

    def targets(self, data, steps, log_pi, action_value, log_mu=None):
        r"""``(G_t, Q_opc)`` from :func:`evaluate`'s ``steps`` on ``data``.

        ``log_pi`` is :math:`\log\pi(a_t|s_t)`, ``action_value`` :math:`Q(s_t, a_t)`,
        both ``[*B, T, 1]``; ``log_mu`` the behaviour log-probabilities
        (:func:`behaviour_log_prob`), read from ``data`` if not given. For a
        Gaussian policy the traces are :math:`\lambda \min(\bar c, \rho_t^{1/d})` and
        :math:`Q_{opc}` has every trace 1; for a categorical one :math:`Q_{opc}`
        is ``None``.
        """
        keys = self.tensor_keys
        key = ("next", keys.reward)
        reward = get_entry(data, key, "the reward of each step")
        reward = as_step_tensor(reward, data.batch_size, str(key))
        if self.check_values:
            check_finite(
                reward,
                repr(key),
                "a non-finite reward would make every target, and after one update "
                "every parameter, non-finite",
            )
        if log_mu is None:
            log_mu = behaviour_log_prob(data, keys, self.family)
        if self.check_values:
            check_finite(
                log_mu,
                repr(keys.sample_log_prob),
                "a behaviour log-probability of -inf or NaN for an action that "
                "was taken means corrupted data; it is not clipped",
            )
        done, terminated = (flag.unsqueeze(-1) for flag in steps.flags)

        def retrace(log_pi, log_mu, lmbda, c_thresh):
            return retrace_lambda_return_estimate(
                self.gamma,
                lmbda,
                log_pi,
                log_mu,
                action_value,
                steps.next_state_value,
                reward,
                done,
                terminated,
                time_dim=-2,
                c_thresh=c_thresh,
            )

        if self.family != "gaussian":
            return retrace(log_pi, log_mu, self.lmbda, self.c_thresh), None
        power = 1.0 / steps.loc.shape[-1]
        q_ret = retrace(log_pi * power, log_mu * power, self.lmbda, self.c_thresh)
        # a zero log-ratio makes every trace 1 * min(1, 1): mu does not enter
        zeros = torch.zeros_like(action_value)
        return q_ret, retrace(zeros, zeros, 1.0, 1.0)


class Steps:
    r"""Per-step network outputs of a ``[*B, T]`` window (time last), in the graph.

    ``data``: the steps after the burn-in ``prefix``; ``flags``: ``(done,
    terminated)``; ``next_state_value``: :math:`V(s'_t)`. Categorical policies:
    ``logits``, ``q`` (:math:`Q(s_t, \cdot)`) and ``action_value``; Gaussian ones:
    ``loc``, ``scale``, ``value`` and the flat ``observations`` the advantage
    head reads.
    """

    def __init__(self, window, params, out, action, flags, data, prefix, obs=None):
        self.window, self.action, self.flags = window, action, flags
        self.data, self.prefix = data, prefix
        if "logits" in params:
            self.logits, next_logits = window.split(params["logits"])
            self.q, next_q = window.split(out)
            self.next_state_value = state_value(softmax(next_logits), next_q)
            self.action_value = taken(self.q, action)
        else:
            loc = params["loc"]
            self.loc = window.split(loc)[0]
            self.scale = window.split(params["scale"].expand_as(loc))[0]
            self.value, self.next_state_value = window.split(out)
            self.observations = obs


def evaluate(
    estimator: RetraceEstimator,
    data: TensorDictBase,
    *,
    actor_params: TensorDictBase | None = None,
    critic_params: TensorDictBase | None = None,
    detach_shared: bool = False,
    reuse_critic_outputs: bool = True,
) -> Steps:
    """Runs ``estimator``'s networks once over ``data`` (``[*B, T]``, time last).

    With the estimator's keys, ``shifted``, ``skip_existing`` (unless not
    ``reuse_critic_outputs``: a loss needs the critic's outputs in its graph) and
    ``check_values``; with a burn-in, the steps are those after it.
    """
    keys, evaluator = estimator.tensor_keys, estimator.evaluator
    k, T = evaluator.burn_in, data.batch_size[-1]
    if k and k >= T:
        raise ValueError(
            f"burn_in={k} leaves no step to learn from in segments of {T} steps; "
            f"sample segments longer than the burn-in"
        )
    # the burn-in steps only warm the recurrent state
    prefix, data = (data[..., :k], data[..., k:]) if k else (None, data)
    if 0 in data.batch_size:  # TensorDict.numel() is at least 1
        raise ValueError(
            f"got an empty batch (batch_size {tuple(data.batch_size)}); a [*B, T] "
            f"batch needs at least one row and one step"
        )
    done, terminated = done_flags(data, keys)
    gaussian = estimator.family == "gaussian"
    output_key = estimator.value_network.value_key if gaussian else keys.action_value
    run = {
        "output_key": output_key,
        "actor_params": actor_params,
        "critic_params": critic_params,
        "detach_shared": detach_shared,
    }
    if evaluator.recurrent:
        prefix_done = None if prefix is None else done_flags(prefix, keys)[0]
        window = evaluator.window(data, prefix, done, terminated, prefix_done, run)
        # the states after each sequence are not needed past the burn-in
        run["pieces"] = evaluator.modules
    else:
        skip = estimator.skip_existing
        # the critic's outputs travel through the window like observations, so
        # the critic can skip them at s_t and s'_t alike
        reuse = run["skip_existing"] = (
            reuse_critic_outputs
            and (skip_existing() if skip is None else skip)
            and data.get(output_key, None) is not None
            and data.get(("next", output_key), None) is not None
        )
        in_keys = [*evaluator.in_keys, output_key] if reuse else evaluator.in_keys
        window = ObservationWindow(
            data, in_keys, done=done, terminated=terminated, shifted=estimator.shifted
        )
    try:
        params, out = evaluator(window.inputs, **run)
    except RuntimeError as error:
        networks = (estimator.actor_network, estimator.value_network)
        explain_dtype_error(error, window.inputs, networks)
        raise
    action = get_entry(data, keys.action, "the stored action")
    if gaussian:
        # the stored actions have the policy's action dimension, scales are positive
        d, scale = params["loc"].shape[-1], params["scale"]
        if tuple(action.shape) != (*data.batch_size, d):
            raise ValueError(
                f"action has shape {tuple(action.shape)}, expected "
                f"{(*data.batch_size, d)} (the policy's {d}-dimensional actions for "
                f"the [*B, T] batch)"
            )
        if estimator.check_values and not bool((scale > 0).all()):
            raise ValueError(
                f"the policy's scale holds values that are not positive (or NaN); "
                f"min {scale.min().item()}"
            )
        # the advantage network reads each step's observations (and, recurrent,
        # the features of the actor's pass over the sequences), flattened
        observations = window.flat_current(estimator.value_network.observation_keys)
        flags = (done, terminated)
        return Steps(window, params, out, action, flags, data, prefix, observations)
    logits = params["logits"]
    if out.shape != logits.shape:
        raise ValueError(
            f"the critic's {keys.action_value!r} has shape {tuple(out.shape)} where "
            f"the policy's logits have {tuple(logits.shape)}; the critic must output "
            f"one value per action"
        )
    action = action_index(
        action,
        data.batch_size,
        logits.shape[-1],
        one_hot=estimator.family == "one_hot",
        check_values=estimator.check_values,
    )
    return Steps(window, params, out, action, (done, terminated), data, prefix)


def done_flags(data: TensorDictBase, keys) -> tuple[torch.Tensor, torch.Tensor]:
    """``(done, terminated)`` under the estimator's ``keys``, ``[*B, T]`` booleans."""
    flags = []
    for name in ("done", "terminated"):
        key = ("next", getattr(keys, name))
        value = get_entry(data, key, f"the {name} flag after each step")
        flags.append(as_step_tensor(value, data.batch_size, str(key)).squeeze(-1))
    return flags[0].bool(), flags[1].bool()


def behaviour_log_prob(data: TensorDictBase, keys, family: str) -> torch.Tensor:
    """The behaviour policy's log-probability of each stored action, ``[*B, T, 1]``.

    A ``torch.distributions.Normal`` policy stores one per action dimension (the
    action's shape): they are summed, as a diagonal Gaussian's log-density is.
    """
    key = keys.sample_log_prob
    value = get_entry(data, key, "the behaviour policy's log-probability")
    gaussian = family == "gaussian"
    if gaussian and value.shape == get_entry(data, keys.action, "the action").shape:
        value = value.sum(-1, keepdim=True)
    return as_step_tensor(value, data.batch_size, repr(key))


def state_value(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r""":math:`V(s) = \sum_a \pi(a|s) Q(s, a)`, keeping a trailing singleton dim."""
    return (probs * q).sum(-1, keepdim=True)


def softmax(x: torch.Tensor, log: bool = False) -> torch.Tensor:
    """The (log-)softmax over the last dim of ``x``, computed over its moved view.

    Torch's CPU kernel is slow over a short last dim (a few actions): out of the
    graph, ``[128, 20, 2]`` takes 129 us over the last dim and 16 us moved first,
    ``[16, 20, 6]`` 41 and 13 us. (With a gradient the backward gives much back.)
    """
    moved = x.movedim(-1, 0)
    return (moved.log_softmax(0) if log else moved.softmax(0)).movedim(0, -1)


def taken(per_action: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The entry of the taken action: ``[*B, T, A]`` and ``[*B, T]`` to ``[*B, T, 1]``."""
    return per_action.gather(-1, action.unsqueeze(-1))


def _detached(params: TensorDictBase | None, module) -> TensorDictBase:
    """``params`` (or the module's own) without gradient."""
    if params is None:
        params = TensorDict.from_module(module)
    return params.detach()


def policy_family(actor_network) -> str:
    """``"categorical"``, ``"one_hot"`` or ``"gaussian"``, from the actor's distribution."""
    dist_class = _probabilistic_module(actor_network).distribution_class
    if not isinstance(dist_class, type):
        raise TypeError(f"unsupported distribution {dist_class!r}")
    if issubclass(dist_class, MaskedCategorical):
        # its mask is no distribution parameter here: it would be ignored, and
        # masked actions would keep their probability
        raise TypeError(
            f"{dist_class.__name__} is not supported: ACER's loss and estimator read "
            f"the policy's logits alone, so its action mask would be ignored. Mask "
            f"the logits in the actor network (a large negative value at masked "
            f"actions) and use Categorical or OneHotCategorical"
        )
    if issubclass(dist_class, D.OneHotCategorical) or (
        issubclass(dist_class, D.Categorical) and "OneHot" in dist_class.__name__
    ):
        return "one_hot"  # TorchRL's OneHotCategorical subclasses Categorical
    if issubclass(dist_class, D.Categorical):
        return "categorical"
    if issubclass(dist_class, (D.Normal, IndependentNormal)):
        return "gaussian"
    raise TypeError(
        f"ACER supports categorical policies (Categorical, OneHotCategorical) and "
        f"Gaussian ones (Normal, IndependentNormal), got {dist_class.__name__}; "
        f"bound actions in the environment (clipping) rather than with a squashed "
        f"distribution, so that log-probabilities stay exact"
    )


def gaussian_log_prob(loc, scale, action) -> torch.Tensor:
    r""":math:`\log\pi(a|s)` of a diagonal Gaussian, ``[..., 1]``."""
    return D.Normal(loc, scale).log_prob(action).sum(-1, keepdim=True)


# -- input checks, shared by the estimator and the loss: structural ones (keys,
# shapes) read metadata only; value checks (finite values, actions in range)
# reduce over the data and run only with check_values


class MissingKeyError(KeyError):
    """A ``KeyError`` whose message prints as written (``KeyError`` quotes it)."""

    # a plain KeyError's str is the repr of its message, which escapes the quotes
    # of the keys it lists

    def __str__(self) -> str:
        return str(self.args[0])


#: what the windows' entries hold, for get_entry's errors
OBSERVATION = "an input of the policy or critic"
NEXT_OBSERVATION = (
    "the next observation of each step, read at the last step and at mid-row "
    "truncations"
)


def get_entry(tensordict: TensorDictBase, key: NestedKey, what: str) -> torch.Tensor:
    """Reads ``key``, raising a ``KeyError`` that names it and says what it should hold."""
    value = tensordict.get(key, None)
    if value is None:
        raise MissingKeyError(
            f"the input tensordict has no entry {key!r}, expected {what}. Its keys "
            f"are {sorted(map(str, tensordict.keys(True, True)))}; use "
            f"set_keys(...) if the entry has another name."
        )
    return value


def as_step_tensor(value: torch.Tensor, batch_shape, name: str) -> torch.Tensor:
    """A per-step entry, ``[*batch_shape]`` or ``[*batch_shape, 1]``, as the latter."""
    shape, batch = tuple(value.shape), tuple(batch_shape)
    if shape == batch:
        return value.unsqueeze(-1)
    if shape == (*batch, 1):
        return value
    raise ValueError(
        f"{name} has shape {shape}, expected {batch} or {(*batch, 1)} (one value "
        f"per step of the [*B, T] batch)"
    )


def check_finite(value: torch.Tensor, name: str, what: str) -> None:
    """Raises ``ValueError`` naming ``name`` if ``value`` holds NaN or infinities."""
    # one sum read back (two operations, not seven); an overflowing one, entry by entry
    if not math.isfinite(value.sum().item()) and (bad := ~torch.isfinite(value)).any():
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name} holds {bad.sum().item()} non-finite values (first at index "
            f"{index}: {value[index].item()}); {what}"
        )


def explain_dtype_error(error: RuntimeError, inputs: TensorDictBase, networks) -> None:
    """Re-raises torch's dtype clash between the data and a network, naming both.

    Called only after a network call failed: nothing to pay on the normal path.
    """
    param_dtypes = {
        p.dtype for net in networks for p in net.parameters() if p.is_floating_point()
    }
    clashes = {
        key: value.dtype
        for key, value in inputs.items(True, True)
        if value.is_floating_point() and value.dtype not in param_dtypes
    }
    if param_dtypes and clashes:
        raise ValueError(
            f"the inputs {clashes} do not have the networks' parameter dtype "
            f"{sorted(map(str, param_dtypes))}; cast the data (e.g. TorchRL's "
            f"DoubleToFloat transform) or the networks (.to(dtype))"
        ) from error


def action_index(
    action: torch.Tensor,
    batch_shape: torch.Size,
    num_actions: int,
    *,
    one_hot: bool,
    check_values: bool,
) -> torch.Tensor:
    """The stored discrete actions as ``[*batch_shape]`` indices.

    One-hot actions are ``[*batch_shape, num_actions]``; index actions
    ``[*batch_shape]`` or ``[*batch_shape, 1]``.
    """
    batch = tuple(batch_shape)
    if one_hot:
        if tuple(action.shape) != (*batch, num_actions):
            raise ValueError(
                f"one-hot action has shape {tuple(action.shape)}, expected "
                f"{(*batch, num_actions)} for a batch {batch} and {num_actions} actions"
            )
        index = action.argmax(-1)
        # a one-hot row is the one-hot vector of its argmax, and no other row is
        if check_values and not torch.equal(
            action, torch.zeros_like(action).scatter_(-1, index.unsqueeze(-1), 1)
        ):
            raise ValueError(
                f"one-hot action holds rows that are not one-hot (exactly one 1 "
                f"and {num_actions - 1} zeros)"
            )
        return index
    if tuple(action.shape) == (*batch, 1):
        action = action.squeeze(-1)
    if tuple(action.shape) != batch:
        raise ValueError(
            f"action has shape {tuple(action.shape)}, expected {batch} or "
            f"{(*batch, 1)} (action indices for a Categorical policy)"
        )
    if action.is_floating_point():
        raise ValueError(f"action has dtype {action.dtype}, expected integer indices")
    if check_values:
        bad = (action < 0) | (action >= num_actions)
        if bad.any():
            index = tuple(bad.nonzero()[0].tolist())
            raise ValueError(
                f"action {action[index].item()} at index {index} is out of range "
                f"for the {num_actions} actions of the policy"
            )
    return action.long()


class ObservationWindow:
    """The observations of a ``[*B, T]`` batch (time last), flattened for one call.

    The ``T + 1`` observations ``s_0 .. s_{T-1}, s'_{T-1}`` of each row, then the
    real next observation of each step before the last that needs one: shifted,
    the mid-row truncations (``done`` and not ``terminated``: a reset observation
    follows them), else every step. ``inputs`` is the flat TensorDict the networks
    run on; :meth:`split` takes their outputs back to the steps.

    Under ``torch.compile`` the number of mid-row truncations (data) must not set a
    shape: the window holds the next observations of ``extra_bound(rows)`` steps,
    the truncations first, and more truncations than that fail with an error.
    """

    #: the bound on mid-row truncations under ``torch.compile``, from the number
    #: of rows; assign a function to change it
    extra_bound = staticmethod(lambda rows: rows)

    def __init__(
        self,
        tensordict: TensorDictBase,
        in_keys: list[NestedKey],
        *,
        done: torch.Tensor,
        terminated: torch.Tensor,
        shifted: bool = True,
    ):
        self.batch_shape = tensordict.batch_size[:-1]
        self.T = tensordict.batch_size[-1]
        time = len(self.batch_shape)
        rows = math.prod(self.batch_shape)
        # inside an episode s'_t is s_{t+1}, already in the window
        mid_truncation = done & ~terminated if shifted else torch.ones_like(done)
        mid_truncation[..., -1] = False
        self.mid_truncation = mid_truncation
        flat = mid_truncation.flatten()
        if is_compiling():
            bound = rows * (self.T - 1)
            if shifted:
                bound = min(self.extra_bound(rows), bound)
            torch._assert_async(
                flat.sum() <= bound,
                f"under torch.compile the window holds at most {bound} mid-row "
                f"truncations (ObservationWindow.extra_bound); this batch has more",
            )
            # the truncations first, in order, then other steps as padding
            extra = torch.argsort(flat.to(torch.uint8), descending=True, stable=True)
            self._extra_index = extra[:bound]
        else:
            self._extra_index = flat.nonzero().squeeze(-1)
        self.num_extra = len(self._extra_index)
        # plain tensor operations per key: TensorDict-level select/cat/reshape
        # cost tens of microseconds each, which adds up in small-network updates
        window, current = {}, {}
        for key in in_keys:
            obs = get_entry(tensordict, key, OBSERVATION)
            next_obs = get_entry(tensordict, ("next", key), NEXT_OBSERVATION)
            parts = [obs, next_obs.narrow(time, self.T - 1, 1)]
            window[key] = torch.cat(parts, time).flatten(0, time)
            current[key] = obs.flatten(0, time)
            if self.num_extra:
                extra = next_obs.flatten(0, time)[self._extra_index]
                window[key] = torch.cat([window[key], extra], 0)
        self.current_tensors = current
        self.inputs = TensorDict(window, [rows * (self.T + 1) + self.num_extra])

    def flat_current(self, keys: list[NestedKey]) -> TensorDictBase:
        """The observations ``keys`` at each ``s_t``, ``[prod(B) T]``."""
        rows = math.prod(self.batch_shape)
        return TensorDict({k: self.current_tensors[k] for k in keys}, [rows * self.T])

    def split(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs on ``inputs`` split into ``(at s_t, at s'_t)``, each ``[*B, T, *F]``."""
        feature_shape = values.shape[1:]
        n = math.prod(self.batch_shape) * (self.T + 1)
        # no slice without extras: its backward would copy the whole gradient
        window = values[:n] if self.num_extra else values
        window = window.reshape(*self.batch_shape, self.T + 1, *feature_shape)
        time = len(self.batch_shape)
        current = window.narrow(time, 0, self.T)
        nxt = window.narrow(time, 1, self.T)
        if self.num_extra:
            mask = self.mid_truncation.reshape(
                *self.mid_truncation.shape, *(1,) * len(feature_shape)
            )
            # under torch.compile the padding's outputs land on steps that are not
            # truncations and are masked out: every shape is static
            extra = values.new_zeros(n - math.prod(self.batch_shape), *feature_shape)
            extra = extra.index_copy(0, self._extra_index, values[n:])
            nxt = torch.where(mask, extra.view_as(nxt), nxt)
        return current, nxt


def _probabilistic_module(actor: TensorDictModuleBase) -> ProbabilisticTensorDictModule:
    for module in reversed(list(actor.modules())):
        if isinstance(module, ProbabilisticTensorDictModule):
            return module
    raise TypeError(
        f"actor_network must be a ProbabilisticActor (or a "
        f"ProbabilisticTensorDictSequential) ending in a probabilistic module, got "
        f"{type(actor).__name__}"
    )


def make_evaluator(actor_network, value_network, family, recurrent_state, burn_in):
    """The evaluator of an estimator's networks: recurrent if one holds an RNN."""
    if recurrent_state not in RECURRENT_STATES:
        raise ValueError(
            f"recurrent_state must be one of {RECURRENT_STATES}, got "
            f"{recurrent_state!r}"
        )
    if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
        raise ValueError(f"burn_in must be an integer >= 0, got {burn_in!r}")
    gaussian = family == "gaussian"
    args = (
        actor_network,
        value_network,
        ("loc", "scale") if gaussian else ("logits",),
        value_network.value_network if gaussian else None,
    )
    if is_recurrent(actor_network, "actor_network") | is_recurrent(
        value_network, "critic"
    ):
        return RecurrentEvaluator(
            *args, recurrent_state=recurrent_state, burn_in=burn_in
        )
    if burn_in:
        raise ValueError(
            f"burn_in={burn_in} warms the state of recurrent networks, but neither "
            f"the actor nor the critic holds an LSTMModule or a GRUModule"
        )
    return PolicyCriticEvaluator(*args)


class PolicyCriticEvaluator:
    """Calls the policy (up to its distribution parameters) and the critic once.

    Leading modules of the critic that are the actor's (TorchRL's
    ``ActorValueOperator``) run once, in the actor's pass. ``dist_params`` are the
    distribution's parameters the actor produces (``("logits",)`` or ``("loc",
    "scale")``), ``critic_head`` the part of the critic run on the window if not
    all of it (a stochastic dueling network's value head).
    """

    #: whether the networks run over sequences (:class:`RecurrentEvaluator`), and
    #: the steps of each segment that only warm their state
    recurrent, burn_in = False, 0

    def __init__(self, actor_network, critic_network, dist_params, critic_head=None):
        self.actor_network = actor_network
        self.critic_network = critic_network
        # (id(params), id(module)) -> (weak refs to both, whether params are the
        # module's own); lives and dies with this evaluator
        self._own_params = {}
        prob_module = _probabilistic_module(actor_network)
        dist_keys = list(prob_module.dist_keys)
        missing = [p for p in dist_params if p not in dist_keys]
        if missing:
            raise ValueError(
                f"the actor's distribution must be parameterised by {list(dist_params)}"
                f", but its probabilistic module takes {dist_keys}"
            )
        self.dist_param_keys = {
            p: prob_module.in_keys[dist_keys.index(p)] for p in dist_params
        }
        critic_head = critic_network if critic_head is None else critic_head
        actor_modules = {id(m) for m in actor_network.modules()}
        shared = []
        # the critic's modules that run after the actor's pass (all of them,
        # unless it starts with the actor's own trunk)
        self.critic_modules = [critic_head]
        if isinstance(critic_head, TensorDictSequential):
            modules = submodules(critic_head)
            while modules and id(modules[0]) in actor_modules:
                shared.append(modules.pop(0))
            if shared:
                if not modules:
                    raise ValueError(
                        "critic_network is made only of modules of the actor network"
                    )
                self.critic_modules = modules
        self.shared_out_keys = [key for m in shared for key in m.out_keys]
        # a dueling network's advantage head runs on the steps, on what it reads
        sdn = isinstance(critic_network, StochasticDuelingNetwork)
        sdn_keys = critic_network.observation_keys if sdn else ()
        self.in_keys = list(
            dict.fromkeys([*actor_network.in_keys, *critic_head.in_keys, *sdn_keys])
        )
        #: the entries read from the data, at ``s_t`` and ``s'_t``, and those the
        #: critic reads from the actor's outputs (recurrent networks)
        self.obs_keys, self.features = self.in_keys, ()
        # the averaged policy: a copy of the actor holding the target parameters,
        # see _average_actor
        self._average = None

    def __getstate__(self) -> dict:
        # the caches hold weak references, which do not pickle (torch.save of a
        # loss, sending it to a process); a copy rebuilds them on its first call
        return {**self.__dict__, "_own_params": {}, "_average": None}

    def transition_in_keys(self, keys) -> list[NestedKey]:
        """The entries a ``[*B, T]`` batch must hold, under the estimator's ``keys``.

        The networks' observations now and next, the action, its behaviour
        log-probability, and the reward and end flags under ``"next"``.
        """
        return [
            *self.obs_keys,
            *(unravel_key(("next", key)) for key in self.obs_keys),
            keys.action,
            keys.sample_log_prob,
            *(
                unravel_key(("next", k))
                for k in (keys.reward, keys.done, keys.terminated)
            ),
        ]

    def __call__(
        self,
        data: TensorDictBase,
        *,
        output_key: NestedKey,
        actor_params: TensorDictBase | None = None,
        critic_params: TensorDictBase | None = None,
        detach_shared: bool = False,
        skip_existing: bool = False,
        pieces=(),
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(distribution parameters, the critic's output_key)``, written into ``data``.

        With ``skip_existing`` the critic's modules whose outputs ``data`` holds are
        skipped; the policy always runs (stored behaviour logits must never stand
        in for the current policy's). The recurrent modules in ``pieces`` run
        by :func:`forward_in_pieces`.
        """
        params = self._actor_pass(self.actor_network, actor_params, data, pieces)
        if detach_shared:
            for key in (*self.shared_out_keys, *self.features):
                data.set(key, data.get(key).detach())
        with (
            self.recurrent_mode(),
            self.params_context(critic_params, self.critic_network),
            set_skip_existing(skip_existing),
        ):
            run_modules(self.critic_modules, data, pieces)
        return params, data.get(output_key)

    def recurrent_mode(self):
        """Enter TorchRL's recurrent mode if the networks hold recurrent modules."""
        return set_recurrent_mode(True) if self.recurrent else contextlib.nullcontext()

    def average_dist_params(self, steps, full, keys, params):
        """The averaged policy's distribution parameters (``params``) at ``steps``."""
        return self._average_pass(
            steps.window.flat_current(self.actor_network.in_keys), params
        )

    @torch.no_grad()
    def _average_pass(self, data: TensorDictBase, params) -> dict:
        """The averaged policy's (``params``) distribution parameters on ``data``.

        Recurrent, ``data`` holds the ``[R, L]`` sequences of a :class:`SequenceWindow`.
        """
        # under torch.compile a traced swap, TorchRL's way; else a copy holding params
        actor = self.actor_network
        if not is_compiling():
            actor, params = self._average_actor(params), None
        pieces = recurrent_modules(actor) if self.recurrent else ()
        return self._actor_pass(actor, params, data, pieces)

    def _actor_pass(self, actor, params, data: TensorDictBase, pieces) -> dict:
        """Runs ``actor`` with ``params`` on ``data`` up to its distribution's parameters."""
        with (
            self.recurrent_mode(),
            self.params_context(params, actor),
            set_skip_existing(False),
        ):
            run_modules(submodules(actor.det_part), data, pieces)
        return {name: data.get(key) for name, key in self.dist_param_keys.items()}

    def _average_actor(self, params):
        """A copy of the actor holding ``params`` (the averaged policy's).

        Swapping parameters in at every call costs more than a small network's
        forward. The copy, made once, holds the very tensors of ``params`` as
        buffers, so ``SoftUpdate``, ``load_state_dict`` and ``.to`` reach it; it is no
        submodule of anything (state dicts are unchanged).
        """
        cached = self._average
        if cached is None or cached[0]() is not params:
            actor = copy.deepcopy(self.actor_network)
            for key, value in params.items(True, True):
                *path, name = key if isinstance(key, tuple) else (key,)
                owner = actor.get_submodule(".".join(path))
                delattr(owner, name)
                owner.register_buffer(name, value)
            cached = self._average = (weakref.ref(params), actor)
        actor = cached[1]
        if actor.training is not self.actor_network.training:
            actor.train(self.actor_network.training)
        return actor

    def _is_own(self, params, module) -> bool:
        """Whether ``params`` are ``module``'s own tensors (or ``None``)."""
        if params is None:
            return True
        cache = self._own_params
        key = (id(params), id(module))
        cached = cache.get(key)
        if cached is None or cached[0]() is not params or cached[1]() is not module:
            for stale in [
                k for k, v in cache.items() if v[0]() is None or v[1]() is None
            ]:
                del cache[stale]
            mine = {id(t) for t in (*module.parameters(), *module.buffers())}
            given = [id(t) for t in params.values(True, True)]
            own = len(given) == len(mine) and mine.issuperset(given)
            cached = cache[key] = (weakref.ref(params), weakref.ref(module), own)
        return cached[2]

    def params_context(self, params, module):
        """Puts ``params`` in ``module`` for the call, unless they are its own.

        A loss's functional parameters are the module's own tensors
        (``convert_to_functional`` keeps them): swapping them would only cost time.
        """
        if self._is_own(params, module):
            return contextlib.nullcontext()
        return params.to_module(module, preserve_module_state=False)


def submodules(sequence: TensorDictSequential) -> list:
    """The modules a ``TensorDictSequential`` runs, in order."""
    modules = sequence.module
    return list(
        modules.values() if isinstance(modules, torch.nn.ModuleDict) else modules
    )


def run_modules(modules, tensordict: TensorDictBase, pieces=()) -> None:
    """Calls each of ``modules`` on ``tensordict`` in turn, as a sequence would.

    A ``TensorDictSequential`` call costs about a small network's forward. The
    recurrent modules in ``pieces`` run by :func:`forward_in_pieces`, unless
    bidirectional or set to TorchRL's ``"scan"`` / ``"triton"`` backend.
    """
    for module in modules:
        if not pieces:
            module(tensordict)
        elif isinstance(module, (LSTMModule, GRUModule)) and any(
            module is m for m in pieces
        ):
            if not module_rnn(module).bidirectional and module.recurrent_backend in (
                "auto",
                "pad",
            ):
                forward_in_pieces(module, tensordict)
            else:
                module(tensordict)
        elif isinstance(module, TensorDictSequential) and any(
            m is p for m in module.modules() for p in pieces
        ):
            run_modules(submodules(module), tensordict, pieces)
        else:
            module(tensordict)


def is_recurrent(network, name: str) -> bool:
    """Whether ``network`` holds TorchRL's ``LSTMModule`` or ``GRUModule``.

    A bare ``nn.LSTM`` / ``nn.GRU`` is refused: it would see neither its sequence
    nor its stored state (TorchRL's modules declare the keys for both).
    """
    modules = recurrent_modules(network)
    wrapped = {id(m) for module in modules for m in module.modules()}
    for sub_name, module in network.named_modules():
        if isinstance(module, torch.nn.RNNBase) and id(module) not in wrapped:
            where = f" at {sub_name!r}" if sub_name else ""
            raise TypeError(
                f"{name} contains a bare recurrent module{where} "
                f"({type(module).__name__}); ACER's loss and Retrace estimator run "
                f"recurrent networks over sequences from their stored hidden state, "
                f"which needs TorchRL's LSTMModule or GRUModule (they declare the "
                f"hidden-state keys and reset at is_init). Wrap it in one of them, "
                f"or use a feed-forward network."
            )
    return bool(modules)


#: the replay modes of the initial recurrent state
RECURRENT_STATES = ("stored", "zero")
#: the episode-start flag TorchRL's recurrent modules read (a fixed name there)
IS_INIT = "is_init"


def recurrent_modules(network) -> list[LSTMModule | GRUModule]:
    """The ``LSTMModule`` and ``GRUModule`` of TorchRL inside ``network``, in order."""
    return [m for m in network.modules() if isinstance(m, (LSTMModule, GRUModule))]


def module_rnn(module: LSTMModule | GRUModule) -> torch.nn.Module:
    """The ``torch.nn`` (or TorchRL python-based) RNN inside ``module``."""
    return module.lstm if isinstance(module, LSTMModule) else module.gru


class RecurrentEvaluator(PolicyCriticEvaluator):
    """Runs a policy and a critic holding recurrent modules over ``[*B, T]`` segments.

    Each row is one sequence (:class:`SequenceWindow`) in TorchRL's recurrent mode,
    from the stored or a zero state, after ``burn_in`` steps that only warm it (see
    :class:`~torchrl_acer.ACERLoss`). ``features`` are what the critic reads of the
    actor's outputs (never read from the data), ``obs_keys`` what is read from the
    data, ``states`` ``{state key: (module, per-step shape)}``.
    """

    recurrent = True

    def __init__(self, *args, recurrent_state: str = "stored", burn_in: int = 0):
        super().__init__(*args)
        self.recurrent_state, self.burn_in = recurrent_state, burn_in
        sdn = self.critic_network
        if isinstance(sdn, StochasticDuelingNetwork):
            for name, module in sdn.named_modules():
                if isinstance(module, (LSTMModule, GRUModule)):
                    raise TypeError(
                        f"the {type(sdn).__name__} holds a recurrent module at "
                        f"{name!r} ({type(module).__name__}); with a Gaussian policy "
                        f"the LSTMModule / GRUModule must be in the actor network, "
                        f"and the dueling network's value and advantage networks "
                        f"feed-forward modules reading its output features (its "
                        f"out_key, e.g. {module.out_keys[0]!r}) and observations"
                    )
        modules = {}
        for network in (self.actor_network, self.critic_network):
            for module in recurrent_modules(network):
                modules[id(module)] = module
        self.modules = list(modules.values())
        self.actor_modules = recurrent_modules(self.actor_network)
        # the output key carrying each state after each step is the module's
        # matching out_key
        self.states, self._state_out = {}, {}
        for module in self.modules:
            rnn = module_rnn(module)
            layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
            h_size = getattr(rnn, "proj_size", 0) or rnn.hidden_size
            sizes = (h_size, rnn.hidden_size)  # (h, c) of an LSTM, h of a GRU
            for key, out_key, size in zip(
                module.in_keys[1:-1], module.out_keys[1:], sizes, strict=False
            ):
                key = unravel_key(key)
                if key in self.states and self.states[key][0] is not module:
                    raise ValueError(
                        f"two recurrent modules read the hidden state {key!r}; give "
                        f"each LSTMModule / GRUModule its own in_keys"
                    )
                self.states[key] = (module, (layers, size))
                self._state_out[key] = unravel_key(out_key)
        hidden = {*self.states, IS_INIT}
        # what the actor writes on its way to its distribution: its trunk's
        # features and the distribution parameters (not the sample or its
        # log-prob, nor an entry it reads and rewrites in place)
        actor = self.actor_network
        not_written = {
            unravel_key(k)
            for k in (*_probabilistic_module(actor).out_keys, *actor.in_keys)
        }
        written = {unravel_key(k) for k in actor.out_keys} - not_written
        keys = [
            key
            for key in dict.fromkeys(map(unravel_key, self.in_keys))
            if key not in hidden
        ]
        self.features = [key for key in keys if key in written]
        self.obs_keys = [key for key in keys if key not in written]

    def transition_in_keys(self, keys) -> list[NestedKey]:
        """The transitions, ``is_init`` and, with ``"stored"``, each hidden state."""
        stored = list(self.states) if self.recurrent_state == "stored" else []
        return [*super().transition_in_keys(keys), *stored, IS_INIT]

    def resets(self, data, done, done_before=None) -> torch.Tensor:
        """The steps whose incoming state is zero, ``[*B, T]`` booleans.

        ``is_init_t`` or ``done_{t-1}``; ``done_before`` is the ``done`` of the step
        before the first.
        """
        is_init = get_entry(
            data,
            IS_INIT,
            "the episode-start flag of each step (TorchRL's InitTracker writes it); "
            "recurrent networks reset their state there",
        )
        reset = as_step_tensor(is_init, data.batch_size, repr(IS_INIT))
        before = (
            done[..., :1] & False if done_before is None else done_before[..., None]
        )
        return reset.squeeze(-1).bool() | torch.cat([before, done[..., :-1]], -1)

    def initial_states(self, data: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        """The state entering the segment's first step, before any reset.

        ``{state key: [R, *shape]}`` for ``R`` rows, in the dtype and device of the
        recurrent modules' parameters.
        """
        like = next(p for m in self.modules for p in m.parameters())
        batch = tuple(data.batch_size)
        rows = math.prod(batch[:-1])
        out = {}
        for key, (module, shape) in self.states.items():
            if self.recurrent_state == "zero":
                out[key] = like.new_zeros(rows, *shape)
                continue
            value = get_entry(
                data,
                key,
                f"the hidden state of {type(module).__name__} stored with each step "
                f"(the collector stores it when the environment has the module's "
                f"make_tensordict_primer()); or use recurrent_state='zero'",
            )
            expected = (*batch, *shape)
            if tuple(value.shape) != expected:
                raise ValueError(
                    f"hidden state {key!r} has shape {tuple(value.shape)}, expected "
                    f"{expected}: the [*B, T] batch, then (num_layers * directions, "
                    f"size) = {shape} of its {type(module).__name__}"
                )
            out[key] = value[..., 0, :, :].reshape(rows, *shape).to(like)
        return out

    def window(self, data, prefix, done, terminated, prefix_done, run):
        """The sequences over ``data``, from the states entering them.

        ``data`` holds the steps after the burn-in ``prefix``, whose ``done`` flags are
        ``prefix_done``; ``run`` are :meth:`__call__`'s arguments, for the burn-in.
        """
        if prefix is None:
            states, done_before = self.initial_states(data), None
        else:
            with torch.no_grad():
                warm = SequenceWindow(
                    prefix,
                    self.obs_keys,
                    self.initial_states(prefix),
                    self.resets(prefix, prefix_done),
                )
                # their own forward, which writes the states after each sequence
                self(warm.inputs, **run)
            states = {
                key: warm.inputs.get(out_key)[:, -1]
                for key, out_key in self._state_out.items()
            }
            done_before = prefix_done[..., -1]
        reset = self.resets(data, done, done_before)
        return SequenceWindow(
            data, self.obs_keys, states, reset, done=done, terminated=terminated
        )

    def average_dist_params(self, steps, full, keys, params):
        """The averaged policy's distribution parameters after the burn-in.

        The actor with ``params`` run over the whole segment ``full`` from the same
        states, ``[*B, T - burn_in, ...]``.
        """
        window = SequenceWindow(
            full,
            self.obs_keys,
            {
                k: v
                for k, v in self.initial_states(full).items()
                if self.states[k][0] in self.actor_modules
            },
            self.resets(full, done_flags(full, keys)[0]),
        )
        dist = self._average_pass(window.inputs, params)
        k = self.burn_in
        return {name: window.current(value)[..., k:, :] for name, value in dist.items()}


def forward_in_pieces(
    module: LSTMModule | GRUModule, tensordict: TensorDictBase
) -> TensorDictBase:
    """Writes the output of ``module`` in recurrent mode on ``[R, L]`` rows.

    TorchRL cuts the rows at ``is_init`` into pieces and packs them, and a packed
    LSTM or GRU runs in small operations on a CPU (3 235 ATen operations for a
    ``[32, 21]`` forward and backward, 77 padded; the loss was 1.2 to 1.7 times
    slower, issue #18). Here the pieces, longest first and padded after their end,
    go through the RNN in a few calls over spans of time, each on the pieces still
    running, from the states the previous one left.
    """
    R, L = tensordict.batch_size
    x = tensordict.get(module.in_keys[0])
    entry = torch.arange(R * L, device=x.device)
    starts = tensordict.get(IS_INIT).reshape(R * L) | (entry % L == 0)
    first = entry[starts]  # each piece's first entry
    count = len(first)
    if count == R:  # no reset after a row's first entry: nothing to cut
        return module(tensordict)
    lengths, order = torch.diff(first, append=entry[-1:] + 1).sort(
        descending=True, stable=True
    )
    rank = order.argsort()  # each piece's place in that order
    piece = starts.long().cumsum(0) - 1
    # entry e is at [rank of its piece, its index in the piece] of the pieces
    at = (rank[piece], entry - first[piece])
    lengths = lengths.tolist()
    index = entry.new_zeros(count, lengths[0]).index_put(at, entry)
    hidden = [
        tensordict.get(key).flatten(0, 1)[index[:, 0]].transpose(0, 1).contiguous()
        for key in module.in_keys[1:-1]
    ]
    state = tuple(hidden) if len(hidden) > 1 else hidden[0]
    x = x.flatten(0, 1)[index]
    rnn = module_rnn(module)
    outputs, t, running = [], 0, count
    while t < lengths[0]:
        # a span ends where half of its pieces have: padding at most doubles the work
        half = (running + 1) // 2
        end = lengths[half] if half < running else lengths[0]
        y, state = rnn(x[:running, t:end], state)
        outputs.append(torch.nn.functional.pad(y, (0, 0, 0, 0, 0, count - running)))
        t = end
        running = sum(n > t for n in lengths[:running])
        # cuDNN takes contiguous states only
        state = (
            tuple(s[:, :running].contiguous() for s in state)
            if isinstance(state, tuple)
            else state[:, :running].contiguous()
        )
    y = torch.cat(outputs, 1)[at]
    tensordict.set(module.out_keys[0], y.reshape(R, L, *y.shape[1:]))
    return tensordict


class SequenceWindow:
    """The observations of a ``[*B, T]`` segment (time last) as ``R`` sequences.

    Row ``b`` holds ``s_0 .. s_{T-1}`` with, given ``done`` and ``terminated``, the
    real next observation of each mid-row truncation and ``s'_{T-1}`` inserted after
    their step (evaluated from the state after it; the reset that follows discards
    it), padded after the row's end. ``inputs`` (``[R, L]``) holds them,
    ``is_init`` and each hidden state at the row's first entry; step ``t`` is at
    ``positions`` (``[R, T]``), its next observation at ``positions + 1``.
    """

    def __init__(
        self,
        data: TensorDictBase,
        obs_keys: list[NestedKey],
        states: dict[NestedKey, torch.Tensor],
        reset: torch.Tensor,
        *,
        done: torch.Tensor | None = None,
        terminated: torch.Tensor | None = None,
    ):
        self.batch_shape = data.batch_size[:-1]
        T = self.T = data.batch_size[-1]
        R = self.rows = math.prod(self.batch_shape)
        device = reset.device
        steps = torch.arange(T, device=device).expand(R, T)
        self._row_index = torch.arange(R, device=device)[:, None].expand(R, T)
        with_next = done is not None
        if with_next:
            truncation = (done & ~terminated).reshape(R, T).clone()
            truncation[:, -1] = False
            extra = truncation.long()
            # step t moves right by the number of truncations before it
            self.positions = steps + extra.cumsum(1) - extra
            length = T + 1 + int(extra.sum(1).max())
            has_next = truncation
            has_next[:, -1] = True
            next_rows, next_steps = has_next.nonzero(as_tuple=True)
            next_positions = self.positions[next_rows, next_steps] + 1
        else:
            self.positions = steps
            length = T
        index = (self._row_index, self.positions)
        tensors = {}
        for key in obs_keys:
            obs = get_entry(data, key, OBSERVATION)
            obs = obs.reshape(R, T, *obs.shape[len(self.batch_shape) + 1 :])
            seq = obs.new_zeros(R, length, *obs.shape[2:]).index_put(index, obs)
            if with_next:
                next_obs = get_entry(data, ("next", key), NEXT_OBSERVATION)
                next_obs = next_obs.reshape(obs.shape)
                seq = seq.index_put(
                    (next_rows, next_positions), next_obs[next_rows, next_steps]
                )
            tensors[key] = seq
        reset = reset.reshape(R, T)
        # padding after a row's end continues it: no split, no output read
        tensors[IS_INIT] = (
            torch.zeros(R, length, dtype=torch.bool, device=device)
            .index_put(index, reset)
            .unsqueeze(-1)
        )
        for key, state in states.items():
            first = torch.where(
                reset[:, 0].reshape(R, *(1,) * (state.ndim - 1)),
                torch.zeros_like(state),
                state,
            )
            seq = state.new_zeros(R, length, *state.shape[1:])
            tensors[key] = torch.cat([first.unsqueeze(1), seq[:, 1:]], 1)
        self.inputs = TensorDict(tensors, [R, length])

    def current(self, values: torch.Tensor) -> torch.Tensor:
        """Outputs on ``inputs`` (``[R, L, *F]``) at ``s_t``, ``[*B, T, *F]``."""
        out = values[self._row_index, self.positions]
        return out.reshape(*self.batch_shape, self.T, *values.shape[2:])

    def flat_current(self, keys: list[NestedKey]) -> TensorDictBase:
        """The entries ``keys`` of ``inputs`` at each ``s_t``, for heads run on steps.

        The observations, and the features the networks wrote there, ``[prod(B) T]``,
        steps in the order of ``[*B, T]`` flattened.
        """
        # current() is [*B, T, *F]: B's dims and T flattened into one
        last = len(self.batch_shape)
        return TensorDict(
            {key: self.current(self.inputs.get(key)).flatten(0, last) for key in keys},
            [self.rows * self.T],
        )

    def split(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs on ``inputs`` split into ``(at s_t, at s'_t)``, each ``[*B, T, *F]``."""
        nxt = values[self._row_index, self.positions + 1]
        nxt = nxt.reshape(*self.batch_shape, self.T, *values.shape[2:])
        return self.current(values), nxt
