"""ACERLoss forward+backward against the bare networks' forward+backward.

    python bench/loss.py [--rounds 10] [--device cpu] [--B 16] [--T 20]
                         [--threads 1] [--compile | --recurrent] [--against REV]

Both sides do the same network work on the same batch: the policy and the critic
forward and backward on the ``B (T + 1)`` observations of the window (trunk once
when it is shared), and the averaged policy forward without gradient on the
``B T`` observations. The bare side then backpropagates the plain sum of the
outputs; the loss side computes everything ACER needs (Retrace, truncated
importance sampling with bias correction, entropy, critic loss, the trust-region
hook, checks, TensorDict plumbing) and backpropagates the sum of its losses. The
ratio loss / bare is the loss's overhead; the target is at most 1.3.

The loss candidates run in the same interleaved rounds: ``loss`` (the default,
value checks on), ``unchecked`` (``check_values=False``) and, with ``--compile``,
``compiled`` (``torch.compile`` of the unchecked loss, inductor, ``fullgraph=True``;
it compiles in the warm-up call, a minute or more per case on a small CPU, so it
is not in ``bench/gpu_check.sh``'s timed run).

``--against REV`` adds the loss of the package as it was at git revision ``REV``
(``loss@REV`` and ``unchecked@REV``, imported beside today's by
``_common.package_at``) on copies of the same networks and batch, in the same
rounds: ``loss_over_against`` is today's cost per update over REV's, per round.

TorchRL's own losses run in the same rounds on the CartPole cases, each on its own
networks of the same sizes ([64, 64] ReLU MLPs, 4 inputs, 2 actions) and the same
batch, and are divided by the same bare work (ACER's networks): ``a2c_gae``
(``A2CLoss``, its GAE with lambda 0.95 computed inside the call, as ACER's
Retrace is), ``ppo_gae`` (``ClipPPOLoss`` and GAE alike), ``dqn`` (``DQNLoss``
with a target network, ``delay_value=True``). They do less network work than
ACER (no averaged policy; A2C and PPO a value head of one output), so their
ratios are not a measure of their own overhead, only of their cost beside ours.

Cases: separate [64, 64] MLPs on CartPole-sized inputs (4 features, 2 actions)
with [16, 20] batches (and [128, 20], to show how much of the overhead is fixed),
and the DQN conv trunk shared by both heads on Atari-sized
[16, 20] batches of 4x84x84 uint8 frames (6 actions).

``--device cuda`` puts the networks and the batch on the GPU and synchronizes
around every timed call; its results are saved as ``loss_cuda-*.json``, apart from
the CPU ones that ``bench/report.py`` reads.

``--recurrent`` runs, instead, the gym example's recurrent model
(``model.recurrent=lstm``: the [64, 64] MLP trunk, then TorchRL's ``LSTMModule`` of
64 units, shared by the policy and Q heads, which read the LSTM's output, next to
the MLP's if the model has that skip connection) on CartPole-sized [B, T] and
[8 B, T] segments laid out as the collector stores them: ``is_init``, the LSTM
state stored at every step, mid-row terminations and truncations (about 4% and 1%
of steps) and episode starts at some rows' first step. The loss replays from the
stored state (``recurrent_state="stored"``), without and with a burn-in of 5
steps. The bare side does the network work the loss cannot avoid, on the same
parameter tensors (``torch.nn.LSTM`` is the ``LSTMModule``'s own):

- with gradient: the MLP trunk on the entries of each row the loss must evaluate,
  that is ``s_k .. s_{T-1}`` (``k`` the burn-in), the real next observation
  ``s'_t`` of each mid-row truncation right after ``s_t`` (both sides evaluate it:
  no other state gives ``V(s'_t)``), and ``s'_{T-1}`` at the row's end (even after
  a termination there, as the loss does); the LSTM over each row cut into pieces
  at its resets (``is_init_t`` or ``done_{t-1}``), padded to the longest piece,
  from the stored state at the row's start (or the burn-in's final state) and
  from zero after a reset; both linear heads on every entry; then the plain sum of
  logits and Q values backpropagated;
- without gradient, with a burn-in: the trunk and the LSTM (packed, for the final
  state) over each row's burn-in steps from its last reset there, for the state
  entering step ``k``;
- without gradient: the averaged policy (the loss's target actor parameters) over
  the segment's ``T`` steps from the stored state, cut at the same resets, padded,
  its head on steps ``k .. T-1``.

What the bare side prepares once, outside the timing, the loss does in every call:
the layout (each row's observations with the next observations inserted, cut into
pieces at the resets read from ``is_init`` and the done flags). Besides, the loss
runs the trunk and both heads on the padding after rows shorter than the longest,
the whole burn-in of every row with both heads, and the LSTM the way TorchRL's
``LSTMModule`` does in recurrent mode: split and pad at resets, pack, unpad (the
bare side runs the padded pieces unpacked, which was faster on the CPU measured).
The loss's network outputs (logits and Q values at ``s_t``, ``V(s'_t)``, the
averaged logits) are checked equal to the bare side's before timing. Each round
gives one ratio (loss / bare); the result, ``loss_recurrent-*.json``, holds their
median and range.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import warnings
from pathlib import Path

import torch
from tensordict import TensorDict
from torch.nn.utils.rnn import pack_padded_sequence

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    interleaved_samples,
    package_at,
    per_round_ratios,
    resolved_commit,
    save,
)

from torchrl_acer import ACERLoss  # noqa: E402
from torchrl_acer.modules.models import atari_actor_critic, mlp_actor_critic  # noqa: E402
from torchrl_acer.objectives.value.retrace import evaluate  # noqa: E402


def batch(B, T, obs_key, obs_shape, num_actions, dtype):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.uint8:
        obs = torch.randint(0, 256, (B, T + 1, *obs_shape), generator=g, dtype=dtype)
    else:
        obs = torch.randn(B, T + 1, *obs_shape, generator=g)
    logits = torch.randn(B, T, num_actions, generator=g)
    action = torch.multinomial(logits.softmax(-1).reshape(-1, num_actions), 1).reshape(
        B, T
    )
    done = torch.rand(B, T, 1, generator=g) < 0.01
    return TensorDict(
        {
            obs_key: obs[:, :T],
            "action": torch.nn.functional.one_hot(action, num_actions),
            "logits": logits,
            "action_log_prob": logits.log_softmax(-1).gather(-1, action[..., None])[
                ..., 0
            ],
            "next": {
                obs_key: obs[:, 1:],
                "reward": torch.randn(B, T, 1, generator=g),
                "done": done,
                "terminated": done,
            },
        },
        [B, T],
    )


def run_settings(args, device) -> dict:
    """The settings every result of this script records."""
    return {
        "rounds": args.rounds,
        "seed": 0,
        "device": str(device),
        "B": args.B,
        "T": args.T,
        "threads": torch.get_num_threads(),
    }


def loss_step(loss, data):
    """One timed call: ``loss`` forward on ``data`` and backward of its losses."""

    def run():
        out = loss(data)
        (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()

    return run


def bare_step(policy, critic_head, trunk, avg_policy, avg_trunk, window, current):
    """The networks alone: what the loss cannot avoid computing."""
    hidden = trunk(window)
    out = (
        policy(hidden).sum()
        + critic_head(hidden if critic_head.shared else window).sum()
    )
    with torch.no_grad():
        avg_policy(avg_trunk(current))
    out.backward()


class Head(torch.nn.Module):
    def __init__(self, module, shared):
        super().__init__()
        self.module = module
        self.shared = shared

    def forward(self, x):
        return self.module(x)


def torchrl_peers(data, obs_dim, num_actions, device):
    """TorchRL's A2C, PPO (both with GAE) and DQN losses on [64, 64] MLPs of
    their own, as timed calls on ``data`` (see the module docstring)."""
    from tensordict.nn import TensorDictModule
    from torchrl.data import OneHot
    from torchrl.modules import (
        MLP,
        OneHotCategorical,
        ProbabilisticActor,
        QValueActor,
        ValueOperator,
    )
    from torchrl.objectives import A2CLoss, ClipPPOLoss, DQNLoss, ValueEstimators

    def mlp(out):
        return MLP(in_features=obs_dim, out_features=out, num_cells=[64, 64]).to(device)

    def actor_critic():
        actor = ProbabilisticActor(
            TensorDictModule(mlp(num_actions), ["observation"], ["logits"]),
            in_keys=["logits"],
            distribution_class=OneHotCategorical,
            return_log_prob=True,
        )
        return actor, ValueOperator(mlp(1), in_keys=["observation"])

    # DQN's target network is left as built: no updater is the point here
    warnings.filterwarnings("ignore", "No target network updater")
    data = data.to(device)
    peers = {}
    for name, cls in (("a2c_gae", A2CLoss), ("ppo_gae", ClipPPOLoss)):
        loss = cls(*actor_critic())
        loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.95)

        def run(loss=loss):
            td = data.clone(False)  # the loss writes its advantage into the batch
            out = loss(td)
            sum(v for k, v in out.items() if k.startswith("loss_")).backward()

        peers[name] = run
    qnet = QValueActor(
        mlp(num_actions),
        in_keys=["observation"],
        spec=OneHot(num_actions, device=device),
    )
    dqn = DQNLoss(qnet, delay_value=True)
    dqn.make_value_estimator(gamma=0.99)

    def run_dqn():
        dqn(data.clone(False))["loss"].backward()

    peers["dqn"] = run_dqn
    return peers


def case(
    name,
    actor,
    critic,
    data,
    obs_key,
    shared,
    device,
    compile_loss=False,
    peers=False,
    against=None,
):
    actor, critic, data = actor.to(device), critic.to(device), data.to(device)
    loss = ACERLoss(actor, critic)
    loss.make_value_estimator(gamma=0.99)
    unchecked = ACERLoss(actor, critic)
    unchecked.make_value_estimator(gamma=0.99, check_values=False)
    # the loss's own parameters, so that both sides run the very same modules
    if shared:
        trunk = actor.module[0].module
        policy = actor.module[1].module
        critic_head = Head(critic.module[1].module, shared=True)
    else:
        trunk = torch.nn.Identity()
        policy = actor.module[0].module
        critic_head = Head(critic.module, shared=False)
    avg_trunk, avg_policy = copy.deepcopy(trunk), copy.deepcopy(policy)
    window = torch.cat([data[obs_key], data["next", obs_key][:, -1:]], 1).flatten(0, 1)
    current = data[obs_key].flatten(0, 1)

    def bare():
        bare_step(policy, critic_head, trunk, avg_policy, avg_trunk, window, current)

    fns = {"bare": bare, "loss": loss_step(loss, data)}
    fns["unchecked"] = loss_step(unchecked, data)
    if compile_loss:
        fns["compiled"] = loss_step(torch.compile(unchecked, fullgraph=True), data)
    if peers:
        fns.update(torchrl_peers(data, obs_dim=4, num_actions=2, device=device))
    if against is not None:  # (REV, its package): the same networks, copied
        rev, package = against
        for candidate, check_values in (("loss", True), ("unchecked", False)):
            # copied together: a trunk they share stays shared
            old = package.ACERLoss(*copy.deepcopy((actor, critic)))
            old.make_value_estimator(gamma=0.99, check_values=check_values)
            fns[f"{candidate}@{rev}"] = loss_step(old, data)
    return name, fns


def recurrent_batch(B, T, size, seed=0):
    """A [B, T] CartPole-sized batch as the collector stores it for an LSTM of
    ``size`` units: ``is_init``, the state stored at every step, some mid-row
    terminations and truncations (the row goes on with a fresh observation)."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T + 1, 4, generator=g)
    next_obs = obs[:, 1:].clone()
    u = torch.rand(B, T, 1, generator=g)
    done, terminated = u < 0.05, u < 0.04
    next_obs[done[..., 0]] = torch.randn(int(done.sum()), 4, generator=g)
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 1:] = done[:, :-1]
    is_init[:, 0] = torch.rand(B, 1, generator=g) < 0.05
    logits = torch.randn(B, T, 2, generator=g)
    action = torch.multinomial(logits.softmax(-1).reshape(-1, 2), 1, generator=g)
    action = action.reshape(B, T)
    return TensorDict(
        {
            "observation": obs[:, :T],
            "action": torch.nn.functional.one_hot(action, 2),
            "logits": logits,
            "action_log_prob": logits.log_softmax(-1).gather(-1, action[..., None])[
                ..., 0
            ],
            "is_init": is_init,
            "recurrent_state_h": 0.5 * torch.randn(B, T, 1, size, generator=g),
            "recurrent_state_c": 0.5 * torch.randn(B, T, 1, size, generator=g),
            "next": {
                "observation": next_obs,
                "reward": torch.randn(B, T, 1, generator=g),
                "done": done,
                "terminated": terminated,
            },
        },
        [B, T],
    )


