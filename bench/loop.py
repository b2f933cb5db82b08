"""The CartPole training loop against its networks' compute bound.

    python bench/loop.py [--batches 20] [--repeats 5] [--threads 1] [--compile]
                         [--no-value-checks]

Measures, in one run, alternating windows of each:

- the whole loop of ``examples/acer_gym.py`` at its defaults (CartPole-v1, 8
  envs, T = 20, replay ratio 4 with 32 replayed segments, Adam, gradient
  clipping, the averaged policy, the health checks; evaluation, logging and
  checkpoints off), past its replay start, on
  :class:`~torchrl_acer.trainers.ACERTrainer` driven a collected batch at a
  time (``_common.train_on_batch``, ``Trainer.train``'s loop body): env steps
  per second, and where its time goes (collection, the loss's forward and
  backward, the optimizer step, the averaged-policy step, replay storage and
  sampling, the rest: TorchRL's hooks among it);
- the compute bound of the same networks on the same shapes: for each batch
  the loop collected, T policy inferences on the 8 environments' observations,
  and for each update the loop made (its own count), the policy and critic
  forward and backward on ``[B, T + 1]`` observations plus the averaged policy's
  forward on ``[B, T]``, on the bare ``nn.Module`` s;
- gymnasium's own stepping of the same vector environment with random actions.

It reports the ratio loop / bound (target: at least 0.4) and loop / gymnasium,
medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import close, save, start, train_on_batch, updates  # noqa: E402
from health_cost import cartpole_trainer  # noqa: E402


class Timers:
    """Seconds spent inside methods of the loop's pieces, swapped in place."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._undo = []

    def wrap(self, owner, method: str, name: str):
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] = (
                    self.seconds.get(name, 0.0) + time.perf_counter() - start
                )

        setattr(owner, method, timed)
        self._undo.append((owner, method, original))

    def restore(self):
        for owner, method, original in reversed(self._undo):
            setattr(owner, method, original)
        self._undo.clear()


def time_loop(trainer, iterator, batches: int, breakdown: bool) -> dict:
    """Env steps per second over ``batches`` iterations of the trainer's loop;
    with ``breakdown``, where the time went (the timers' own cost included)."""
    timers = Timers()
    if breakdown:
        # an update is the stepper's step (loss, backward, clipping, checks,
        # optimizer step), then the post_optim hooks (the averaged policy's step)
        timers.wrap(trainer.optimization_stepper, "step", "updates")
        timers.wrap(trainer.loss_module, "forward", "loss forward")
        timers.wrap(trainer.optimizer, "step", "optimizer step")
        timers.wrap(trainer.target_net_updater, "step", "averaged-policy step")
        timers.wrap(trainer.replay_buffer, "extend", "replay extend")
        timers.wrap(trainer.replay_buffer, "sample", "replay sample")
    frames, before = trainer.collected_frames, updates(trainer)
    collect = 0.0
    begin = time.perf_counter()
    for _ in range(batches):
        tick = time.perf_counter()
        batch = next(iterator)
        collect += time.perf_counter() - tick
        train_on_batch(trainer, batch)
    elapsed = time.perf_counter() - begin
    timers.restore()
    steps = trainer.collected_frames - frames
    out = {
        "steps_per_s": steps / elapsed,
        "updates": updates(trainer) - before,
        "steps": steps,
        "seconds": elapsed,
    }
    if breakdown:
        parts = dict(timers.seconds)
        parts["collection"] = collect
        # the loss's backward, clipping and checks are inside the stepper's
        # step, outside the loss's forward and the optimizer's step
        parts["backward, clipping, checks"] = (
            parts.pop("updates")
            - parts.get("loss forward", 0.0)
            - parts.get("optimizer step", 0.0)
        )
        parts["rest"] = elapsed - sum(parts.values())
        out["fractions"] = {k: v / elapsed for k, v in parts.items()}
    return out


def bare_modules(trainer):
    """The plain networks under the loss's TensorDict modules."""
    loss = trainer.loss_module
    policy = loss.actor_network.module[0].module
    critic = loss.critic_network.module
    return policy, critic


