"""Environment builders for the examples: gymnasium vector tasks and MinAtar."""

from __future__ import annotations

import difflib
import os
import signal

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    RewardSum,
    TransformedEnv,
)
from torchrl.envs.transforms import VecGymEnvTransform

from torchrl_acer.training.cue_recall import ENV_ID as CUE_RECALL
from torchrl_acer.training.cue_recall import register as register_cue_recall
from torchrl_acer.training.refusal import ConfigError

__all__ = [
    "SelectObservation",
    "check_env_id",
    "check_spaces",
    "check_vector_observation",
    "forget_saved_step",
    "is_minatar",
    "make_env",
    "reset_every_copy",
]


def is_minatar(env_id: str) -> bool:
    return env_id.startswith("MinAtar/")


def check_env_id(env_id: str) -> None:
    """Raises ``ValueError`` naming ``env_id`` if gymnasium does not know it."""
    if is_minatar(env_id):
        try:
            from minatar.gym import register_envs
        except ImportError as err:
            raise ConfigError(
                f"env.name={env_id!r} needs MinAtar: pip install minatar "
                f"(or the 'examples' extra)"
            ) from err
        if env_id not in gym.registry:
            register_envs()
    if env_id == CUE_RECALL:
        register_cue_recall()
    if env_id.startswith("ALE/"):
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError as err:
            raise ConfigError(
                f"env.name={env_id!r} needs ale-py: install the 'atari' extra"
            ) from err
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise ConfigError(f"env.name={env_id!r} is not a registered gymnasium id{hint}")


# the example that trains each kind of action space, for the refusal messages
_EXAMPLE_FOR = {
    "discrete": "examples/acer_gym.py",
    "continuous": "examples/acer_mujoco.py",
}


def check_spaces(
    env: gym.Env,
    env_id: str,
    action_space: str | None = None,
    *,
    observation: bool = True,
) -> None:
    """Refuses, naming the space, what the networks and the loss cannot take.

    Observations must be a ``Box`` (vectors, or MinAtar's and Atari's grids);
    ``action_space`` (``"discrete"`` or ``"continuous"``), when given, is the kind
    of actions the caller's networks produce.
    """
    obs = env.observation_space
    if observation and not isinstance(obs, gym.spaces.Box):
        raise ConfigError(
            f"env.name={env_id!r} has the observation space {obs}; ACER's networks "
            f"here take Box observations (vectors or image grids). Flatten or "
            f"one-hot it with a gymnasium wrapper (e.g. FlattenObservation) first"
        )
    if action_space is None:
        return
    if action_space not in _EXAMPLE_FOR:
        raise ValueError(
            f"action_space must be 'discrete' or 'continuous', got {action_space!r}"
        )
    act = env.action_space
    kind = (
        "discrete"
        if isinstance(act, gym.spaces.Discrete)
        else "continuous"
        if isinstance(act, gym.spaces.Box)
        else None
    )
    if kind != action_space:
        hint = f"; train it with {_EXAMPLE_FOR[kind]}" if kind else ""
        raise ConfigError(
            f"env.name={env_id!r} has the action space {act}, but this example "
            f"trains a {action_space} policy{hint}"
        )


def check_vector_observation(env: EnvBase, env_id: str, *, takes: str) -> None:
    """Refuses, naming ``env_id``, the observation's shape and dtype and what the
    caller's networks take (``takes``), an ``"observation"`` that is not a float
    vector per copy: an MLP given images (an Atari game) or integer vectors (its
    RAM) would fail at its first step, inside the collector."""
    spec = env.observation_spec["observation"]
    shape = tuple(spec.shape[env.batch_dims :])
    if len(shape) != 1 or not spec.dtype.is_floating_point:
        dtype = str(spec.dtype).removeprefix("torch.")
        raise ConfigError(
            f"env.name={env_id!r} observes {dtype} arrays of shape {shape}; {takes}"
        )


class SelectObservation(gym.ObservationWrapper):
    """Keeps the entries ``indices`` of a vector observation: a partially observed
    task, such as CartPole's cart position and pole angle without their
    velocities (``indices=[0, 2]``)."""

    def __init__(self, env: gym.Env, indices):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ConfigError(
                f"env.observation_indices needs a vector observation (a Box of one "
                f"dimension), got {space}"
            )
        indices = np.asarray(list(indices), dtype=np.int64)
        n = space.shape[0]
        if (
            indices.ndim != 1
            or not len(indices)
            or len(set(indices.tolist())) != len(indices)
            or ((indices < 0) | (indices >= n)).any()
        ):
            raise ConfigError(
                f"env.observation_indices must be distinct entries of the "
                f"{n}-entry observation (0 to {n - 1}), got {indices.tolist()}"
            )
        self.indices = indices
        self.observation_space = gym.spaces.Box(
            space.low[indices], space.high[indices], dtype=space.dtype
        )

    def observation(self, observation):
        return observation[..., self.indices]


