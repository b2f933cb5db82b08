"""Stacked random frames as an Atari env gives them, collected as a collector does,
and the check that a frame replay rebuilds what was collected (``test_frame_replay.py``,
``test_atari.py``, ``test_resume.py``)."""

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers import FrameStackObservation
from torchrl.envs import GymWrapper


class RandomFrames(gym.Env):
    """Random 84x84 uint8 frames; episodes end at random (terminated) or after
    ``limit`` steps (truncated). Every frame is distinct, so a wrong frame in a
    rebuilt stack cannot go unnoticed."""

    observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, p_end=0.08, limit=13):
        self.p_end, self.limit = p_end, limit

    def _frame(self):
        return self.np_random.integers(0, 256, (84, 84), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < self.p_end)
        truncated = self.t >= self.limit and not terminated
        return self._frame(), 1.0, terminated, truncated, {}


GYM_PADDING = {"first": "reset", "zeros": "zero"}


def make_stacked_env(num_envs, seed=0, padding="first"):
    def make():
        return FrameStackObservation(
            RandomFrames(), 4, padding_type=GYM_PADDING[padding]
        )

    env = GymWrapper(
        gym.vector.SyncVectorEnv(
            [make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    env.set_seed(seed)
    return env


def collect(env, T, num_batches):
    """Consecutive [num_envs, T] batches of random actions, like a collector's."""
    batches = []
    td = env.reset()
    for _ in range(num_batches):
        steps = []
        for _ in range(T):
            td = env.rand_action(td)
            out, td = env.step_and_maybe_reset(td)
            steps.append(out.clone())
        batches.append(torch.stack(steps, 1))
    return batches


def tag_worker(batches, worker):
    """``batches`` as worker ``worker``'s, as ``make_collector``'s environments
    tag every step."""
    for batch in batches:
        batch.set("worker_index", torch.full(batch.shape, worker))
    return batches


def assert_rebuilt_as_collected(rb, batches):
    """Every segment ``rb`` can sample equals the one its environment produced,
    in every entry it stores and in its rebuilt frame stacks; ``batches[w][i]``
    is the ``i``-th batch ``rb`` stored from worker ``w``. Returns how many
    segments it compared."""
    slot, row = rb._sampleable().unbind(1)
    got = rb.get_segments(row, slot)
    worker, env = row // rb.num_envs, row % rb.num_envs
    assert rb.pixels_key in got.keys() and ("next", rb.pixels_key) in got.keys(True)
    for i in range(len(row)):
        w = int(worker[i])
        original = batches[w][int(rb._slot_id[w, slot[i]])][int(env[i])]
        for key in got.keys(True, True):
            assert torch.equal(got[i][key], original[key]), (key, w, int(env[i]))
    return len(row)
