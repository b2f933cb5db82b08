"""Does prioritized segment replay help ACER? The tuned presets with and without it.

    python bench/prioritized_replay.py                       # both tasks, seeds 0-9
    python bench/prioritized_replay.py --tasks CartPole-v1 --seeds 0 --budget 20000

Issue #34 asks for prioritized segment replay through TorchRL's samplers "if it
helps". ACER replays whole ``T``-step segments (one per stored item of
:func:`~torchrl_acer.trainers.acer.make_segment_replay_buffer`), so the sampler that
fits is a prioritized sampler over segments (TorchRL's ``PrioritizedSampler``; here
written out, see :class:`PrioritizedSegments`), as Reactor's prioritized sequence
replay (Gruslys et al. 2018) samples sequences: a segment's priority is the mean absolute
Retrace error :math:`|Q^{ret}_t - Q(s_t, a_t)|` over its steps, measured by the
update that last trained on it; a new segment enters at the largest priority so far
(as TorchRL's sampler does), so that each is likely replayed soon. Sampling is
proportional to ``priority ** ALPHA``; no importance weights are applied (the loss
has no per-segment weight).

``ours_tuned``: ``examples/acer_gym.py`` with the task's preset, as in
``bench/time_to_solve.py``. ``ours_tuned_prioritized``: the same run with its
segment replay swapped for the prioritized one before training starts (``patch``:
a bench-only wrapper, nothing in the package changes). Each run goes on ``settle``
env steps past its first evaluation at the threshold, so that ``solved_for_good``
shows whether it stayed solved. Protocol, one-thread processes and the file's
layout are ``bench/time_to_solve.py``'s; the result is
``bench/results/prioritized_replay-<UTC stamp>.json``.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import time_to_solve as tts  # noqa: E402

CANDIDATES = ("ours_tuned", "ours_tuned_prioritized")
ALPHA = 0.6  # priority exponent (proportional PER's, Schaul et al. 2016)
EPS = 1e-3  # keeps every segment's priority above zero
SETTLE = 10_000
BUDGET = 100_000


class PrioritizedSegments:
    """The schedule's segment replay, sampled in proportion to ``priority **
    ALPHA``, each replayed batch's priorities updated from the Retrace errors of
    the update that trained on it.

    TorchRL's ``PrioritizedSampler`` needs its C++ extension, which does not load
    with the torch installed here (``../shared/TORCHRL_NOTES.md``), so the
    sampling is written out: ``torch.multinomial`` over the stored segments'
    priorities (cheap at these sizes), the segments read from the schedule's own
    buffer. The update schedule samples a replayed batch and the trainer's loss
    then runs on it; its errors (``errors``, refreshed by each loss call) are read
    at the next ``sample`` or ``extend``, which come after that update and before
    any other replayed one.
    """

    def __init__(self, uniform, errors: dict):
        import torch

        self.buffer, self.errors = uniform, errors
        self.priority = torch.zeros(uniform.storage.max_size)
        self.pending = None  # the index of the last replayed batch

    def _update(self):
        error = self.errors.get("error")
        if self.pending is not None and error is not None:
            # a segment drawn twice in one batch keeps one of its errors
            self.priority[self.pending] = error.detach().float() + EPS
        self.pending = None

    def extend(self, data):
        self._update()
        index = self.buffer.extend(data)
        # a new segment at the largest priority so far: replayed soon at least once
        self.priority[index] = float(self.priority.max().clamp_min(1.0))
        return index

    def sample(self):
        import torch

        self._update()
        weights = self.priority[: len(self.buffer)] ** ALPHA
        self.pending = torch.multinomial(weights, self.buffer.batch_size, True)
        self.errors["error"] = None
        return self.buffer[self.pending]

    def __len__(self):
        return len(self.buffer)


def prioritize(trainer, errors: dict):
    """Puts :class:`PrioritizedSegments` in place of ``trainer``'s segment replay."""
    schedule = trainer.schedule
    if schedule.replay_buffer is not None:
        schedule.replay_buffer = PrioritizedSegments(schedule.replay_buffer, errors)


