"""Where CartPole collection time goes: TorchRL's plumbing against what it wraps.

    python bench/collection.py [--rounds 15] [--threads 1]

Times, round-robin in one run (medians over ``--rounds``), one ``[8, 20]`` batch
(160 env steps, ``examples/acer_gym.py``'s defaults) of:

- ``collector_probabilistic``: a TorchRL ``Collector`` on the example's env with
  the policy as a plain :class:`~torchrl.modules.ProbabilisticActor` (what the
  example used before :class:`~torchrl_acer.modules.actors.CategoricalActor`);
- ``collector``: the same with the example's actor, a ``CategoricalActor`` on
  the same network (same draws, see tests/modules/test_categorical_actor.py);
- ``lean_collector``: :class:`~torchrl_acer.training.gym_collector.GymVectorCollector`
  (``collector.backend=lean``) on the same env and actor: the same batches as
  ``collector``, bit for bit (tests/training/test_gym_collector.py), stepping gymnasium's
  vector env itself;
- ``gymnasium``: gymnasium's own vector env stepped 20 times with random actions
  (no torch, no TensorDict);
- ``policy_bare``: the policy network's forward on 8 observations, 20 times.

It reports the speed-up of the lean actor and of the lean collector (the median
of the per-round ratios to TorchRL's ``Collector``), and each collector against
the gymnasium + bare-network floor (``gymnasium + policy_bare``): what TorchRL's
env wrapper, transforms and collector add to the work they wrap, and what is left
of it without them (the actor's sampling, the batch's TensorDict).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torchrl.collectors import Collector
from torchrl.modules import OneHotCategorical, ProbabilisticActor

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved_samples, per_round_ratios, save  # noqa: E402

from torchrl_acer.modules.models import mlp_actor_critic  # noqa: E402
from torchrl_acer.training.envs import make_env  # noqa: E402
from torchrl_acer.training.gym_collector import GymVectorCollector  # noqa: E402

NUM_ENVS, T = 8, 20


def torchrl_collector(env, policy) -> Collector:
    """TorchRL's ``Collector`` of endless ``[NUM_ENVS, T]`` batches on the CPU."""
    return Collector(
        env,
        policy,
        frames_per_batch=NUM_ENVS * T,
        total_frames=-1,
        storing_device="cpu",
        auto_register_policy_transforms=False,
    )


def collector_batches(policy, seed, gym_vector=False):
    env = make_env("CartPole-v1", num_envs=NUM_ENVS, seed=seed, action_space="discrete")
    if gym_vector:
        collector = GymVectorCollector(env, policy, frames_per_batch=NUM_ENVS * T)
    else:
        collector = torchrl_collector(env, policy)
    iterator = iter(collector)
    return collector, lambda: next(iterator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    lean, _ = mlp_actor_critic(4, 2, num_cells=[64, 64])
    probabilistic = ProbabilisticActor(
        lean.module[0],
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    torchrl_collector, torchrl_batch = collector_batches(lean, 0)
    prob_collector, prob_batch = collector_batches(probabilistic, 0)
    gym_collector, gym_collector_batch = collector_batches(lean, 0, gym_vector=True)

    vec = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync")
    vec.reset(seed=0)
    rng = np.random.default_rng(0)

    def gymnasium_batch():
        for _ in range(T):
            vec.step(rng.integers(0, 2, size=NUM_ENVS))

    net = lean.module[0].module
    obs = torch.randn(NUM_ENVS, 4)

    @torch.no_grad()
    def policy_bare():
        for _ in range(T):
            net(obs)

    samples = interleaved_samples(
        {
            "collector_probabilistic": prob_batch,
            "collector": torchrl_batch,
            "lean_collector": gym_collector_batch,
            "gymnasium": gymnasium_batch,
            "policy_bare": policy_bare,
        },
        rounds=args.rounds,
        min_time=0.3,
    )
    seconds = {name: statistics.median(s) for name, s in samples.items()}
    # the same round's samples saw the same load from elsewhere
    speedup = per_round_ratios(samples["collector"], samples["lean_collector"])
    round_ratios = speedup["ratios"]
    torchrl_collector.shutdown()
    prob_collector.shutdown()
    gym_collector.shutdown()
    vec.close()
    steps = NUM_ENVS * T
    floor = seconds["gymnasium"] + seconds["policy_bare"]
    result = {
        "setting": {
            "env": "CartPole-v1",
            "num_envs": NUM_ENVS,
            "T": T,
            "rounds": args.rounds,
            "torch_threads": args.threads,
        },
        "seconds_per_batch": seconds,
        "steps_per_s": {k: steps / v for k, v in seconds.items()},
        "lean_actor_speedup": seconds["collector_probabilistic"] / seconds["collector"],
        "collector_over_floor": seconds["collector"] / floor,
        "collector_probabilistic_over_floor": seconds["collector_probabilistic"]
        / floor,
        "lean_collector_over_floor": seconds["lean_collector"] / floor,
        # median of the per-round ratios, and their range
        "lean_collector_speedup": speedup["median"],
        "lean_collector_speedup_range": [speedup["min"], speedup["max"]],
    }
    path = save("collection", result)
    for name, s in seconds.items():
        print(f"{name:>24}: {steps / s:8.0f} steps/s ({1e3 * s:.2f} ms per batch)")
    print(
        f"lean actor: collection {result['lean_actor_speedup']:.2f}x faster; "
        f"collector / (gymnasium + bare policy): {result['collector_over_floor']:.1f} "
        f"(was {result['collector_probabilistic_over_floor']:.1f})"
    )
    print(
        f"lean collector: {result['lean_collector_speedup']:.2f}x faster than "
        f"TorchRL's Collector (rounds: {min(round_ratios):.2f} to "
        f"{max(round_ratios):.2f}); lean collector / (gymnasium + bare policy): "
        f"{result['lean_collector_over_floor']:.1f}"
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
