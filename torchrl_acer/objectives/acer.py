"""ACERLoss: discrete ACER as a TorchRL LossModule."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.nn import (
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    dispatch,
)
from tensordict.utils import NestedKey, unravel_key
from torch import distributions as D
from torchrl.objectives.common import LossModule
from torchrl.objectives.utils import (
    _get_default_device,
    dispatch_value_estimator,
    distance_loss,
)
from torchrl.objectives.value import ValueEstimatorBase

from torchrl_acer.modules.sdn import StochasticDuelingNetwork
from torchrl_acer.objectives._value_estimators import ValueEstimators
from torchrl_acer.objectives.trust_region import (
    TRUST_REGION_SPACES,
    TRUST_REGION_STATS,
    categorical_log_probs,
    gaussian_statistics,
    register_projection,
)
from torchrl_acer.objectives.value.retrace import (
    RetraceEstimator,
    behaviour_log_prob,
    check_finite,
    evaluate,
    gaussian_log_prob,
    get_entry,
    softmax,
    state_value,
    taken,
)

__all__ = ["ACERLoss"]


class ACERLoss(LossModule):
    r"""ACER loss, for discrete and for continuous actions.

    "Sample Efficient Actor-Critic with Experience Replay", Wang et al., ICLR 2017,
    https://arxiv.org/abs/1611.01224 (section 3, Algorithm 2).

    On a ``[*B, T]`` batch collected by a behaviour policy :math:`\mu` (whose logits
    and log-probabilities are stored with each step), with the current policy
    :math:`\pi`, the critic :math:`Q`, :math:`V_t = \sum_a \pi(a|s_t) Q(s_t, a)`,
    :math:`\rho_t(a) = \pi(a|s_t) / \mu(a|s_t)`, :math:`\rho_t = \rho_t(a_t)` and the
    Retrace target :math:`G_t` (:class:`~torchrl_acer.RetraceEstimator`), each step
    contributes (:math:`\mathrm{sg}` = stop-gradient)

    .. math::

        J_t &= \min(c, \rho_t)\, \mathrm{sg}(G_t - V_t) \log \pi(a_t|s_t)
            + \sum_a \mathrm{sg}\big([1 - c / \rho_t(a)]_+ \pi(a|s_t)
              (Q(s_t, a) - V_t)\big) \log \pi(a|s_t) \\
        H_t &= -\sum_a \pi(a|s_t) \log \pi(a|s_t) \\
        L^{critic}_t &= \ell\big(\mathrm{sg}(G_t), Q(s_t, a_t)\big)

    and the outputs are ``loss_objective`` :math:`= -J_t`, ``loss_entropy``
    :math:`= -\beta H_t` and ``loss_critic`` :math:`= c_{critic} L^{critic}_t`, each
    reduced over the batch, with :math:`\ell` TorchRL's ``distance_loss`` (``"l2"``:
    the squared error :math:`(x - y)^2`, without a factor ``1/2``). The paper's
    critic update is the gradient of :math:`\tfrac12 (G_t - Q)^2`, so
    :math:`c_{critic} = 0.25` with ``"l2"`` is OpenAI baselines' ``q_coef = 0.5``.
    The bias-correction sum runs over all actions, which is exact for a
    categorical policy.

    **Trust region.** The gradient of :math:`J_t + \beta H_t` arriving at the policy
    statistics of step ``t`` (``trust_region_space``: logits by default) is projected
    so that :math:`k_t \cdot z_t \leq \delta` for every step, with :math:`k_t` the
    gradient of :math:`\mathrm{KL}(\pi_{avg}(\cdot|s_t) \| \pi(\cdot|s_t))`, see
    :mod:`torchrl_acer.objectives.trust_region`. It is a gradient hook: backpropagate
    the losses in one ``backward``; its statistics are then in
    :attr:`trust_region_stats`. The averaged policy :math:`\pi_{avg}` is the actor's
    target parameters: keep them with ``SoftUpdate(loss, eps=0.99)``. The hook undoes
    the ``"mean"`` or ``"sum"`` reduction's scale, so ``delta`` bounds every step;
    with ``"none"`` it assumes the per-step losses will be summed.

    **Continuous actions** (paper section 5). With a Gaussian policy
    (``Normal`` / ``IndependentNormal`` over ``loc`` and ``scale``, learned or
    fixed) the critic is a :class:`~torchrl_acer.modules.sdn.StochasticDuelingNetwork`
    (:math:`V` and :math:`\tilde Q`; a :class:`~torchrl_acer.modules.sdn.PlainQCritic`
    gives the paper's ablation, with no :math:`V` term in the critic loss), the traces
    are :math:`\min(1, \rho_t^{1/d})`, and, with :math:`Q_{opc}` the same recursion
    with every trace 1 and one action :math:`a'_t \sim \pi(\cdot|s_t)`:

    .. math::

        J_t &= \min(c, \rho_t)\, \mathrm{sg}(Q_{opc,t} - V_t) \log \pi(a_t|s_t)
            + \mathrm{sg}\big([1 - c / \rho_t(a'_t)]_+ (\tilde Q(s_t, a'_t) - V_t)\big)
              \log \pi(a'_t|s_t) \\
        L^{critic}_t &= \ell\big(\mathrm{sg}(G_t), \tilde Q(s_t, a_t)\big)
            + \ell\big(\mathrm{sg}(V^{target}_t), V(s_t)\big), \qquad
        V^{target}_t = \min(1, \rho_t) \big(G_t - \tilde Q(s_t, a_t)\big) + V(s_t)

    (the paper's :math:`V` update, in the paper's ratio to the first term's). The
    trust region acts on the mean, joined by the scale when it is learned, with the
    closed-form Gaussian KL gradient. Bound actions in the environment (clipping),
    not with a squashed distribution, so log-probabilities stay exact. Each forward
    draws once, after the networks ran: ``torch.randn(1 + n, *loc.shape)`` (``n``
    the dueling network's ``num_samples``), row ``0`` for :math:`a'_t = \mu_t +
    \sigma_t \epsilon_{0,t}`, the others for the :math:`u_i` of :math:`\tilde Q`.

    **Recurrent networks** (TorchRL's :class:`~torchrl.modules.LSTMModule` and
    :class:`~torchrl.modules.GRUModule`, in the actor, the critic or a trunk they
    share; for a Gaussian policy in the actor) run each row of the segment as one
    sequence. With :math:`h_t` the state entering step ``t``, :math:`f` the
    recurrent core and :math:`h^{stored}_0` the state stored with the first step:

    .. math::

        h_0 &= \begin{cases} h^{stored}_0 & \text{recurrent\_state="stored"} \\
                              0 & \text{recurrent\_state="zero"} \end{cases}, \qquad
        h_{t+1} = f(s_t, h_t), \qquad
        h_t \leftarrow 0 \text{ if } \mathrm{is\_init}_t \lor \mathrm{done}_{t-1}

    and the outputs at :math:`s_t` come from :math:`(s_t, h_t)`, those at the next
    observation :math:`s'_t` from :math:`(s'_t, h_{t+1})`. The averaged policy runs
    the same way from the same states. With ``burn_in=k`` (R2D2, Kapturowski et
    al., ICLR 2019) steps ``0 .. k-1`` only compute :math:`h_k`, without gradient;
    the loss covers steps ``k .. T-1`` (``reduction="none"`` returns ``[*B, T -
    k]``). With a Gaussian policy the dueling network's value and advantage
    networks are feed-forward heads reading the actor trunk's output features
    (:math:`V_t = V(y_t, s_t)` with :math:`y_t` the trunk's output at :math:`(s_t,
    h_t)`), run on the flattened steps; the critic loss trains the trunk through
    them (not with ``separate_losses=True``).

    With ``check_values=False`` on the estimator, ``torch.compile(loss)`` traces
    the whole forward, trust-region hook included, as one graph (see
    :class:`~torchrl_acer.objectives.value.retrace.ObservationWindow`).

    Args:
        actor_network (ProbabilisticTensorDictSequential): the policy, a categorical
            distribution over logits (``Categorical`` or ``OneHotCategorical``) or a
            Gaussian (``Normal``, ``IndependentNormal``).
        critic_network (TensorDictModule): for a categorical policy, the critic
            writing one value per action under ``"action_value"`` (or its last
            out_key); for a Gaussian one, a
            :class:`~torchrl_acer.modules.sdn.StochasticDuelingNetwork`. It gets no
            target parameters.

    Keyword Args:
        ratio_clip (float): truncation :math:`c` of the importance ratio in the policy
            gradient. Defaults to ``10.0``.
        trust_region_delta (float or None): :math:`\delta`. ``None`` disables the
            trust region. Defaults to ``1.0``.
        trust_region_space (str): the statistics :math:`\phi` the projection acts on
            for a categorical policy: ``"logits"`` (default), ``"log_probs"`` or
            ``"probs"`` (the paper's). A Gaussian's are its mean and scale.
        entropy_coeff (float): :math:`\beta`. Defaults to ``0.01``.
        critic_coeff (float or None): :math:`c_{critic}`. Defaults to ``0.25``.
            ``None`` drops the critic term (the critic must be trained elsewhere).
        loss_critic_type (str): the distance :math:`\ell` of TorchRL's
            ``distance_loss``: ``"l2"`` (default, the squared error), ``"l1"`` or
            ``"smooth_l1"``.
        separate_losses (bool): if ``True``, parameters shared by the actor and the
            critic are trained by the policy terms only. Defaults to ``False``.
        reduction (str, optional): ``"none"``, ``"mean"`` or ``"sum"``. ``None``
            (default) means ``"mean"``.
        recurrent_state (str): with recurrent networks, ``"stored"`` (default) or
            ``"zero"``: the state a replayed segment starts from.
        burn_in (int): with recurrent networks, the steps at the start of each
            segment that only warm the state. Defaults to ``0``.

    ``ratio_clip``, ``entropy_coeff`` and ``critic_coeff`` are buffers that can be
    scheduled by assignment (``loss.entropy_coeff = 0.001``).

    The default value estimator is Retrace with :math:`\lambda = 1`,
    :math:`\bar c = 1`, :math:`\gamma = 0.99` and ``shifted=True``; change it with
    ``make_value_estimator(gamma=..., lmbda=..., c_thresh=..., shifted=...)``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torch.distributions import Categorical
        >>> from torchrl.modules import ProbabilisticActor
        >>> from torchrl.objectives import SoftUpdate
        >>> _ = torch.manual_seed(0)
        >>> n_obs, n_act, B, T = 3, 4, 2, 5
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(n_obs, n_act), ["observation"], ["logits"]),
        ...     in_keys=["logits"], distribution_class=Categorical, return_log_prob=True)
        >>> critic = TensorDictModule(
        ...     torch.nn.Linear(n_obs, n_act), ["observation"], ["action_value"])
        >>> loss = ACERLoss(actor, critic)
        >>> loss.make_value_estimator(gamma=0.99)  # doctest: +ELLIPSIS
        ACERLoss(...)
        >>> updater = SoftUpdate(loss, eps=0.99)
        >>> behaviour_logits = torch.randn(B, T, n_act)
        >>> action = torch.distributions.Categorical(logits=behaviour_logits).sample()
        >>> data = TensorDict({
        ...     "observation": torch.randn(B, T, n_obs),
        ...     "action": action,
        ...     "logits": behaviour_logits,
        ...     "action_log_prob": behaviour_logits.log_softmax(-1).gather(
        ...         -1, action[..., None])[..., 0],
        ...     ("next", "observation"): torch.randn(B, T, n_obs),
        ...     ("next", "reward"): torch.randn(B, T, 1),
        ...     ("next", "done"): torch.zeros(B, T, 1, dtype=torch.bool),
        ...     ("next", "terminated"): torch.zeros(B, T, 1, dtype=torch.bool),
        ... }, [B, T])
        >>> out = loss(data)
        >>> sorted(k for k in out.keys() if k.startswith("loss_"))
        ['loss_critic', 'loss_entropy', 'loss_objective']
        >>> (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()
        >>> sorted(loss.trust_region_stats.keys())
        ['active_fraction', 'k_dot_g', 'k_norm']
        >>> updater.step()
    """

    @dataclass
    class _AcceptedKeys(RetraceEstimator._AcceptedKeys):
        """Configurable tensordict keys (``set_keys(name=key)``, nested keys allowed).

        The first ten are the value estimator's, forwarded to it (see
        :class:`~torchrl_acer.RetraceEstimator`); ``action`` and ``sample_log_prob``
        default to the actor's keys, ``action_value`` to the critic's last out_key
        when the critic writes no ``"action_value"``.

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
            behavior_logits (NestedKey): the behaviour policy's logits stored with
                each step (categorical policies). Defaults to the actor's logits key
                (``"logits"``), where collectors store them.
            behavior_loc (NestedKey): the behaviour policy's mean stored with each
                step (Gaussian policies). Defaults to the actor's key (``"loc"``).
            behavior_scale (NestedKey): the behaviour policy's scale stored with
                each step (Gaussian policies). Defaults to the actor's key
                (``"scale"``).
        """

        behavior_logits: NestedKey = "logits"
        behavior_loc: NestedKey = "loc"
        behavior_scale: NestedKey = "scale"

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys
    _schedulable_buffers = frozenset({"ratio_clip", "entropy_coeff", "critic_coeff"})
    default_value_estimator = ValueEstimators.Retrace
    SUPPORTED_VALUE_ESTIMATORS = (ValueEstimators.Retrace,)
    # every key of the estimator is forwarded to it
    _value_estimator_default_keys = tuple(
        RetraceEstimator._AcceptedKeys.__dataclass_fields__
    )

    actor_network: ProbabilisticTensorDictSequential
    critic_network: TensorDictModule
    actor_network_params: TensorDictParams
    critic_network_params: TensorDictParams
    target_actor_network_params: TensorDictParams
    target_critic_network_params: TensorDictParams

    def __init__(
        self,
        actor_network: ProbabilisticTensorDictSequential,
        critic_network: TensorDictModule,
        *,
        ratio_clip: float = 10.0,
        trust_region_delta: float | None = 1.0,
        trust_region_space: str = "logits",
        entropy_coeff: float = 0.01,
        critic_coeff: float | None = 0.25,
        loss_critic_type: str = "l2",
        separate_losses: bool = False,
        reduction: str | None = None,
        recurrent_state: str = "stored",
        burn_in: int = 0,
    ):
        reduction = "mean" if reduction is None else reduction
        for name, value, choices in (
            ("trust_region_space", trust_region_space, TRUST_REGION_SPACES),
            ("reduction", reduction, ("none", "mean", "sum")),
            ("loss_critic_type", loss_critic_type, ("l2", "l1", "smooth_l1")),
        ):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        if trust_region_delta is not None and not trust_region_delta > 0:
            raise ValueError(
                f"trust_region_delta must be positive or None, got {trust_region_delta}"
            )
        if not ratio_clip > 0:
            raise ValueError(f"ratio_clip must be positive, got {ratio_clip}")
        self._out_keys = None
        super().__init__()
        self.convert_to_functional(
            actor_network, "actor_network", create_target_params=True
        )
        self.convert_to_functional(
            critic_network,
            "critic_network",
            compare_against=list(actor_network.parameters())
            if separate_losses
            else None,
        )
        self.separate_losses = separate_losses
        self.trust_region_space = trust_region_space
        self.trust_region_delta = trust_region_delta
        self.loss_critic_type = loss_critic_type
        self.reduction = reduction
        device = _get_default_device(self)
        # float64 scalars: they do not promote float32 losses (0-dim tensors never
        # do), and float64 losses keep their precision (float32 0.01 does not)
        for name, value in (
            ("ratio_clip", ratio_clip),
            ("entropy_coeff", entropy_coeff),
            ("critic_coeff", critic_coeff),
        ):
            self.register_coeff_buffer(name, value, device=device, dtype=torch.float64)
        # the trust region's hook writes its statistics here, in the policy's dtype
        # (NaN until the first backward). Allocated once, here: a tensor created
        # in a compiled forward and written by the compiled backward is not
        # supported. Not persistent: they describe one backward, not the loss.
        dtype = next(
            (p.dtype for p in actor_network.parameters() if p.is_floating_point()),
            torch.get_default_dtype(),
        )
        self.register_buffer(
            "_trust_region_stats",
            torch.full(
                (len(TRUST_REGION_STATS),), math.nan, dtype=dtype, device=device
            ),
            persistent=False,
        )
        self.recurrent_state = recurrent_state
        self.burn_in = burn_in
        # a Q critic writing its values under another name: its output, so that
        # the estimator built now accepts it (set_keys can change it later)
        out_keys = [unravel_key(k) for k in getattr(critic_network, "out_keys", ())]
        if (
            not isinstance(critic_network, StochasticDuelingNetwork)
            and out_keys
            and self.tensor_keys.action_value not in out_keys
        ):
            self.set_keys(action_value=out_keys[-1])
        # the default estimator, built now: it validates the networks and finds
        # the distribution's keys, which name the behaviour policy's entries
        self.make_value_estimator()
        if self.value_estimator.family == "gaussian" and trust_region_space != "logits":
            raise ValueError(
                f"trust_region_space={trust_region_space!r} applies to categorical "
                f"policies; a Gaussian policy's trust region acts on its mean and "
                f"scale (leave trust_region_space at its default)"
            )
        behavior = {
            f"behavior_{name}": key
            for name, key in self.value_estimator.evaluator.dist_param_keys.items()
        }
        self.set_keys(
            **behavior,
            sample_log_prob=actor_network.log_prob_keys[0],
            action=actor_network.dist_sample_keys[0],
        )

    @property
    def in_keys(self):
        # the behaviour policy's statistics: behavior_logits, or _loc and _scale
        names = self.value_estimator.evaluator.dist_param_keys
        behavior = [getattr(self.tensor_keys, f"behavior_{name}") for name in names]
        return [*self.value_estimator.in_keys, *behavior]

    @property
    def out_keys(self):
        if self._out_keys is None:
            critic = [] if self.critic_coeff is None else ["loss_critic"]
            self._out_keys = [
                "loss_objective",
                *critic,
                "loss_entropy",
                "entropy",
                "kl_avg",
                "rho_mean",
                "rho_clip_fraction",
                "explained_variance",
            ]
        return self._out_keys

    @out_keys.setter
    def out_keys(self, values):
        self._out_keys = values

    def make_value_estimator(self, value_type=None, **hyperparams):
        """Builds the Retrace estimator (the only one ACER supports).

        ``value_type`` is ``ValueEstimators.Retrace`` (the default; ``"retrace"``
        too), built with the loss's ``recurrent_state`` and ``burn_in``; a
        :class:`RetraceEstimator` instance or subclass is taken as every TorchRL
        loss takes one.
        """
        if isinstance(value_type, (ValueEstimatorBase, type)):
            super().make_value_estimator(value_type, **hyperparams)
            if not isinstance(self._value_estimator, RetraceEstimator):
                raise NotImplementedError(
                    f"ACERLoss needs a RetraceEstimator, got {value_type}"
                )
        else:
            recurrent = {
                "recurrent_state": self.recurrent_state,
                "burn_in": self.burn_in,
            }
            for name in recurrent.keys() & hyperparams.keys():
                raise TypeError(
                    f"{name} is an option of ACERLoss(...), which passes it to its "
                    f"estimator; do not pass it to make_value_estimator"
                )
            dispatch_value_estimator(
                self,
                self.default_value_estimator if value_type is None else value_type,
                supported=self.SUPPORTED_VALUE_ESTIMATORS,
                **{"device": _get_default_device(self), **hyperparams},
                **recurrent,
            )
        self._forward_value_estimator_keys()
        return self

    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        estimator = self.value_estimator
        time_dim = estimator._get_time_dim(None, tensordict)  # the estimator's rule
        last = tensordict.ndim - 1
        full = tensordict if time_dim == last else tensordict.transpose(time_dim, last)
        categorical = estimator.family != "gaussian"
        steps = evaluate(
            estimator,
            full,
            actor_params=self.actor_network_params,
            critic_params=self.critic_network_params,
            detach_shared=self.separate_losses,
            # the critic term trains the critic: it runs even where the data holds
            # its outputs (skip_existing), as TorchRL's losses run theirs
            reuse_critic_outputs=False,
        )
        data = steps.data  # burn-in steps only warm the recurrent state: no loss terms
        average = estimator.evaluator.average_dist_params(
            steps, full, estimator.tensor_keys, self.target_actor_network_params
        )
        log_mu = behaviour_log_prob(data, estimator.tensor_keys, estimator.family)
        # the per-step losses are reduced below (masked where _reduce_loss finds a
        # mask): the reduction tells the trust-region hook how each step's gradient
        # is scaled when it reaches the policy
        masked = any(data.get(k, None) is not None for k in self._loss_mask_keys())
        if masked:
            valid = self._reduce_loss(
                torch.ones_like(log_mu), data, reduction="none"
            ).detach()
            scale = valid.sum().clamp_min(1) if self.reduction == "mean" else 1.0
        else:
            valid = None  # every step counts
            # the count of steps is shape metadata: no reduction, no read-back
            scale = float(log_mu.numel()) if self.reduction == "mean" else 1.0
        register = functools.partial(
            register_projection,
            delta=self.trust_region_delta,
            scale=scale,
            valid=valid,
            stats_out=self._trust_region_stats,
        )
        terms = categorical_terms if categorical else gaussian_terms
        terms = terms(self, steps, average, log_mu, register)
        return self._outputs(terms, data, time_dim, last, masked)

    def _reduce(self, value, data, masked):
        # _reduce_loss's result without a mask, minus its per-call key lookups
        if masked:
            return self._reduce_loss(value, data)
        if self.reduction == "mean":
            return value.mean()
        if self.reduction == "sum":
            return value.sum()
        return value

    def _outputs(self, terms, data, time_dim, last, masked) -> TensorDictBase:
        losses = {"loss_objective": -terms["objective"]}
        if self.critic_coeff is not None:
            losses["loss_critic"] = self.critic_coeff * terms["critic"]
        losses["loss_entropy"] = -self.entropy_coeff * terms["entropy"]
        out = {}
        for name, value in losses.items():
            reduced = self._reduce(value, data, masked)
            if reduced.ndim:  # reduction="none": [*B, T]
                reduced = reduced.squeeze(-1)
                if time_dim != last:
                    reduced = reduced.transpose(time_dim, last)
            out[name] = reduced
        out.update(self._diagnostics(terms, data, masked))
        return TensorDict(out, [])

    @torch.no_grad()
    def _diagnostics(self, terms, data, masked) -> dict[str, torch.Tensor]:
        rho = terms["rho"]
        names = ("entropy", "kl_avg", "rho_mean", "rho_clip_fraction")
        per_step = (
            terms["entropy"],
            terms["kl_avg"],
            rho,
            (rho > self.ratio_clip).to(rho.dtype),
        )
        # no detach: under no_grad nothing here joins the graph
        if masked:
            means = [self._reduce_loss(x, data, reduction="mean") for x in per_step]
        else:
            # one reduction for the four means (a row each, reduced as alone)
            means = torch.stack(per_step).flatten(1).mean(1)
        target = terms["value_target"]
        residual = target - terms["action_value"]
        return {
            **dict(zip(names, means, strict=True)),
            "explained_variance": 1 - residual.var() / target.var(),
        }

    @property
    def trust_region_stats(self) -> TensorDict | None:
        r"""The trust region's statistics for the last ``backward``.

        ``active_fraction``, ``k_norm`` and ``k_dot_g`` (see
        :func:`~torchrl_acer.objectives.trust_region.register_projection`); ``NaN``
        before the first backward, ``None`` without a trust region.
        """
        if self.trust_region_delta is None:
            return None
        stats = self._trust_region_stats
        values = stats.clone().unbind(0)
        return TensorDict(dict(zip(TRUST_REGION_STATS, values, strict=True)), [])


def categorical_terms(loss, steps, average, log_mu, register) -> dict:
    """Per-step terms of ``loss`` for a categorical policy (the sum over actions is exact).

    ``steps`` from :func:`~torchrl_acer.objectives.value.retrace.evaluate`, the
    averaged policy's distribution parameters ``average``, the behaviour
    log-probabilities ``log_mu``; ``register`` puts the trust region's hook.
    """
    estimator, data = loss.value_estimator, steps.data
    (behaviour_logits,) = behaviour_statistics(
        data, loss.tensor_keys, steps.logits.shape, False, estimator.check_values
    )
    avg_logits = average["logits"].reshape(steps.logits.shape)
    behaviour_probs = softmax(behaviour_logits)
    avg_log_probs = softmax(avg_logits, log=True)
    avg_probs = avg_log_probs.exp()
    space = loss.trust_region_space
    log_probs, pi = categorical_log_probs(steps.logits, avg_probs, space, register)
    probs = pi.detach()
    q = steps.q.detach()
    value = state_value(probs, q)
    with torch.no_grad():  # what it computes joins no graph: no detach needed
        log_pi = taken(log_probs, steps.action)
        value_target, _ = estimator.targets(
            data, steps, log_pi, steps.action_value, log_mu
        )
        c = loss.ratio_clip
        rho = (log_pi - log_mu).exp()
        # [1 - c / rho(a)]_+ pi(a) is [pi(a) - c mu(a)]_+, as rho(a) = pi(a) / mu(a)
        weights = (probs - c * behaviour_probs).clamp_min(0) * (q - value)
        # the taken action's term joins the bias correction's sum over actions
        weights = weights.scatter_add(
            -1,
            steps.action.unsqueeze(-1),
            rho.clamp(max=c) * (value_target - value),
        )
        kl_avg = (avg_probs * (avg_log_probs - log_probs)).sum(-1, keepdim=True)
    objective = (weights * log_probs).sum(-1, keepdim=True)
    entropy = -(pi * log_probs).sum(-1, keepdim=True)
    return {
        "objective": objective,
        "entropy": entropy,
        "critic": distance_loss(
            value_target, steps.action_value, loss.loss_critic_type
        ),
        "kl_avg": kl_avg,
        "rho": rho,
        "value_target": value_target,
        "action_value": steps.action_value,
    }


def gaussian_terms(loss, steps, average, log_mu, register) -> dict:
    """Per-step terms for a Gaussian policy and a stochastic dueling network.

    Paper section 5: Q_opc in the policy gradient, one sampled action for the bias
    correction, a V term in the critic loss. The arguments are
    :func:`categorical_terms`'s.
    """
    estimator, data = loss.value_estimator, steps.data
    sdn, sdn_params = loss.critic_network, loss.critic_network_params
    mu_loc, mu_scale = behaviour_statistics(
        data, loss.tensor_keys, steps.loc.shape, True, estimator.check_values
    )
    d = steps.loc.shape[-1]
    avg_loc = average["loc"].reshape(steps.loc.shape)
    avg_scale = average["scale"].expand_as(average["loc"]).reshape(steps.loc.shape)
    loc, scale = gaussian_statistics(
        steps.loc, steps.scale, avg_loc, avg_scale, register
    )
    with torch.no_grad():
        # one action a' ~ pi for the bias correction, n for the dueling baseline
        n = 1 + sdn.num_samples * sdn.dueling
        noise = torch.randn(n, *loc.shape, dtype=loc.dtype, device=loc.device)
        drawn = loc + scale * noise
        sampled = drawn[0]
    actions = torch.cat([steps.action[None], drawn], 0)
    with estimator.evaluator.params_context(sdn_params, sdn):
        advantages = sdn.advantages(
            steps.observations, actions.flatten(1, -2)
        ).unflatten(1, steps.loc.shape[:-1])
    value = steps.value
    if sdn.dueling:  # Q~ = V + A - mean_i A(u_i)
        offset = value - advantages[2:].mean(0)
    else:  # a plain Q = A
        offset = 0.0
    q_taken = advantages[0] + offset
    log_pi = gaussian_log_prob(loc, scale, steps.action)
    log_pi_sampled = gaussian_log_prob(loc, scale, sampled)
    with torch.no_grad():  # what it computes joins no graph: no detach needed
        c = loss.ratio_clip
        v = value.detach()  # a name, not a computation: detached by hand
        q_sampled = advantages[1] + offset
        q_ret, q_opc = estimator.targets(data, steps, log_pi, q_taken, log_mu)
        rho = (log_pi - log_mu).exp()
        rho_sampled = (
            log_pi_sampled - gaussian_log_prob(mu_loc, mu_scale, sampled)
        ).exp()
        correction = (1 - c / rho_sampled).clamp_min(0)
        # no validation: the loss checks scales itself (once, naming the key);
        # torch's would add a device synchronisation per call
        kl_avg = D.kl_divergence(
            D.Normal(avg_loc, avg_scale, validate_args=False),
            D.Normal(loc, scale, validate_args=False),
        ).sum(-1, keepdim=True)
    objective = (
        rho.clamp(max=c) * (q_opc - v) * log_pi
        + correction * (q_sampled - v) * log_pi_sampled
    )
    entropy = scale.log().sum(-1, keepdim=True) + 0.5 * d * (
        1.0 + math.log(2 * math.pi)
    )
    # (Q_ret - Q~) grad Q~ + min(1, rho) (Q_ret - Q~) grad V, as two distances:
    # the paper's V_target = min(1, rho) (Q_ret - Q~) + V makes the second one a
    # real regression (a plain Q critic has no V of its own to train)
    critic = distance_loss(q_ret, q_taken, loss.loss_critic_type)
    if sdn.dueling:
        with torch.no_grad():
            value_target = rho.clamp(max=1.0) * (q_ret - q_taken) + value
        critic = critic + distance_loss(value_target, value, loss.loss_critic_type)
    return {
        "objective": objective,
        "entropy": entropy,
        "critic": critic,
        "kl_avg": kl_avg,
        "rho": rho,
        "value_target": q_ret,
        "action_value": q_taken,
    }


def behaviour_statistics(data, keys, shape, gaussian: bool, check: bool) -> list:
    """The behaviour policy's statistics stored with the ``[*B, T]`` steps.

    ``[logits]`` (categorical policies, of the policy's ``shape``) or ``[loc,
    scale]`` (Gaussian ones, expanded to ``shape``), read under the loss's ``keys``
    (``behavior_*``) and checked (their values too if ``check``).
    """
    what = "Gaussian parameters" if gaussian else "logits"
    out = []
    for name in ("loc", "scale") if gaussian else ("logits",):
        key = getattr(keys, f"behavior_{name}")
        value = get_entry(
            data,
            key,
            f"the behaviour policy's {what} stored with each step (collectors "
            f"store the actor's)",
        )
        expanded = value
        if gaussian:  # a Gaussian's may broadcast
            try:
                expanded = value.expand(shape)
            except RuntimeError:
                pass
        if expanded.shape != shape:
            raise ValueError(
                f"behaviour {name} {key!r} "
                f"{'has' if gaussian else 'have'} shape {tuple(value.shape)}, "
                f"expected {tuple(shape)} (the policy's {what} for the [*B, T] "
                f"batch)"
            )
        if check:
            # a NaN logit makes every ratio NaN, and NaN > c is False: the bias
            # correction would silently switch off
            check_finite(
                value,
                repr(key),
                f"the behaviour policy's {what} are corrupted",
            )
        out.append(expanded)
    if check and gaussian and not bool((out[1] > 0).all()):
        raise ValueError(
            f"behaviour scale {keys.behavior_scale!r} holds values that "
            f"are not positive; min {out[1].min().item()}"
        )
    return out
