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

import torch

__all__ = [
    "TRUST_REGION_SPACES",
    "TRUST_REGION_STATS",
    "TrustRegionHook",
    "categorical_log_probs",
    "gaussian_kl_gradient",
    "gaussian_statistics",
    "kl_gradient",
    "project",
]

TRUST_REGION_SPACES = ("logits", "log_probs", "probs")
# the statistics a projection leaves in its output tensor, in this order
TRUST_REGION_STATS = ("active_fraction", "k_norm", "k_dot_g")


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
    r"""Projects each row of ``g`` onto ``k . z <= delta``; returns ``(z, coefficient)``.

    The coefficient is :math:`\max(0, (k \cdot g - \delta) / \|k\|^2)` (zero where
    :math:`k = 0`), ``[..., 1]``; it is positive exactly where the constraint is
    active.
    """
    z, coefficient, _, _ = _project(g, k, delta)
    return z, coefficient


def _project(g, k, delta):
    r""":func:`project`, with :math:`k \cdot g` and :math:`\|k\|^2` too."""
    k_dot_g = (k * g).sum(-1, keepdim=True)
    k_sq = (k * k).sum(-1, keepdim=True)
    excess = (k_dot_g - delta).clamp_min(0)
    nonzero = k_sq > 0
    coefficient = torch.where(nonzero, excess / torch.where(nonzero, k_sq, 1), 0.0)
    return g - coefficient * k, coefficient, k_dot_g, k_sq


class TrustRegionHook:
    r"""Projects, per step, the gradient arriving at the policy statistics.

    The gradient reaching :math:`\phi_t` is :math:`-g_t / s`: minus the ascent
    direction of the step's objective, divided by the reduction's scale ``s`` (the
    number of valid steps for a mean, 1 for a sum). The hook projects :math:`g_t`
    and returns :math:`-z^*_t / s`.

    It also writes the projection's statistics (:data:`TRUST_REGION_STATS`, means
    over the valid steps) into ``stats_out``, in place. The hook is a function of
    tensors whose only side effect is that copy into a tensor its owner holds, so
    ``torch.compile`` traces it into the backward graph as it is, and the
    statistics reach the owner without a registry or a callback.

    Args:
        k: :math:`k_t`, ``[..., A]`` (detached).
        delta: :math:`\delta`.
        scale: ``s``.
        valid: ``[..., 1]`` weights of the steps that count (1 valid, 0 padding),
            for the statistics only; ``None``: every step counts.
        stats_out: a ``[3]`` tensor of the statistics' dtype that receives
            ``(active_fraction, k_norm, k_dot_g)``: the share of valid steps whose
            constraint was active, the mean :math:`\|k_t\|` and the mean
            :math:`k_t \cdot g_t` before projection.
    """

    @classmethod
    def register(cls, stats, k, *, delta, scale, valid, stats_out):
        """Registers the projection on ``stats`` (if ``delta`` and a gradient)."""
        if delta is not None and stats.requires_grad:
            stats.register_hook(cls(k, delta, scale, valid, stats_out))

    def __init__(self, k, delta, scale, valid, stats_out):
        self.k = k
        self.delta = delta
        self.scale = scale
        self.valid = valid
        self.stats_out = stats_out

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        g = -grad * self.scale
        z, coefficient, k_dot_g, k_sq = _project(g, self.k, self.delta)
        with torch.no_grad():
            per_step = torch.cat(
                [(coefficient > 0).to(g.dtype), k_sq.sqrt(), k_dot_g], -1
            )
            per_step = per_step.reshape(-1, len(TRUST_REGION_STATS))
            if self.valid is None:
                self.stats_out.copy_(per_step.mean(0))
            else:  # one weighted sum for the three means
                sums = (per_step * self.valid.reshape(-1, 1)).sum(0)
                self.stats_out.copy_(sums / self.valid.sum().clamp_min(1))
        return -z / self.scale


def categorical_log_probs(logits, avg_probs, space: str, register) -> torch.Tensor:
    """Log-probabilities of the current policy, through the trust region.

    The statistics the trust region acts on (``space``) are computed from the
    logits, ``register(stats, k)`` (:meth:`TrustRegionHook.register`) puts the
    projection on them, and the log-probabilities are computed from them, so that
    every policy term's gradient passes through the projection.
    """
    if space == "logits":
        stats = logits
    elif space == "log_probs":
        stats = logits.log_softmax(-1)
    else:
        stats = logits.softmax(-1)
    register(stats, kl_gradient(space, stats.detach(), avg_probs))
    if space == "logits":
        return stats.log_softmax(-1)
    if space == "log_probs":
        return stats
    return stats.clamp_min(torch.finfo(stats.dtype).tiny).log()


def gaussian_statistics(loc, scale, avg_loc, avg_scale, register):
    """The policy's mean (and learned scale) through the trust region.

    The statistics are the mean, joined by the scale when it is learned (has a
    gradient), so that the projection bounds them together per step; ``register``
    as for :func:`categorical_log_probs`. Returns ``(loc, scale)``.
    """
    learned = scale.requires_grad
    d = loc.shape[-1]
    stats = torch.cat([loc, scale], -1) if learned else loc
    k = gaussian_kl_gradient(
        loc.detach(), scale.detach(), avg_loc, avg_scale, learned_scale=learned
    )
    register(stats, k)
    if learned:
        return stats[..., :d], stats[..., d:]
    return stats, scale