class Pieces:
    """Rows of entries cut into pieces at their resets: index tensors, built once.

    ``rows`` holds, per row, ``(entry, reset)`` pairs in order, ``entry`` indexing
    a flat tensor (entries ``0 .. M-1``, each once). ``index`` ([N, L], padded
    after each piece's end with entry 0) gathers the pieces;
    ``lengths`` (on the CPU, where packing wants them) are their lengths;
    ``unpad`` gathers the padded outputs back in entry order; ``first`` is each
    row's first piece, ``keep`` whether the state entering the row survives (no
    reset at its first entry).
    """

    def __init__(self, rows, device):
        pieces, first, keep = [], [], []
        for row in rows:
            first.append(len(pieces))
            keep.append(not row[0][1])
            pieces.append([])
            for j, (entry, reset) in enumerate(row):
                if reset and j:
                    pieces.append([])
                pieces[-1].append(entry)
        width = max(map(len, pieces))
        where = {
            e: n * width + j for n, p in enumerate(pieces) for j, e in enumerate(p)
        }
        self.count = len(pieces)
        padded = [p + [0] * (width - len(p)) for p in pieces]
        self.index = torch.tensor(padded, device=device)
        self.lengths = torch.tensor([len(p) for p in pieces])
        self.unpad = torch.tensor([where[e] for e in range(len(where))], device=device)
        self.first = torch.tensor(first, device=device)
        self.keep = torch.tensor(keep, device=device)[:, None]


