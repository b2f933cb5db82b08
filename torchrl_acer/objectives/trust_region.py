r"""ACER's efficient trust region, as a gradient hook on the policy's statistics.

Wang et al. 2017, section 3.3. Let :math:`\phi_t` be the statistics the policy
network outputs at step ``t`` (logits, log-probabilities or probabilities), ``g_t``
the gradient of that step's objective with respect to :math:`\phi_t` and

.. math::

    k_t = \nabla_{\phi_t} \mathrm{KL}\big(\pi_{avg}(\cdot|s_t) \,\|\, \pi(\cdot|s_t)\big).

The step is projected onto the half-space :math:`k_t \cdot z \leq \delta`:

.. math::

    z^*_t = g_t - \max\Big(0, \frac{k_t \cdot g_t - \delta}{\|k_t\|^2}\Big) k_t

and :math:`z^*_t` replaces :math:`g_t` in back-propagation from :math:`\phi_t` into
the parameters. The constraint is per step: the hook undoes the loss reduction's
scaling before projecting and redoes it after, so ``delta`` bounds every step
whatever the batch size (projecting the batch-mean gradient instead would make the
effective delta ``delta * batch size`` and the trust region inert).
"""

from __future__ import annotations

import weakref

import torch
from tensordict import TensorDict

__all__ = [
    "TRUST_REGION_SPACES",
    "TrustRegionHook",
    "TrustRegionStats",
    "gaussian_kl_gradient",
    "kl_gradient",
    "project",
    "register_stats_callback",
]

TRUST_REGION_SPACES = ("logits", "log_probs", "probs")


def kl_gradient(space: str, stats: torch.Tensor, avg_probs: torch.Tensor):
    r""":math:`\nabla_\phi \mathrm{KL}(\pi_{avg} \| \pi)` for a categorical policy.

    Args:
        space: what :math:`\phi` is: ``"logits"`` (:math:`\pi = softmax(\phi)`, then
            :math:`k = \pi - \pi_{avg}`), ``"log_probs"`` (:math:`k = -\pi_{avg}`) or
            ``"probs"`` (:math:`k = -\pi_{avg} / \pi`, the paper's choice).
        stats: :math:`\phi`, ``[..., A]``.
        avg_probs: :math:`\pi_{avg}`, ``[..., A]``.
    """
    if space == "logits":
        return stats.softmax(-1) - avg_probs
    if space == "log_probs":
        return -avg_probs.expand_as(stats)
    if space == "probs":
        return -avg_probs / stats
    raise ValueError(
        f"trust_region_space must be one of {TRUST_REGION_SPACES}, got {space!r}"
    )


def gaussian_kl_gradient(
    loc: torch.Tensor,
    scale: torch.Tensor,
    avg_loc: torch.Tensor,
    avg_scale: torch.Tensor,
    *,
    learned_scale: bool,
) -> torch.Tensor:
    r""":math:`\nabla_\phi \mathrm{KL}(\pi_{avg} \| \pi)` for diagonal Gaussians.

    With :math:`\pi = N(\mu, \mathrm{diag}\,\sigma^2)`, :math:`\pi_{avg} =
    N(\mu_a, \mathrm{diag}\,\sigma_a^2)` and

    .. math::

        \mathrm{KL} = \sum_i \log\frac{\sigma_i}{\sigma_{a,i}}
            + \frac{\sigma_{a,i}^2 + (\mu_{a,i} - \mu_i)^2}{2 \sigma_i^2} - \frac12,

    :math:`\partial/\partial\mu_i = (\mu_i - \mu_{a,i}) / \sigma_i^2` and
    :math:`\partial/\partial\sigma_i = 1/\sigma_i - (\sigma_{a,i}^2 +
    (\mu_{a,i} - \mu_i)^2) / \sigma_i^3`.

    Returns:
        ``[..., d]`` (the mean's part) or, with ``learned_scale``, ``[..., 2 d]``
        (mean's, then scale's): the statistics :math:`\phi` are the mean, and the
        scale when the policy learns it.
    """
    loc, scale, avg_loc, avg_scale = torch.broadcast_tensors(
        loc, scale, avg_loc, avg_scale
    )
    var = scale.pow(2)
    k_loc = (loc - avg_loc) / var
    if not learned_scale:
        return k_loc
    k_scale = 1 / scale - (avg_scale.pow(2) + (avg_loc - loc).pow(2)) / (var * scale)
    return torch.cat([k_loc, k_scale], -1)


