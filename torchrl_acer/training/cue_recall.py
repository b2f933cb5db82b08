"""A memory task for recurrent policies: recall a cue seen ``delay`` steps earlier.

``CueRecall-v0`` (registered by :func:`register`, which
:func:`~torchrl_acer.training.envs.check_env_id` calls for that id). An episode
lasts ``delay + 1`` steps. The first observation shows a cue, ``+1`` or ``-1``
with equal probability; the following ``delay - 1`` observations show nothing;
the last one flags the decision. The action at the decision step earns ``+1`` if
it names the cue (action 1 for ``+1``, action 0 for ``-1``) and ``-1`` otherwise;
the actions before it earn nothing and change nothing. A policy without memory
returns 0 on average, one that remembers the cue returns 1.

Observation: ``[cue, decision]``, the cue on the first step and 0 after it, the
decision flag 1 on the last step and 0 before it.

Why it exists: on velocity-less CartPole two consecutive observations suffice, so
how a replayed segment's recurrent state starts hardly matters. Here, with the
collector's segments of ``T`` steps and ``delay < T``, a segment that holds the
decision but not its cue (started inside the episode) can only be learned from
with a state that carries the cue: the stored state, or a burn-in over the cue.
A replay from a zero state sees no cue there. Learning to *store* the cue, on the
other hand, takes a segment holding both the cue and its decision in its loss
steps (no gradient crosses a segment's start or its burn-in): with ``delay`` 15
and ``T`` 20, segments starting at the episode's first 5 steps; none after a
burn-in of 5.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "CueRecall-v0"

__all__ = ["ENV_ID", "CueRecallEnv", "register"]


class CueRecallEnv(gym.Env):
    """Recall the sign of the first observation ``delay`` steps later (module
    docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 15):
        if int(delay) != delay or delay < 1:
            raise ValueError(f"CueRecall: delay must be an integer >= 1, got {delay}")
        self.delay = int(delay)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 0.0
        self._t = 0

    def _observation(self) -> np.ndarray:
        cue = self._cue if self._t == 0 else 0.0
        decision = 1.0 if self._t == self.delay else 0.0
        return np.array([cue, decision], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cue = 1.0 if self.np_random.random() < 0.5 else -1.0
        self._t = 0
        return self._observation(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"CueRecall: action must be 0 or 1, got {action!r}")
        if self._t == self.delay:
            named = 1.0 if int(action) == 1 else -1.0
            reward = 1.0 if named == self._cue else -1.0
            self._t += 1
            return np.zeros(2, np.float32), reward, True, False, {}
        self._t += 1
        return self._observation(), 0.0, False, False, {}


def register() -> None:
    """Registers :data:`ENV_ID` with gymnasium (once)."""
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=CueRecallEnv)
