"""A collector that steps a gymnasium vector env directly, for the batches TorchRL's
:class:`~torchrl.collectors.Collector` makes of it, at a fraction of its cost.

On :func:`~torchrl_acer.training.envs.make_env`'s environments (a ``GymWrapper``
around a gymnasium vector env that resets finished copies within the step, then
``RewardSum``) TorchRL's ``Collector`` costs about 15 times the work it wraps
(gymnasium's steps and the policy network, ``bench/collection.py``): per step it
builds and validates several TensorDicts, reads the terminal observations from the
info dict one copy at a time, swaps them in and out of a cache
(``VecGymEnvTransform``), runs each transform's ``_step`` and ``_reset`` and
updates the trajectory ids. :class:`GymVectorCollector` does the same arithmetic
on numpy arrays, calls the policy on a TensorDict of the observation, and builds
one TensorDict per batch.

It is a drop-in for the environments it accepts: from the same environment state,
the same policy and the same torch random state, its batches equal the
``Collector``'s bit for bit, key for key (``tests/training/test_gym_collector.py``), and
it carries its state between batches as the ``Collector`` does (``_carrier``,
``_frames``, ``_iter``, TorchRL's ``_traj_pool``), so that
:func:`~torchrl_acer.training.env_state.collector_state_dict` saves both alike
and a run may switch between the two on resume. What it cannot reproduce it refuses, naming
it: other environments, transforms other than ``RewardSum``, ``DoubleToFloat``
and ``RewardScaling``, and policies reading more than the observation (recurrent
states, ``is_init``).
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.collectors import BaseCollector
from torchrl.collectors.utils import _TrajectoryPool
from torchrl.envs import (
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    RewardScaling,
    RewardSum,
)
from torchrl.envs.transforms import VecGymEnvTransform
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_acer.training.envs import env_transforms
from torchrl_acer.training.refusal import Refusal

__all__ = ["GymVectorCollector", "NotReproducedError"]


class NotReproducedError(Refusal, ValueError):
    """An environment or policy :class:`GymVectorCollector` does not reproduce
    TorchRL's ``Collector`` on (raised before it touches the environment)."""


_USE_COLLECTOR = "use TorchRL's Collector (collector.backend=single) for it"
_DONE_KEYS = ["done", "terminated", "truncated"]


def _key(key):
    return key if isinstance(key, str) else tuple(key)


def _keys(spec) -> set:
    return {_key(k) for k in spec.keys(True, True)}


def _not_done(*shape: int) -> dict:
    """The done flags of steps that start from a live state (all ``False``)."""
    return {key: torch.zeros(*shape, 1, dtype=torch.bool) for key in _DONE_KEYS}


