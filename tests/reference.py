"""Plain references for the Retrace target, written from the equations.

Nothing here imports torchrl_acer: these are the independent references the tests
compare the package against, and the "plain loop" the benchmark times.
Inputs are ``[*B, T, F]`` tensors with time at dim -2.
"""

from __future__ import annotations

import torch


def retrace_sum_definition(
    gamma, lmbda, log_pi, log_mu, q, next_v, reward, done, terminated, c_thresh=1.0
):
    """Double loop over the sum definition, one scalar at a time.

    G_t = Q_t + sum_{k >= t} gamma^(k-t) (prod_{j=t+1..k} c_j (1 - done_{j-1})) delta_k
    with c_j = lmbda min(c_thresh, pi_j / mu_j) and
    delta_k = r_k + gamma (1 - terminated_k) V'_k - Q_k.
    """
    shape = q.shape
    T = shape[-2]
    flat = [x.reshape(-1, T, shape[-1]) for x in (log_pi, log_mu, q, next_v, reward)]
    log_pi, log_mu, q, next_v, reward = flat
    done = done.reshape(-1, T, shape[-1])
    terminated = terminated.reshape(-1, T, shape[-1])
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for f in range(q.shape[-1]):
            for t in range(T):
                total = q[b, t, f].item()
                for k in range(t, T):
                    weight = gamma ** (k - t)
                    for j in range(t + 1, k + 1):
                        rho = (log_pi[b, j, f] - log_mu[b, j, f]).exp().item()
                        c = lmbda * min(c_thresh, rho)
                        weight *= c * (1.0 - float(done[b, j - 1, f]))
                        # the bracket of a terminated step is zero
                        weight *= 1.0 - float(terminated[b, j - 1, f])
                    delta = (
                        reward[b, k, f].item()
                        + gamma
                        * (1.0 - float(terminated[b, k, f]))
                        * next_v[b, k, f].item()
                        - q[b, k, f].item()
                    )
                    total += weight * delta
                out[b, t, f] = total
    return out.reshape(shape)


def retrace_backward_loop(
    gamma, lmbda, log_pi, log_mu, q, next_v, reward, done, terminated, c_thresh=1.0
):
    """The backward recursion of ACER's Algorithm 2, a Python loop over time.

    G_t = r_t + gamma (1 - terminated_t) [V'_t + (1 - done_t) c_{t+1} (G_{t+1} - Q_{t+1})]
    """
    T = q.shape[-2]
    not_term = 1.0 - terminated.to(q.dtype)
    not_done = 1.0 - done.to(q.dtype)
    c = lmbda * torch.clamp((log_pi - log_mu).exp(), max=c_thresh)
    out = torch.empty_like(q)
    g = reward[..., T - 1, :] + gamma * not_term[..., T - 1, :] * next_v[..., T - 1, :]
    out[..., T - 1, :] = g
    for t in range(T - 2, -1, -1):
        correction = not_done[..., t, :] * c[..., t + 1, :] * (g - q[..., t + 1, :])
        g = reward[..., t, :] + gamma * not_term[..., t, :] * (
            next_v[..., t, :] + correction
        )
        out[..., t, :] = g
    return out
