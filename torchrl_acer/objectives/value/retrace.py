"""RetraceEstimator: the Retrace(lambda) target as a TorchRL value estimator."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import composite_lp_aggregate, dispatch, skip_existing
from tensordict.utils import NestedKey, unravel_key
from torch import distributions as D
from torchrl.modules import GRUModule, IndependentNormal, LSTMModule
from torchrl.objectives.utils import register_value_estimator
from torchrl.objectives.value.advantages import ValueEstimatorBase

from torchrl_acer.modules.sdn import StochasticDuelingNetwork
from torchrl_acer.objectives._recurrent import RECURRENT_STATES, RecurrentEvaluator
from torchrl_acer.objectives._value_estimators import ValueEstimators
from torchrl_acer.objectives._window import (
    ObservationWindow,
    PolicyCriticEvaluator,
    _probabilistic_module,
    action_index,
    as_step_tensor,
    check_finite,
    check_not_empty,
    explain_dtype_error,
    get_entry,
    transition_in_keys,
)
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

    Each network is called once per forward. With ``shifted=True`` it runs on the
    ``T + 1`` observations of every row (the ``T`` observations and the last next
    observation) plus the next observation of each mid-row truncation, rather than
    on ``2 T`` observations; this relies on ``("next", obs)[t] == obs[t + 1]``
    inside an episode, as collectors and replay buffers produce it (multi-step
    returns break it). With ``shifted=False`` (the default, as in TorchRL) it runs
    on the ``T`` observations and the ``T`` next observations.

    **Gaussian policies** (ACER's continuous actions, paper section 5): with a
    ``Normal`` / ``IndependentNormal`` actor over ``loc`` and ``scale``, the critic
    is a :class:`~torchrl_acer.StochasticDuelingNetwork`; :math:`V` comes from its
    value head, :math:`Q` of the taken action is :math:`\tilde Q` (with fresh
    draws :math:`u_i \sim \pi`), the traces are
    :math:`\lambda \min(\bar c, \rho_t^{1/d})` for ``d``-dimensional actions, and
    :math:`Q_{opc}` (the same recursion with every trace 1) is also written, under
    ``value_target_opc``.

    **Recurrent networks** (TorchRL's ``LSTMModule`` / ``GRUModule``; for a
    Gaussian policy in the actor alone, the dueling network's value and advantage
    networks being feed-forward modules that read the actor's trunk features):
    each row runs as one sequence in recurrent mode, from the state
    stored with its first step (``recurrent_state="stored"``) or zero (``"zero"``),
    reset to zero at ``is_init`` (and after ``done``); :math:`V(s'_t)` is evaluated
    from the state after step ``t``, so a mid-row truncation bootstraps from the
    state that continues its episode. With ``burn_in=k`` the first ``k`` steps of
    each row run without gradient only to warm the state. Retrace treats them as
    not being there: it runs on steps ``k .. T-1`` alone, which gives those steps
    the targets of the whole segment (:math:`G_t` reads only steps ``>= t``), and
    the burn-in steps get ``NaN`` as target, advantage and state value. See
    :class:`~torchrl_acer.ACERLoss` for the equations.

    The functional form is :func:`~torchrl_acer.retrace_lambda_return_estimate`.

    Keyword Args:
        gamma (scalar): discount.
        actor_network (ProbabilisticTensorDictSequential): the policy :math:`\pi`, a
            categorical distribution over ``"logits"`` (``Categorical`` with action
            indices, or ``OneHotCategorical`` with one-hot actions), or a Gaussian.
        value_network (TensorDictModule): the critic. For a categorical policy, a
            module writing one value per action under the ``action_value`` key (a
            critic that shares its leading modules with the actor, as TorchRL's
            ``ActorValueOperator`` makes, has them run once); for a Gaussian one, a
            :class:`~torchrl_acer.StochasticDuelingNetwork`.
        lmbda (scalar): trace decay :math:`\lambda`. Defaults to ``1.0`` (ACER).
        c_thresh (scalar): trace truncation :math:`\bar c`. Defaults to ``1.0``.
        differentiable (bool): if ``True``, the outputs carry gradients to the
            data (rewards, observations), never to the parameters of the networks
            (TorchRL's meaning). Defaults to ``False``.
        shifted (bool): if ``True``, the networks run on the shifted ``T + 1``
            observations of each row (plus the real next observation of each
            mid-row truncation) instead of on the ``T`` observations and the ``T``
            next observations; see above. Defaults to ``False``; ``ACERLoss``'s
            default estimator uses ``True``.
        skip_existing (bool, optional): if ``True``, the critic is not run where
            the input already holds its output (``action_value``, or the dueling
            network's state value, at ``s_t`` and under ``"next"``); the policy
            always runs. ``None`` (default) follows
            :func:`tensordict.nn.skip_existing`.
        check_values (bool): if ``True`` (default), check that the rewards and
            the behaviour log-probabilities are finite and the actions in range
            (and, in ``ACERLoss``, that the behaviour logits, or ``loc`` and a
            positive ``scale``, are finite), and raise ``ValueError`` naming the
            entry otherwise. These checks reduce over the batch and read the result
            back (a device synchronisation on GPU, a few microseconds on CPU); pass
            ``False`` in hot loops once the data pipeline is trusted. Key, shape and
            empty-batch checks read only metadata and always run; a data dtype that
            is not the networks' is named when the networks refuse it.
        time_dim (int, optional): the time dimension of inputs; defaults to the
            dimension named ``"time"``, else the last one.
        device (torch.device, optional): device of the hyper-parameter buffers.
        recurrent_state (str): with recurrent networks, ``"stored"`` (default) or
            ``"zero"``: the state a segment starts from. Ignored otherwise.
        burn_in (int): with recurrent networks, the steps at the start of each
            segment that only warm the state (their targets are ``NaN``).
            Defaults to ``0``.

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

    Like TorchRL's estimators it also takes the entries as keyword arguments
    (``next_`` prefixes the ``"next"`` entries) and returns ``(advantage,
    value_target)``:

        >>> advantage, value_target = estimator(
        ...     observation=data["observation"], action=data["action"],
        ...     action_log_prob=data["action_log_prob"],
        ...     next_observation=data["next", "observation"],
        ...     next_reward=data["next", "reward"], next_done=data["next", "done"],
        ...     next_terminated=data["next", "terminated"])
        >>> torch.testing.assert_close(value_target, data["value_target"])
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
            value_target_opc (NestedKey): written for Gaussian policies,
                :math:`Q_{opc}`. Defaults to ``"value_target_opc"``.
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
        """Builds the estimator on a loss's ``actor_network`` and ``critic_network``."""
        hyperparams.setdefault("actor_network", loss_module.actor_network)
        hyperparams.setdefault("value_network", loss_module.critic_network)
        return cls(**hyperparams)

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        actor_network,
        value_network=None,
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
        if value_network is None:
            raise TypeError(
                "RetraceEstimator needs value_network=: the critic (a Q network, "
                "or a StochasticDuelingNetwork for a Gaussian policy)"
            )
        super().__init__(
            value_network=value_network,
            differentiable=differentiable,
            shifted=shifted,
            skip_existing=skip_existing,
            device=device,
        )
        self.family = policy_family(actor_network)
        if self.family == "gaussian":
            if not isinstance(value_network, StochasticDuelingNetwork):
                raise TypeError(
                    "a Gaussian policy needs a StochasticDuelingNetwork critic "
                    f"(V and A heads) as value_network, got "
                    f"{type(value_network).__name__}"
                )
            self.evaluator = PolicyCriticEvaluator(
                actor_network,
                value_network,
                ("loc", "scale"),
                critic_head=value_network.value_network,
            )
        else:
            self.evaluator = PolicyCriticEvaluator(
                actor_network, value_network, ("logits",)
            )
        self.__dict__["actor_network"] = actor_network
        self.recurrent = self._recurrent_evaluator(recurrent_state, burn_in)
        for name, value in (("gamma", gamma), ("lmbda", lmbda), ("c_thresh", c_thresh)):
            # float64 buffers: the target is computed in the data's dtype, and a
            # float32 0.99 would cap float64 data at float32 precision
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value, dtype=torch.float64)
            self.register_buffer(name, value.to(self._device))
        self.check_values = check_values
        self.time_dim = time_dim
        self.one_hot = self.family == "one_hot"

    def _recurrent_evaluator(self, recurrent_state, burn_in):
        """The sequence evaluator for networks holding recurrent modules.

        ``None`` otherwise (the feed-forward window).
        """
        if recurrent_state not in RECURRENT_STATES:
            raise ValueError(
                f"recurrent_state must be one of {RECURRENT_STATES}, got "
                f"{recurrent_state!r}"
            )
        if isinstance(burn_in, bool) or not isinstance(burn_in, int) or burn_in < 0:
            raise ValueError(f"burn_in must be an integer >= 0, got {burn_in!r}")
        self.recurrent_state = recurrent_state
        self.burn_in = burn_in
        if not self.evaluator.recurrent:
            if burn_in:
                raise ValueError(
                    f"burn_in={burn_in} warms the state of recurrent networks, but "
                    f"neither the actor nor the critic holds an LSTMModule or a "
                    f"GRUModule"
                )
            return None
        critic_keys = ()
        if self.family == "gaussian":
            sdn = self.value_network
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
            # the advantage network runs on the steps, outside the sequences
            critic_keys = sdn.observation_keys
        return RecurrentEvaluator(
            self.evaluator,
            recurrent_state=recurrent_state,
            burn_in=burn_in,
            critic_keys=critic_keys,
        )

    def set_keys(self, **kwargs) -> None:
        value = kwargs.get("action_value")
        out_keys = getattr(self.value_network, "out_keys", None)
        if getattr(self, "family", None) == "gaussian":
            value = None  # the dueling network's keys are its own
        if value is not None and out_keys is not None:
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
        if self.recurrent is not None:
            return self.recurrent.in_keys(self.tensor_keys)
        return transition_in_keys(self.evaluator.in_keys, self.tensor_keys)

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
        if self.differentiable:
            # gradients reach the data, never the networks' parameters
            actor_params = _detached(actor_params, self.actor_network)
            params = _detached(params, self.value_network)
        prefix = None
        if self.recurrent is not None:
            prefix, data = self.recurrent.split_burn_in(data, type(self).__name__)
        with torch.set_grad_enabled(self.differentiable and torch.is_grad_enabled()):
            steps = self.evaluate(
                data, actor_params=actor_params, critic_params=params, prefix=prefix
            )
            if self.family == "gaussian":
                outputs = self._gaussian_outputs(data, steps, actor_params, params)
            else:
                log_probs = steps.logits.log_softmax(-1)
                value = state_value(log_probs.exp(), steps.q)
                value_target = self.value_estimate(
                    data,
                    log_pi=taken(log_probs, steps.action),
                    action_value=steps.action_value,
                    next_state_value=steps.next_state_value,
                    flags=steps.flags,
                )
                outputs = {
                    self.tensor_keys.value_target: value_target,
                    self.tensor_keys.advantage: value_target - value,
                    self.tensor_keys.value: value,
                }
        for key, value in outputs.items():
            if prefix is not None:
                # burn-in steps get no target: NaN, so that no use of them passes
                value = torch.cat(
                    [
                        value.new_full(
                            (*prefix.batch_size, *value.shape[last + 1 :]), math.nan
                        ),
                        value,
                    ],
                    last,
                )
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
        prefix: TensorDictBase | None = None,
    ) -> DiscreteSteps | GaussianSteps:
        """Runs the networks once over ``data`` (``[*B, T]``, time last).

        Returns the per-step quantities Retrace and ACER need, see
        :class:`DiscreteSteps` and :class:`GaussianSteps`.

        With recurrent networks, ``prefix`` holds the burn-in steps that come
        before ``data`` (see :class:`RetraceEstimator`), or ``None``.
        """
        owner = type(self).__name__
        check_not_empty(data, owner)
        done, terminated = self.done_flags(data)
        gaussian = self.family == "gaussian"
        output_key = (
            self.value_network.value_key if gaussian else self.tensor_keys.action_value
        )
        if self.recurrent is not None:
            window, params, out = self._run_recurrent(
                data,
                prefix,
                done=done,
                terminated=terminated,
                output_key=output_key,
                actor_params=actor_params,
                critic_params=critic_params,
                detach_shared=detach_shared,
            )
            if gaussian:
                # the advantage network reads each step's features (from the
                # actor's pass over the sequences) and observations, flattened
                observations = window.flat_current(self.value_network.observation_keys)
                steps = self._gaussian_steps(data, window, params, out, observations)
            else:
                steps = self._discrete_steps(data, window, params, out)
            steps.flags = done, terminated
            return steps
        in_keys = self.evaluator.in_keys
        skip = skip_existing() if self.skip_existing is None else self.skip_existing
        # the critic's outputs travel through the window like observations, so the
        # critic can skip them at s_t and s'_t alike
        reuse = (
            skip
            and data.get(output_key, None) is not None
            and data.get(("next", *_as_tuple(output_key)), None) is not None
        )
        if reuse:
            in_keys = [*in_keys, output_key]
        window = ObservationWindow(
            data,
            in_keys,
            done=done,
            terminated=terminated,
            owner=owner,
            shifted=self.shifted,
        )
        try:
            params, out = self.evaluator(
                window.tensors,
                output_key=output_key,
                actor_params=actor_params,
                critic_params=critic_params,
                detach_shared=detach_shared,
                skip_existing=reuse,
            )
        except RuntimeError as error:
            explain_dtype_error(
                error, window.inputs, (self.actor_network, self.value_network), owner
            )
            raise
        if gaussian:
            steps = self._gaussian_steps(data, window, params, out, window.current)
        else:
            steps = self._discrete_steps(data, window, params, out)
        steps.flags = done, terminated
        return steps

    def _run_recurrent(self, data, prefix, *, done, terminated, output_key, **kwargs):
        """Runs recurrent networks over the segment's sequences (``_recurrent.py``)."""
        owner = type(self).__name__
        prefix_done = None if prefix is None else self.done_flags(prefix)[0]
        window = self.recurrent.window(
            data,
            prefix,
            done=done,
            terminated=terminated,
            prefix_done=prefix_done,
            output_key=output_key,
            actor_params=kwargs["actor_params"],
            critic_params=kwargs["critic_params"],
            like=self.recurrent.parameter(),
            owner=owner,
        )
        try:
            params, out = self.recurrent.run(
                window.inputs, output_key=output_key, **kwargs
            )
        except RuntimeError as error:
            explain_dtype_error(
                error, window.inputs, (self.actor_network, self.value_network), owner
            )
            raise
        return window, params, out

    def _discrete_steps(self, data, window, params, out):
        """Checks the categorical outputs and the stored actions; the steps."""
        owner = type(self).__name__
        action = get_entry(data, self.tensor_keys.action, owner, "the stored action")
        logits = params["logits"]
        if out.shape != logits.shape:
            raise ValueError(
                f"{owner}: the critic's {self.tensor_keys.action_value!r} has shape "
                f"{tuple(out.shape)} where the policy's logits have "
                f"{tuple(logits.shape)}; the critic must output one value per action"
            )
        action = action_index(
            action,
            data.batch_size,
            logits.shape[-1],
            one_hot=self.one_hot,
            owner=owner,
            check_values=self.check_values,
        )
        return DiscreteSteps(window, logits, out, action)

    def _gaussian_steps(self, data, window, params, out, observations):
        """Checks the Gaussian outputs and the stored actions; the steps."""
        owner = type(self).__name__
        action = get_entry(data, self.tensor_keys.action, owner, "the stored action")
        loc, scale = params["loc"], params["scale"]
        check_gaussian(action, loc, scale, data.batch_size, owner, self.check_values)
        return GaussianSteps(window, loc, scale, out, action, observations)

    def _gaussian_outputs(self, data, steps, actor_params, critic_params):
        """Q_ret, Q_opc, V and the advantage for a Gaussian policy and an SDN."""
        sdn = self.value_network
        d = steps.loc.shape[-1]
        # the window's observations are flat: [*B, T] entries go in flattened
        with self.evaluator.params_context(critic_params, sdn):
            q_taken = sdn.dueling_action_value(
                steps.observations,
                steps.value.flatten(0, -2),
                steps.action.flatten(0, -2),
                steps.loc.flatten(0, -2),
                steps.scale.flatten(0, -2),
            ).unflatten(0, steps.loc.shape[:-1])
        log_pi = gaussian_log_prob(steps.loc, steps.scale, steps.action)
        q_ret = self.value_estimate(
            data,
            log_pi=log_pi,
            action_value=q_taken,
            next_state_value=steps.next_state_value,
            trace_power=1.0 / d,
            flags=steps.flags,
        )
        q_opc = self.value_estimate(
            data,
            log_pi=log_pi,
            action_value=q_taken,
            next_state_value=steps.next_state_value,
            unit_traces=True,
            flags=steps.flags,
        )
        keys = self.tensor_keys
        return {
            keys.value_target: q_ret,
            keys.value_target_opc: q_opc,
            keys.advantage: q_ret - steps.value,
            keys.value: steps.value,
        }

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

    def behaviour_log_prob(self, data: TensorDictBase) -> torch.Tensor:
        """The behaviour policy's log-probability of each stored action, ``[*B, T, 1]``.

        A ``torch.distributions.Normal`` policy stores one log-probability per
        action dimension (``[*B, T, d]``): they are summed, as a diagonal
        Gaussian's log-density is.
        """
        owner = type(self).__name__
        key = self.tensor_keys.sample_log_prob
        value = get_entry(
            data, key, owner, "the behaviour policy's log-probability of the action"
        )
        batch = tuple(data.batch_size)
        if (
            self.family == "gaussian"
            and value.ndim == len(batch) + 1
            and tuple(value.shape[:-1]) == batch
            and value.shape[-1] > 1
        ):
            action = get_entry(data, self.tensor_keys.action, owner, "the action")
            if value.shape[-1] != action.shape[-1]:
                raise ValueError(
                    f"{owner}: {key!r} has shape {tuple(value.shape)}: per-dimension "
                    f"log-probabilities must have the action's {action.shape[-1]} "
                    f"dimensions"
                )
            value = value.sum(-1, keepdim=True)
        return as_step_tensor(value, data.batch_size, repr(key), owner)

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        *,
        log_pi: torch.Tensor,
        action_value: torch.Tensor,
        next_state_value: torch.Tensor,
        trace_power: float = 1.0,
        unit_traces: bool = False,
        log_mu: torch.Tensor | None = None,
        flags: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        r"""The Retrace target from network outputs already computed.

        Args:
            tensordict: the ``[*B, T]`` batch, time last, holding rewards, done
                flags and the behaviour log-probabilities.

        Keyword Args:
            log_pi: :math:`\log\pi(a_t|s_t)`, ``[*B, T, 1]``.
            action_value: :math:`Q(s_t, a_t)`, ``[*B, T, 1]``.
            next_state_value: :math:`V(s'_t)`, ``[*B, T, 1]``.
            trace_power: the traces are :math:`\lambda \min(\bar c,
                \rho_t^{p})`; continuous ACER uses :math:`p = 1 / d` for
                ``d``-dimensional actions.
            unit_traces: every trace coefficient 1: ACER's :math:`Q_{opc}`.
            log_mu: :meth:`behaviour_log_prob` of ``tensordict``, if the caller
                has it already.
            flags: :meth:`done_flags` of ``tensordict``, if the caller has them
                already (the ``flags`` of :meth:`evaluate`'s steps).
        """
        owner = type(self).__name__
        keys = self.tensor_keys
        batch = tensordict.batch_size

        def step_entry(key, what):
            value = get_entry(tensordict, key, owner, what)
            return as_step_tensor(value, batch, str(key), owner)

        reward = step_entry(("next", keys.reward), "the reward of each step")
        check = self.check_values
        if check:
            check_finite(reward, *self._reward_check(owner))
        done, terminated = self.done_flags(tensordict) if flags is None else flags
        gamma, lmbda, c_thresh = self.gamma, self.lmbda, self.c_thresh
        if unit_traces:
            # a zero log-ratio makes every ratio 1: c_t = 1 * min(1, 1); the
            # behaviour policy does not enter
            log_pi = log_mu = torch.zeros_like(action_value)
            lmbda, c_thresh = 1.0, 1.0
        else:
            if log_mu is None:
                log_mu = self.behaviour_log_prob(tensordict)
            if check:
                check_finite(log_mu, *self._log_mu_check(owner))
            if trace_power != 1.0:
                log_pi, log_mu = log_pi * trace_power, log_mu * trace_power
        return retrace_lambda_return_estimate(
            gamma,
            lmbda,
            log_pi,
            log_mu,
            action_value,
            next_state_value,
            reward,
            done.unsqueeze(-1),
            terminated.unsqueeze(-1),
            time_dim=-2,
            c_thresh=c_thresh,
        )

    def _reward_check(self, owner):
        return (
            repr(("next", self.tensor_keys.reward)),
            owner,
            "a non-finite reward would make every target, and after one update "
            "every parameter, non-finite",
        )

    def _log_mu_check(self, owner):
        return (
            repr(self.tensor_keys.sample_log_prob),
            owner,
            "a behaviour log-probability of -inf or NaN for an action that "
            "was taken means corrupted data; it is not clipped",
        )


