"""What running environments hold, saved and restored, so that a resumed run
continues the same episodes.

A TorchRL :class:`~torchrl.collectors.Collector` carries, between two batches, the
tensordict of the environments' current step (the last ``"next"`` observation, the
running ``episode_reward`` of :class:`~torchrl.envs.RewardSum`, the trajectory
ids), and the environments hold their own state (positions, step counters, random
generators). Where both can be saved, a resumed run steps on from exactly where
the checkpoint left, and collects the same data as a run that was never stopped.

What can be saved: a :class:`gymnasium.vector.SyncVectorEnv` whose copies pickle
with their state (gymnasium's classic-control tasks, MinAtar, plain Python envs).
What cannot: environments in other processes (``AsyncVectorEnv``), the ALE's
vector env (Atari), and envs that pickle by re-running their constructor
(:class:`gymnasium.utils.EzPickle`: MuJoCo, Box2D). For those, a resumed run
starts fresh episodes with a seed derived from the run's seed and frame count
(:func:`resume_seed`), never the start's seeds again, and says so.
"""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import torch
from torchrl.envs import EnvBase, GymWrapper

from torchrl_acer.training.envs import env_transforms, forget_saved_step

__all__ = [
    "CollectorState",
    "collector_state_dict",
    "env_state_dict",
    "load_collector_state_dict",
    "load_env_state_dict",
    "restart_episodes",
    "resume_seed",
]

# a SyncVectorEnv's own attributes that are not its state: its constructors
# (closures, which do not pickle), and its copies, pickled beside it
_NOT_STATE = ("env_fns", "envs")


def _memo_transforms(env: EnvBase) -> list:
    """The transforms holding a ``_memo`` dict (the auto-reset transform's stash)."""
    transforms = env_transforms(env)[1]
    return [t for t in transforms if isinstance(getattr(t, "_memo", None), dict)]


def _saveable(env: EnvBase) -> tuple[gym.vector.SyncVectorEnv | None, str | None]:
    """The gymnasium vector env inside a TorchRL env (``GymWrapper`` under
    transforms) and ``None`` if :func:`env_state_dict` can save it, else ``None``
    and why not."""
    if not isinstance(env, EnvBase):
        return None, f"{type(env).__name__} is not a TorchRL environment"
    base, _ = env_transforms(env)
    # not getattr on any env: a SerialEnv's forwards to copies it may not have built
    vector = base._env if isinstance(base, GymWrapper) else None
    if not isinstance(vector, gym.vector.VectorEnv):
        return None, f"{type(env).__name__} does not wrap a gymnasium vector env"
    if not isinstance(vector, gym.vector.SyncVectorEnv):
        return None, (
            f"{type(vector).__name__} keeps its environments out of this process "
            f"or in native code"
        )
    for layer in vector.envs:  # each copy, through its wrappers to the task
        while layer is not None:
            if isinstance(layer, gym.utils.EzPickle):
                return None, (
                    f"{type(layer).__name__} pickles by re-running its constructor "
                    f"(EzPickle), which loses its state"
                )
            inner = getattr(layer, "env", None)
            layer = inner if isinstance(inner, gym.Env) and inner is not layer else None
    return vector, None


def env_state_dict(env: EnvBase) -> dict:
    """The state of a TorchRL env around a gymnasium ``SyncVectorEnv``.

    Returns ``{"saved": True, ...}`` with the pickled copies (each wrapper's and
    the task's attributes, its random generator included), the vector env's own
    buffers, the TorchRL transforms' state and the auto-reset transform's stash;
    or ``{"saved": False, "reason": ...}`` where the state cannot be saved.
    """
    vector, reason = _saveable(env)
    if reason is not None:
        return {"saved": False, "reason": reason}
    own = {k: v for k, v in vars(vector).items() if k not in _NOT_STATE}
    try:
        blob = pickle.dumps({"envs": vector.envs, "vector": own})
    except Exception as err:  # an env holding a window, a socket, a library handle
        return {"saved": False, "reason": f"its state does not pickle ({err})"}
    return {
        "saved": True,
        "kind": type(vector).__name__,
        "num_envs": vector.num_envs,
        "vector": blob,
        "transforms": env.state_dict(),
        "memos": [dict(t._memo) for t in _memo_transforms(env)],
    }


def load_env_state_dict(env: EnvBase, state: dict) -> None:
    """Restores what :func:`env_state_dict` saved into a freshly built ``env`` of
    the same kind."""
    vector, reason = _saveable(env)
    if reason is not None:
        raise ValueError(f"cannot restore the environment's state: {reason}")
    if state["num_envs"] != vector.num_envs:
        raise ValueError(
            f"the checkpoint holds {state['num_envs']} environments, this run "
            f"has {vector.num_envs}"
        )
    saved = pickle.loads(state["vector"])
    # the copies are replaced: the vector env only reaches them through .envs
    vector.envs = saved["envs"]
    vars(vector).update(saved["vector"])
    env.load_state_dict(state["transforms"])
    for transform, memo in zip(_memo_transforms(env), state["memos"], strict=True):
        transform._memo = dict(memo)


