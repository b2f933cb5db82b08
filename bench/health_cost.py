"""Cost of the trainer's numerical health checks: the training loop with and
without them.

    python bench/health_cost.py [--rounds 7] [--cartpole-batches 20]
                                [--atari-batches 2] [--no-atari] [--threads N]

Two trainers are built alike from the same seed, one with ``check_health=True``
(the default: the :class:`~torchrl_acer.trainers.NonFiniteGuard` stepper, one
reduction and one read-back per update over the loss terms and the gradient norm,
one over each collected batch) and one with ``check_health=False`` (TorchRL's
default stepper). Both are :class:`~torchrl_acer.trainers.ACERTrainer` s driven a
collected batch at a time (``_common.train_on_batch``: ``Trainer.train``'s loop
body). They draw the same Poisson numbers of replayed updates (the schedule's own
generator, same seed), so each round gives both the same work; rounds alternate
which goes first. Reported per loop: the median seconds per collected
batch of each, and the median over rounds of the ratio checked / unchecked.

Loops: CartPole-v1 with ``examples/config_gym.yaml``'s defaults (8 envs, T = 20,
replay ratio 4, [64, 64] MLPs; no evaluation, logging or checkpoints), timed past
its replay start; and Atari (``bench/throughput.py``'s setup: ALE/Breakout-v5,
16 envs, T = 20, replay ratio 4, the frame-lean replay).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "examples"))
from _common import (  # noqa: E402
    bare_trainer,
    close,
    example_config,
    interleaved_medians,
    per_round_ratios,
    save,
    start,
    train_on_batch,
    update,
    updates,
)
from utils_gym import make_env, make_models  # noqa: E402

from torchrl_acer.trainers import ACERTrainer, make_segment_replay_buffer  # noqa: E402
from torchrl_acer.trainers.hooks import _batch_is_finite  # noqa: E402
from torchrl_acer.training.experiment import (  # noqa: E402
    make_collector,
    make_loss,
    make_optimizer,
)


def cartpole_trainer(check_health: bool) -> ACERTrainer:
    """``examples/acer_gym.py``'s pieces with its defaults, without evaluation,
    logging or checkpoints."""
    cfg = example_config("config_gym")
    torch.manual_seed(cfg.seed)
    env = make_env(cfg, cfg.env.num_envs, seed=cfg.seed)
    actor, critic = make_models(cfg, env)
    loss = make_loss(cfg.loss, actor, critic)
    T, num_envs = cfg.collector.T, cfg.env.num_envs
    collector = make_collector(
        cfg, functools.partial(make_env, cfg), actor, device="cpu", env=env
    )
    return bare_trainer(
        cfg,
        collector=collector,
        loss=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        replay=make_segment_replay_buffer(
            cfg.replay.capacity, T, cfg.replay.batch_segments or num_envs
        ),
        check_health=check_health,
    )


def atari_trainer(check_health: bool) -> ACERTrainer:
    from throughput import make_trainer

    return make_trainer("ALE/Breakout-v5", 16, 20, check_health=check_health)


def compare(build, rounds: int, batches: int, warmup: int) -> dict:
    trainers = {"checked": build(True), "unchecked": build(False)}
    iterators = {name: start(t) for name, t in trainers.items()}
    for name, trainer in trainers.items():
        for _ in range(warmup):
            train_on_batch(trainer, next(iterators[name]))
    seconds = {name: [] for name in trainers}
    timed = {name: 0 for name in trainers}
    for r in range(rounds):
        order = ["checked", "unchecked"] if r % 2 == 0 else ["unchecked", "checked"]
        for name in order:
            trainer = trainers[name]
            before = updates(trainer)
            tick = time.perf_counter()
            for _ in range(batches):
                train_on_batch(trainer, next(iterators[name]))
            seconds[name].append((time.perf_counter() - tick) / batches)
            timed[name] += updates(trainer) - before
    ratios = per_round_ratios(seconds["checked"], seconds["unchecked"])
    assert trainers["checked"].optimization_stepper.nonfinite == {
        "updates": 0,
        "batches": 0,
    }
    # the parts, less noisy: one replayed update with and without its check (each
    # trainer's own stepper on the same replayed batch), and the check of one
    # collected batch
    trainer = trainers["checked"]
    replayed = trainer.replay_buffer.sample()
    fresh = next(iterators["checked"])
    keys = trainer.loss_module.in_keys
    parts = interleaved_medians(
        {
            "update_checked": lambda: update(trainers["checked"], replayed),
            "update_unchecked": lambda: update(trainers["unchecked"], replayed),
            "batch_check": lambda: _batch_is_finite(fresh.select(*keys, strict=False)),
        },
        rounds=rounds,
    )
    for t in trainers.values():
        close(t)
    return {
        "update_seconds": {
            "checked": parts["update_checked"],
            "unchecked": parts["update_unchecked"],
        },
        "update_ratio_checked_over_unchecked": parts["update_checked"]
        / parts["update_unchecked"],
        "batch_check_seconds": parts["batch_check"],
        "batch_check_fraction_of_iteration": parts["batch_check"]
        / statistics.median(seconds["unchecked"]),
        "rounds": rounds,
        "batches_per_round": batches,
        "updates_timed": timed,  # equal: the same work on both sides
        "seconds_per_batch": {k: statistics.median(v) for k, v in seconds.items()},
        "seconds_per_batch_all": seconds,
        "ratio_checked_over_unchecked": ratios["median"],
        "ratios": ratios["ratios"],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cartpole-batches", type=int, default=20)
    parser.add_argument("--atari-batches", type=int, default=2)
    parser.add_argument("--no-atari", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    results = {}
    # past replay.start (1 000 steps = 7 batches of 160): replayed updates happen
    results["cartpole"] = compare(
        cartpole_trainer, args.rounds, args.cartpole_batches, warmup=8
    )
    print(
        f"CartPole: checked / unchecked = "
        f"{results['cartpole']['ratio_checked_over_unchecked']:.3f}"
    )
    if not args.no_atari:
        results["atari"] = compare(
            atari_trainer, args.rounds, args.atari_batches, warmup=1
        )
        print(
            f"Atari: checked / unchecked = "
            f"{results['atari']['ratio_checked_over_unchecked']:.3f}"
        )
    for name, r in results.items():
        s = r["seconds_per_batch"]
        print(
            f"{name}: {s['checked'] * 1e3:.1f} ms per batch checked, "
            f"{s['unchecked'] * 1e3:.1f} unchecked; median ratio "
            f"{r['ratio_checked_over_unchecked']:.3f} over {r['rounds']} rounds "
            f"(range {min(r['ratios']):.3f}-{max(r['ratios']):.3f}); updates timed "
            f"{r['updates_timed']}"
        )
        u = r["update_seconds"]
        print(
            f"{name}: one replayed update {u['checked'] * 1e3:.2f} ms checked, "
            f"{u['unchecked'] * 1e3:.2f} unchecked (ratio "
            f"{r['update_ratio_checked_over_unchecked']:.3f}); the batch check "
            f"{r['batch_check_seconds'] * 1e6:.0f} us "
            f"({r['batch_check_fraction_of_iteration']:.2%} of an iteration)"
        )
    path = save(
        "health_cost",
        {"args": vars(args), "torch_threads": torch.get_num_threads(), **results},
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