class GymVectorCollector(BaseCollector):
    r"""Collects ``[num_envs, T]`` batches from a TorchRL ``GymWrapper`` over a
    gymnasium vector env by stepping the vector env itself.

    The batches have the keys, shapes, dtypes and values of
    ``Collector(env, policy, frames_per_batch=..., total_frames=...,
    storing_device="cpu", auto_register_policy_transforms=False)``'s: the root
    ``"observation"``, ``"done"``/``"terminated"``/``"truncated"`` (all ``False``:
    every row starts from a live state), the policy's outputs (``"action"``,
    ``"logits"`` or ``"loc"``/``"scale"``, ``"action_log_prob"``, ... whatever
    the policy writes), ``("collector", "traj_ids")``, and under ``"next"`` the
    observation the action led to (the true last observation at an episode's
    end, from gymnasium's ``final_obs`` info), ``"reward"``, the done flags,
    and with :class:`~torchrl.envs.RewardSum` the episode's running return
    (root: before the step; ``"next"``: after it). Dims are named
    ``[None, "time"]``.

    Bit-for-bit equality with the ``Collector`` includes its ways:

    - at construction it resets the vector env (unseeded: seed it with the
      TorchRL env's ``set_seed`` before, as ``make_env`` does) and, where TorchRL
      would, calls the policy once on that observation (outside any exploration
      context) to learn its outputs;
    - it samples actions under ``ExplorationType.RANDOM`` and ``torch.no_grad``;
    - when every copy's episode ends in the same step, TorchRL resets the vector
      env again (a full reset: gymnasium's in-step resets are discarded and the
      new episodes drawn from the copies' next random numbers); so does this.

    Args:
        env: a TorchRL env around a gymnasium vector env whose
            ``autoreset_mode`` is ``SAME_STEP`` (``GymWrapper`` adds its
            ``VecGymEnvTransform``), under ``RewardSum``, ``DoubleToFloat``
            (before the reward transforms) and ``RewardScaling`` only:
            :func:`~torchrl_acer.training.envs.make_env`'s, and the gym example's.
        policy: a TensorDict module reading ``"observation"`` only and writing
            its outputs in place (an actor of :mod:`torchrl_acer.modules`).
        frames_per_batch (int): steps of all envs together per batch; rounded up
            to a multiple of ``num_envs`` as TorchRL's ``Collector`` does.
        total_frames (int): steps after which iteration stops; ``-1`` (default):
            never.
        policy_device: where the policy runs (observations go there, its outputs
            come back to the CPU); ``None``: the CPU.

    Raises:
        ValueError: naming the environment type, transform or policy key it does
            not reproduce, for anything else.

    Examples:
        >>> import torch
        >>> from torchrl_acer.modules.models import mlp_actor_critic
        >>> from torchrl_acer.training.envs import make_env
        >>> from torchrl_acer.training.gym_collector import GymVectorCollector
        >>> env = make_env("CartPole-v1", num_envs=4, seed=0)
        >>> actor, _ = mlp_actor_critic(4, 2, num_cells=[16])
        >>> collector = GymVectorCollector(env, actor, frames_per_batch=40)
        >>> batch = next(iter(collector))
        >>> batch.shape, batch.names
        (torch.Size([4, 10]), [None, 'time'])
        >>> sorted(batch["next"].keys())
        ['done', 'episode_reward', 'observation', 'reward', 'terminated', 'truncated']
        >>> collector.shutdown()
    """

    # no random warm-up: TorchRL's Trainer reads it to start updates at once
    init_random_frames = 0

    def __init__(
        self,
        env: EnvBase,
        policy,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        policy_device: torch.device | str | None = None,
    ):
        super().__init__()
        self.env = env
        self.policy = policy
        self._vector = self._check_env(env)
        self._check_policy(policy)
        self.n_env = self._vector.num_envs
        if frames_per_batch < 1:
            raise ValueError(f"frames_per_batch must be >= 1, got {frames_per_batch}")
        # as TorchRL's Collector: frames_per_batch counts steps per env
        self.frames_per_batch = -(-frames_per_batch // self.n_env)
        self.requested_frames_per_batch = self.frames_per_batch * self.n_env
        if frames_per_batch % self.n_env:
            warnings.warn(
                f"frames_per_batch ({frames_per_batch}) is not a multiple of the "
                f"{self.n_env} environments: each batch has "
                f"{self.requested_frames_per_batch} frames",
                stacklevel=2,
            )
        self.total_frames = (
            math.inf if total_frames is None or total_frames < 0 else int(total_frames)
        )
        # None on the CPU, where the observations are: nothing to move
        device = torch.device("cpu" if policy_device is None else policy_device)
        self.policy_device = None if device.type == "cpu" else device
        self.track_traj_ids = True
        self.closed = False
        self._frames = 0
        self._iter = -1
        self._traj_pool = _TrajectoryPool()  # TorchRL's, as its Collector keeps ids
        self._policy_keys: list | None = None
        self._start_episodes()
        if self._torchrl_probes_policy(env, policy):
            # TorchRL's Collector runs the policy once on the reset observation,
            # outside any exploration context, to learn its outputs: the same
            # call here keeps the random state (and so the actions) the same
            with torch.no_grad():
                self._call_policy(self._policy_input(self._obs))

    # -- what it accepts ---------------------------------------------------------

    def _check_env(self, env: EnvBase) -> gym.vector.VectorEnv:
        """The gymnasium vector env to step; reads what ``env``'s transforms do,
        refusing what this collector does not reproduce."""
        if not isinstance(env, EnvBase):
            raise NotReproducedError(
                f"GymVectorCollector needs a TorchRL env, got {type(env).__name__}"
            )
        base, transforms = env_transforms(env)
        # not getattr on any env: a SerialEnv's forwards to copies it may not have
        # built, recursing
        vector = base._env if isinstance(base, GymWrapper) else None
        if not isinstance(base, GymWrapper) or not isinstance(
            vector, gym.vector.VectorEnv
        ):
            inner = type(vector).__name__ if isinstance(base, GymWrapper) else None
            raise NotReproducedError(
                f"GymVectorCollector steps a gymnasium vector env in TorchRL's "
                f"GymWrapper (torchrl_acer.training.envs.make_env), got "
                f"{type(base).__name__}"
                + (f" around {inner}" if inner else "")
                + f"; {_USE_COLLECTOR}"
            )
        mode = getattr(vector, "autoreset_mode", None)
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            raise NotReproducedError(
                f"GymVectorCollector needs a vector env that resets finished copies "
                f"within the step (autoreset_mode=SAME_STEP), got {mode}; "
                f"{_USE_COLLECTOR}"
            )
        if base.wrapper_frame_skip != 1 or base.device not in (
            None,
            torch.device("cpu"),
        ):
            raise NotReproducedError(
                f"GymVectorCollector steps a GymWrapper on the CPU without frame "
                f"skip, got frame_skip={base.wrapper_frame_skip} on {base.device}; "
                f"{_USE_COLLECTOR}"
            )
        entries = _keys(base.observation_spec)
        if entries - {("final", "observation")} != {"observation"}:
            raise NotReproducedError(
                f"GymVectorCollector reproduces a single 'observation' entry (a Box "
                f"observation space, no info entries), got the entries "
                f"{sorted(map(str, entries))}; {_USE_COLLECTOR}"
            )
        if (
            list(env.action_keys) != ["action"]
            or list(env.reward_keys) != ["reward"]
            or sorted(env.done_keys) != _DONE_KEYS
        ):
            raise NotReproducedError(
                f"GymVectorCollector needs the keys 'action', 'reward' and "
                f"{_DONE_KEYS}, got action {env.action_keys}, reward "
                f"{env.reward_keys}, done {env.done_keys}; {_USE_COLLECTOR}"
            )
        # the step's outputs, transform by transform
        self._reward_scalings: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
        self._return_key = None  # RewardSum's out key
        self._scalings_summed = 0  # RewardSum sums the rewards these scalings made
        for transform in transforms:
            kind = type(transform)
            if kind is VecGymEnvTransform and not transform.native_autoreset:
                continue  # its swap of the final observation is done here
            if kind is DoubleToFloat:
                if self._return_key is not None or self._reward_scalings:
                    raise NotReproducedError(
                        "GymVectorCollector reproduces DoubleToFloat before the "
                        "reward transforms (RewardSum, RewardScaling) only; "
                        "append it first, as make_env does, or " + _USE_COLLECTOR
                    )
                continue  # casts to the final specs' dtypes, read below
            if kind is RewardSum:
                if (
                    self._return_key is not None
                    or list(transform.in_keys) != ["reward"]
                    or len(transform.out_keys) != 1
                ):
                    raise NotReproducedError(
                        f"GymVectorCollector reproduces one RewardSum of 'reward' "
                        f"into one key, got in_keys={transform.in_keys}, "
                        f"out_keys={transform.out_keys}; {_USE_COLLECTOR}"
                    )
                self._return_key = transform.out_keys[0]
                self._scalings_summed = len(self._reward_scalings)
                continue
            if kind is RewardScaling:
                if list(transform.in_keys) != ["reward"] or list(
                    transform.out_keys
                ) != ["reward"]:
                    raise NotReproducedError(
                        f"GymVectorCollector reproduces RewardScaling of 'reward' in "
                        f"place, got in_keys={transform.in_keys}, "
                        f"out_keys={transform.out_keys}; {_USE_COLLECTOR}"
                    )
                self._reward_scalings.append(
                    (
                        transform.loc.detach().cpu(),
                        transform.scale.detach().cpu(),
                        bool(transform.standard_normal),
                    )
                )
                continue
            raise NotReproducedError(
                f"GymVectorCollector does not reproduce the transform "
                f"{kind.__name__} (it reproduces RewardSum, DoubleToFloat and "
                f"RewardScaling); {_USE_COLLECTOR}"
            )
        # dtypes after the transforms (DoubleToFloat's casts included)
        self._obs_dtype = env.observation_spec["observation"].dtype
        self._reward_dtype = env.reward_spec.dtype
        if self._return_key is not None:
            # RewardSum adds the rewards to the return in their own dtype
            return_dtype = env.observation_spec[self._return_key].dtype
            if return_dtype != self._reward_dtype:
                raise NotReproducedError(
                    f"{self._return_key!r} is {return_dtype}, the reward "
                    f"{self._reward_dtype}; {_USE_COLLECTOR}"
                )
        self._np_reward_dtype = torch.empty((), dtype=self._reward_dtype).numpy().dtype
        # actions go to gymnasium as TorchRL sends them: cast to the base env's
        # action dtype (DoubleToFloat's inverse), through its spec's to_numpy
        self._action_spec = base.full_action_spec["action"]
        return vector

    def _check_policy(self, policy) -> None:
        in_keys = getattr(policy, "in_keys", None)
        if in_keys is None or not callable(policy):
            raise NotReproducedError(
                f"GymVectorCollector needs a TensorDict module (with in_keys) as "
                f"its policy, got {type(policy).__name__}; {_USE_COLLECTOR}"
            )
        for key in in_keys:
            if key != "observation":
                raise NotReproducedError(
                    f"the policy reads {key!r}, but GymVectorCollector gives it the "
                    f"observation only: it carries no recurrent state or is_init "
                    f"flags between steps; {_USE_COLLECTOR}"
                )
        for key in getattr(policy, "out_keys", ()):
            if isinstance(key, tuple) and key[0] == "next":
                raise NotReproducedError(
                    f"the policy writes {key!r}, a state for the next step, which "
                    f"GymVectorCollector does not carry; {_USE_COLLECTOR}"
                )

    @staticmethod
    def _torchrl_probes_policy(env: EnvBase, policy) -> bool:
        """Whether TorchRL's ``Collector`` calls the policy once when it is built
        (``_maybe_make_final_rollout``): unless the policy's spec, complete, adds
        entries to the environment's and names all its out_keys."""
        spec = getattr(policy, "spec", None)
        if spec is None or any(v is None for v in spec.values(True, True)):
            return True
        spec_keys = _keys(spec)
        env_keys = {_key(k) for k in env.fake_tensordict().keys(True)}
        added = spec_keys if spec_keys - env_keys else set()
        return any(_key(k) not in added for k in getattr(policy, "out_keys", ()))

    # -- stepping ------------------------------------------------------------------

    def _start_episodes(self) -> None:
        """Resets the vector env (unseeded, as TorchRL's ``env.reset()``) and starts
        a trajectory in every copy."""
        obs, _ = self._vector.reset()
        self._obs = self._as_obs(np.array(obs, copy=True))
        self._return = np.zeros(self.n_env, dtype=self._np_reward_dtype)
        self._traj_ids = self._traj_pool.get_traj_and_increment(self.n_env).numpy()

    def _as_obs(self, obs: np.ndarray) -> torch.Tensor:
        # TorchRL reads gymnasium's array into its spec's dtype; ``obs`` is a copy
        # (a vector env may reuse its buffer, copy=False), which the tensor shares
        return torch.from_numpy(obs).to(self._obs_dtype)

    def _policy_input(self, obs: torch.Tensor) -> TensorDictBase:
        if self.policy_device is not None:
            obs = obs.to(self.policy_device, non_blocking=True)
        return TensorDict(
            {"observation": obs}, batch_size=[self.n_env], device=self.policy_device
        )

    def _call_policy(self, td: TensorDictBase) -> TensorDictBase:
        out = self.policy(td)
        return td if out is None else out

    def _act(self, obs: torch.Tensor) -> dict:
        """The policy's outputs on ``obs``, on the CPU: the entries it added."""
        out = self._call_policy(self._policy_input(obs))
        if self._policy_keys is None:
            self._policy_keys = [k for k in out.keys(True, True) if k != "observation"]
            if "action" not in self._policy_keys:
                raise ValueError(f"the policy wrote {self._policy_keys}, no 'action'")
        result = {}
        for key in self._policy_keys:
            value = out.get(key, None)
            if value is None:
                raise RuntimeError(
                    f"the policy wrote {key!r} at the first step but not now"
                )
            result[key] = value.cpu() if self.policy_device is not None else value
        return result

    @torch.no_grad()
    def rollout(self) -> TensorDictBase:
        """One ``[num_envs, T]`` batch."""
        vector, spec = self._vector, self._action_spec
        policy_out: dict[object, list] = {}
        # what each step adds to the batch, kept as arrays until it is built
        steps = defaultdict(list)
        with set_exploration_type(ExplorationType.RANDOM):
            for _ in range(self.frames_per_batch):
                obs = self._obs
                out = self._act(obs)
                for key, value in out.items():
                    policy_out.setdefault(key, []).append(value)
                action = spec.to_numpy(out["action"].to(spec.dtype), safe=False)
                next_obs, reward, terminated, truncated, info = vector.step(action)
                # a copy: a vector env may reuse its buffer (copy=False)
                next_obs = np.array(next_obs, copy=True)
                done = np.logical_or(terminated, truncated)
                stepped = next_obs
                if done.any():
                    # gymnasium returned the reset observation of the copies
                    # that ended; the step's true last one is in the info
                    stepped = next_obs.copy()
                    stepped[done] = np.stack(info["final_obs"][done])
                reward, summed = self._rewards(reward)
                returned = self._return + summed
                steps["obs"].append(obs)
                steps["next_obs"].append(stepped)
                steps["reward"].append(reward)
                steps["terminated"].append(np.asarray(terminated, dtype=bool))
                steps["truncated"].append(np.asarray(truncated, dtype=bool))
                steps["traj_ids"].append(self._traj_ids)
                steps["return"].append(self._return)
                steps["next_return"].append(returned)
                if done.all():
                    # TorchRL resets the whole vector env when every copy ended
                    next_obs, _ = vector.reset()
                    next_obs = np.array(next_obs, copy=True)
                self._obs = self._as_obs(next_obs)
                # RewardSum's reset: torch.where(~reset, value, 0.0)
                self._return = np.where(done, np.zeros_like(returned), returned)
                n_done = int(done.sum())
                if n_done:
                    # new ids in the order of the copies, from one counter
                    ids = self._traj_ids.copy()
                    ids[done] = self._traj_pool.get_traj_and_increment(n_done)
                    self._traj_ids = ids
        return self._batch(policy_out, steps)

    def _rewards(self, reward) -> tuple[np.ndarray, np.ndarray]:
        """The step's reward after the transforms, and the reward RewardSum adds
        to the return (before the scalings that come after it)."""
        reward = np.asarray(reward).astype(self._np_reward_dtype)
        summed = reward
        for j, (loc, scale, standard) in enumerate(self._reward_scalings):
            # RewardScaling's arithmetic, on tensors of its dtypes
            r = torch.from_numpy(reward)
            reward = ((r - loc) / scale if standard else r * scale + loc).numpy()
            if j + 1 == self._scalings_summed:
                summed = reward
        return reward, summed

    def _batch(self, policy_out: dict, steps: dict) -> TensorDictBase:
        """The TensorDict of one batch, from the steps' arrays (time second)."""
        N, T = self.n_env, self.frames_per_batch

        def stack(arrays, dtype=None, flag=False):
            out = torch.from_numpy(np.stack(arrays, axis=1))
            if dtype is not None:
                out = out.to(dtype)
            return out.unsqueeze(-1) if flag else out

        terminated = stack(steps["terminated"], flag=True)
        truncated = stack(steps["truncated"], flag=True)
        root = {"observation": torch.stack(steps["obs"], dim=1), **_not_done(N, T)}
        nxt = {
            "observation": stack(steps["next_obs"], self._obs_dtype),
            "reward": stack(steps["reward"], self._reward_dtype, flag=True),
            "done": terminated | truncated,
            "terminated": terminated,
            "truncated": truncated,
        }
        if self._return_key is not None:
            root[self._return_key] = stack(steps["return"], flag=True)
            nxt[self._return_key] = stack(steps["next_return"], flag=True)
        for key, values in policy_out.items():
            root[key] = torch.stack(values, dim=1)
        root["next"] = nxt
        root["collector"] = {"traj_ids": stack(steps["traj_ids"])}
        batch = TensorDict(root, batch_size=[N, T], device="cpu")
        batch.refine_names(..., "time")
        return batch

    # -- BaseCollector ---------------------------------------------------------------

    def iterator(self) -> Iterator[TensorDictBase]:
        while self._frames < self.total_frames:
            self._iter += 1
            if self.pre_collect_hook is not None:
                self.pre_collect_hook()
            batch = self.rollout()
            self._frames += batch.numel()
            if self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            yield batch

    @torch.no_grad()
    def reset(self) -> None:
        """Starts fresh episodes in every copy (new trajectory ids), as
        ``Collector.reset()``."""
        self._start_episodes()

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seeds (and so resets) the vector env through the TorchRL env, as
        ``Collector.set_seed``; call :meth:`reset` to start episodes from it."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def update_policy_weights_(self, policy_or_weights=None, **kwargs) -> None:
        """The collector acts with the policy it was given: with no argument there
        is nothing to do; weights (a TensorDict, a dict, or a module) are copied
        into it in place."""
        weights = policy_or_weights
        for key in ("weights", "policy"):
            if kwargs.get(key) is not None:
                weights = kwargs.pop(key)
        if weights is None:
            return
        if isinstance(weights, nn.Module):
            weights = TensorDict.from_module(weights)
        elif isinstance(weights, dict):
            weights = TensorDict(weights).unflatten_keys(".")
        TensorDict.from_module(self.policy).data.update_(weights.data)

    def shutdown(
        self,
        timeout: float | None = None,
        close_env: bool = True,
        raise_on_error: bool = True,
    ) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if close_env and not self.env.is_closed:
                self.env.close(raise_if_closed=raise_on_error)
        except Exception:
            if raise_on_error:
                raise

    @property
    def _carrier(self) -> TensorDictBase:
        """What the next step starts from, as TorchRL's ``Collector`` carries it:
        the observation, the done flags, the running return and the trajectory
        ids of the ``[num_envs]`` copies. Set, the collector continues from it
        (a ``Collector``'s, or this one's)."""
        carrier = TensorDict(
            {
                "observation": self._obs.clone(),
                **_not_done(self.n_env),
                "collector": {"traj_ids": torch.from_numpy(self._traj_ids.copy())},
            },
            batch_size=[self.n_env],
        )
        if self._return_key is not None:
            ret = torch.from_numpy(self._return.copy())
            carrier[self._return_key] = ret.unsqueeze(-1)
        return carrier

    @_carrier.setter
    def _carrier(self, carrier: TensorDictBase) -> None:
        if tuple(carrier.batch_size) != (self.n_env,):
            raise ValueError(
                f"the carrier has batch size {tuple(carrier.batch_size)}, this "
                f"collector {self.n_env} environments"
            )
        self._obs = carrier.get("observation").cpu().to(self._obs_dtype).clone()
        self._traj_ids = carrier.get(("collector", "traj_ids")).cpu().numpy().copy()
        if self._return_key is not None:
            ret = carrier.get(self._return_key).cpu().reshape(self.n_env)
            self._return = ret.numpy().astype(self._np_reward_dtype)

    def state_dict(self) -> OrderedDict:
        """The counters, as TorchRL's ``Collector.state_dict`` has them."""
        return OrderedDict(
            frames=self._frames, iter=self._iter, traj_pool=self._traj_pool.state_dict()
        )

    def load_state_dict(self, state_dict: OrderedDict) -> None:
        self._frames, self._iter = state_dict["frames"], state_dict["iter"]
        self._traj_pool.load_state_dict(state_dict["traj_pool"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.n_env}, "
            f"frames_per_batch={self.requested_frames_per_batch}, "
            f"env={type(self._vector).__name__})"
        )
