"""Small networks and batches the tests build on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import distributions as D
from torch import nn
from torchrl.modules import ActorValueOperator, OneHotCategorical, ProbabilisticActor


def discrete_actor_critic(
    obs_dim=3,
    num_actions=4,
    *,
    one_hot=False,
    shared=False,
    dtype=torch.float64,
    seed=0,
):
    """A categorical actor and a Q critic, as TorchRL modules.

    With ``shared=True`` they come from an ``ActorValueOperator`` and share a trunk.
    """
    torch.manual_seed(seed)
    dist = OneHotCategorical if one_hot else D.Categorical
    if shared:
        trunk = TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh()), ["observation"], ["hidden"]
        )
        policy_head = ProbabilisticActor(
            TensorDictModule(nn.Linear(8, num_actions), ["hidden"], ["logits"]),
            in_keys=["logits"],
            distribution_class=dist,
            return_log_prob=True,
        )
        q_head = TensorDictModule(
            nn.Linear(8, num_actions), ["hidden"], ["action_value"]
        )
        op = ActorValueOperator(trunk, policy_head, q_head).to(dtype)
        return op.get_policy_operator(), op.get_value_operator()
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, num_actions)),
            ["observation"],
            ["logits"],
        ),
        in_keys=["logits"],
        distribution_class=dist,
        return_log_prob=True,
    ).to(dtype)
    critic = TensorDictModule(
        nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, num_actions)),
        ["observation"],
        ["action_value"],
    ).to(dtype)
    return actor, critic


def random_batch(
    B,
    T,
    *,
    obs_dim=3,
    num_actions=4,
    one_hot=False,
    dones=(),
    terminations=(),
    dtype=torch.float64,
    seed=0,
):
    """A ``[B, T]`` batch laid out as a collector writes it.

    Inside an episode ``("next", "observation")[t] == observation[t + 1]``; after each
    ``(b, t)`` in ``dones`` (truncations) or ``terminations`` the row continues with a
    fresh observation. The behaviour logits are stored under ``"logits"``.
    """
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T + 1, obs_dim, generator=g, dtype=dtype)
    next_obs = obs[:, 1:].clone()
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    terminated = torch.zeros(B, T, 1, dtype=torch.bool)
    for b, t in (*dones, *terminations):
        done[b, t] = True
        # the real next observation differs from the reset that follows it
        next_obs[b, t] = torch.randn(obs_dim, generator=g, dtype=dtype) + 10.0
    for b, t in terminations:
        terminated[b, t] = True
    logits = torch.randn(B, T, num_actions, generator=g, dtype=dtype)
    action = torch.multinomial(
        logits.softmax(-1).reshape(-1, num_actions), 1, generator=g
    ).reshape(logits.shape[:-1])
    log_prob = torch.log_softmax(logits, -1).gather(-1, action[..., None])[..., 0]
    if one_hot:
        action = nn.functional.one_hot(action, num_actions)
    return TensorDict(
        {
            "observation": obs[:, :T],
            "action": action,
            "logits": logits,
            "action_log_prob": log_prob,
            "next": {
                "observation": next_obs,
                "reward": torch.randn(B, T, 1, generator=g, dtype=dtype),
                "done": done,
                "terminated": terminated,
            },
        },
        [B, T],
    )


class CallCounter:
    """Records the batch size of every call of an ``nn.Module``."""

    def __init__(self, module: nn.Module):
        self.sizes = []
        module.register_forward_hook(
            lambda m, args, out: self.sizes.append(len(args[0]))
        )


def table_actor_critic(num_states, num_actions, *, one_hot=False, seed=0):
    """Actor and critic that look up one row of a table per state (float64).

    Observations are one-hot state indicators, so the gradient of a loss with respect
    to ``weight[:, s]`` of each network is its gradient at the logits (or the Q
    values) of state ``s``.
    """
    torch.manual_seed(seed)
    dist = OneHotCategorical if one_hot else D.Categorical
    policy = nn.Linear(num_states, num_actions, bias=False).double()
    q = nn.Linear(num_states, num_actions, bias=False).double()
    actor = ProbabilisticActor(
        TensorDictModule(policy, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=dist,
        return_log_prob=True,
    )
    critic = TensorDictModule(q, ["observation"], ["action_value"])
    return actor, critic, policy, q


def table_batch(B, T, num_actions, *, dones=(), terminations=(), seed=0):
    """A ``[B, T]`` batch over one-hot states, every observation its own state.

    Returns the batch and ``(state_ids, next_state_ids)``, each ``[B, T]``: the row
    of the tables each step's ``s_t`` and ``s'_t`` read. The number of states is
    ``B * (T + 1) + len(dones) + len(terminations)``.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(B * (T + 1)).reshape(B, T + 1)
    state_ids, next_ids = ids[:, :T], ids[:, 1:].clone()
    fresh = B * (T + 1)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    terminated = torch.zeros(B, T, 1, dtype=torch.bool)
    for b, t in (*dones, *terminations):
        done[b, t] = True
        next_ids[b, t] = fresh
        fresh += 1
    for b, t in terminations:
        terminated[b, t] = True
    num_states = fresh
    eye = torch.eye(num_states, dtype=torch.float64)
    logits = torch.randn(B, T, num_actions, generator=g, dtype=torch.float64)
    action = torch.multinomial(
        logits.softmax(-1).reshape(-1, num_actions), 1, generator=g
    ).reshape(logits.shape[:-1])
    batch = TensorDict(
        {
            "observation": eye[state_ids],
            "action": action,
            "logits": logits,
            "action_log_prob": logits.log_softmax(-1).gather(-1, action[..., None])[
                ..., 0
            ],
            "next": {
                "observation": eye[next_ids],
                "reward": torch.randn(B, T, 1, generator=g, dtype=torch.float64),
                "done": done,
                "terminated": terminated,
            },
        },
        [B, T],
    )
    return batch, (state_ids, next_ids), num_states


