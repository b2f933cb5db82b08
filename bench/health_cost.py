"""Cost of the trainer's numerical health checks: the training loop with and
without them.

    python bench/health_cost.py [--rounds 7] [--cartpole-batches 20]
                                [--atari-batches 2] [--no-atari] [--threads N]

Two trainers are built alike from the same seed, one with ``check_health=True``
(the default: one reduction and one read-back per update over the loss terms and
the gradient norm, one over each collected batch, one over the observations the
policy acts on at each step) and one with
``check_health=False``. They draw the same Poisson numbers of replayed updates
(the trainer's own generator), so each round gives both the same work; rounds
alternate which goes first. Reported per loop: the median seconds per collected
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
from _common import example_config, interleaved_medians, save  # noqa: E402
from utils_gym import make_env, make_models  # noqa: E402

from torchrl_acer.training.experiment import (  # noqa: E402
    make_collector,
    make_loss,
    make_optimizer,
)
from torchrl_acer.training.trainer import (  # noqa: E402
    ACERTrainer,
    _batch_is_finite,
    make_segment_replay_buffer,
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
    return ACERTrainer(
        collector=collector,
        loss_module=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        total_frames=10**9,
        replay_buffer=make_segment_replay_buffer(
            cfg.replay.capacity, T, cfg.replay.batch_segments or num_envs
        ),
        replay_ratio=cfg.replay.ratio,
        replay_start=cfg.replay.start,
        target_eps=cfg.loss.alpha,
        max_grad_norm=cfg.optim.max_grad_norm,
        progress_bar=False,
        seed=cfg.seed,
        check_health=check_health,
    )


def atari_trainer(check_health: bool) -> ACERTrainer:
    from throughput import make_trainer

    trainer = make_trainer("ALE/Breakout-v5", 16, 20)
    trainer.check_health = check_health
    return trainer


def compare(build, rounds: int, batches: int, warmup: int) -> dict:
    trainers = {"checked": build(True), "unchecked": build(False)}
    # the trainer's own iteration: the policy's inputs are checked there
    iterators = {name: t._collected_batches() for name, t in trainers.items()}
    for name, trainer in trainers.items():
        for _ in range(warmup):
            trainer.train_on_batch(next(iterators[name]))
    seconds = {name: [] for name in trainers}
    updates = {name: 0 for name in trainers}
    for r in range(rounds):
        order = ["checked", "unchecked"] if r % 2 == 0 else ["unchecked", "checked"]
        for name in order:
            trainer = trainers[name]
            before = trainer.updates
            start = time.perf_counter()
            for _ in range(batches):
                trainer.train_on_batch(next(iterators[name]))
            seconds[name].append((time.perf_counter() - start) / batches)
            updates[name] += trainer.updates - before
    ratios = [
        c / u for c, u in zip(seconds["checked"], seconds["unchecked"], strict=True)
    ]
    for trainer in trainers.values():
        assert trainer.nonfinite_updates == trainer.nonfinite_batches == 0
    # the parts, less noisy: one replayed update with and without its check, and
    # the check of one collected batch
    trainer = trainers["checked"]
    replayed = trainer.replay_buffer.sample()
    fresh = next(iterators["checked"])
    keys = trainer.loss_module.in_keys
    step = fresh[..., 0]
    policy_keys = trainer.loss_module.actor_network.in_keys

    def update(check):
        def run():
            trainer.check_health = check
            trainer.update(replayed, tag="off_policy")

        return run

    parts = interleaved_medians(
        {
            "update_checked": update(True),
            "update_unchecked": update(False),
            "batch_check": lambda: _batch_is_finite(fresh.select(*keys, strict=False)),
            # what the policy's pre-hook checks at every environment step
            "policy_input_check": lambda: _batch_is_finite(
                step.select(*policy_keys, strict=False)
            ),
        },
        rounds=rounds,
    )
    for t in trainers.values():
        t.close()
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
        "policy_input_check_seconds": parts["policy_input_check"],
        # T checks per collected batch
        "policy_input_checks_fraction_of_iteration": parts["policy_input_check"]
        * fresh.shape[-1]
        / statistics.median(seconds["unchecked"]),
        "rounds": rounds,
        "batches_per_round": batches,
        "updates_timed": updates,  # equal: the same work on both sides
        "seconds_per_batch": {k: statistics.median(v) for k, v in seconds.items()},
        "seconds_per_batch_all": seconds,
        "ratio_checked_over_unchecked": statistics.median(ratios),
        "ratios": ratios,
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
