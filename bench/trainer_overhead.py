"""The cost of TorchRL's Trainer framework: ACERTrainer against a plain loop over
the same pieces.

    python bench/trainer_overhead.py [--rounds 7] [--batches 5]

Three loops are built from ``examples/acer_gym.py``'s pieces at its defaults
(CartPole-v1, 8 envs, T = 20, replay ratio 4, 32 replayed segments, Adam with
clipping, the averaged policy; no evaluation, logging or checkpoints), each with
its own copy, and run past the replay start:

- ``trainer``: :class:`~torchrl_acer.trainers.ACERTrainer` as built
  (``_common.bare_trainer``), its non-finite guard on, driven a collected batch at
  a time by ``Trainer.train``'s loop body (``_common.train_on_batch``): the
  hooks, the update schedule, the stepper, TorchRL's ``SoftUpdate`` through its
  ``post_optim`` hook, the weight-push hook;
- ``trainer_unchecked``: the same with ``check_health=False`` (TorchRL's default
  stepper);
- ``plain``: the same work written out, with none of the framework
  (:class:`PlainLoop`): each collected batch stored in the replay as segments
  (the keys the loss reads), the on-policy update, then Poisson(replay ratio)
  replayed ones (a generator seeded as the trainer's schedule's, so the three
  draw the same numbers of updates), each the loss's ``loss_*`` terms, backward,
  gradient clipping, the optimizer step and the ``SoftUpdate`` step.

One round times ``--batches`` iterations (collect, store, on-policy and replayed
updates) of each in turn (:func:`_common.interleaved_samples`), so that load from
elsewhere hits all alike; the report is the median of the per-round ratios
trainer / plain, with and without the trainer's health checks: what the framework
costs over the loop it runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import (  # noqa: E402
    close,
    interleaved_samples,
    per_round_ratios,
    save,
    start,
    train_on_batch,
    updates,
)
from health_cost import cartpole_trainer  # noqa: E402
from torchrl.objectives import SoftUpdate  # noqa: E402

from torchrl_acer.trainers.acer import as_segments, replay_keys  # noqa: E402


class PlainLoop:
    """ACER's per-batch work on ``pieces``' collector, loss, optimizer and replay
    (an :class:`~torchrl_acer.trainers.ACERTrainer` never trained, whose settings
    it reads), as a plain loop: no hooks, no stepper, no schedule object."""

    def __init__(self, pieces, seed: int):
        schedule = pieces.schedule
        self.loss, self.optimizer = pieces.loss_module, pieces.optimizer
        self.replay = pieces.replay_buffer
        self.ratio, self.replay_start = schedule.replay_ratio, schedule.replay_start
        self.clip_norm = pieces.clip_norm
        self.soft_update = SoftUpdate(self.loss, eps=pieces.target_net_updater.eps)
        self.generator = torch.Generator().manual_seed(seed)  # as the schedule's
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.keys = replay_keys(self.loss, self.replay)
        self.iterator = iter(pieces.collector)
        self.collector = pieces.collector
        self.frames = self.updates = self.stored_steps = 0

    def update(self, batch) -> None:
        losses = self.loss(batch)
        sum(v for k, v in losses.items() if k.startswith("loss")).backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.soft_update.step()
        self.updates += 1

    def train_on_batch(self) -> None:
        batch = as_segments(next(self.iterator))
        self.batch_steps = batch.numel()
        self.frames += batch.numel()
        self.replay.extend(batch.select(*self.keys, strict=False))
        self.stored_steps += batch.numel()
        self.update(batch)
        if self.stored_steps >= self.replay_start:
            rate = torch.tensor(float(self.ratio))
            for _ in range(int(torch.poisson(rate, generator=self.generator))):
                self.update(self.replay.sample())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--warmup", type=int, default=10, help="batches before the timing"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    checked = cartpole_trainer(check_health=True)
    unchecked = cartpole_trainer(check_health=False)
    pieces = cartpole_trainer(check_health=False)
    plain = PlainLoop(pieces, seed=pieces.seed)
    iterators = {"trainer": start(checked), "trainer_unchecked": start(unchecked)}
    steps = {
        "trainer": lambda: train_on_batch(checked, next(iterators["trainer"])),
        "trainer_unchecked": lambda: train_on_batch(
            unchecked, next(iterators["trainer_unchecked"])
        ),
        "plain": plain.train_on_batch,
    }
    # past replay.start (1000 steps = 7 batches of 160)
    for _ in range(args.warmup):
        for step in steps.values():
            step()

    def run(step):
        def fn():
            for _ in range(args.batches):
                step()

        return fn

    samples = interleaved_samples(
        {name: run(step) for name, step in steps.items()}, args.rounds, min_time=0.0
    )
    frames = {
        "trainer": checked.collected_frames,
        "trainer_unchecked": unchecked.collected_frames,
        "plain": plain.frames,
    }
    made = {
        "trainer": updates(checked),
        "trainer_unchecked": updates(unchecked),
        "plain": plain.updates,
    }
    # the same seed, the same work: the same batches and numbers of updates
    assert len(set(frames.values())) == 1 and len(set(made.values())) == 1, (
        frames,
        made,
    )

    def ratio(name):
        return per_round_ratios(samples[name], samples["plain"])["median"]

    result = {
        "settings": vars(args),
        "env_steps_per_s": {
            name: plain.batch_steps * args.batches / statistics.median(s)
            for name, s in samples.items()
        },
        "updates": made,
        "ratio_trainer_over_plain": ratio("trainer"),
        "ratio_trainer_unchecked_over_plain": ratio("trainer_unchecked"),
    }
    for trainer in (checked, unchecked, pieces):
        close(trainer)
    for name, value in result["env_steps_per_s"].items():
        print(f"{name:>17}: {value:8.0f} env steps/s")
    print(
        f"seconds per batch, ACERTrainer / plain loop: "
        f"{result['ratio_trainer_over_plain']:.3f} (without health checks: "
        f"{result['ratio_trainer_unchecked_over_plain']:.3f})"
    )
    print(save("trainer_overhead", result))


if __name__ == "__main__":
    main()