def run_example(script, *args, cwd):
    """Runs ``examples/<script>`` with Hydra overrides; returns the finished process."""
    return subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "examples" / script), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


class TableGaussian(nn.Module):
    """loc = weight[:, s] for a one-hot state s; scale fixed or exp(log_scale)."""

    def __init__(self, num_states, action_dim, fixed_scale=None):
        super().__init__()
        self.loc = nn.Linear(num_states, action_dim, bias=False).double()
        self.fixed_scale = fixed_scale
        if fixed_scale is None:
            self.log_scale = nn.Parameter(torch.full((action_dim,), -0.5).double())

    def forward(self, observation):
        loc = self.loc(observation)
        if self.fixed_scale is not None:
            return loc, torch.full_like(loc, self.fixed_scale)
        return loc, self.log_scale.exp().expand_as(loc)


def table_gaussian_sdn(num_states, action_dim, *, fixed_scale=None, seed=0, n=3):
    """A table Gaussian policy and a dueling critic with a table V and an MLP A."""
    from torchrl.modules import MLP, IndependentNormal

    from torchrl_acer.modules.sdn import StochasticDuelingNetwork

    torch.manual_seed(seed)
    policy = TableGaussian(num_states, action_dim, fixed_scale)
    actor = ProbabilisticActor(
        TensorDictModule(policy, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    v = nn.Linear(num_states, 1, bias=False).double()
    a = MLP(
        in_features=num_states + action_dim,
        out_features=1,
        num_cells=[8],
        activation_class=nn.Tanh,
    ).double()
    critic = StochasticDuelingNetwork(
        TensorDictModule(v, ["observation"], ["state_value"]),
        TensorDictModule(a, ["observation", "action"], ["advantage"]),
        num_samples=n,
    )
    return actor, critic, policy, v, a


def gaussian_table_batch(B, T, action_dim, *, dones=(), terminations=(), seed=0):
    """A [B, T] batch over one-hot states with behaviour Gaussians stored."""
    g = torch.Generator().manual_seed(seed)
    batch, ids, num_states = table_batch(
        B, T, 2, dones=dones, terminations=terminations, seed=seed
    )
    loc = torch.randn(B, T, action_dim, generator=g, dtype=torch.float64) * 0.5
    scale = 0.3 + torch.rand(B, T, action_dim, generator=g, dtype=torch.float64)
    action = loc + scale * torch.randn(
        B, T, action_dim, generator=g, dtype=torch.float64
    )
    log_prob = D.Normal(loc, scale).log_prob(action).sum(-1)
    del batch["logits"]
    batch.set("action", action)
    batch.set("loc", loc)
    batch.set("scale", scale)
    batch.set("action_log_prob", log_prob)
    return batch, ids, num_states