def record_errors(errors: dict):
    """Wraps the loss's categorical terms to keep each segment's mean absolute
    Retrace error (``[B]``) of the last loss call."""
    from torchrl_acer.objectives import acer

    terms = acer.categorical_terms

    @functools.wraps(terms)
    def recorded(*args, **kwargs):
        out = terms(*args, **kwargs)
        error = out["value_target"] - out["action_value"].detach()
        errors["error"] = error.abs().flatten(1).mean(1)
        return out

    acer.categorical_terms = recorded


def run_prioritized(
    task, seed, budget, max_minutes, run_dir, tree=tts.ROOT, settle=None
):
    errors: dict = {}
    record_errors(errors)
    return tts.run_ours(
        task,
        seed,
        budget,
        max_minutes,
        run_dir,
        tree=tree,
        preset=tts.PRESETS[task],
        settle=settle,
        patch=functools.partial(prioritize, errors=errors),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks", nargs="+", default=list(tts.THRESHOLDS), choices=list(tts.THRESHOLDS)
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--budget", type=int, default=BUDGET, help="env steps per run")
    parser.add_argument("--settle", type=int, default=SETTLE)
    parser.add_argument("--order-seed", type=int, default=0, help="seeds the shuffle")
    parser.add_argument("--max-minutes", type=float, default=None)
    tts.add_worker_arguments(parser, CANDIDATES)
    args = parser.parse_args(argv)
    if args.worker:
        settle = {"settle": args.settle}
        return tts.worker(
            args,
            {
                "ours_tuned": functools.partial(
                    tts.run_ours, preset=tts.PRESETS[args.task], **settle
                ),
                "ours_tuned_prioritized": functools.partial(run_prioritized, **settle),
            },
        )
    args.budget = {task: args.budget for task in args.tasks}
    args.bench_venv, args.ours_tree = None, None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = tts.ROOT / "bench" / "results" / f"prioritized_replay-{stamp}.json"
    commit, info = tts.machine_info()
    payload = {
        "benchmark": "prioritized_replay",
        "date": stamp,
        "commit": commit,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": info,
        "settings": {
            "thresholds": tts.THRESHOLDS,
            "budget_env_steps": args.budget,
            "settle_env_steps": args.settle,
            "late": tts.LATE,
            "presets": tts.PRESETS,
            "prioritized": {
                "sampler": "torch.multinomial over the T-step segments stored, "
                "weights priority ** alpha",
                "alpha": ALPHA,
                "eps": EPS,
                "priority": "mean |Q_ret - Q(s, a)| over the segment's steps, from "
                "the last update that trained on it; new segments at the largest "
                "priority so far",
                "importance_weights": "not applied",
            },
            "protocol": tts.PROTOCOL,
            "threads": "torch.set_num_threads(1), OMP/MKL/OPENBLAS_NUM_THREADS=1, "
            "one run at a time",
            "order": "round-robin over seeds; in each round both candidates, in an "
            f"order shuffled by random.Random({args.order_seed})",
        },
    }
    order = random.Random(args.order_seed)
    plan = []
    for task in args.tasks:
        for seed in args.seeds:
            candidates = list(CANDIDATES)
            order.shuffle(candidates)
            plan += [(c, task, seed) for c in candidates]
    runs = []
    for i, (candidate, task, seed) in enumerate(plan):
        run_dir = tts.RUNS / f"prioritized-{stamp}" / f"{candidate}-{task}-seed{seed}"
        run = tts.run_one(candidate, task, seed, args, script=__file__, run_dir=run_dir)
        runs.append(run)
        steps = run.get("env_steps_to_threshold")
        print(
            f"[{i + 1}/{len(plan)}] {candidate} {task} seed {seed}: reached at "
            f"{steps}, solved for good {run.get('solved_for_good')}",
            flush=True,
        )
        tts.write(path, payload, runs)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
