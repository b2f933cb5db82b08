"""Pure tensor functions behind ACER: the Retrace(lambda) target.

Functions of tensors, as TorchRL's ``torchrl.objectives.value.functional``: shapes
are ``[*B, T, *F]`` with time at ``time_dim`` (default ``-2``).
"""

from __future__ import annotations

import torch
from torchrl._utils import is_compiling

__all__ = ["retrace_lambda_return_estimate"]


def _reverse_discounted_scan(
    delta: torch.Tensor, decay: torch.Tensor, dim: int = 0
) -> torch.Tensor:
    r"""Solves ``A_t = delta_t + decay_t * A_{t+1}`` backwards in time, with ``A_T = 0``.

    Equivalently ``A_t = sum_{k >= t} (prod_{j=t..k-1} decay_j) delta_k``. Time is
    dimension ``dim`` of both tensors (broadcastable to each other;
    :func:`retrace_lambda_return_estimate` checks their shapes).

    Short windows (``T <= 32``, at most ``2**22`` elements in the ``[T, T, ...]``
    matrix) are one weighted sum, the products of decays from every ``t`` to every
    ``k`` from one cumulative product; longer ones a Hillis-Steele scan
    (``ceil(log2 T)`` vectorised steps). No division or logarithm is involved, so
    zeros in ``decay`` (episode ends) are exact. Autograd flows through both forms.
    """
    delta, decay = torch.broadcast_tensors(delta, decay)
    T = delta.shape[dim]
    # short windows (ACER's T = 20) in a handful of ops on a [T, T, ...] matrix:
    # per-call overhead, not arithmetic, is what costs there
    if T <= _MATRIX_MAX_T and T * delta.numel() <= _MATRIX_MAX_NUMEL:
        return _matrix_scan(delta, decay, dim)
    return _hillis_steele_scan(delta, decay, dim)


_MATRIX_MAX_T = 32
_MATRIX_MAX_NUMEL = 2**22
# (T, dims after time, device) -> the [T, T, 1, ...] masks k > t and k >= t
_MASKS: dict = {}


def _matrix_masks(T: int, trailing: int, device: torch.device):
    key = (T, trailing, device)
    masks = None if is_compiling() else _MASKS.get(key)
    if masks is None:
        t = torch.arange(T, device=device)
        shape = (T, T) + (1,) * trailing
        after = (t[None, :] > t[:, None]).reshape(shape)
        from_t = (t[None, :] >= t[:, None]).reshape(shape)
        masks = (after, from_t)
        if not is_compiling():
            _MASKS[key] = masks
    return masks


def _matrix_scan(delta: torch.Tensor, decay: torch.Tensor, dim: int = 0):
    # A_t = sum_{k >= t} M[t, k] delta_k with M[t, k] = prod_{j=t..k-1} decay_j: a
    # cumulative product along k of decay_{k-1} (1 for k <= t), kept for k >= t.
    # Products and sums only, so episode ends (zeros) stay exact. The t axis is
    # inserted before time's, which becomes k's.
    dim = dim - delta.ndim if dim >= 0 else dim
    after, from_t = _matrix_masks(delta.shape[dim], -dim - 1, delta.device)
    # decay_{k-1} at k; k = 0 gets decay_{T-1}, which the mask k > t never keeps
    previous = decay.roll(1, dim)
    weights = torch.where(after, previous.unsqueeze(dim - 1), 1).cumprod(dim)
    # masked after the product: a non-finite delta_k must not reach the t > k
    return torch.where(from_t, weights * delta.unsqueeze(dim - 1), 0).sum(dim)


def _hillis_steele_scan(delta: torch.Tensor, decay: torch.Tensor, dim: int = 0):
    offset = 1
    while offset < delta.shape[dim]:
        # segment [t, t + offset) is extended by segment [t + offset, t + 2 offset);
        # past the end is the empty segment (A = 0, decay = 0)
        delta = delta + decay * _ahead(delta, offset, dim)
        decay = decay * _ahead(decay, offset, dim)
        offset *= 2
    return delta


def _ahead(x: torch.Tensor, offset: int, dim: int) -> torch.Tensor:
    # x_{t + offset} at t, zero past the end
    zeros = torch.zeros_like(x.narrow(dim, 0, offset))
    return torch.cat([x.narrow(dim, offset, x.shape[dim] - offset), zeros], dim)


