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
    "categorical_log_probs",
    "gaussian_statistics",
    "project",
    "register_projection",
]

TRUST_REGION_SPACES = ("logits", "log_probs", "probs")
# the statistics a projection leaves in its output tensor, in this order
TRUST_REGION_STATS = ("active_fraction", "k_norm", "k_dot_g")


def project(g: torch.Tensor, k: torch.Tensor, delta: float | torch.Tensor):
    r"""Projects each row of ``g`` onto ``k . z <= delta`` (``delta > 0``).

    Returns ``(z, coefficient, k . g, |k|^2)``, each but ``z`` ``[..., 1]``; the
    coefficient is :math:`\max(0, (k \cdot g - \delta) / \|k\|^2)` (zero where
    :math:`k = 0`), positive exactly where the constraint is active.
    """
    k_dot_g = (k * g).sum(-1, keepdim=True)
    k_sq = (k * k).sum(-1, keepdim=True)
    # where k = 0, k . g = 0 < delta: the excess is 0, and so is the coefficient
    tiny = torch.finfo(k_sq.dtype).tiny
    coefficient = (k_dot_g - delta).clamp_min(0) / k_sq.clamp_min(tiny)
    return torch.addcmul(g, coefficient, k, value=-1), coefficient, k_dot_g, k_sq


def register_projection(stats, k, *, delta, scale, valid, stats_out) -> None:
    r"""Projects, per step, the gradient arriving at the policy statistics ``stats``.

    The gradient reaching :math:`\phi_t` is :math:`-g_t / s`, ``s`` the reduction's
    scale (the number of valid steps for a mean, 1 for a sum): the hook projects
    :math:`g_t` onto :math:`k_t \cdot z \leq \delta` and returns :math:`-z^*_t / s`.
    It copies the statistics :data:`TRUST_REGION_STATS` (the share of ``valid``
    steps whose constraint was active, the mean :math:`\|k_t\|` and the mean
    :math:`k_t \cdot g_t`) into ``stats_out``, a tensor its owner holds: no registry
    or callback, so ``torch.compile`` traces the hook into the backward graph.
    ``valid`` weighs the steps in the statistics (``None``: every step counts).
    Nothing is registered without ``delta`` or without a gradient to project.
    """
    if delta is None or not stats.requires_grad:
        return
    # -z*/s is the projection of the arriving gradient -g/s onto (-k) . z <= delta/s,
    # the same coefficient divided by s: no scaling of the gradient, in or out
    minus_k, bound = -k, delta / scale

    def hook(grad: torch.Tensor) -> torch.Tensor:
        z, coefficient, k_dot_grad, k_sq = project(grad, minus_k, bound)
        with torch.no_grad():
            # the coefficient is >= 0: its sign is the constraint's activity
            per_step = torch.cat(
                [coefficient.sign(), k_sq.sqrt(), k_dot_grad * scale], -1
            )
            per_step = per_step.reshape(-1, len(TRUST_REGION_STATS))
            if valid is None:
                stats_out.copy_(per_step.mean(0))
            else:  # one weighted sum for the three means
                sums = (per_step * valid.reshape(-1, 1)).sum(0)
                stats_out.copy_(sums / valid.sum().clamp_min(1))
        return z

    stats.register_hook(hook)


def categorical_log_probs(logits, avg_probs, space: str, register):
    r"""Log-probabilities and probabilities of the current policy, through the trust region.

    The statistics :math:`\phi` (``space``) are computed from the logits and
    ``register(stats, k)`` (:func:`register_projection`) puts the projection on
    them, with :math:`k = \nabla_\phi \mathrm{KL}(\pi_{avg} \| \pi)`: :math:`\pi -
    \pi_{avg}` for logits, :math:`-\pi_{avg}` for log-probabilities, :math:`-\pi_{avg}
    / \pi` for probabilities (the paper's choice). Both outputs are computed from
    them, so that every policy term's gradient passes through the projection.
    """
    if space == "probs":
        probs = logits.softmax(-1)
        register(probs, -avg_probs / probs.detach())
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).log(), probs
    log_probs = logits.log_softmax(-1)
    probs = log_probs.exp()
    if space == "logits":
        register(logits, probs.detach() - avg_probs)
    else:
        register(log_probs, -avg_probs.expand_as(log_probs))
    return log_probs, probs


def gaussian_statistics(loc, scale, avg_loc, avg_scale, register):
    r"""The policy's mean (and learned scale) through the trust region.

    The statistics are the mean, joined by the scale when it is learned (has a
    gradient), so that the projection bounds them together per step; ``register``
    as for :func:`categorical_log_probs`. With :math:`\pi = N(\mu, \sigma^2)` and
    :math:`\pi_{avg} = N(\mu_a, \sigma_a^2)` per dimension,
    :math:`\partial \mathrm{KL} / \partial\mu = (\mu - \mu_a) / \sigma^2` and
    :math:`\partial \mathrm{KL} / \partial\sigma = 1/\sigma - (\sigma_a^2 + (\mu_a -
    \mu)^2) / \sigma^3`. Returns ``(loc, scale)``.
    """
    learned = scale.requires_grad
    d = loc.shape[-1]
    with torch.no_grad():
        mu, sigma, mu_a, sigma_a = torch.broadcast_tensors(
            loc, scale, avg_loc, avg_scale
        )
        var = sigma.pow(2)
        k = (mu - mu_a) / var
        if learned:
            k_scale = 1 / sigma - (sigma_a.pow(2) + (mu_a - mu).pow(2)) / (var * sigma)
            k = torch.cat([k, k_scale], -1)
    stats = torch.cat([loc, scale], -1) if learned else loc
    register(stats, k)
    if learned:
        return stats[..., :d], stats[..., d:]
    return stats, scale