def collector_state_dict(collector) -> dict:
    """The state of a TorchRL ``Collector`` (or a
    :class:`~torchrl_acer.training.gym_collector.GymVectorCollector`, which
    carries the same) between two batches: its environment's
    (:func:`env_state_dict`), the tensordict it carries to the next step, its
    frame and trajectory counters, so a run may resume with the other.
    ``{"saved": False, "reason": ...}`` where the environment cannot be saved or
    the collector is another kind."""
    env = getattr(collector, "env", None)
    carrier = getattr(collector, "_carrier", None)
    if env is None or carrier is None:
        return {
            "saved": False,
            "reason": f"{type(collector).__name__} keeps its environments out of reach",
        }
    state = env_state_dict(env)
    if not state["saved"]:
        return state
    state["carrier"] = carrier.clone()
    state["frames"] = collector._frames
    state["iter"] = collector._iter
    if collector.track_traj_ids:
        state["traj_pool"] = collector._traj_pool.state_dict()
    return state


def load_collector_state_dict(collector, state: dict) -> None:
    """Restores what :func:`collector_state_dict` saved into a fresh collector."""
    load_env_state_dict(collector.env, state)
    device = collector._carrier.device
    carrier = state["carrier"].clone()
    collector._carrier = (
        carrier.clear_device_() if device is None else carrier.to(device)
    )
    collector._frames = state["frames"]
    collector._iter = state["iter"]
    if "traj_pool" in state and collector.track_traj_ids:
        collector._traj_pool.load_state_dict(state["traj_pool"])


class CollectorState:
    """A collector's (or an environment's) environments mid-episode, as a
    checkpoint component (``state_dict`` / ``load_state_dict``, for
    :class:`torchrl.checkpoint.Checkpoint`).

    Where the state can be saved (:func:`collector_state_dict`,
    :func:`env_state_dict`), loading it continues the saved episodes. Where it
    could not be (or does not fit: other environments), loading starts fresh
    episodes seeded with :func:`resume_seed` from ``seed``, the frames at the save
    and ``stream``. Each outcome is appended to :attr:`notes`, for the run to say.

    Args:
        target: a collector, or an environment (an evaluator's).

    Keyword Args:
        name (str): what the notes call these environments. Defaults to
            ``"training"``.
        seed (int): the run's seed. Defaults to 0.
        stream (int): another stream of fresh-episode seeds for each target.
        frames (callable): the frames trained so far, stored with the state.
    """

    def __init__(self, target, *, name="training", seed=0, stream=0, frames=lambda: 0):
        self.target, self.name = target, name
        env = isinstance(target, EnvBase)
        self._save = env_state_dict if env else collector_state_dict
        self._load = load_env_state_dict if env else load_collector_state_dict
        self.seed, self.stream, self.frames = seed, stream, frames
        self.notes: list[str] = []
        #: set, why the next saves leave the state out (the environments failed:
        #: a resume starts fresh episodes instead of stepping into the failure)
        self.unsaved: str | None = None

    def state_dict(self) -> dict:
        if self.unsaved is not None:
            return {"saved": False, "reason": self.unsaved, "at_frames": self.frames()}
        return {**self._save(self.target), "at_frames": self.frames()}

    def load_state_dict(self, state: dict) -> None:
        reason = state.get("reason")
        if state["saved"]:
            try:  # checked before anything changes
                self._load(self.target, state)
            except ValueError as err:  # other environments than the saved ones
                reason = str(err)
            else:
                self.notes.append(
                    f"{self.name} environments: state restored ({state['kind']} of "
                    f"{state['num_envs']}), episodes continue"
                )
                return
        frames = state.get("at_frames", 0)
        seed = resume_seed(self.seed, frames, self.stream)
        restart_episodes(self.target, seed)
        self.notes.append(
            f"{self.name} environments: state not saved ({reason}); fresh episodes "
            f"seeded with {seed}, derived from seed={self.seed} and frames={frames}"
        )


def resume_seed(seed: int, frames: int, stream: int = 0) -> int:
    """The seed of the fresh episodes a resumed run starts at ``frames`` (another
    for each ``stream``: the training and the evaluation environments): a hash of
    all three, so that a resume does not replay the start's episodes (seeded
    ``seed, seed + 1, ...``) nor another resume's. Below ``2**31 - 2**16``, so that
    the copies' ``seed + i`` fit the ALE's 32-bit seeds."""
    state = np.random.SeedSequence([seed, frames, stream, 0xACE5]).generate_state(1)
    return int(state[0]) % (2**31 - 2**16)


def restart_episodes(target, seed: int) -> None:
    """Starts fresh episodes in a collector (or an environment) seeded with
    ``seed``."""
    if hasattr(target, "set_seed"):
        target.set_seed(seed)
    # an env, or a collector's (TorchRL's resets it with a bare env.reset())
    env = target if isinstance(target, EnvBase) else getattr(target, "env", None)
    if isinstance(env, EnvBase):
        forget_saved_step(env)
    if hasattr(target, "reset"):
        with torch.no_grad():
            target.reset()
