"""ACERLoss forward+backward against the bare networks' forward+backward.

    python bench/loss.py [--rounds 10] [--device cpu] [--B 16] [--T 20]
                         [--threads 1] [--compile]

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

Cases: separate [64, 64] MLPs on CartPole-sized inputs (4 features, 2 actions)
with [16, 20] batches (and [128, 20], to show how much of the overhead is fixed),
and the DQN conv trunk shared by both heads on Atari-sized
[16, 20] batches of 4x84x84 uint8 frames (6 actions).

``--device cuda`` puts the networks and the batch on the GPU and synchronizes
around every timed call; its results are saved as ``loss_cuda-*.json``, apart from
the CPU ones that ``bench/report.py`` reads.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved_medians, save  # noqa: E402

from torchrl_acer import ACERLoss  # noqa: E402
from torchrl_acer.modules.models import atari_actor_critic, mlp_actor_critic  # noqa: E402


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


def case(name, actor, critic, data, obs_key, shared, device, compile_loss=False):
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

    def step(fn):
        def run():
            out = fn(data)
            (
                out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]
            ).backward()

        return run

    def bare():
        bare_step(policy, critic_head, trunk, avg_policy, avg_trunk, window, current)

    fns = {"bare": bare, "loss": step(loss), "unchecked": step(unchecked)}
    if compile_loss:
        fns["compiled"] = step(torch.compile(unchecked, fullgraph=True))
    return name, fns


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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T = args.B, args.T
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    torch.manual_seed(0)
    cases = [
        case(
            f"cartpole_mlp_{B}x{T}",
            *mlp_actor_critic(4, 2),
            batch(B, T, "observation", (4,), 2, torch.float32),
            "observation",
            shared=False,
            device=device,
            compile_loss=args.compile,
        ),
        case(
            f"cartpole_mlp_{8 * B}x{T}",
            *mlp_actor_critic(4, 2),
            batch(8 * B, T, "observation", (4,), 2, torch.float32),
            "observation",
            shared=False,
            device=device,
            compile_loss=args.compile,
        ),
        case(
            f"atari_dqn_conv_shared_{B}x{T}",
            *atari_actor_critic(6),
            batch(B, T, "pixels", (4, 84, 84), 6, torch.uint8),
            "pixels",
            shared=True,
            device=device,
            compile_loss=args.compile,
        ),
    ]
    rows = []
    candidates = ["loss", "unchecked"] + (["compiled"] if args.compile else [])
    header = "".join(f"{c + ' ms':>14} {c + '/bare':>15}" for c in candidates)
    print(f"{'case':<30} {'bare ms':>9}{header}")
    for name, fns in cases:
        rounds = args.rounds if "mlp" in name else max(3, args.rounds // 2)
        med = interleaved_medians(fns, rounds, sync=sync)
        ratios = {c: med[c] / med["bare"] for c in candidates}
        row = {"case": name, "median_s": med, "loss_over_bare": ratios["loss"]}
        row.update({f"{c}_over_bare": ratios[c] for c in candidates[1:]})
        rows.append(row)
        cells = "".join(f"{med[c] * 1e3:>14.2f} {ratios[c]:>15.2f}" for c in candidates)
        print(f"{name:<30} {med['bare'] * 1e3:>9.2f}{cells}")
    settings = {
        "rounds": args.rounds,
        "seed": 0,
        "device": str(device),
        "B": B,
        "T": T,
        "threads": torch.get_num_threads(),
    }
    name = "loss" if device.type == "cpu" else f"loss_{device.type}"
    path = save(name, {"settings": settings, "rows": rows})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