def entering(pieces, state):
    """``(h0, c0)`` of ``pieces``: ``state`` (``(h, c)``, ``[R, H]``) entering each
    row, zeros entering a piece after a reset."""
    return tuple(
        s.new_zeros(pieces.count, s.shape[-1])
        .index_copy(0, pieces.first, torch.where(pieces.keep, s, 0))
        .unsqueeze(0)
        for s in state
    )


def bare_core(actor):
    """The bare modules of a recurrent actor from ``mlp_actor_critic``: ``(trunk,
    lstm, skip)`` (the MLP, the ``LSTMModule``'s ``nn.LSTM``, whether the heads
    read the MLP's output next to the LSTM's), and the policy head."""
    encoder, core, *skip = actor.module[0].module
    return (encoder.module, core.lstm, bool(skip)), actor.module[1].module


def run_core(core, obs, pieces, state):
    """The MLP trunk on the flat entries ``obs``, then the LSTM over ``pieces``
    padded to the longest, from ``state``; what the heads read, in entry order
    (padding trails each piece, so it cannot reach it; faster than packing on a
    CPU)."""
    trunk, lstm, skip = core
    embed = trunk(obs)
    y, _ = lstm(embed[pieces.index], entering(pieces, state))
    y = y.flatten(0, 1)[pieces.unpad]
    return torch.cat([embed, y], -1) if skip else y


