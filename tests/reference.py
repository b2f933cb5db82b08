"""Plain references for Retrace and ACER, written from the equations.

Nothing here imports torchrl_acer: these are the independent references the tests
compare the package against (with the checks that run a loss or an estimator
against them), and the "plain loop" the benchmark times.
Inputs are ``[*B, T, F]`` tensors with time at dim -2.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn


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


def retrace_per_step_reference(actor, critic, data, gamma, lmbda=1.0, c_thresh=1.0):
    """Retrace for a discrete actor and Q critic on a ``[B, T]`` batch: evaluates
    the networks on each s_t and each real s'_t on its own (2T calls per row, in
    float64), then takes the sum definition. Returns ``(G, V)``, each ``[B, T, 1]``.
    """
    actor, critic = actor.double(), critic.double()
    data = data.apply(lambda x: x.double() if x.is_floating_point() else x)

    def policy_and_q(obs):
        td = TensorDict({"observation": obs}, [])
        logits = actor.get_dist_params(td.clone())["logits"]
        return logits.log_softmax(-1), critic(td.clone())["action_value"]

    B, T = data.batch_size
    log_pi, q_taken, v, next_v = (
        torch.zeros(B, T, 1, dtype=torch.float64) for _ in range(4)
    )
    action = data["action"]
    if action.ndim == 3:  # one-hot
        action = action.argmax(-1)
    with torch.no_grad():
        for b in range(B):
            for t in range(T):
                a = action[b, t]
                lp, q = policy_and_q(data["observation"][b, t])
                log_pi[b, t, 0], q_taken[b, t, 0] = lp[a], q[a]
                v[b, t, 0] = (lp.exp() * q).sum()
                lp, q = policy_and_q(data["next", "observation"][b, t])
                next_v[b, t, 0] = (lp.exp() * q).sum()
    G = retrace_sum_definition(
        gamma,
        lmbda,
        log_pi,
        data["action_log_prob"].unsqueeze(-1),
        q_taken,
        next_v,
        data["next", "reward"],
        data["next", "done"],
        data["next", "terminated"],
        c_thresh=c_thresh,
    )
    return G, v


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
    the critic loss (sg(G_t) - Q(s_t, a_t))^2 (TorchRL's "l2" distance: the paper's
    update is the gradient of half of it, a factor that critic_coeff absorbs). The policy gradient of each step
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
            # critic: d/dQ[s, a] of critic_coeff * (G - Q)^2 / n
            grad_Q[s, a] += critic_coeff * 2 * (Q[s, a] - G[t]) / n
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


def gaussian_log_density(a, loc, scale):
    """log N(a; loc, diag scale^2), summed over dimensions, written out."""
    per_dim = (
        -((a - loc) ** 2) / (2 * scale**2)
        - torch.log(scale)
        - 0.5 * math.log(2 * math.pi)
    )
    return per_dim.sum(-1)


def acer_gaussian_reference(
    loc_table,
    log_scale,
    fixed_scale,
    value_table,
    advantage_fn,
    avg_loc_table,
    avg_scale,
    state_ids,
    next_ids,
    action,
    behaviour_loc,
    behaviour_scale,
    behaviour_log_prob,
    reward,
    done,
    terminated,
    noise,
    *,
    gamma,
    ratio_clip,
    entropy_coeff,
    critic_coeff,
    delta=None,
    reduction="mean",
    dueling=True,
    values=None,
):
    """Gradients of continuous ACER (paper section 5), step by step.

    ``advantage_fn(s, a)`` is A(s, a) for a state index and an action (a function
    of the critic's parameters); ``noise[0]`` draws a'_t = loc + scale * noise and
    ``noise[1:]`` the dueling baseline's u_i. The scale is ``exp(log_scale)`` if
    ``log_scale`` is given, else ``fixed_scale``.

    With ``dueling=False`` the critic is a plain Q: ``advantage_fn`` is Q itself,
    ``value_table`` a function ``V(s)`` (no baseline draws: ``noise`` holds a'
    alone) and the critic loss has no V term.

    Returns the policy objective's gradients ``(at loc_table, at log_scale or
    None)`` and the total critic loss (a scalar in the critic's graph), with
    reduce(-J - beta H) and critic_coeff * reduce(critic loss).

    A ``values`` dict, if given, is filled with the loss's outputs as floats
    (``loss_objective`` = reduce(-J), ``loss_entropy`` = reduce(-beta H),
    ``loss_critic``, and ``kl_avg``, the mean KL(pi_avg || pi)) and the targets
    ``value_target`` (Q_ret) and ``value_target_opc`` (Q_opc), ``[B, T, 1]``.
    """
    B, T, d = action.shape
    n_baseline = noise.shape[0] - 1
    value_of = value_table.__getitem__ if dueling else value_table
    n = B * T if reduction == "mean" else 1
    L = loc_table.detach()
    learned = log_scale is not None
    sigma = (
        log_scale.detach().exp()
        if learned
        else torch.full((d,), fixed_scale, dtype=L.dtype)
    )
    sigma = sigma.to(L.dtype)
    avg_sigma = avg_scale
    grad_L = torch.zeros_like(L)
    grad_log_scale = torch.zeros(d, dtype=L.dtype) if learned else None
    critic_total = 0.0
    objective_total = entropy_total = kl_total = 0.0
    targets = torch.zeros(2, B, T, 1, dtype=L.dtype)  # Q_ret, Q_opc
    for b in range(B):
        # Q~ at the taken actions, V now and next, and the traces
        q_taken, v_now, v_next, log_pi, rho, q_sampled, drawn = (
            [],
            [],
            [],
            [],
            [],
            [],
            [],
        )
        for t in range(T):
            s, s2 = state_ids[b, t], next_ids[b, t]
            loc = L[s]
            a_prime = loc + sigma * noise[0, b, t]
            drawn.append(a_prime)
            v = value_of(s)
            if dueling:  # Q~ = V + A - mean_i A(u_i)
                u = [loc + sigma * noise[1 + i, b, t] for i in range(n_baseline)]
                offset = v - sum(advantage_fn(s, ui) for ui in u) / n_baseline
            else:  # a plain Q
                offset = 0.0
            q_taken.append(advantage_fn(s, action[b, t]) + offset)
            q_sampled.append((advantage_fn(s, a_prime) + offset).detach())
            v_now.append(v)
            v_next.append(value_of(s2).detach())
            lp = gaussian_log_density(action[b, t], loc, sigma)
            log_pi.append(lp)
            rho.append(float(torch.exp(lp - behaviour_log_prob[b, t])))
        q_ret, q_opc = [None] * T, [None] * T
        for t in range(T - 1, -1, -1):
            keep = 0.0 if terminated[b, t] else 1.0
            boot_ret = boot_opc = v_next[t]
            if t < T - 1 and not done[b, t]:
                c_next = min(1.0, rho[t + 1] ** (1.0 / d))
                q_next = q_taken[t + 1].detach()
                boot_ret = boot_ret + c_next * (q_ret[t + 1] - q_next)
                boot_opc = boot_opc + 1.0 * (q_opc[t + 1] - q_next)
            q_ret[t] = reward[b, t] + gamma * keep * boot_ret
            q_opc[t] = reward[b, t] + gamma * keep * boot_opc
            targets[0, b, t, 0] = float(q_ret[t])
            targets[1, b, t, 0] = float(q_opc[t])
        for t in range(T):
            s = state_ids[b, t]
            # critic: (Q_ret - Q~)^2 + (V_target - V)^2 with the paper's
            # V_target = sg(min(1, rho) (Q_ret - Q~) + V): gradients
            # 2 (Q_ret - Q~) grad Q~ and 2 min(1, rho) (Q_ret - Q~) grad V
            err = q_ret[t] - q_taken[t]
            critic = err**2
            if dueling:
                v_target = (min(1.0, rho[t]) * err + v_now[t]).detach()
                critic = critic + (v_target - v_now[t]) ** 2
            critic_total = critic_total + critic_coeff * critic / n
            # policy: the step's statistics (mean, and scale if learned) as a leaf
            phi = torch.cat([L[s], sigma]) if learned else L[s].clone()
            phi = phi.detach().requires_grad_()
            loc_t = phi[:d]
            sig_t = phi[d:] if learned else sigma
            v = float(v_now[t].detach())
            lp = gaussian_log_density(action[b, t], loc_t, sig_t)
            lp_prime = gaussian_log_density(drawn[t], loc_t, sig_t)
            mu_prime = gaussian_log_density(
                drawn[t], behaviour_loc[b, t], behaviour_scale[b, t]
            )
            rho_prime = float(torch.exp(lp_prime.detach() - mu_prime))
            weight = max(0.0, 1.0 - ratio_clip / rho_prime) if rho_prime > 0 else 0.0
            J = min(ratio_clip, rho[t]) * (float(q_opc[t]) - v) * lp
            J = J + weight * (float(q_sampled[t]) - v) * lp_prime
            H = torch.log(sig_t).sum() + 0.5 * d * (1 + math.log(2 * math.pi))
            objective_total -= float(J.detach()) / n
            entropy_total -= entropy_coeff * float(H.detach()) / n
            # KL(N(mu_a, sigma_a^2) || N(mu, sigma^2)), per dimension, summed
            mu_a = avg_loc_table[s]
            kl_total += float(
                (
                    torch.log(sigma / avg_sigma)
                    + (avg_sigma**2 + (mu_a - L[s]) ** 2) / (2 * sigma**2)
                    - 0.5
                ).sum()
            )
            (g,) = torch.autograd.grad(J + entropy_coeff * H, phi)
            if delta is not None:
                k = (L[s] - mu_a) / sigma**2
                if learned:
                    spread = avg_sigma**2 + (mu_a - L[s]) ** 2
                    k_sigma = 1 / sigma - spread / sigma**3
                    k = torch.cat([k, k_sigma])
                g = project_step(g, k, delta)
            grad_L[s] += -g[:d] / n
            if learned:
                grad_log_scale += -g[d:] * sigma / n  # d sigma / d log sigma = sigma
    if values is not None:
        values.update(
            loss_objective=objective_total,
            loss_entropy=entropy_total,
            loss_critic=float(critic_total.detach()),
            kl_avg=kl_total / (B * T),
            value_target=targets[0],
            value_target_opc=targets[1],
        )
    return grad_L, grad_log_scale, critic_total


def plain_mlp(mlp, weights, eye):
    """``f(s, action)``: the MLP ``mlp`` (Linear and tanh layers) on
    ``[one_hot(s), action]``, written out with ``weights`` (copies of its
    parameters, in order)."""
    linears = [m for m in mlp if isinstance(m, nn.Linear)]

    def f(s, action):
        x = torch.cat([eye[s], action])
        for i, (w, b) in enumerate(zip(weights[::2], weights[1::2], strict=True)):
            x = nn.functional.linear(x, w, b)
            if i < len(linears) - 1:
                x = torch.tanh(x)
        return x[0]

    return f


def check_gaussian_policy_against_reference(
    loss,
    batch,
    ids,
    policy,
    noise,
    value,
    q_or_a,
    *,
    fixed_scale,
    gamma=0.9,
    ratio_clip=1.2,
    entropy_coeff=0.05,
    **kwargs,
):
    """Runs a continuous ACER loss on a table batch backward, and
    ``acer_gaussian_reference`` on the same batch and draws (``value`` and
    ``q_or_a`` as it takes them, ``kwargs`` passed on); asserts that the table
    policy's gradients agree and returns the reference's critic loss, in the graph
    of the critic's reference weights. The hyper-parameters are
    ``builders.gaussian_setup``'s."""
    out = loss(batch)
    (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()
    d = batch["action"].shape[-1]
    avg = loss.target_actor_network_params.flatten_keys(".")
    avg_scale = (
        avg["module.0.module.log_scale"].exp()
        if fixed_scale is None
        else torch.full((d,), fixed_scale, dtype=torch.float64)
    )
    grad_loc, grad_log_scale, critic_loss = acer_gaussian_reference(
        policy.loc.weight.T,
        None if fixed_scale is not None else policy.log_scale,
        fixed_scale,
        value,
        q_or_a,
        avg["module.0.module.loc.weight"].T,
        avg_scale,
        ids[0],
        ids[1],
        batch["action"],
        batch["loc"],
        batch["scale"],
        batch["action_log_prob"],
        batch["next", "reward"][..., 0],
        batch["next", "done"][..., 0],
        batch["next", "terminated"][..., 0],
        noise,
        gamma=gamma,
        ratio_clip=ratio_clip,
        entropy_coeff=entropy_coeff,
        critic_coeff=float(loss.critic_coeff),
        **kwargs,
    )
    torch.testing.assert_close(
        policy.loc.weight.grad.T, grad_loc, rtol=1e-9, atol=1e-12
    )
    if fixed_scale is None:
        torch.testing.assert_close(
            policy.log_scale.grad, grad_log_scale, rtol=1e-9, atol=1e-12
        )
    return critic_loss


def assert_same_grads(params, reference_params):
    """Each parameter's gradient is its reference copy's."""
    for ours, ref in zip(params, reference_params, strict=True):
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-9, atol=1e-12)
