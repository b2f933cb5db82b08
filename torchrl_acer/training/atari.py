"""Atari environments with the DeepMind preprocessing, for ACER.

The games run in the ALE's own vector environment (``ale_py.vector_env``, C++,
one process), which implements the standard DeepMind preprocessing: up to 30
no-op starts, frame skip 4 with the max over the last two frames, 84x84
grayscale, a stack of the last 4 frames (blank frames before an episode's first),
FIRE after reset for games that wait for it, and the 108 000-frame time limit
(a truncation). Sticky actions (``repeat_action_probability``) default to 0, the
DQN / OpenAI-baselines protocol behind the published ACER numbers (Machado et
al. recommend 0.25, the ``-v5`` default; pass it to compare with that protocol).

On top, in TorchRL: the frames under ``"pixels"``, the game score (the raw return
of each game) under ``("next", "episode_reward")``, and the training targets of
:class:`AtariTrainingSignals`: rewards clipped to their sign, and the loss of a
life as the end of a training episode (``train_done`` / ``train_terminated``).
Games reset at game over only, so evaluation and ``episode_reward`` see real games.
"""

from __future__ import annotations

import re

import torch
from tensordict import TensorDictBase
from torchrl.data import Binary, Unbounded
from torchrl.envs import EnvBase, GymWrapper, RenameTransform, RewardSum, Transform

from torchrl_acer.training.envs import check_env_id
from torchrl_acer.training.refusal import ConfigError

__all__ = ["AtariTrainingSignals", "ale_game_name", "make_atari_env"]


class AtariTrainingSignals(Transform):
    """What the loss trains on, beside what the environment reports.

    Writes under ``"next"``:

    - ``reward_clipped``: the reward's sign;
    - ``train_terminated``: ``terminated``, or a life lost (DeepMind's
      end-of-life signal: the value after a lost life is not bootstrapped);
    - ``train_done``: ``done`` or a life lost.

    Lives are read from the ``"lives"`` entry the ALE reports; the game itself goes
    on after a lost life.
    """

    def __init__(self):
        super().__init__(in_keys=["lives"], out_keys=[])

    def _step(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase
    ) -> TensorDictBase:
        reward = next_tensordict.get("reward")
        done = next_tensordict.get("done")
        terminated = next_tensordict.get("terminated")
        lives = tensordict.get("lives", None)
        next_lives = next_tensordict.get("lives", None)
        if lives is None or next_lives is None:
            life_lost = torch.zeros_like(done)
        else:
            life_lost = (next_lives < lives).reshape(done.shape) & ~done
        next_tensordict.set("reward_clipped", reward.sign())
        next_tensordict.set("train_terminated", terminated | life_lost)
        next_tensordict.set("train_done", done | life_lost)
        return next_tensordict

    def _reset(self, tensordict, tensordict_reset):
        done = tensordict_reset.get("done")
        for key in ("train_done", "train_terminated"):
            tensordict_reset.set(key, torch.zeros_like(done))
        return tensordict_reset

    def transform_reward_spec(self, reward_spec):
        spec = reward_spec["reward"]
        reward_spec["reward_clipped"] = Unbounded(
            shape=spec.shape, device=spec.device, dtype=spec.dtype
        )
        return reward_spec

    def transform_done_spec(self, done_spec):
        spec = done_spec["done"]
        for key in ("train_done", "train_terminated"):
            done_spec[key] = Binary(
                n=1, shape=spec.shape, device=spec.device, dtype=torch.bool
            )
        return done_spec


def ale_game_name(env_id: str) -> str:
    """``"ALE/SpaceInvaders-v5"`` -> ``"space_invaders"`` (the ALE's ROM name)."""
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", env_id)
    if match is None:
        raise ConfigError(f"env.name={env_id!r} is not an ALE/<Game>-v5 id")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()


class _ALEWrapper(GymWrapper):
    """``GymWrapper`` whose seeds fit the ALE's: it seeds its games with C ``int``
    (game ``i`` with ``seed + i``) and refuses larger ones, while TorchRL draws each
    collector worker's seed up to ``2**32 - 1`` (``seed_generator``)."""

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            seed %= 2**31 - self.batch_size.numel()
        super()._set_seed(seed)


def make_atari_env(
    env_id: str = "ALE/Pong-v5",
    *,
    num_envs: int = 1,
    seed: int | None = None,
    repeat_action_probability: float = 0.0,
    noop_max: int = 30,
    frame_skip: int = 4,
    frame_stack: int = 4,
    max_episode_steps: int | None = None,
    num_threads: int = 1,
    training_signals: bool = True,
) -> EnvBase:
    """A batch of ``num_envs`` preprocessed Atari games, as one TorchRL env.

    Args:
        max_episode_steps: agent steps per game before truncation; ``None`` keeps
            the 108 000-frame limit (27 000 agent steps at frame skip 4).
        num_threads: threads the ALE steps the games with.
        training_signals: add :class:`AtariTrainingSignals`.
    """
    game = ale_game_name(env_id)
    check_env_id(env_id)
    from ale_py.vector_env import AtariVectorEnv

    max_frames = (
        108_000 if max_episode_steps is None else max_episode_steps * frame_skip
    )
    try:
        vector = AtariVectorEnv(
            game,
            num_envs,
            num_threads=num_threads,
            max_num_frames_per_episode=max_frames,
            repeat_action_probability=repeat_action_probability,
            noop_max=noop_max,
            frameskip=frame_skip,
            stack_num=frame_stack,
            img_height=84,
            img_width=84,
            grayscale=True,
            maxpool=True,
            reward_clipping=False,  # clipped in AtariTrainingSignals, scores kept raw
            episodic_life=False,  # lives end training episodes, not games
            use_fire_reset=True,
            autoreset_mode="SameStep",
        )
    except Exception as err:  # the ALE says which ROM it lacks
        raise ConfigError(
            f"env.name={env_id!r}: the ALE cannot make it ({err})"
        ) from err
    env = _ALEWrapper(vector, device="cpu")  # see make_env: None breaks GPU policies
    env = env.append_transform(RenameTransform(["observation"], ["pixels"]))
    env.append_transform(RewardSum())
    if training_signals:
        env.append_transform(AtariTrainingSignals())
    if seed is not None:
        env.set_seed(seed)
    return env