def final_state(core, obs, pieces, state):
    """The LSTM's state after each piece's last entry (packed, so that padding
    does not run)."""
    trunk, lstm, _ = core
    packed = pack_padded_sequence(
        trunk(obs)[pieces.index], pieces.lengths, batch_first=True, enforce_sorted=False
    )
    _, (h, c) = lstm(packed, entering(pieces, state))
    return h[0], c[0]


class RecurrentLayout:
    """What the bare side prepares once from a [B, T] batch with a burn-in of
    ``k`` steps (see the module docstring): flat observations and pieces of the
    gradient window (``window_obs``, ``window``), of the burn-in (``warm_obs``,
    ``warm``; ``None`` without one) and of the averaged policy (``avg_obs``,
    ``avg``, ``avg_steps``: its entries at steps ``k .. T-1``); the stored state
    entering each row (``state``); for the check, each step's entry in the window
    (``current``, ``[B, T - k]``) and its next observation's (``following``, -1
    after a termination, where none is needed)."""

    def __init__(self, data, k, device):
        B, T = data.batch_size
        obs, next_obs = data["observation"], data["next", "observation"]
        done = data["next", "done"][..., 0]
        truncated = done & ~data["next", "terminated"][..., 0]
        reset = data["is_init"][..., 0].clone()
        reset[:, 1:] |= done[:, :-1]
        window, rows, current, following = [], [], [], []
        for b in range(B):
            row, cur, nxt = [], [], []
            for t in range(k, T):
                cur.append(len(window))
                row.append((len(window), bool(reset[b, t])))
                window.append(obs[b, t])
                if t == T - 1 or truncated[b, t]:
                    nxt.append(len(window))
                    row.append((len(window), False))
                    window.append(next_obs[b, t])
                else:
                    nxt.append(-1 if done[b, t] else None)
            # inside an episode, s'_t is s_{t+1}
            nxt = [cur[j + 1] if n is None else n for j, n in enumerate(nxt)]
            rows.append(row)
            current.append(cur)
            following.append(nxt)
        self.window_obs = torch.stack(window).to(device)
        self.window = Pieces(rows, device)
        self.current = torch.tensor(current, device=device)
        self.following = torch.tensor(following, device=device)
        self.warm = None
        if k:
            starts = [
                max([t for t in range(k) if reset[b, t]], default=0) for b in range(B)
            ]
            warm = [obs[b, t] for b in range(B) for t in range(starts[b], k)]
            rows, entry = [], 0
            for b in range(B):
                rows.append([(entry, bool(reset[b, starts[b]]))])
                rows[-1] += [(entry + j, False) for j in range(1, k - starts[b])]
                entry += k - starts[b]
            self.warm_obs = torch.stack(warm).to(device)
            self.warm = Pieces(rows, device)
        self.avg_obs = obs.reshape(B * T, -1).to(device)
        self.avg = Pieces(
            [[(b * T + t, bool(reset[b, t])) for t in range(T)] for b in range(B)],
            device,
        )
        self.avg_steps = (
            torch.arange(B * T, device=device).reshape(B, T)[:, k:].flatten()
            if k
            else None
        )
        self.state = tuple(
            data[key][:, 0, 0].to(device)
            for key in ("recurrent_state_h", "recurrent_state_c")
        )


