"""A peer on issue #18's partially observed task: sb3-contrib's RecurrentPPO with the
RL Zoo's hyperparameters for CartPoleNoVel-v1, on CartPole-v1 observing the cart
position and the pole angle only, evaluated as ``bench/run_learning.sh
cartpole_pomdp`` evaluates ACER (greedy, mean of 5 episodes every 5k env steps).

Runs in the peers' venv (``bash bench/peers_setup.sh``), never the project's:

    .venv-bench/bin/python bench/recurrent_peer.py --seeds 0 1 2 3 4

The zoo's settings: 8 envs, 32 steps each per update, 20 epochs of minibatches of
256, gamma 0.98, GAE lambda 0.8, no entropy bonus, learning rate and clip range
decaying linearly from 1e-3 and 0.2, an LSTM of 64 units for the policy and another
for the critic, ReLU heads of 64, and ``VecNormalize`` (observations and rewards;
the evaluation normalizes observations with the training statistics and counts the
task's unscaled rewards).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import save  # noqa: E402

VISIBLE = [0, 2]  # cart position, pole angle


class Visible(gym.ObservationWrapper):
    """The entries ``VISIBLE`` of CartPole's observation (as ``env.observation_indices``)."""

    def __init__(self, env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            space.low[VISIBLE], space.high[VISIBLE], dtype=np.float32
        )

    def observation(self, observation):
        return observation[VISIBLE]


def greedy_return(model, normalizer, seed: int, episodes: int) -> float:
    """Mean return of ``episodes`` greedy episodes, the LSTM state carried along."""
    env = Visible(gym.make("CartPole-v1"))
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        state, start, total, done = None, np.ones(1, dtype=bool), 0.0, False
        while not done:
            action, state = model.predict(
                normalizer.normalize_obs(obs[None]),
                state=state,
                episode_start=start,
                deterministic=True,
            )
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total += reward
            done = terminated or truncated
            start = np.zeros(1, dtype=bool)
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def run_seed(seed: int, total_steps: int, interval: int, episodes: int) -> dict:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    envs = VecNormalize(
        make_vec_env("CartPole-v1", n_envs=8, seed=seed, wrapper_class=Visible),
        gamma=0.98,
    )

    class Evaluate(BaseCallback):
        def __init__(self):
            super().__init__()
            self.curve, self.next = [], interval

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                self.next += interval
                score = greedy_return(self.model, envs, 10_000 + seed, episodes)
                self.curve.append((self.num_timesteps, score))
            return True

    def linear(start):
        return lambda remaining: remaining * start

    model = RecurrentPPO(
        "MlpLstmPolicy",
        envs,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        policy_kwargs={
            "ortho_init": False,
            "activation_fn": torch.nn.ReLU,
            "lstm_hidden_size": 64,
            "enable_critic_lstm": True,
            "net_arch": {"pi": [64], "vf": [64]},
        },
    )
    evaluate = Evaluate()
    start = time.time()
    model.learn(total_steps, callback=evaluate)
    return {"seed": seed, "curve": evaluate.curve, "wall_s": time.time() - start}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--total-steps", type=int, default=100_000)
    parser.add_argument("--interval", type=int, default=5_000)
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=475.0)
    args = parser.parse_args()
    runs = [
        run_seed(s, args.total_steps, args.interval, args.episodes) for s in args.seeds
    ]
    to_threshold = [
        next((step for step, r in run["curve"] if r >= args.threshold), None)
        for run in runs
    ]
    finals = [run["curve"][-1][1] for run in runs]
    import sb3_contrib
    import stable_baselines3

    result = {
        "peer": f"sb3-contrib {sb3_contrib.__version__} RecurrentPPO (RL Zoo "
        "hyperparameters for CartPoleNoVel-v1), stable-baselines3 "
        f"{stable_baselines3.__version__}, torch on 1 thread",
        "protocol": "CartPole-v1 observing cart position and pole angle only "
        f"(entries 0, 2), {args.total_steps} env steps, greedy eval mean of "
        f"{args.episodes} episodes every {args.interval} env steps",
        "threshold": args.threshold,
        "seeds": args.seeds,
        "steps_to_threshold": to_threshold,
        "final_eval": {
            "median": statistics.median(finals),
            "min": min(finals),
            "max": max(finals),
        },
        "runs": runs,
    }
    path = save("recurrent_peer", result)
    print(json.dumps({k: result[k] for k in ("steps_to_threshold", "final_eval")}))
    print(path)


if __name__ == "__main__":
    main()
