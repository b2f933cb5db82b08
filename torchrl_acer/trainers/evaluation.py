"""Greedy evaluation, and a hook any TorchRL ``Trainer`` registers to run it on a
schedule of frames."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, unravel_key
from torchrl.envs import (
    DoubleToFloat,
    EnvBase,
    ExplorationType,
    GymWrapper,
    RewardScaling,
    RewardSum,
    set_exploration_type,
)
from torchrl.envs.transforms import VecGymEnvTransform
from torchrl.trainers.trainers import Trainer, TrainerHookBase

from torchrl_acer.trainers.acer import module_device
from torchrl_acer.training.envs import env_transforms, reset_every_copy

__all__ = ["Evaluation", "GreedyEvaluator"]


class Evaluation(TrainerHookBase):
    """Runs ``evaluate`` every ``interval`` frames and once at the end, and logs it.

    The schedule is on multiples of ``interval`` collected frames, so that runs
    with other batch sizes, or resumed, evaluate at the same points. Results go
    straight to the trainer's logger under ``prefix`` against the frame count
    (``Trainer._log``'s ``log_interval`` would drop evaluations that come more
    often); the last is kept in :attr:`last`, with its ``"frames"``. Registered
    at ``post_steps_log`` and ``shutdown``; the schedule and the last result are
    in its state dict.

    Args:
        evaluate: returns a mapping of scalars, e.g. a :class:`GreedyEvaluator`
            or ``torchrl.collectors.Evaluator(...).evaluate``.
        interval (int, optional): frames between evaluations; ``None``: at the
            end only.

    Keyword Args:
        prefix (str): of the logged names. Defaults to ``"eval/"``.
        at_end (bool): evaluate when training ends, unless the last frame count
            was evaluated. Defaults to ``True``.
    """

    def __init__(
        self,
        evaluate: Callable[[], Mapping[str, Any]],
        interval: int | None = None,
        *,
        prefix: str = "eval/",
        at_end: bool = True,
    ) -> None:
        if interval is not None and not interval >= 1:
            raise ValueError(f"interval must be >= 1 frames or None, got {interval}")
        self.evaluate = evaluate
        self.interval = interval
        self.prefix = prefix
        self.at_end = at_end
        self.next_frames = 0 if interval is not None else None
        self.last: dict | None = None
        self._trainer: Trainer | None = None

    def _run(self) -> None:
        frames = self._trainer.collected_frames
        result = {key: float(value) for key, value in self.evaluate().items()}
        self.last = {**result, "frames": frames}
        logger = self._trainer.logger
        if logger is not None:
            for key, value in result.items():
                logger.log_scalar(f"{self.prefix}{key}", value, step=frames)

    def __call__(self, batch=None) -> None:
        frames = self._trainer.collected_frames
        if self.next_frames is not None and frames >= self.next_frames:
            # the next multiple: the schedule holds whatever the batch size
            self.next_frames = (frames // self.interval + 1) * self.interval
            self._run()

    def _final(self) -> None:
        evaluated = self.last is not None and (
            self.last["frames"] == self._trainer.collected_frames
        )
        if self.at_end and not evaluated:
            self._run()

    def state_dict(self) -> dict[str, Any]:
        return {"next_frames": self.next_frames, "last": self.last}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.next_frames = state_dict["next_frames"]
        self.last = state_dict["last"]

    def register(self, trainer: Trainer, name: str = "evaluation") -> None:
        self._trainer = trainer
        trainer.register_op("post_steps_log", self)
        trainer.register_op("shutdown", self._final)
        trainer.register_module(name, self)


class GreedyEvaluator:
    """Mean return of the greedy policy (the mode of the distribution).

    Args:
        env: a batched environment of ``num_episodes`` copies (one episode each) with
            the episode return under ``return_key`` (``RewardSum``).
        policy: the actor.
        max_steps: cap on an episode's length.

    The environment may run on another device than the policy (CPU environments,
    a CUDA policy): observations go to the policy's device, actions come back.
    """

    def __init__(
        self,
        env: EnvBase,
        policy,
        *,
        max_steps: int,
        return_key=("next", "episode_reward"),
        done_key=("next", "done"),
    ):
        if not max_steps >= 1:  # 0 would report a return of 0 without playing
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.env = env
        self.policy = policy
        self.max_steps = max_steps
        self.return_key = return_key
        self.done_key = done_key
        # TorchRL's step costs 15-20 times the gymnasium vector env's own on
        # CartPole: where nothing but that step happens between them, the
        # evaluation steps the vector env itself (the same steps, bit for bit)
        self._vector = _steppable_vector_env(self)

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        # Stepped by hand rather than with env.rollout, which keeps every step:
        # 8 Atari games of 10 000 steps would hold 4.5 GB of frames.
        n = self.env.batch_size.numel()
        episode_returns = torch.zeros(n)
        finished = torch.zeros(n, dtype=torch.bool)
        steps = self._steps_of_gymnasium if self._vector is not None else self._steps
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            for returns, done in itertools.islice(steps(n), self.max_steps):
                # each environment's first episode; one cut off at max_steps
                # counts as is
                episode_returns = torch.where(finished, episode_returns, returns)
                finished |= done
                if finished.all():
                    break
        return {
            "reward": episode_returns.mean().item(),
            "reward_min": episode_returns.min().item(),
            "reward_max": episode_returns.max().item(),
        }

    def _steps(self, n: int):
        """Each step's returns so far and episode ends, from TorchRL's steps."""
        policy_device = module_device(self.policy)
        env_device = self.env.device or torch.device("cpu")
        td = reset_every_copy(self.env)
        while True:
            if policy_device is None or policy_device == env_device:
                td = self.policy(td)
            else:
                td = self.policy(td.to(policy_device)).to(env_device)
            td, next_root = self.env.step_and_maybe_reset(td)
            returns = td.get(self.return_key, None)
            if returns is None:
                raise KeyError(
                    f"GreedyEvaluator: the environment's steps hold no return under "
                    f"{self.return_key!r}: sum the episode's rewards there with "
                    f"RewardSum(in_keys=['reward'], out_keys=['episode_reward']), "
                    f"or pass return_key"
                )
            returns = returns.reshape(n).float()
            yield returns, td.get(self.done_key).reshape(n)
            td = next_root

    def _steps_of_gymnasium(self, n: int):
        """:meth:`_steps` with the gymnasium vector env stepped directly:
        TorchRL's reset (as there), then each step as TorchRL's would go, the
        return summed as ``RewardSum`` sums it (in its dtype), and the whole
        vector env reset again when every copy ends in one step (as TorchRL
        does)."""
        vector, spec = self._vector, self.env.base_env.full_action_spec["action"]
        obs_dtype = self.env.observation_spec["observation"].dtype
        sum_dtype = self.env.observation_spec[self.return_key[1:]].dtype
        policy_device = module_device(self.policy)
        returns = torch.zeros(n, dtype=sum_dtype).numpy()
        obs = reset_every_copy(self.env).get("observation")
        while True:
            td = TensorDict({"observation": obs}, batch_size=[n])
            if policy_device is not None and policy_device.type != "cpu":
                td = td.to(policy_device)
            action = self.policy(td).get("action").cpu()
            action = spec.to_numpy(action.to(spec.dtype), safe=False)
            next_obs, reward, terminated, truncated, _ = vector.step(action)
            done = np.logical_or(terminated, truncated)
            returns = returns + np.asarray(reward).astype(returns.dtype)
            if done.all():  # TorchRL resets the whole vector env then
                next_obs, _ = vector.reset()
            yield torch.from_numpy(returns).float(), torch.from_numpy(done)
            returns = np.where(done, np.zeros_like(returns), returns)
            # a copy: a vector env may reuse its buffer
            obs = torch.from_numpy(np.array(next_obs, copy=True)).to(obs_dtype)

    def close(self):
        if not self.env.is_closed:
            self.env.close()


def _steppable_vector_env(evaluator: GreedyEvaluator):
    """The gymnasium vector env under ``evaluator.env`` if a step of it is all a
    TorchRL step does there (a ``GymWrapper`` of a vector env resetting finished
    copies within the step, under ``VecGymEnvTransform``, one ``RewardSum`` of
    ``"reward"`` into the return key, ``DoubleToFloat`` and ``RewardScaling``
    after the sum), and the policy reads the observation alone; else ``None``."""
    env, transforms = env_transforms(evaluator.env)
    # not getattr on any env: a SerialEnv's forwards to copies it may not have built
    vector = env._env if isinstance(env, GymWrapper) else None
    if not (
        isinstance(env, GymWrapper)
        and isinstance(vector, gym.vector.VectorEnv)
        and getattr(vector, "autoreset_mode", None)
        == gym.vector.AutoresetMode.SAME_STEP
        and env.wrapper_frame_skip == 1
        and env.device in (None, torch.device("cpu"))
        and list(getattr(evaluator.policy, "in_keys", ())) == ["observation"]
        and evaluator.done_key == ("next", "done")
    ):
        return None
    sums = [i for i, t in enumerate(transforms) if type(t) is RewardSum]
    if len(sums) != 1:
        return None
    summed = transforms[sums[0]]
    sums_into = [unravel_key(("next", key)) for key in summed.out_keys]
    if list(summed.in_keys) != ["reward"] or sums_into != [
        unravel_key(evaluator.return_key)
    ]:
        return None
    for i, transform in enumerate(transforms):
        if type(transform) is VecGymEnvTransform and transform.native_autoreset:
            return None
        if type(transform) is RewardScaling and i < sums[0]:
            return None  # the sum would add scaled rewards
        if type(transform) not in (
            VecGymEnvTransform,
            RewardSum,
            DoubleToFloat,
            RewardScaling,
        ):
            return None
    return vector