def bare_recurrent(nets, average, layout):
    """The recurrent networks alone (see the module docstring): the logits and Q
    values on the window's entries, in the graph, and the averaged policy's logits
    at steps ``k .. T-1``."""
    core, policy, q_head = nets
    state = layout.state
    if layout.warm is not None:
        with torch.no_grad():
            state = final_state(core, layout.warm_obs, layout.warm, state)
    hidden = run_core(core, layout.window_obs, layout.window, state)
    with torch.no_grad():
        avg_core, avg_policy = average
        avg_hidden = run_core(avg_core, layout.avg_obs, layout.avg, layout.state)
        if layout.avg_steps is not None:
            avg_hidden = avg_hidden[layout.avg_steps]
        avg_logits = avg_policy(avg_hidden)
    return policy(hidden), q_head(hidden), avg_logits


def check_recurrent(loss, data, nets, average, layout):
    """The loss's network outputs on ``data`` equal the bare side's."""
    estimator = loss.value_estimator
    with torch.no_grad():
        steps = evaluate(
            estimator,
            data,
            actor_params=loss.actor_network_params,
            critic_params=loss.critic_network_params,
        )
        avg = estimator.evaluator.average_dist_params(
            steps, data, estimator.tensor_keys, loss.target_actor_network_params
        )["logits"]
        logits, q, avg_logits = bare_recurrent(nets, average, layout)
    torch.testing.assert_close(logits[layout.current], steps.logits)
    torch.testing.assert_close(q[layout.current], steps.q)
    valid = layout.following >= 0
    nxt = layout.following[valid]
    value = (logits[nxt].softmax(-1) * q[nxt]).sum(-1, keepdim=True)
    torch.testing.assert_close(value, steps.next_state_value[valid])
    torch.testing.assert_close(avg_logits, avg.flatten(0, 1))


