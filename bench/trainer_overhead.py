"""The cost of TorchRL's Trainer framework: ACERTrainer against the old loop.

    python bench/trainer_overhead.py [--rounds 7] [--batches 5]

Both trainers are built from ``examples/acer_gym.py``'s pieces at its defaults
(CartPole-v1, 8 envs, T = 20, replay ratio 4, 32 replayed segments, Adam with
clipping, the averaged policy; no evaluation, logging or checkpoints), each with
its own copy, past the replay start. One round times ``--batches`` iterations
(collect, store, on-policy and replayed updates) of each in turn
(:func:`_common.interleaved_samples`), so that load from elsewhere hits both alike;
the report is the median of the per-round ratios new / old, with the old loop's
health checks on and off. ACERTrainer runs as built by default: its non-finite
guard on, TorchRL's ``SoftUpdate`` (the old loop has its own foreach copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved_samples, save  # noqa: E402
from health_cost import cartpole_trainer  # noqa: E402

from torchrl_acer.trainers.acer import ACERTrainer  # noqa: E402


def acer_trainer() -> ACERTrainer:
    """The old trainer's pieces at the same settings, wired into ACERTrainer."""
    old = cartpole_trainer(check_health=False)
    return ACERTrainer(
        collector=old.collector,
        total_frames=10**9,
        loss_module=old.loss_module,
        optimizer=old.optimizer,
        replay_buffer=old.replay_buffer,
        replay_ratio=old.replay_ratio,
        replay_start=old.replay_start,
        alpha=old.target_updater.eps,  # ACERTrainer's own: TorchRL's SoftUpdate
        clip_norm=old.max_grad_norm,
        progress_bar=False,
        seed=old.seed,
    )


def new_iteration(trainer: ACERTrainer, batches):
    """The body of ``Trainer.train`` for one collected batch (train() itself shuts
    the collector down when it returns)."""
    batch = trainer._process_batch_hook(next(batches))
    trainer.collected_frames += batch.numel()
    trainer._pre_steps_log_hook(batch)
    trainer.optim_steps(batch)
    trainer._post_steps_hook()
    trainer._post_steps_log_hook(batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old_checked = cartpole_trainer(check_health=True)
    old_unchecked = cartpole_trainer(check_health=False)
    new = acer_trainer()
    iterators = {}
    for name, trainer in (("old", old_checked), ("old_unchecked", old_unchecked)):
        iterators[name] = iter(trainer.collector)
    iterators["new"] = iter(new.collector)
    warmup = 10  # past replay.start (1000 steps = 7 batches of 160)
    for _ in range(warmup):
        old_checked.train_on_batch(next(iterators["old"]))
        old_unchecked.train_on_batch(next(iterators["old_unchecked"]))
        new_iteration(new, iterators["new"])

    def run(step):
        def fn():
            for _ in range(args.batches):
                step()

        return fn

    fns = {
        "old": run(lambda: old_checked.train_on_batch(next(iterators["old"]))),
        "old_unchecked": run(
            lambda: old_unchecked.train_on_batch(next(iterators["old_unchecked"]))
        ),
        "new": run(lambda: new_iteration(new, iterators["new"])),
    }
    samples = interleaved_samples(fns, args.rounds, min_time=0.0)
    frames = 160 * args.batches
    result = {
        "settings": vars(args),
        "env_steps_per_s": {
            name: frames / statistics.median(s) for name, s in samples.items()
        },
        "ratio_new_over_old": statistics.median(
            n / o for n, o in zip(samples["new"], samples["old"], strict=True)
        ),
        "ratio_new_over_old_unchecked": statistics.median(
            n / o for n, o in zip(samples["new"], samples["old_unchecked"], strict=True)
        ),
    }
    for name, value in result["env_steps_per_s"].items():
        print(f"{name:>14}: {value:8.0f} env steps/s")
    print(
        f"seconds per batch, new / old: {result['ratio_new_over_old']:.3f} "
        f"(old without health checks: {result['ratio_new_over_old_unchecked']:.3f})"
    )
    print(save("trainer_overhead", result))


if __name__ == "__main__":
    main()
