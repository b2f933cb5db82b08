"""A plain reference for recurrent ACER: the networks unrolled one step at a time.

Nothing here imports torchrl_acer. The LSTM and GRU cells are written from their
equations (PyTorch's gate order), the rows are walked in a Python loop, and the
ACER math is ``tests/reference.py``'s (the Retrace backward loop and the discrete
ACER gradients; the continuous ACER gradients, with a stochastic dueling network on
the recurrent trunk's features), fed with the per-step outputs of the unroll.

The recurrent semantics the reference encodes:

- the state entering step 0 is the stored one (or zero), zero if the step starts an
  episode; it is reset to zero at every step with ``is_init`` or after ``done``;
- ``s_t`` is evaluated from the state entering step ``t``; ``s'_t`` from the state
  after step ``t`` (the state that continues the sequence);
- with a burn-in of ``k`` steps, steps ``0 .. k-1`` run without gradient and give
  no outputs: the state after step ``k-1`` enters step ``k`` as a constant.
"""

from __future__ import annotations

import torch
from reference import (
    acer_discrete_reference,
    acer_gaussian_reference,
    retrace_backward_loop,
)


def lstm_cell(x, state, w_ih, w_hh, b_ih, b_hh):
    """One LSTM step: ``(output, new state)``; ``state = (h, c)``, vectors."""
    h, c = state
    i, f, g, o = (w_ih @ x + b_ih + w_hh @ h + b_hh).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, (h, c)


def gru_cell(x, state, w_ih, w_hh, b_ih, b_hh):
    """One GRU step: ``(output, new state)``; ``state = (h,)``."""
    (h,) = state
    r_x, z_x, n_x = (w_ih @ x + b_ih).chunk(3)
    r_h, z_h, n_h = (w_hh @ h + b_hh).chunk(3)
    r = torch.sigmoid(r_x + r_h)
    z = torch.sigmoid(z_x + z_h)
    n = torch.tanh(n_x + r * n_h)
    h = (1 - z) * n + z * h
    return h, (h,)


class RecurrentNet:
    """Cores (recurrent cells with their weights) and linear heads on their outputs.

    Args:
        cores: ``{name: (cell, [w_ih, w_hh, b_ih, b_hh], state_keys)}``.
        heads: ``{output name: (core name, weight, bias)}``.
    """

    def __init__(self, cores, heads):
        self.cores = cores
        self.heads = heads

    @property
    def outputs(self):
        """The names of the outputs: the heads', then each core's (its features)."""
        return [*self.heads, *self.cores]

    def step(self, x, states):
        """``({output name: tensor}, new states)`` for one observation."""
        outputs, new = {}, {}
        for name, (cell, weights, _) in self.cores.items():
            outputs[name], new[name] = cell(x, states[name], *weights)
        heads = {
            key: weight @ outputs[core] + bias
            for key, (core, weight, bias) in self.heads.items()
        }
        return {**heads, **outputs}, new


def unroll(net, data, *, stored_state: bool, burn_in: int = 0):
    """Runs ``net`` over every row of ``data`` (``[B, T]``), step by step.

    Returns ``(now, next)``: ``{output name: [B, T - burn_in, F]}`` at ``s_t`` and at
    ``s'_t`` (the heads' outputs and each core's features), in the graph of the
    net's weights.
    """
    B, T = data.batch_size
    done = data["next", "done"][..., 0]
    is_init = data["is_init"][..., 0]
    now = {key: [] for key in net.outputs}
    nxt = {key: [] for key in net.outputs}
    for b in range(B):
        states = {}
        for name, (_, _, keys) in net.cores.items():
            states[name] = tuple(
                data[key][b, 0, 0]
                if stored_state
                else torch.zeros_like(data[key][b, 0, 0])
                for key in keys
            )
        row_now = {key: [] for key in net.outputs}
        row_next = {key: [] for key in net.outputs}
        for t in range(T):
            if is_init[b, t] or (t > 0 and done[b, t - 1]):
                states = {
                    name: tuple(torch.zeros_like(s) for s in state)
                    for name, state in states.items()
                }
            with torch.set_grad_enabled(t >= burn_in):
                out, after = net.step(data["observation"][b, t], states)
                out_next, _ = net.step(data["next", "observation"][b, t], after)
            states = after
            if t >= burn_in:
                for key in net.outputs:
                    row_now[key].append(out[key])
                    row_next[key].append(out_next[key])
        for key in net.outputs:
            now[key].append(torch.stack(row_now[key]))
            nxt[key].append(torch.stack(row_next[key]))
    return (
        {key: torch.stack(v) for key, v in now.items()},
        {key: torch.stack(v) for key, v in nxt.items()},
    )