def recurrent_case(name, B, T, burn_in, device):
    actor, critic = mlp_actor_critic(4, 2, recurrent="lstm", recurrent_size=64)
    actor, critic = actor.to(device), critic.to(device)
    data = recurrent_batch(B, T, 64).to(device)
    losses = {}
    for candidate, check_values in (("loss", True), ("unchecked", False)):
        losses[candidate] = ACERLoss(
            actor, critic, recurrent_state="stored", burn_in=burn_in
        )
        losses[candidate].make_value_estimator(gamma=0.99, check_values=check_values)
    # the averaged policy away from the current one, so that the check tells them
    # apart; both losses average with the same parameters
    average_params = losses["loss"].target_actor_network_params
    with torch.no_grad():
        for p in average_params.values(True, True):
            p.add_(0.01 * torch.randn_like(p))
    losses["unchecked"].target_actor_network_params.update_(average_params)
    # the loss's own parameters: the trunk, the LSTMModule's nn.LSTM, the heads
    nets = (*bare_core(actor), critic.module[1].module)
    average = copy.deepcopy(actor)
    average_params.to_module(average)
    average = bare_core(average)
    layout = RecurrentLayout(data.cpu(), burn_in, device)
    check_recurrent(losses["loss"], data, nets, average, layout)

    def bare():
        logits, q, _ = bare_recurrent(nets, average, layout)
        (logits.sum() + q.sum()).backward()

    return name, {
        "bare": bare,
        **{c: loss_step(loss, data) for c, loss in losses.items()},
    }


def timed_row(name, fns, rounds, sync) -> dict:
    """A case's result: median seconds of each candidate over interleaved rounds,
    and each candidate's median and range of per-round ratios to ``bare`` (each
    round's load hits both sides alike), and to its own ``@REV`` if there is one."""
    seconds = interleaved_samples(fns, rounds, sync=sync)
    row = {
        "case": name,
        "median_s": {f: statistics.median(s) for f, s in seconds.items()},
        "rounds_s": seconds,
    }
    for c in fns:
        if c != "bare" and "@" not in c:
            ratio = per_round_ratios(seconds[c], seconds["bare"])
            row[f"{c}_over_bare"] = ratio["median"]
            row[f"{c}_over_bare_range"] = [ratio["min"], ratio["max"]]
            old = next((f for f in fns if f.startswith(f"{c}@")), None)
            if old is not None:
                ratio = per_round_ratios(seconds[c], seconds[old])
                row[f"{c}_over_against"] = ratio["median"]
                row[f"{c}_over_against_range"] = [ratio["min"], ratio["max"]]
    return row