class DiscreteSteps:
    r"""Per-step network outputs of a ``[*B, T]`` window (time last).

    Built from the flat outputs of one call of each network.

    Attributes:
        logits: the policy's logits at ``s_t``, ``[*B, T, A]``, in the graph.
        q: :math:`Q(s_t, \cdot)`, ``[*B, T, A]``, in the graph.
        action: stored action indices, ``[*B, T]``.
        action_value: :math:`Q(s_t, a_t)`, ``[*B, T, 1]``, in the graph.
        next_state_value: :math:`V(s'_t) = \sum_a \pi(a|s'_t) Q(s'_t, a)` at the
            real next observation, ``[*B, T, 1]``, in the graph.
        flags: ``(done, terminated)`` (:meth:`RetraceEstimator.done_flags`).
    """

    def __init__(self, window, logits, q, action):
        self.window = window
        self.logits, next_logits = window.split(logits)
        self.q, next_q = window.split(q)
        self.next_state_value = state_value(next_logits.softmax(-1), next_q)
        self.action = action
        self.action_value = taken(self.q, action)


def state_value(probs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r""":math:`V(s) = \sum_a \pi(a|s) Q(s, a)`, keeping a trailing singleton dim."""
    return (probs * q).sum(-1, keepdim=True)


def taken(per_action: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The entry of the taken action: ``[*B, T, A]`` and ``[*B, T]`` to ``[*B, T, 1]``."""
    return per_action.gather(-1, action.unsqueeze(-1))


class GaussianSteps:
    """Per-step outputs for a Gaussian policy and a stochastic dueling network.

    Attributes:
        loc, scale: the policy's parameters at ``s_t``, ``[*B, T, d]``, in the
            graph (``scale`` as the policy gives it: it may be a constant).
        value: :math:`V(s_t)`, ``[*B, T, 1]``, in the graph.
        next_state_value: :math:`V(s'_t)` at the real next observation.
        action: the stored actions, ``[*B, T, d]``.
        window: the window the networks ran on.
        observations: what the advantage head reads at each ``s_t`` (the
            observations, and with a recurrent actor the features of its trunk),
            a flat ``[prod(B) T]`` TensorDict.
        flags: ``(done, terminated)`` (:meth:`RetraceEstimator.done_flags`).
    """

    def __init__(self, window, loc, scale, value, action, observations):
        self.window = window
        self.loc = window.split(loc)[0]
        self.scale = window.split(scale.expand_as(loc))[0]
        self.value, self.next_state_value = window.split(value)
        self.action = action
        self.observations = observations


def _as_tuple(key: NestedKey) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


def _detached(params: TensorDictBase | None, module) -> TensorDictBase:
    """``params`` (or the module's own) without gradient."""
    if params is None:
        params = TensorDict.from_module(module)
    return params.detach()


def policy_family(actor_network) -> str:
    """The policy family, from the actor's distribution class.

    ``"categorical"``, ``"one_hot"`` or ``"gaussian"``; anything else raises
    ``TypeError``.
    """
    dist_class = _probabilistic_module(actor_network).distribution_class
    if not isinstance(dist_class, type):
        raise TypeError(f"unsupported distribution {dist_class!r}")
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


def check_gaussian(action, loc, scale, batch_shape, owner, check_values):
    """The stored actions match the policy's action dimension; scales are positive."""
    expected = (*batch_shape, loc.shape[-1])
    if tuple(action.shape) != expected:
        raise ValueError(
            f"{owner}: action has shape {tuple(action.shape)}, expected {expected} "
            f"(the policy's {loc.shape[-1]}-dimensional actions for the [*B, T] batch)"
        )
    if check_values and not bool((scale > 0).all()):
        raise ValueError(
            f"{owner}: the policy's scale holds values that are not positive (or "
            f"NaN); min {scale.min().item()}"
        )