def unroll_with_average(net, average_net, data, stored_state, burn_in):
    """``(now, nxt, average, part)``: ``net`` unrolled at ``s_t`` and ``s'_t``,
    the averaged policy at ``s_t`` (no gradient), both over the whole segment
    from the same states, and the steps ``burn_in .. T-1`` of ``data``."""
    now, nxt = unroll(net, data, stored_state=stored_state, burn_in=burn_in)
    with torch.no_grad():
        average, _ = unroll(
            average_net, data, stored_state=stored_state, burn_in=burn_in
        )
    return now, nxt, average, data[:, burn_in:]


def recurrent_acer_reference(
    net,
    average_net,
    data,
    *,
    gamma,
    ratio_clip,
    entropy_coeff,
    critic_coeff,
    delta,
    stored_state=True,
    burn_in=0,
):
    r"""Discrete ACER with recurrent networks on a ``[B, T]`` segment.

    ``net`` writes ``"logits"`` and ``"action_value"``; ``average_net`` writes
    ``"logits"`` (the averaged policy, unrolled over the whole segment from the same
    states). The loss terms and the Retrace targets cover steps ``burn_in ..
    T-1``.

    Back-propagates the ACER gradients (mean reduction) into ``net``'s weights and
    returns ``(values, Retrace targets [B, T - burn_in, 1])``, the values as
    ``{"loss_objective", "loss_entropy", "loss_critic", "kl_avg"}`` (the mean
    :math:`KL(\pi_{avg} \| \pi)`).
    """
    now, nxt, average, part = unroll_with_average(
        net, average_net, data, stored_state, burn_in
    )
    B, T = part.batch_size
    A = now["logits"].shape[-1]
    action = part["action"]
    log_mu = part["action_log_prob"]
    reward = part["next", "reward"][..., 0]
    done = part["next", "done"][..., 0]
    terminated = part["next", "terminated"][..., 0]

    # the Retrace targets from the backward loop
    log_pi = now["logits"].detach().log_softmax(-1)
    q = now["action_value"].detach()
    next_v = (nxt["logits"].detach().softmax(-1) * nxt["action_value"].detach()).sum(
        -1, keepdim=True
    )
    G = retrace_backward_loop(
        gamma,
        1.0,
        log_pi.gather(-1, action[..., None]),
        log_mu[..., None],
        q.gather(-1, action[..., None]),
        next_v,
        reward[..., None],
        done[..., None],
        terminated[..., None],
    )

    # the loss values, step by step
    objective = entropy = critic = kl = 0.0
    mu = part["logits"].softmax(-1)
    for b in range(B):
        for t in range(T):
            a = action[b, t]
            lp = log_pi[b, t]
            p = lp.exp()
            v = float((p * q[b, t]).sum())
            rho = float((lp[a] - log_mu[b, t]).exp())
            J = min(ratio_clip, rho) * (float(G[b, t, 0]) - v) * float(lp[a])
            for a2 in range(A):
                rho2 = float(p[a2] / mu[b, t, a2])
                weight = max(0.0, 1.0 - ratio_clip / rho2)
                J += weight * float(p[a2]) * (float(q[b, t, a2]) - v) * float(lp[a2])
            objective -= J
            entropy += entropy_coeff * float((p * lp).sum())
            critic += critic_coeff * (float(G[b, t, 0]) - float(q[b, t, a])) ** 2
            avg_lp = average["logits"][b, t].log_softmax(-1)
            kl += float((avg_lp.exp() * (avg_lp - lp)).sum())
    n = B * T
    values = {
        "loss_objective": objective / n,
        "loss_entropy": entropy / n,
        "loss_critic": critic / n,
        "kl_avg": kl / n,
    }

    # the gradients at each step's outputs, carried back through the unroll: the
    # outputs at s_t and s'_t are the rows of a table, step (b, t) reading row
    # b T + t and its next observation row B T + b T + t
    ids = torch.arange(n).reshape(B, T)
    logits_table = torch.cat([now["logits"].reshape(n, A), nxt["logits"].reshape(n, A)])
    q_table = torch.cat(
        [now["action_value"].reshape(n, A), nxt["action_value"].reshape(n, A)]
    )
    average_table = torch.cat([average["logits"].reshape(n, A)] * 2)
    grad_logits, grad_q = acer_discrete_reference(
        logits_table,
        q_table,
        average_table,
        ids,
        ids + n,
        action,
        part["logits"],
        log_mu,
        reward,
        done,
        terminated,
        gamma=gamma,
        ratio_clip=ratio_clip,
        entropy_coeff=entropy_coeff,
        critic_coeff=critic_coeff,
        delta=delta,
    )
    torch.autograd.backward([logits_table, q_table], [grad_logits, grad_q])
    return values, G