def project(g: torch.Tensor, k: torch.Tensor, delta: float | torch.Tensor):
    """Projects each row of ``g`` onto ``k . z <= delta``; returns ``(z, coefficient)``.

    The coefficient is :math:`\\max(0, (k \\cdot g - \\delta) / \\|k\\|^2)` (zero where
    :math:`k = 0`), ``[..., 1]``; it is positive exactly where the constraint is
    active.
    """
    k_dot_g = (k * g).sum(-1, keepdim=True)
    k_sq = (k * k).sum(-1, keepdim=True)
    excess = (k_dot_g - delta).clamp_min(0)
    coefficient = torch.where(
        k_sq > 0, excess / torch.where(k_sq > 0, k_sq, 1), torch.zeros_like(k_sq)
    )
    return g - coefficient * k, coefficient


class TrustRegionStats:
    """The statistics of a projection, reduced when first read.

    The hook only keeps references to its per-step tensors; the means are computed
    on access, so that an update that does not log them does not pay for them.

    Attributes (of :meth:`to_tensordict`):
        active_fraction: share of valid steps whose constraint was active.
        k_norm: mean :math:`\\|k_t\\|`.
        k_dot_g: mean :math:`k_t \\cdot g_t` before projection.
    """

    def __init__(self, k, g, coefficient, valid):
        self._inputs = (k, g, coefficient, valid)
        self._reduced = None

    @torch.no_grad()
    def to_tensordict(self) -> TensorDict:
        if self._reduced is None:
            k, g, coefficient, valid = self._inputs
            count = valid.sum().clamp_min(1)

            def mean(x):
                return (x * valid).sum() / count

            self._reduced = TensorDict(
                {
                    "active_fraction": mean((coefficient > 0).to(g.dtype)),
                    "k_norm": mean(k.norm(dim=-1, keepdim=True)),
                    "k_dot_g": mean((k * g).sum(-1, keepdim=True)),
                },
                [],
            )
            self._inputs = None
        return self._reduced


# key -> weak reference to a statistics callback, for hooks traced by torch.compile
_STATS_CALLBACKS: dict[int, weakref.WeakMethod] = {}


def register_stats_callback(callback) -> int:
    """Registers a bound method to receive :class:`TrustRegionStats` from hooks
    compiled by ``torch.compile``; returns the key to give the hook (the id of
    the method's object). Dead entries are dropped as new ones come."""
    for key in [k for k, ref in _STATS_CALLBACKS.items() if ref() is None]:
        del _STATS_CALLBACKS[key]
    key = id(callback.__self__)
    _STATS_CALLBACKS[key] = weakref.WeakMethod(callback)
    return key


# A gradient hook traced by torch.compile must be a pure function of tensors (a
# Python side effect in it breaks the graph), so there the statistics leave the
# hook through this op, which the compiler does not look into. The tensors are
# copied: a compiled graph may reuse their memory once the op returns.
# named after the package that defines it, so that copies of this module in two
# packages (this one and TorchRL) can be imported together
@torch.library.custom_op(
    f"{__name__.partition('.')[0]}::acer_trust_region_stats", mutates_args=()
)
def _send_stats(
    z: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    coefficient: torch.Tensor,
    valid: torch.Tensor,
    key: int,
) -> torch.Tensor:
    ref = _STATS_CALLBACKS.get(key)
    callback = None if ref is None else ref()
    if callback is not None:
        callback(TrustRegionStats(k.clone(), g.clone(), coefficient.clone(), valid))
    return z.clone()


@_send_stats.register_fake
def _(z, k, g, coefficient, valid, key):
    return torch.empty_like(z)


class TrustRegionHook:
    """Projects, per step, the gradient arriving at the policy statistics.

    The gradient reaching :math:`\\phi_t` is :math:`-g_t / s`: minus the ascent
    direction of the step's objective, divided by the reduction's scale ``s`` (the
    number of valid steps for a mean, 1 for a sum). The hook projects :math:`g_t`
    and returns :math:`-z^*_t / s`.

    Args:
        k: :math:`k_t`, ``[..., A]`` (detached).
        delta: :math:`\\delta`.
        scale: ``s``.
        valid: ``[..., 1]`` weights of the steps that count (1 valid, 0 padding),
            for the statistics only.
        on_stats: called with the projection's :class:`TrustRegionStats`.
        stats_key: the key :func:`register_stats_callback` gave ``on_stats``,
            used instead of it when the hook is compiled by ``torch.compile``
            (``None``: no statistics there).
    """

    def __init__(self, k, delta, scale, valid, on_stats, stats_key=None):
        self.k = k
        self.delta = delta
        self.scale = scale
        self.valid = valid
        self.on_stats = on_stats
        self.stats_key = stats_key

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        g = -grad * self.scale
        z, coefficient = project(g, self.k, self.delta)
        if torch.compiler.is_compiling():
            if self.stats_key is not None:
                z = _send_stats(z, self.k, g, coefficient, self.valid, self.stats_key)
        else:
            self.on_stats(
                TrustRegionStats(self.k, g.detach(), coefficient.detach(), self.valid)
            )
        return -z / self.scale