def env_transforms(env: EnvBase) -> tuple[EnvBase, list]:
    """The env under ``env``'s ``TransformedEnv`` layers, and their transforms in
    the order they apply to a step's output (innermost first).

    A layer holds a ``Compose`` or one transform alone (``GymWrapper``'s own, a
    user's ``TransformedEnv(env, RewardSum())``). No attribute is looked up on
    other envs: a ``SerialEnv``'s lookups go to copies it may not have built.
    """
    layers = []
    while isinstance(env, TransformedEnv):
        transform = env.transform
        layers.append(
            list(transform) if isinstance(transform, Compose) else [transform]
        )
        env = env.base_env
    return env, [t for layer in reversed(layers) for t in layer]


def forget_saved_step(env: EnvBase) -> None:
    """Makes the next bare ``env.reset()`` of ``env`` return the new episodes' first
    observations.

    With TorchRL 0.14, a bare ``env.reset()`` of a gymnasium vector env (one that
    resets finished copies within the step) after a step where some but not all
    copies ended resets every copy, yet its ``VecGymEnvTransform`` returns the
    observations it saved at that step, those of the episodes that were running
    (``upstream/torchrl/0002-*.patch`` fixes it in TorchRL: the transform forgets
    them on a full reset). This does what the fix does, before a reset. (A reset
    mask over every copy is no way round: the transform fails on one before the
    env's first step.) Other envs are left alone.
    """
    for transform in env_transforms(env)[1]:
        if isinstance(transform, VecGymEnvTransform):
            transform._memo.clear()


def reset_every_copy(env: EnvBase) -> TensorDictBase:
    """``env.reset()``, returning the first observations of the new episodes in
    every copy (see :func:`forget_saved_step`)."""
    forget_saved_step(env)
    return env.reset()


def make_env(
    env_id: str,
    *,
    num_envs: int = 1,
    parallel: bool = False,
    seed: int | None = None,
    max_episode_steps: int | None = None,
    wrappers=(),
    action_space: str | None = None,
) -> EnvBase:
    """``num_envs`` copies of a gymnasium task as one batched TorchRL env, with the
    return of each episode under ``("next", "episode_reward")``.

    The copies run in a gymnasium vector env (in this process, or one process each
    if ``parallel``) that resets finished copies within the step that ended them, so
    ``("next", obs)`` holds the real last observation of an episode and the next
    row starts the new one. One TorchRL step for all copies costs far less than
    TorchRL's per-env ``SerialEnv`` (2.6x the frames per second on CartPole).
    Float64 observations (MuJoCo's) are cast to float32.

    Args:
        wrappers: gymnasium wrappers (callables ``env -> env``) applied to each copy.
        action_space: ``"discrete"`` or ``"continuous"``: the kind of actions the
            caller's policy produces; another kind is refused with a message naming
            the example that trains it. Observation spaces other than ``Box`` are
            always refused, naming the space.
    """
    check_env_id(env_id)
    if num_envs < 1:
        raise ConfigError(f"env.num_envs must be at least 1, got {num_envs}")

    def make_one(check=False):
        check_env_id(env_id)  # registers MinAtar/ALE ids in worker processes too
        # None: the task's own time limit, as gymnasium reads it
        env = gym.make(env_id, max_episode_steps=max_episode_steps)
        if check:  # the task's own actions, before a wrapper assumes their kind
            check_spaces(env, env_id, action_space, observation=False)
        for wrapper in wrappers:
            env = wrapper(env)
        if check:  # the observations the networks will see, after the wrappers
            check_spaces(env, env_id)
        return env

    # one copy, built and closed here, so that an unsupported space fails with its
    # name before the vector env and TorchRL's specs are built around it
    make_one(check=True).close()

    if parallel:
        main_pid = os.getpid()

        def make_one_in_worker():
            # The worker processes share the terminal's process group, so Ctrl-C
            # reaches them too: one that died of it broke the pipe the trainer
            # closes it through (a BrokenPipeError instead of the resume hint).
            # They ignore it; this process stops them. AsyncVectorEnv also calls
            # this here, for the spaces, where Ctrl-C must keep working.
            if os.getpid() != main_pid:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            return make_one()

        vector, make_copy = gym.vector.AsyncVectorEnv, make_one_in_worker
    else:
        vector, make_copy = gym.vector.SyncVectorEnv, make_one
    # device="cpu": GymWrapper's default, None, leaves a collector with its
    # policy on a GPU nothing to bring the actions back to (the env then
    # steps and resets with CUDA tensors in its input and fails)
    env = GymWrapper(
        vector(
            [make_copy] * num_envs,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        ),
        device="cpu",
    )
    if any(
        spec.dtype == torch.float64 for spec in env.observation_spec.values(True, True)
    ):
        # MuJoCo observes in float64; the networks (and the replay) use float32
        env = env.append_transform(DoubleToFloat())
    # RewardSum writes ("next", "episode_reward"): the return of each episode
    env = env.append_transform(RewardSum())
    if seed is not None:
        env.set_seed(seed)
    return env
