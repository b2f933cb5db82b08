"""Memory of the Atari replay: frame-lean storage against naive stacked storage.

    python bench/memory.py [--envs 16] [--steps-per-env 50000]

Builds the default replay of ``examples/acer_atari.py`` (16 envs x 50 000 steps,
T = 20), fills it completely with batches shaped like the real collector's
(``ALE/Breakout-v5``: 4x84x84 uint8 stacks and every other entry the collector
stores), and reports the bytes per stored step (the buffer's tensors), the growth
of the process's resident memory, and what storing both stacks of every step
would take (uint8, and float32 as some ports do).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import save  # noqa: E402

from torchrl_acer.training.frame_replay import FrameStackReplayBuffer  # noqa: E402


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def template_batch(num_envs, T):
    """One real [num_envs, T] collector batch of Breakout."""
    from torchrl.collectors import Collector

    from torchrl_acer.modules.models import atari_actor_critic
    from torchrl_acer.training.atari import make_atari_env

    env = make_atari_env("ALE/Breakout-v5", num_envs=num_envs, seed=0)
    actor, _ = atari_actor_critic(
        env.action_spec.shape[-1], action_spec=env.action_spec[0]
    )
    collector = Collector(
        env,
        actor,
        frames_per_batch=num_envs * T,
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    batch = next(iter(collector))
    collector.shutdown()
    # the collected batch without the policy's intermediate outputs, as the old
    # trainer stored it. ACERTrainer (trainers/acer.py) stores less still: only
    # what the loss reads and the replay's own keys (replay_keys), so the bytes
    # per step measured here are an upper bound of its replay's
    return batch.exclude("hidden")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps-per-env", type=int, default=50_000)
    parser.add_argument("--T", type=int, default=20)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    N, T = args.envs, args.T
    batch = template_batch(N, T)
    rb = FrameStackReplayBuffer(N, args.steps_per_env, T, N)
    before = rss_bytes()
    # consecutive batches: each continues the previous one's frames
    for i in range(rb.slots + 2):
        b = batch.clone()
        b["pixels"] = torch.roll(batch["pixels"], shifts=i, dims=-1)
        b["next", "pixels"] = torch.roll(batch["next", "pixels"], shifts=i, dims=-1)
        b["pixels"][:, 0, :-1] = 0  # each first stack starts an episode
        rb.extend(b)
    after = rss_bytes()
    steps = rb.slots * N * T
    stored = N * args.steps_per_env
    frame = 84 * 84
    pixels = batch["pixels"]
    other = batch.exclude("pixels", ("next", "pixels"))
    other_bytes = sum(t.numel() * t.element_size() for t in other.values(True, True))
    result = {
        "settings": {"envs": N, "steps_per_env": args.steps_per_env, "T": T},
        "frame_shape": list(pixels.shape[-3:]),
        "bytes_per_step": rb.nbytes() / steps,
        "of_which_other_entries": other_bytes / (N * T),
        "replay_tensor_bytes": rb.nbytes(),
        "rss_growth_bytes": after - before,
        "stored_steps": stored,
        "naive_uint8_bytes_per_step": 2 * pixels.shape[-3] * frame
        + other_bytes / (N * T),
        "naive_float32_bytes_per_step": 2 * pixels.shape[-3] * frame * 4
        + other_bytes / (N * T),
    }
    result["naive_uint8_total_bytes"] = result["naive_uint8_bytes_per_step"] * stored
    result["naive_float32_total_bytes"] = (
        result["naive_float32_bytes_per_step"] * stored
    )
    path = save("memory", result)
    gb = 1e9
    print(
        f"bytes per stored step: {result['bytes_per_step']:.0f} "
        f"(frame {frame}, other entries {result['of_which_other_entries']:.0f})"
    )
    print(
        f"default replay ({N} envs x {args.steps_per_env} steps): "
        f"{rb.nbytes() / gb:.2f} GB of tensors, resident memory grew "
        f"{(after - before) / gb:.2f} GB"
    )
    print(
        f"naive storage of both stacks: {result['naive_uint8_total_bytes'] / gb:.1f} GB "
        f"as uint8, {result['naive_float32_total_bytes'] / gb:.1f} GB as float32"
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