def retrace_lambda_return_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    log_pi: torch.Tensor,
    log_mu: torch.Tensor,
    action_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    time_dim: int = -2,
    c_thresh: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    r"""Retrace(:math:`\lambda`) target for :math:`Q(s_t, a_t)`.

    From Munos et al., "Safe and Efficient Off-Policy Reinforcement Learning"
    (https://arxiv.org/abs/1606.02647), as used by ACER (Wang et al. 2017,
    https://arxiv.org/abs/1611.01224):

    .. math::

        c_t &= \lambda \min(\bar c, \pi(a_t|s_t) / \mu(a_t|s_t)) \\
        \delta_t &= r_t + \gamma (1 - \mathrm{terminated}_t) V(s'_t) - Q(s_t, a_t) \\
        G_t &= Q(s_t, a_t) + \sum_{k \geq t} \gamma^{k-t}
               \Big(\prod_{j=t+1}^{k} c_j (1 - \mathrm{done}_{j-1})\Big) \delta_k

    or, backwards, :math:`G_t = r_t + \gamma (1 - \mathrm{terminated}_t) [V(s'_t) +
    (1 - \mathrm{done}_t) c_{t+1} (G_{t+1} - Q(s_{t+1}, a_{t+1}))]`, with the last
    step of the window bootstrapped from :math:`V(s'_{T-1})` alone. A step that is
    ``done`` but not ``terminated`` (a time limit, or the end of a replayed slice) is
    bootstrapped from :math:`V(s'_t)` and cuts the trace; a ``terminated`` step is not
    bootstrapped.

    Args:
        gamma (float or Tensor): discount. A tensor is either a scalar or has the
            shape of ``reward`` (one discount per step).
        lmbda (float or Tensor): trace decay :math:`\lambda` (ACER uses 1). A tensor
            is either a scalar or has the shape of ``reward``; it multiplies the
            trace coefficient of its own step, :math:`c_t`.
        log_pi (Tensor): :math:`\log \pi(a_t|s_t)`, the log-probability of the stored
            action under the policy being evaluated. ``[*B, T, *F]``.
        log_mu (Tensor): :math:`\log \mu(a_t|s_t)`, the same under the behaviour
            policy that collected the data. ``[*B, T, *F]``.
        action_value (Tensor): :math:`Q(s_t, a_t)`. ``[*B, T, *F]``.
        next_state_value (Tensor): :math:`V(s'_t)`, the state value at the real next
            observation of each step (never the reset observation). ``[*B, T, *F]``.
        reward (Tensor): :math:`r_t`. ``[*B, T, *F]``.
        done (Tensor): end of the trajectory after step ``t`` (termination,
            truncation, or the end of a sampled slice). ``[*B, T, *F]``.
        terminated (Tensor, optional): end of the episode after step ``t`` with no
            value beyond it. Defaults to ``done``, as in TorchRL's estimators.

    Keyword Args:
        time_dim (int): the time dimension of the inputs. Defaults to ``-2``.
        c_thresh (float or Tensor): truncation :math:`\bar c` of the trace ratio.
            Defaults to ``1.0`` (the value ACER and Retrace use).

    Returns:
        The target :math:`G_t`, with the shape and dtype of ``action_value``.

    Examples:
        >>> import torch
        >>> T = 5
        >>> zeros = torch.zeros(T, 1)
        >>> reward = torch.ones(T, 1)
        >>> done = torch.zeros(T, 1, dtype=torch.bool)
        >>> # lmbda = 0 is the one-step expected-SARSA target r + gamma V'
        >>> G = retrace_lambda_return_estimate(
        ...     0.9, 0.0, zeros, zeros, zeros, torch.full((T, 1), 2.0), reward, done
        ... )
        >>> G.squeeze(-1)
        tensor([2.8000, 2.8000, 2.8000, 2.8000, 2.8000])
    """
    if terminated is None:
        terminated = done
    named = {
        "log_pi": log_pi,
        "log_mu": log_mu,
        "action_value": action_value,
        "next_state_value": next_state_value,
        "reward": reward,
        "done": done,
        "terminated": terminated,
    }
    shape = action_value.shape
    mismatched = {k: tuple(v.shape) for k, v in named.items() if v.shape != shape}
    if mismatched:
        raise ValueError(
            "retrace_lambda_return_estimate: every input must have the shape of "
            f"action_value {tuple(shape)}; got {mismatched}"
        )
    ndim = action_value.ndim
    if not -ndim <= time_dim < ndim:
        raise ValueError(
            f"time_dim={time_dim} is out of range for inputs of shape {tuple(shape)}"
        )
    dtype = action_value.dtype

    def hyperparameter(x):
        if not isinstance(x, torch.Tensor):
            return x
        if x.ndim == ndim:  # one per step
            return x.to(dtype)
        if x.numel() != 1:
            raise ValueError(
                f"gamma, lmbda and c_thresh must be scalars or have the shape "
                f"{tuple(shape)} of the other inputs, got {tuple(x.shape)}"
            )
        # a scalar tensor takes the inputs' dtype in the arithmetic (a float64
        # gamma does not promote float32 inputs): no cast needed
        x = x if x.is_floating_point() else x.to(dtype)
        return x if x.ndim == 0 else x.reshape(())

    gamma, lmbda, c_thresh = map(hyperparameter, (gamma, lmbda, c_thresh))
    log_rho = log_pi.to(dtype) - log_mu.to(dtype)
    # gamma where the episode goes on after step t, 0 where it terminated
    discount = gamma * (~terminated.bool()).to(dtype)
    delta = reward.to(dtype) + discount * next_state_value.to(dtype) - action_value
    # c_t multiplies the correction carried back from step t to step t - 1; the
    # trace through step t needs c_{t+1}. decay_{T-1} multiplies A_T = 0: the
    # roll's c_0 there is never used
    trace = lmbda * torch.clamp(log_rho.exp(), max=c_thresh)
    decay = torch.where(done.bool(), 0, discount) * trace.roll(-1, time_dim)
    return action_value + _reverse_discounted_scan(delta, decay, time_dim)
