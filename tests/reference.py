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


def project_step(g, k, delta):
    """z* = g - max(0, (k.g - delta) / |k|^2) k for one step (vectors)."""
    kk = float((k * k).sum())
    if kk == 0.0:
        return g
    excess = float((k * g).sum()) - delta
    return g - max(0.0, excess / kk) * k


def acer_discrete_reference(
    logits_table,
    q_table,
    avg_logits_table,
    state_ids,
    next_ids,
    action,
    behaviour_logits,
    behaviour_log_prob,
    reward,
    done,
    terminated,
    *,
    gamma,
    ratio_clip,
    entropy_coeff,
    critic_coeff,
    delta=None,
    space="logits",
    reduction="mean",
):
    """Gradients of discrete ACER at the logits and Q tables, step by step.

    Straight from the equations: for each row, the Retrace target by the backward
    loop; for each step, J_t = min(c, rho_t) sg(G_t - V_t) log pi(a_t)
    + sum_a sg([1 - c / rho(a)]_+ pi(a) (Q(a) - V_t)) log pi(a), H_t the entropy and
    the critic loss 1/2 (sg(G_t) - Q(s_t, a_t))^2. The policy gradient of each step
    is taken with respect to that step's statistics phi_t (logits, log-probs or
    probs), projected with the trust region when ``delta`` is given, and carried back
    to the logits. Each step must read its own table row.

    Returns ``(grad at logits_table, grad at q_table)`` of
    reduce(-J - beta H) + critic_coeff * reduce(critic loss).
    """
    B, T = action.shape
    n = B * T if reduction == "mean" else 1
    L = logits_table.detach()
    Q = q_table.detach()
    grad_L = torch.zeros_like(L)
    grad_Q = torch.zeros_like(Q)
    for b in range(B):
        # the Retrace target of the row, G_t, from detached values
        log_pi_a, q_a, next_v = [], [], []
        for t in range(T):
            s, s2, a = state_ids[b, t], next_ids[b, t], action[b, t]
            log_pi_a.append(torch.log_softmax(L[s], -1)[a])
            q_a.append(Q[s, a])
            next_v.append((torch.softmax(L[s2], -1) * Q[s2]).sum())
        G = [None] * T
        for t in range(T - 1, -1, -1):
            bootstrap = next_v[t]
            if t < T - 1 and not done[b, t]:
                rho_next = torch.exp(log_pi_a[t + 1] - behaviour_log_prob[b, t + 1])
                c_next = min(1.0, float(rho_next))
                bootstrap = bootstrap + c_next * (G[t + 1] - q_a[t + 1])
            G[t] = reward[b, t] + gamma * (0.0 if terminated[b, t] else 1.0) * bootstrap
        for t in range(T):
            s, a = state_ids[b, t], action[b, t]
            # critic: d/dQ[s, a] of critic_coeff * 1/2 (G - Q)^2 / n
            grad_Q[s, a] += critic_coeff * (Q[s, a] - G[t]) / n
            # policy: the step's statistics as a leaf
            logits = L[s].clone().requires_grad_()
            if space == "logits":
                phi = logits
            elif space == "log_probs":
                phi = torch.log_softmax(logits, -1)
            else:
                phi = torch.softmax(logits, -1)
            phi_leaf = phi.detach().requires_grad_()
            if space == "logits":
                log_p = torch.log_softmax(phi_leaf, -1)
            elif space == "log_probs":
                log_p = phi_leaf
            else:
                log_p = torch.log(phi_leaf)
            p = log_p.detach().exp()
            v = (p * Q[s]).sum()
            rho = float(torch.exp(log_p[a].detach() - behaviour_log_prob[b, t]))
            mu = torch.softmax(behaviour_logits[b, t], -1)
            J = min(ratio_clip, rho) * float(G[t] - v) * log_p[a]
            for a2 in range(L.shape[-1]):
                rho_a2 = float(p[a2] / mu[a2])
                weight = max(0.0, 1.0 - ratio_clip / rho_a2) if rho_a2 > 0 else 0.0
                J = J + weight * float(p[a2]) * float(Q[s, a2] - v) * log_p[a2]
            H = -(log_p.exp() * log_p).sum()
            (g,) = torch.autograd.grad(J + entropy_coeff * H, phi_leaf)
            if delta is not None:
                pi_avg = torch.softmax(avg_logits_table[s], -1)
                if space == "logits":
                    k = torch.softmax(phi_leaf.detach(), -1) - pi_avg
                elif space == "log_probs":
                    k = -pi_avg
                else:
                    k = -pi_avg / phi_leaf.detach()
                g = project_step(g, k, delta)
            (gl,) = torch.autograd.grad(phi, logits, grad_outputs=-g / n)
            grad_L[s] += gl
    return grad_L, grad_Q
