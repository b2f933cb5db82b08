"""Why MinAtar Seaquest stops near 5: how a trained policy's episodes end.

    python bench/seaquest_deaths.py bench/runs/minatar_seaquest/seed0 ...  # run dirs
    python bench/seaquest_deaths.py RUN_DIR --episodes 50 --policies greedy sample

In MinAtar's Seaquest (``minatar/environments/seaquest.py``) the submarine has 200
steps of oxygen. Shooting an enemy scores 1; rising to the surface with at least one
rescued diver refills the oxygen (and with six divers scores up to 10 more); rising
with none, running out of oxygen or touching an enemy or its bullet ends the game.
A policy that never surfaces is capped by what it can shoot in one tank of oxygen;
DQN's ~20 at 5M frames needs it to surface.

For each run directory's last checkpoint this plays ``--episodes`` episodes of
``MinAtar/Seaquest-v1`` (seeds ``10_000 + i``, as the evaluations do) with the
trained policy, greedy (the most probable action, as the evaluations) and sampled
(as in training), or uniformly random actions (``random``: what exploration starts
from), reading the game's own state after every step, and records per
episode: the return, the length, the surfacings that refilled the oxygen, the most
divers carried, and what ended it (``oxygen``: the tank ran out; ``hit``: an enemy,
an enemy sub or a bullet; ``surfaced_empty``: rose with no diver; ``limit``:
``--max-steps``). Writes ``bench/results/seaquest_deaths-<UTC stamp>.json`` with the
checkpoints' commits and frames, and prints a table.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import gymnasium as gym
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    checkpoint_path,
    git_commit,
    machine,
    read_checkpoint,
    save,
)
from utils_gym import make_env, make_models  # noqa: E402

from torchrl_acer.training.experiment import make_loss  # noqa: E402

MAX_OXYGEN = 200  # minatar.environments.seaquest.max_oxygen
NUM_ACTIONS = 6  # no-op, left, up, right, down, fire
EPISODE_SEED = 10_000  # episode i is seeded EPISODE_SEED + i, as the evaluations do


def load_policy(run_dir: Path):
    """The trained policy of ``run_dir``'s last checkpoint, as a function from one
    observation to the logits, and what the checkpoint says of itself: its run's
    config, the commit that wrote it and its frames (``header``)."""
    manifest, state = read_checkpoint(
        checkpoint_path(run_dir), "loss_module", "trainer_state"
    )
    header = {
        **manifest["metadata"]["torchrl_acer"],
        "frames": state["trainer_state"]["collected_frames"],
    }
    cfg = OmegaConf.create(header["config"])
    if cfg.env.name != "MinAtar/Seaquest-v1":
        raise ValueError(
            f"{run_dir}: trained on {cfg.env.name}, not MinAtar/Seaquest-v1"
        )
    env = make_env(cfg, 1, seed=0)  # only for the networks' shapes
    actor, critic = make_models(cfg, env)
    env.close()
    loss = make_loss(cfg.loss, actor, critic)
    loss.load_state_dict(state["loss_module"])
    params = loss.actor_network_params
    network = loss.actor_network

    @torch.no_grad()
    def logits(observation):
        with params.to_module(network):
            out = network(
                TensorDict(observation=torch.as_tensor(observation)[None]),
            )
        return out["logits"][0]

    return logits, header


def chooser(logits, policy: str, seed: int):
    """``observation -> action`` for ``policy`` (``greedy``, ``sample`` or ``random``)."""
    generator = torch.Generator().manual_seed(seed)
    if policy == "greedy":
        return lambda obs: int(logits(obs).argmax())
    if policy == "sample":
        return lambda obs: int(
            torch.multinomial(logits(obs).softmax(-1), 1, generator=generator)
        )
    if policy == "random":  # what exploration starts from
        return lambda obs: int(torch.randint(NUM_ACTIONS, (), generator=generator))
    raise ValueError(f"policy={policy!r}: expected greedy, sample or random")


def play(choose, episodes: int, max_steps: int, seed: int = EPISODE_SEED, **env_kwargs):
    """One record per episode of ``choose``'s actions (see the module's docstring);
    ``env_kwargs`` go to MinAtar's ``Environment`` (the tests turn off its sticky
    actions, on by default as in training: an action repeats the last with
    probability 0.1)."""
    from minatar.gym import register_envs

    register_envs()
    env = gym.make("MinAtar/Seaquest-v1", **env_kwargs)
    game = env.unwrapped.game.env  # the Seaquest Env: sub position, oxygen, divers
    records = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, steps, surfacings, most_divers, end = 0.0, 0, 0, 0, "limit"
        while steps < max_steps:
            action = choose(obs)
            oxygen_before = game.oxygen
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            steps += 1
            most_divers = max(most_divers, game.diver_count)
            if (
                game.sub_y == 0
                and game.oxygen == MAX_OXYGEN
                and oxygen_before < MAX_OXYGEN
            ):
                surfacings += 1
            if terminated:
                if game.oxygen <= 0:
                    end = "oxygen"
                elif game.sub_y == 0 and not game.surface:
                    end = "surfaced_empty"
                else:
                    end = "hit"
                break
            if truncated:
                end = "truncated"
                break
        records.append(
            {
                "return": total,
                "length": steps,
                "surfacings": surfacings,
                "most_divers": most_divers,
                "end": end,
            }
        )
    env.close()
    return records


def summarize(records):
    ends = collections.Counter(r["end"] for r in records)
    return {
        "episodes": len(records),
        "return_median": statistics.median(r["return"] for r in records),
        "return_mean": statistics.fmean(r["return"] for r in records),
        "length_median": statistics.median(r["length"] for r in records),
        "episodes_with_a_surfacing": sum(r["surfacings"] > 0 for r in records),
        "surfacings_mean": statistics.fmean(r["surfacings"] for r in records),
        "most_divers_median": statistics.median(r["most_divers"] for r in records),
        "ends": dict(ends),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument(
        "--policies",
        nargs="+",
        default=["greedy", "sample"],
        choices=["greedy", "sample", "random"],
    )
    parser.add_argument("--max-steps", type=int, default=10_000)
    args = parser.parse_args()
    torch.set_num_threads(1)

    runs = []
    for run_dir in args.run_dirs:
        logits, header = load_policy(run_dir)
        run = {
            "run_dir": str(run_dir),
            "checkpoint_commit": header.get("git_commit"),
            "frames": header.get("frames"),
            "seed": header["config"].get("seed"),
            "policies": {},
        }
        for policy in args.policies:
            choose = chooser(logits, policy, seed=EPISODE_SEED)
            records = play(choose, args.episodes, args.max_steps)
            summary = summarize(records)
            run["policies"][policy] = {"summary": summary, "episodes": records}
            print(
                f"{run_dir} seed {run['seed']} at {run['frames']} frames, {policy}: "
                f"return {summary['return_median']:g} (mean {summary['return_mean']:.2f}), "
                f"length {summary['length_median']:g}, "
                f"{summary['episodes_with_a_surfacing']}/{len(records)} episodes surfaced, "
                f"most divers {summary['most_divers_median']:g}, ends {summary['ends']}",
                flush=True,
            )
        runs.append(run)
    path = save(
        "seaquest_deaths",
        {
            "commit": git_commit(),
            "machine": machine(),
            "settings": {
                "episodes": args.episodes,
                "policies": args.policies,
                "max_steps": args.max_steps,
                "episode_seeds": f"{EPISODE_SEED}..{EPISODE_SEED + args.episodes - 1}",
            },
            "runs": runs,
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
