"""Atari training throughput against the compute bound of its networks.

    python bench/throughput.py [--game ALE/Breakout-v5] [--batches 12] [--repeats 3]
                               [--device cpu] [--prefill 3]

Measures, in one run:

- the full training loop (``examples/acer_atari.py``'s pieces: 16 envs, T = 20,
  replay ratio 4 with the frame-lean replay already past its start, RMSProp,
  grad clipping, averaged policy): agent steps per second over ``--batches``
  collected batches;
- the compute bound for the same networks and batch shapes: per collected batch
  of 16 x 20 steps, 20 policy inferences on 16 observations, plus, for each of
  the updates the loop made in the same window (1 + Poisson(4) per batch), one
  learner forward+backward of the shared trunk and both heads on [16, 21]
  observations and one averaged-policy forward on [16, 20], on bare modules;

and reports the ratio loop / bound (target: at least 0.7), medians over
``--repeats`` alternating repeats. Also reports where the loop's time goes.

Overlap: collecting in another process while learning would give the learner one
core instead of torch's two threads. The benchmark times the learner's update on
one thread too, and estimates the overlapped loop as the longer of (updates on one
thread) and (collection, the loop's time outside updates), against the serial
loop it measured: the choice between the two is made on these numbers.

``--device cuda`` puts the learner on the GPU (networks, loss, optimizer; the
collector's policy runs there too) while the environments stay on the CPU and the
replay in host memory (``examples/acer_atari.py``'s layout with ``device=cuda``):
batches move to the GPU for each update. The compute bound then times the bare
modules on the GPU, and every timer waits for the GPU's queued work
(``torch.cuda.synchronize``). Results are saved as ``throughput_cuda-*.json``,
apart from the CPU ones that ``bench/report.py`` reads.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "examples"))
from _common import (  # noqa: E402
    UpdateTimer,
    bare_trainer,
    close,
    example_config,
    per_round_ratios,
    save,
    start,
    train_on_batch,
    updates,
)
from utils_atari import TRAINING_KEYS, make_env, make_models  # noqa: E402

from torchrl_acer.trainers import ACERTrainer  # noqa: E402
from torchrl_acer.training.experiment import (  # noqa: E402
    make_collector,
    make_loss,
    make_optimizer,
)
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer  # noqa: E402


def make_trainer(game, num_envs, T, device="cpu", check_health=None) -> ACERTrainer:
    """``examples/acer_atari.py``'s pieces with its config, without evaluation,
    logging or checkpoints (``_common.bare_trainer``), and with replay that starts
    at once; ``check_health`` replaces the config's ``health.check``."""
    device = torch.device(device)
    cfg = example_config("config_atari")
    OmegaConf.update(cfg, "env.name", game)
    torch.manual_seed(cfg.seed)
    env = make_env(cfg, num_envs, seed=cfg.seed)
    actor, critic = make_models(env)
    actor, critic = actor.to(device), critic.to(device)
    loss = make_loss(cfg.loss, actor, critic)
    loss.set_keys(**TRAINING_KEYS)
    OmegaConf.update(cfg, "env.num_envs", num_envs)
    OmegaConf.update(cfg, "collector.T", T)
    # on a GPU the policy runs there and batches come back to host memory
    collector = make_collector(
        cfg, functools.partial(make_env, cfg), actor, device=device, env=env
    )
    OmegaConf.update(cfg, "replay.start", 0)
    if check_health is not None:
        OmegaConf.update(cfg, "health.check", check_health)
    return bare_trainer(
        cfg,
        collector=collector,
        loss=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        replay=FrameStackReplayBuffer(num_envs, 50 * T, T, num_envs),
    )


def no_sync():
    pass


def time_loop(trainer, iterator, batches, sync=no_sync):
    """Agent steps per second of the whole loop, and the time inside updates (the
    trainer's optimization stepper and ``post_optim`` hooks: ``UpdateTimer``).

    On a GPU, ``sync`` waits for the queued work at the edges of each update, so
    that its time is counted there rather than in what follows it."""
    frames, before = trainer.collected_frames, updates(trainer)
    with UpdateTimer(trainer, sync) as timer:
        sync()
        tick = time.perf_counter()
        for _ in range(batches):
            train_on_batch(trainer, next(iterator))
        sync()
        elapsed = time.perf_counter() - tick
    steps = trainer.collected_frames - frames
    return steps / elapsed, timer.seconds / elapsed, updates(trainer) - before, steps


