"""Small networks and batches the tests build on."""

from __future__ import annotations

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
    action = D.Categorical(logits=logits).sample()
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