def recurrent_gaussian_reference(
    net,
    average_net,
    data,
    critic,
    noise,
    *,
    log_scale,
    fixed_scale,
    avg_scale,
    gamma,
    ratio_clip,
    entropy_coeff,
    critic_coeff,
    delta,
    stored_state=True,
    burn_in=0,
    dueling=True,
):
    r"""Continuous ACER (paper section 5) with a recurrent actor on a ``[B, T]``
    segment, and a stochastic dueling network on the actor's features.

    ``net`` has one core ``"pi"`` and writes the Gaussian mean ``"loc"``; the scale
    is ``exp(log_scale)`` (a leaf, state-independent) or ``fixed_scale``.
    ``average_net`` writes the averaged policy's ``"loc"`` (unrolled over the whole
    segment from the same states), its scale is ``avg_scale``. The dueling network
    reads, at each step, the core's output next to the observation:
    ``critic(inputs, loc)`` takes the table of those inputs (``[2 n, F]``, row
    ``b T + t`` at ``s_t`` and row ``n + b T + t`` at ``s'_t``, ``n = B (T -
    burn_in)``) and the policy's mean at each row (detached), and returns ``(V at
    each row [2 n], A(row, action))``. ``noise[0]`` draws :math:`a'_t`,
    ``noise[1:]`` the baseline's :math:`u_i`, for the steps ``burn_in .. T-1``.
    With ``dueling=False`` the critic is a plain Q (``A`` is Q, no baseline draws,
    no V term), as ``acer_gaussian_reference`` takes it.

    Back-propagates the ACER gradients (mean reduction) into ``net``'s and the
    critic's weights (and sets ``log_scale.grad``), and returns the values of
    ``acer_gaussian_reference`` (the loss's outputs and the targets
    :math:`Q_{ret}`, :math:`Q_{opc}` of steps ``burn_in .. T-1``).
    """
    now, nxt, average, part = unroll_with_average(
        net, average_net, data, stored_state, burn_in
    )
    B, T = part.batch_size
    n = B * T
    d = now["loc"].shape[-1]
    ids = torch.arange(n).reshape(B, T)
    loc_table = torch.cat([now["loc"].reshape(n, d), nxt["loc"].reshape(n, d)])
    inputs = torch.cat(
        [
            torch.cat([now["pi"], part["observation"]], -1).reshape(n, -1),
            torch.cat([nxt["pi"], part["next", "observation"]], -1).reshape(n, -1),
        ]
    )
    value_table, advantage_fn = critic(inputs, loc_table.detach())
    values = {}
    grad_loc, grad_log_scale, critic_loss = acer_gaussian_reference(
        loc_table,
        log_scale,
        fixed_scale,
        value_table if dueling else value_table.__getitem__,
        advantage_fn,
        torch.cat([average["loc"].reshape(n, d)] * 2),
        avg_scale,
        ids,
        ids + n,
        part["action"],
        part["loc"],
        part["scale"],
        part["action_log_prob"],
        part["next", "reward"][..., 0],
        part["next", "done"][..., 0],
        part["next", "terminated"][..., 0],
        noise,
        gamma=gamma,
        ratio_clip=ratio_clip,
        entropy_coeff=entropy_coeff,
        critic_coeff=critic_coeff,
        delta=delta,
        dueling=dueling,
        values=values,
    )
    # the policy's gradient at each step's mean and the critic loss's graph, back
    # through the critic and the unroll
    torch.autograd.backward(
        [loc_table, critic_loss], [grad_loc, torch.ones_like(critic_loss)]
    )
    if log_scale is not None:
        log_scale.grad = grad_log_scale
    return values