def compute_bound(trainer, loop: dict, num_envs: int, T: int, batch_segments: int):
    """Seconds the loop's network work takes on bare modules, for the loop's own
    numbers of collected batches and updates (the on-policy update on
    ``[num_envs, T + 1]``, the replayed ones on ``[batch_segments, T + 1]``)."""
    policy, critic = bare_modules(trainer)
    policy, critic = copy.deepcopy(policy), copy.deepcopy(critic)
    averaged = copy.deepcopy(policy)
    features = trainer.collector.env.observation_spec["observation"].shape[-1]

    def update_fn(rows):
        window = torch.randn(rows, T + 1, features)
        steps = window[:, :T]

        def run():
            (policy(window).sum() + critic(window).sum()).backward()
            with torch.no_grad():
                averaged(steps)

        return run

    step_obs = torch.randn(num_envs, features)

    @torch.no_grad()
    def inference():
        policy(step_obs)

    def median_time(fn, n=30):
        fn()
        times = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    t_infer = median_time(inference, 200)
    t_on = median_time(update_fn(num_envs))
    t_replay = median_time(update_fn(batch_segments))
    collected = loop["steps"] // (num_envs * T)
    replayed = loop["updates"] - collected  # one on-policy update per batch
    seconds = collected * T * t_infer + collected * t_on + replayed * t_replay
    return {
        "steps_per_s": loop["steps"] / seconds,
        "inference_s": t_infer,
        "on_policy_update_s": t_on,
        "replayed_update_s": t_replay,
    }


def gymnasium_steps_per_s(num_envs: int, steps: int = 2000) -> float:
    """The vector environment stepped by gymnasium alone, random actions."""
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(steps, num_envs))
    start = time.perf_counter()
    for a in actions:
        env.step(a)
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs / elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="the example's compile=true: torch.compile of the loss's forward",
    )
    parser.add_argument(
        "--no-value-checks",
        action="store_true",
        help="the Retrace estimator's check_values=False (no read-back of the "
        "importance weights' validity: the compiled loss then has no graph break)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    trainer = cartpole_trainer(True)
    if args.no_value_checks:
        trainer.loss_module.value_estimator.check_values = False
    if args.compile:
        trainer.loss_module.compile()  # as examples/acer_gym.py does
    num_envs = trainer.collector.env.batch_size.numel()
    batch_segments = trainer.replay_buffer._batch_size
    iterator = start(trainer)
    # T from a collected batch ([num_envs, T]): TorchRL's collectors keep
    # frames_per_batch per environment, not the total they were given
    batch = next(iterator)
    T = batch.shape[-1]
    train_on_batch(trainer, batch)
    for _ in range(7):  # past replay.start (1 000 steps)
        train_on_batch(trainer, next(iterator))
    rounds = []
    for r in range(args.repeats):
        loop = time_loop(trainer, iterator, args.batches, breakdown=False)
        bound = compute_bound(trainer, loop, num_envs, T, batch_segments)
        gym_rate = gymnasium_steps_per_s(num_envs)
        rounds.append(
            {
                "loop_steps_per_s": loop["steps_per_s"],
                "bound_steps_per_s": bound["steps_per_s"],
                "gymnasium_steps_per_s": gym_rate,
                "loop_over_bound": loop["steps_per_s"] / bound["steps_per_s"],
                "loop_over_gymnasium": loop["steps_per_s"] / gym_rate,
                "bound": bound,
                "updates": loop["updates"],
            }
        )
        print(
            f"round {r}: loop {loop['steps_per_s']:.0f} steps/s, bound "
            f"{bound['steps_per_s']:.0f}, ratio {rounds[-1]['loop_over_bound']:.3f}",
            flush=True,
        )
    breakdown = time_loop(trainer, iterator, args.batches, breakdown=True)
    close(trainer)

    def median(key):
        return statistics.median(r[key] for r in rounds)

    result = {
        "setting": {
            "env": "CartPole-v1",
            "num_envs": num_envs,
            "T": T,
            "batch_segments": batch_segments,
            "replay_ratio": trainer.schedule.replay_ratio,
            "batches_per_round": args.batches,
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "compile": args.compile,
            "value_checks": not args.no_value_checks,
        },
        "loop_steps_per_s": median("loop_steps_per_s"),
        "bound_steps_per_s": median("bound_steps_per_s"),
        "gymnasium_steps_per_s": median("gymnasium_steps_per_s"),
        "loop_over_bound": median("loop_over_bound"),
        "loop_over_bound_range": [
            min(r["loop_over_bound"] for r in rounds),
            max(r["loop_over_bound"] for r in rounds),
        ],
        "loop_over_gymnasium": median("loop_over_gymnasium"),
        "time_fractions": breakdown["fractions"],
        "rounds": rounds,
    }
    path = save("loop", result)
    print(f"saved {path}")
    print(
        f"loop / compute bound: {result['loop_over_bound']:.3f} "
        f"(range {result['loop_over_bound_range'][0]:.3f}-"
        f"{result['loop_over_bound_range'][1]:.3f}); loop "
        f"{result['loop_steps_per_s']:.0f} steps/s, bound "
        f"{result['bound_steps_per_s']:.0f}, gymnasium "
        f"{result['gymnasium_steps_per_s']:.0f}"
    )
    for key, value in sorted(result["time_fractions"].items(), key=lambda kv: -kv[1]):
        print(f"  {key}: {100 * value:.1f}%")


if __name__ == "__main__":
    main()
