"""A categorical actor that samples (or acts greedily) without a distribution object.

Collecting runs the policy once per environment step on a handful of
observations, where the network is a few microseconds and TensorDict's
probabilistic-module machinery (building a ``Categorical``, validating its
arguments, looking up the interaction mode, wrapping the sample) is most of the
call. :class:`CategoricalActor` is a :class:`~torchrl.modules.ProbabilisticActor`
that, when it samples, does the same arithmetic with plain tensors.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule, skip_existing
from tensordict.nn.probabilistic import interaction_type
from torch import distributions as D
from torchrl.modules import OneHotCategorical, ProbabilisticActor

__all__ = ["CategoricalActor"]


class CategoricalActor(ProbabilisticActor):
    """A :class:`~torchrl.modules.ProbabilisticActor` over categorical logits
    whose sampling and greedy calls skip the distribution object.

    Built like a ``ProbabilisticActor`` whose module is one
    :class:`~tensordict.nn.TensorDictModule` writing the logits, with
    ``distribution_class`` :class:`~torchrl.modules.OneHotCategorical` or
    :class:`torch.distributions.Categorical` and ``return_log_prob=True``. When it
    samples (``InteractionType.RANDOM``, as collectors run it), it computes, as
    those distributions do,

    .. math::

        \\bar{\\ell} = \\ell - \\log \\sum_a e^{\\ell_a}, \\quad
        a \\sim \\mathrm{multinomial}(\\mathrm{softmax}(\\bar{\\ell})), \\quad
        \\log \\pi(a) = \\bar{\\ell}_a,

    with the same random draws (``torch.multinomial`` on the same probabilities),
    so its actions, log-probabilities and the random state it leaves are those of
    the ``ProbabilisticActor`` it replaces, bit for bit. Greedy calls
    (``InteractionType.DETERMINISTIC`` or ``MODE``, as evaluations run it) take the
    distribution's mode the same way: every maximal logit for
    ``OneHotCategorical``, the first for ``Categorical``. Every other call
    (``tensordict_out``, skip-existing, NaN logits, a sampling ``generator=``,
    another structure) runs ``ProbabilisticActor.forward``. The network runs
    through its own call: hooks on it and on the actor run as usual.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
        >>> from torchrl.modules import OneHotCategorical
        >>> from torchrl_acer.modules.actors import CategoricalActor
        >>> actor = CategoricalActor(
        ...     TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["logits"]),
        ...     in_keys=["logits"],
        ...     distribution_class=OneHotCategorical,
        ...     return_log_prob=True,
        ... )
        >>> td = TensorDict({"observation": torch.randn(8, 4)}, [8])
        >>> with set_interaction_type(InteractionType.RANDOM):
        ...     out = actor(td)
        >>> out["action"].shape, out["action_log_prob"].shape
        (torch.Size([8, 2]), torch.Size([8]))
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # a sampling generator (ProbabilisticTensorDictModule's generator=) is
        # routed by the distribution machinery: that actor samples its own way
        seeded = kwargs.get("generator") is not None
        self._lean = None if seeded else self._lean_plan()

    def _lean_plan(self) -> tuple | None:
        """``(network, logits_key, action_key, log_prob_key, one_hot)``
        when the structure allows sampling with plain tensors, else ``None``."""
        modules = list(self.module)
        if len(modules) != 2:
            return None
        net, head = modules
        if type(net) is not TensorDictModule or len(net.in_keys) != 1:
            return None
        if head.distribution_class not in (OneHotCategorical, D.Categorical):
            return None
        lean_head = (
            head.return_log_prob
            and not head.distribution_kwargs
            and head.num_samples is None
            and not getattr(head, "safe", False)
            and list(head.in_keys) == list(net.out_keys)
            and len(net.out_keys) == 1
            and head.dist_params_keys == ["logits"]
            and len(head.dist_sample_keys) == 1
        )
        if not lean_head:
            return None
        return (
            net,
            net.out_keys[0],
            head.dist_sample_keys[0],
            head.log_prob_key,
            head.distribution_class is OneHotCategorical,
        )

    def forward(
        self,
        tensordict: TensorDictBase,
        tensordict_out: TensorDictBase | None = None,
        **kwargs,
    ) -> TensorDictBase:
        plan, mode = self._lean, interaction_type()
        if (
            plan is None
            or tensordict_out is not None
            or kwargs
            or mode not in _LEAN_MODES
            or skip_existing()
        ):
            return super().forward(tensordict, tensordict_out, **kwargs)
        network, logits_key, action_key, log_prob_key, one_hot = plan
        # the network through its own call (its hooks run), writing the logits
        logits = network(tensordict).get(logits_key)
        n = logits.shape[-1]
        # a single action or NaN logits: the distribution's own path (and errors)
        if n < 2 or torch.isnan(logits).any():
            return super().forward(tensordict, tensordict_out, **kwargs)
        normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
        if mode is InteractionType.RANDOM:
            probs = torch.softmax(normalized, dim=-1)
            index = torch.multinomial(probs.reshape(-1, n), 1, True).T
            index = index.reshape(logits.shape[:-1])
            action = torch.nn.functional.one_hot(index, n) if one_hot else index
        elif one_hot:  # TorchRL's OneHotCategorical.mode: every maximal logit
            action = (normalized == normalized.max(-1, True)[0]).to(torch.long)
            index = action.argmax(-1)  # its log_prob reads the first
        else:  # torch's Categorical.mode
            index = action = torch.softmax(normalized, dim=-1).argmax(-1)
        log_prob = normalized.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        tensordict.set(action_key, action)
        tensordict.set(log_prob_key, log_prob)
        return tensordict


# sampling, and the greedy interaction types (a categorical's deterministic
# sample is its mode)
_LEAN_MODES = (
    InteractionType.RANDOM,
    InteractionType.DETERMINISTIC,
    InteractionType.MODE,
)
