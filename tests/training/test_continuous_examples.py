"""Continuous ACER in the application: the MuJoCo example (Pendulum fully off-policy,
HalfCheetah) and float64 observations reaching the networks as float32."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from builders import run_example

from torchrl_acer.modules.models import gaussian_actor_sdn
from torchrl_acer.training.envs import make_env


def run_small_mujoco_example(tmp_path, *overrides):
    """``examples/acer_mujoco.py`` on 2 envs, 10-step segments and tiny networks."""
    return run_example(
        "acer_mujoco.py",
        "env.num_envs=2",
        "collector.T=10",
        "replay.start=100",
        "replay.batch_segments=2",
        "model.num_cells=[16]",
        "logger.progress_bar=false",
        f"logger.run_dir={tmp_path / 'run'}",
        *overrides,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("dueling", ["true", "false"], ids=["sdn", "plain_q"])
def test_pendulum_example_trains_fully_off_policy(tmp_path, dueling):
    out = run_small_mujoco_example(
        tmp_path,
        "env.name=Pendulum-v1",
        f"model.dueling={dueling}",
        "collector.total_frames=400",
        "model.fixed_scale=null",
        "eval.interval=200",
        "eval.episodes=2",
        "eval.max_steps=50",
        "logger.log_interval=100",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final greedy evaluation (2 episodes) after 400 env steps" in out.stdout
    rows = tmp_path / "run" / "logs" / "scalars" / "train" / "on_policy_updates.csv"
    # fully off-policy: no on-policy update, only replayed ones once replay started
    header, *rows = rows.read_text().split()  # step,value: the examples' header
    assert header == "step,value"
    assert all(float(r.split(",")[1]) == 0 for r in rows)
    off = tmp_path / "run" / "logs" / "scalars" / "train" / "off_policy_updates.csv"
    assert sum(float(r.split(",")[1]) for r in off.read_text().split()[1:]) > 0


class _Float64Observations(gym.Env):
    """A Box task observing in float64, as MuJoCo's do."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 3), {}

    def step(self, action):
        return self.np_random.uniform(-1, 1, 3), float(action.sum()), False, False, {}


def test_float64_observations_reach_the_networks_as_float32():
    if "Float64Obs-v0" not in gym.registry:
        gym.register("Float64Obs-v0", entry_point=_Float64Observations)
    env = make_env("Float64Obs-v0", num_envs=2, seed=0)
    assert env.observation_spec["observation"].dtype == torch.float32
    actor, critic = gaussian_actor_sdn(3, 2, num_cells=[8])
    td = env.rollout(4, actor)
    assert td["observation"].dtype == td["next", "observation"].dtype == torch.float32
    assert critic(td)["action_value"].shape == (2, 4, 1)


def test_halfcheetah_example_runs(tmp_path):
    pytest.importorskip("mujoco")
    out = run_small_mujoco_example(
        tmp_path, "collector.total_frames=200", "eval.episodes=1", "eval.max_steps=20"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final greedy evaluation (1 episodes) after 200 env steps" in out.stdout