def compute_bound(
    actor, critic, num_envs, T, updates, steps, repeats, device, sync=no_sync
):
    """Steps per second if the loop only ran its networks: one inference per
    vector step, and the loop's own number of updates on bare modules."""
    trunk = actor.module[0].module
    policy_head = actor.module[1].module
    q_head = critic.module[1].module
    avg_trunk, avg_head = copy.deepcopy(trunk), copy.deepcopy(policy_head)
    window = torch.randint(
        0, 256, (num_envs * (T + 1), 4, 84, 84), dtype=torch.uint8
    ).to(device)
    obs = window[: num_envs * T]
    step_obs = window[:num_envs]

    def update():
        hidden = trunk(window)
        (policy_head(hidden).sum() + q_head(hidden).sum()).backward()
        with torch.no_grad():
            avg_head(avg_trunk(obs))

    @torch.no_grad()
    def inference():
        policy_head(trunk(step_obs))

    def median_time(fn, n):
        fn()
        times = []
        for _ in range(n):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    t_update = median_time(update, repeats)
    t_infer = median_time(inference, 20)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t_update_one_thread = median_time(update, repeats)
    finally:
        torch.set_num_threads(threads)
    seconds = steps // num_envs * t_infer + updates * t_update
    return steps / seconds, {
        "update_s": t_update,
        "inference_s": t_infer,
        "update_one_thread_s": t_update_one_thread,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--game", default="ALE/Breakout-v5")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--T", type=int, default=20)
    parser.add_argument(
        "--device", default="cpu", help="the learner's: cpu, cuda or cuda:N"
    )
    parser.add_argument(
        "--prefill", type=int, default=3, help="batches collected before timing"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else no_sync
    trainer = make_trainer(args.game, args.envs, args.T, device)
    iterator = start(trainer)
    # fill some replay first, so that every batch makes its replayed updates
    for _ in range(args.prefill):
        train_on_batch(trainer, next(iterator))
    actor = trainer.loss_module.actor_network
    critic = trainer.loss_module.critic_network
    loops, bounds, update_shares, parts = [], [], [], []
    for _ in range(args.repeats):
        steps_per_s, update_share, updates, steps = time_loop(
            trainer, iterator, args.batches, sync
        )
        bound, part = compute_bound(
            actor, critic, args.envs, args.T, updates, steps, 5, device, sync
        )
        part["updates"] = updates
        # serial loop time, split; and the overlapped estimate
        loop_s = steps / steps_per_s
        collect_s = loop_s * (1 - update_share)
        overlapped_s = max(updates * part["update_one_thread_s"], collect_s)
        part["overlap_estimate_over_serial"] = overlapped_s / loop_s
        loops.append(steps_per_s)
        update_shares.append(update_share)
        bounds.append(bound)
        parts.append(part)
        print(
            f"loop {steps_per_s:.1f} agent steps/s, bound {bound:.1f}, "
            f"ratio {steps_per_s / bound:.2f}, time in updates {update_share:.0%}, "
            f"overlapped estimate / serial {part['overlap_estimate_over_serial']:.2f}"
        )
    close(trainer)
    ratios = per_round_ratios(loops, bounds)
    result = {
        "settings": vars(args)
        | {"replay_ratio": 4.0, "threads": torch.get_num_threads()},
        "loop_steps_per_s": loops,
        "bound_steps_per_s": bounds,
        "ratios": ratios["ratios"],
        "median_ratio": ratios["median"],
        "time_in_updates": update_shares,
        "bound_parts": parts,
    }
    name = "throughput" if device.type == "cpu" else f"throughput_{device.type}"
    path = save(name, result)
    print(f"median ratio loop / compute bound: {result['median_ratio']:.2f}")
    overlap = statistics.median(p["overlap_estimate_over_serial"] for p in parts)
    print(f"overlapped collection, estimated time / serial time: {overlap:.2f}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