def recurrent_main(args, device, sync):
    """The LSTM cases: per-round ratios, their median and range."""
    B, T = args.B, args.T
    torch.manual_seed(0)
    cases = [
        recurrent_case(f"cartpole_lstm_{b}x{T}{tag}", b, T, k, device)
        for k, tag in ((0, ""), (5, "_burn_in5"))
        for b in (B, 8 * B)
    ]
    candidates = ["loss", "unchecked"]
    print(
        f"{'case':<32} {'bare ms':>9}"
        + "".join(f"{c + ' ms':>14} {c + '/bare (range)':>24}" for c in candidates)
    )
    rows = []
    for name, fns in cases:
        row = timed_row(name, fns, args.rounds, sync)
        rows.append(row)
        cells = "".join(
            f"{row['median_s'][c] * 1e3:>14.2f} {row[f'{c}_over_bare']:>10.2f} "
            f"({row[f'{c}_over_bare_range'][0]:.2f}-"
            f"{row[f'{c}_over_bare_range'][1]:.2f})"
            for c in candidates
        )
        print(f"{name:<32} {row['median_s']['bare'] * 1e3:>9.2f}{cells}")
    settings = {
        **run_settings(args, device),
        "recurrent": "lstm",
        "recurrent_size": 64,
        "recurrent_state": "stored",
    }
    name = "loss_recurrent" + ("" if device.type == "cpu" else f"_{device.type}")
    path = save(name, {"settings": settings, "rows": rows})
    print(f"saved {path}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--B", type=int, default=16, help="rows (8 B in the large case)"
    )
    parser.add_argument("--T", type=int, default=20, help="steps per row")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: leave as is)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="add the torch.compile candidate"
    )
    parser.add_argument(
        "--recurrent",
        action="store_true",
        help="the LSTM cases instead (saved as loss_recurrent-*.json)",
    )
    parser.add_argument(
        "--against", metavar="REV", help="also time the loss as it was at REV"
    )
    args = parser.parse_args()
    if args.recurrent and args.compile:
        parser.error("--compile: the recurrent path does not compile yet")
    if args.recurrent and args.against:
        parser.error("--against: the feed-forward cases only")
    if args.recurrent and args.T <= 5:
        parser.error("--recurrent: the burn-in cases need T > 5")
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T = args.B, args.T
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    if args.recurrent:
        recurrent_main(args, device, sync)
        return
    against = (args.against, package_at(args.against)) if args.against else None
    common = {"device": device, "compile_loss": args.compile, "against": against}
    torch.manual_seed(0)
    cases = [
        case(
            f"cartpole_mlp_{B}x{T}",
            *mlp_actor_critic(4, 2),
            batch(B, T, "observation", (4,), 2, torch.float32),
            "observation",
            shared=False,
            peers=True,
            **common,
        ),
        case(
            f"cartpole_mlp_{8 * B}x{T}",
            *mlp_actor_critic(4, 2),
            batch(8 * B, T, "observation", (4,), 2, torch.float32),
            "observation",
            shared=False,
            peers=True,
            **common,
        ),
        case(
            f"atari_dqn_conv_shared_{B}x{T}",
            *atari_actor_critic(6),
            batch(B, T, "pixels", (4, 84, 84), 6, torch.uint8),
            "pixels",
            shared=True,
            **common,
        ),
    ]
    rows = []
    for name, fns in cases:
        rounds = args.rounds if "mlp" in name else max(3, args.rounds // 2)
        row = timed_row(name, fns, rounds, sync)
        rows.append(row)
        med = row["median_s"]
        losses = [c for c in fns if f"{c}_over_against" in row]
        cells = ", ".join(
            f"{c} {med[c] * 1e3:.2f} ms ({row[f'{c}_over_bare']:.2f}x"
            + (f", {row[f'{c}_over_against']:.3f}x REV's" if c in losses else "")
            + ")"
            for c in fns
            if c != "bare" and "@" not in c
        )
        print(f"{name}: bare {med['bare'] * 1e3:.2f} ms; {cells}", flush=True)
    settings = run_settings(args, device)
    if against:
        settings["against"] = resolved_commit(args.against)
    name = "loss" if device.type == "cpu" else f"loss_{device.type}"
    path = save(name, {"settings": settings, "rows": rows})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
