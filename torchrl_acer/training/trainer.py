"""ACER's master loop (Wang et al. 2017, Algorithm 1) on TorchRL pieces.

Collect ``[num_envs, T]`` with a TorchRL collector, make one on-policy update on
the fresh batch, store it in a replay buffer of ``T``-step segments, then make
``n ~ Poisson(replay_ratio)`` off-policy updates on batches of stored segments once
``replay_start`` steps are stored. After every optimizer step the averaged policy
moves towards the current one (:class:`~torchrl.objectives.SoftUpdate`).

The pieces stay the user's: any collector, :class:`~torchrl_acer.ACERLoss`, any
optimizer and TorchRL logger. :class:`ACERTrainer` adds what a training run needs
around them: evaluation, logging, a progress bar and checkpoints.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import set_composite_lp_aggregate
from tensordict.utils import unravel_key
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import EnvBase, ExplorationType, set_exploration_type
from torchrl.objectives import SoftUpdate

from torchrl_acer.objectives.acer import ACERLoss

__all__ = ["ACERTrainer", "GreedyEvaluator", "make_segment_replay_buffer"]


def make_segment_replay_buffer(
    capacity_steps: int, segment_length: int, batch_segments: int
) -> TensorDictReplayBuffer:
    """A replay buffer of ``segment_length``-step segments, as ACER replays them.

    Each collected ``[num_envs, T]`` batch is stored as ``num_envs`` segments of one
    environment's ``T`` consecutive steps (episode boundaries inside a segment are
    handled by the loss), and a sample is ``[batch_segments, T]``. A segment never
    mixes environments or crosses the buffer's wrap-around.

    Args:
        capacity_steps: steps the buffer holds (all environments together).
        segment_length: ``T``.
        batch_segments: segments per sampled batch.
    """
    if segment_length < 1:
        raise ValueError(f"segment length T must be positive, got {segment_length}")
    if capacity_steps < segment_length:
        raise ValueError(
            f"replay capacity of {capacity_steps} steps is shorter than one segment "
            f"of T={segment_length} steps"
        )
    if batch_segments < 1:
        raise ValueError(f"replay batch size must be positive, got {batch_segments}")
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity_steps // segment_length),
        batch_size=batch_segments,
    )


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
        self.env = env
        self.policy = policy
        self.max_steps = max_steps
        self.return_key = return_key
        self.done_key = done_key

    @torch.no_grad()
    def __call__(self) -> dict[str, float]:
        # Stepped by hand rather than with env.rollout, which keeps every step:
        # 8 Atari games of 10 000 steps would hold 4.5 GB of frames.
        n = self.env.batch_size.numel()
        episode_returns = torch.zeros(n)
        finished = torch.zeros(n, dtype=torch.bool)
        policy_device = _module_device(self.policy)
        env_device = self.env.device or torch.device("cpu")
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            td = self.env.reset()
            for _ in range(self.max_steps):
                if policy_device is None or policy_device == env_device:
                    td = self.policy(td)
                else:
                    td = self.policy(td.to(policy_device)).to(env_device)
                td, next_root = self.env.step_and_maybe_reset(td)
                returns = td.get(self.return_key).reshape(n).float()
                # each environment's first episode; one cut off at max_steps
                # counts as is
                episode_returns = torch.where(finished, episode_returns, returns)
                finished |= td.get(self.done_key).reshape(n)
                if finished.all():
                    break
                td = next_root
        return {
            "reward": episode_returns.mean().item(),
            "reward_min": episode_returns.min().item(),
            "reward_max": episode_returns.max().item(),
        }

    def close(self):
        if not self.env.is_closed:
            self.env.close()


def _module_device(module) -> torch.device | None:
    """The device of a module's first parameter (``None`` without parameters)."""
    parameters = module.parameters() if hasattr(module, "parameters") else ()
    first = next(iter(parameters), None)
    return None if first is None else first.device


def _next_multiple(frames: int, interval: int) -> int:
    return (frames // interval + 1) * interval


class ACERTrainer:
    r"""Trains :class:`~torchrl_acer.ACERLoss` with ACER's replay-ratio loop.

    Keyword Args:
        collector: yields ``[num_envs, T]`` batches (``[T]`` for one environment)
            with the behaviour logits and log-probabilities stored (any TorchRL
            collector running the loss's actor; make it infinite, the trainer counts
            frames itself).
        loss_module (ACERLoss): the loss; its actor is the collector's policy.
        optimizer: over ``loss_module.parameters()``. The loss and the optimizer may
            sit on a GPU: batches (collected and replayed, kept wherever the collector
            and the replay buffer keep them) move to the loss's device for updates.
        total_frames (int): environment steps to collect.
        replay_buffer: from :func:`make_segment_replay_buffer`; ``None`` for
            on-policy training only (then ``replay_ratio`` must be 0).
        replay_ratio (float): mean number of off-policy updates per collected batch
            (Poisson). Defaults to 4.
        replay_start (int): steps stored before off-policy updates start.
        on_policy_updates (bool): make the on-policy update on each fresh batch
            (ACER's discrete setting). ``False`` trains fully off-policy, as the
            paper's continuous-control runs do. Defaults to ``True``.
        target_eps (float): decay of the averaged policy,
            :math:`\theta_{avg} \leftarrow \epsilon \theta_{avg} + (1 - \epsilon)\theta`.
            Defaults to 0.99. Unused when ``target_updater`` is given.
        target_updater (SoftUpdate, optional): the averaged-policy update, stepped
            after every optimizer step; defaults to
            ``SoftUpdate(loss_module, eps=target_eps)``.
        max_grad_norm (float, optional): global gradient-norm clip.
        evaluator (callable, optional): returns ``{"reward": ...}`` (a
            :class:`GreedyEvaluator`); run every ``eval_interval`` frames and at the
            end.
        eval_interval (int, optional): frames between evaluations.
        logger (torchrl Logger, optional): receives every metric against frames.
        log_interval (int): frames between training logs. Defaults to every batch.
        checkpoint_dir (str, optional): where checkpoints go (``last.pt``).
        checkpoint_interval (int, optional): frames between checkpoints; one is also
            written at the end and on Ctrl-C.
        progress_bar (bool): a tqdm bar with frames, recent return and FPS.
        seed (int): seeds the trainer's own draws (the Poisson counts).
        episode_return_key: where a finished episode's return is read in a batch.
        episode_end_key: marks the steps where an episode ended.
    """

    def __init__(
        self,
        *,
        collector,
        loss_module: ACERLoss,
        optimizer: torch.optim.Optimizer,
        total_frames: int,
        replay_buffer: TensorDictReplayBuffer | None = None,
        replay_ratio: float = 4.0,
        replay_start: int = 0,
        on_policy_updates: bool = True,
        target_eps: float = 0.99,
        target_updater: SoftUpdate | None = None,
        max_grad_norm: float | None = None,
        evaluator=None,
        eval_interval: int | None = None,
        logger=None,
        log_interval: int = 1,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_interval: int | None = None,
        progress_bar: bool = True,
        seed: int = 0,
        episode_return_key=("next", "episode_reward"),
        episode_end_key=("next", "done"),
    ):
        if total_frames <= 0:
            raise ValueError(f"total_frames must be positive, got {total_frames}")
        if not replay_ratio >= 0:
            raise ValueError(f"replay_ratio must be >= 0, got {replay_ratio}")
        if replay_ratio > 0 and replay_buffer is None:
            raise ValueError(f"replay_ratio={replay_ratio} needs a replay_buffer")
        if not on_policy_updates and not replay_ratio > 0:
            raise ValueError(
                "on_policy_updates=False needs replay_ratio > 0: nothing would train"
            )
        if replay_start < 0:
            raise ValueError(f"replay_start must be >= 0, got {replay_start}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
        for name, value in (
            ("eval_interval", eval_interval),
            ("checkpoint_interval", checkpoint_interval),
            ("log_interval", log_interval),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if eval_interval is not None and evaluator is None:
            raise ValueError("eval_interval is set but there is no evaluator")
        self.collector = collector
        self.loss_module = loss_module
        # built now, so that checkpoints can restore its buffers
        loss_module.value_estimator  # noqa: B018
        self.optimizer = optimizer
        if target_updater is None:
            target_updater = SoftUpdate(loss_module, eps=target_eps)
        self.target_updater = target_updater
        self.replay_buffer = replay_buffer
        self.replay_ratio = replay_ratio
        self.replay_start = replay_start
        self.on_policy_updates = on_policy_updates
        self.max_grad_norm = max_grad_norm
        self.total_frames = total_frames
        self.evaluator = evaluator
        self.eval_interval = eval_interval
        self.logger = logger
        self.log_interval = log_interval
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_interval = checkpoint_interval
        self.progress_bar = progress_bar
        self.episode_return_key = episode_return_key
        self.episode_end_key = episode_end_key
        self._rng = torch.Generator().manual_seed(seed)
        # policy outputs the loss does not read (a shared trunk's features) are
        # recomputed from observations at update time: not worth replay memory
        needed = {unravel_key(k) for k in loss_module.in_keys}
        self._transient_keys = [
            k
            for k in loss_module.actor_network.out_keys
            if unravel_key(k) not in needed
        ]
        self._params = [p for p in loss_module.parameters() if p.requires_grad]
        self.device = _module_device(loss_module) or torch.device("cpu")

        self.frames = 0
        self.updates = 0
        self.segment_length: int | None = None
        self.recent_returns: deque = deque(maxlen=20)
        self.last_eval: dict | None = None
        self.last_train_log: dict | None = None
        self.last_checkpoint: Path | None = None
        self.interrupted = False
        self._next_log = 0
        self._next_eval = 0 if eval_interval else None
        self._next_checkpoint = checkpoint_interval
        self._metrics: dict = defaultdict(list)

    # -- the loop ------------------------------------------------------------

    def train(self) -> None:
        """Runs until ``total_frames`` (Ctrl-C saves a checkpoint and returns)."""
        bar = None
        if self.progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=self.total_frames, initial=self.frames, unit="frames")
        start_time, start_frames = time.perf_counter(), self.frames
        try:
            if self.frames >= self.total_frames:
                return
            for batch in self.collector:
                self.train_on_batch(batch)
                if bar is not None:
                    bar.n = self.frames
                    elapsed = time.perf_counter() - start_time
                    bar.set_postfix(
                        ret=f"{self.recent_return:.1f}",
                        fps=f"{(self.frames - start_frames) / elapsed:.0f}",
                        refresh=False,
                    )
                    bar.refresh()
                if self.frames >= self.total_frames:
                    break
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            if bar is not None:
                bar.close()
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        evaluated_now = self.last_eval is not None and (
            self.last_eval["frames"] == self.frames
        )
        if not self.interrupted and self.evaluator is not None and not evaluated_now:
            self._evaluate()

    def train_on_batch(self, batch: TensorDictBase) -> None:
        """One iteration: an on-policy update, storage, replayed updates, logging."""
        if batch.ndim == 1:
            batch = batch.unsqueeze(0)
        if self.segment_length is None:
            self.segment_length = batch.shape[-1]
        self.frames += batch.numel()
        tick = time.perf_counter()
        self._record_episodes(batch)
        if self.on_policy_updates:
            self.update(batch, tag="on_policy")
        if self.replay_buffer is not None:
            self.replay_buffer.extend(batch.exclude(*self._transient_keys))
            if self.replay_ratio > 0 and self.replay_steps >= self.replay_start:
                rate = torch.tensor(float(self.replay_ratio))
                for _ in range(int(torch.poisson(rate, generator=self._rng))):
                    self.update(self.replay_buffer.sample(), tag="off_policy")
        self._metrics["time/iteration"].append(time.perf_counter() - tick)
        self._metrics["time/frames"].append(batch.numel())
        # schedules run on multiples of their interval, whatever the batch size
        if self.frames >= self._next_log:
            self._log_training()
            self._next_log = _next_multiple(self.frames, self.log_interval)
        if self._next_eval is not None and self.frames >= self._next_eval:
            self._evaluate()
            self._next_eval = _next_multiple(self.frames, self.eval_interval)
        if self._next_checkpoint is not None and self.frames >= self._next_checkpoint:
            # advanced first, so that the checkpoint holds the next one to write
            # (otherwise a resumed run would rewrite this one at once)
            self._next_checkpoint = _next_multiple(
                self.frames, self.checkpoint_interval
            )
            self.save_checkpoint()

    def update(self, batch: TensorDictBase, tag: str = "update") -> TensorDictBase:
        """One optimizer step on ``batch``, then the averaged-policy update."""
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        with set_composite_lp_aggregate(False):
            out = self.loss_module(batch)
        loss = sum(value for key, value in out.items() if key.startswith("loss_"))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
            self._metrics["train/grad_norm"].append(grad_norm.detach())
        self.optimizer.step()
        self.target_updater.step()
        self.updates += 1
        out = out.detach()
        for key, value in out.items():
            self._metrics[f"train/{key}"].append(value)
        stats = self.loss_module.trust_region_stats
        if stats is not None:
            for key, value in stats.items():
                self._metrics[f"train/trust_region_{key}"].append(value)
        self._metrics[f"train/{tag}_updates"].append(1)
        return out

    # -- bookkeeping -----------------------------------------------------------

    @property
    def replay_steps(self) -> int:
        if self.replay_buffer is None or self.segment_length is None:
            return 0
        return len(self.replay_buffer) * self.segment_length

    @property
    def recent_return(self) -> float:
        return float(np.mean(self.recent_returns)) if self.recent_returns else math.nan

    def _record_episodes(self, batch):
        ends = batch.get(self.episode_end_key, None)
        returns = batch.get(self.episode_return_key, None)
        if ends is None or returns is None:
            return
        finished = returns[ends].flatten().tolist()
        self.recent_returns.extend(finished)
        self._metrics["train/episode_reward"].extend(finished)

    def _log_training(self):
        metrics = self._metrics
        frames = sum(metrics.pop("time/frames", [])) or 1
        seconds = sum(metrics.pop("time/iteration", [])) or math.nan
        scalars = {
            "time/fps": frames / seconds,
            "train/frames": self.frames,
            "train/updates": self.updates,
            "replay/steps": self.replay_steps,
        }
        for tag in ("on_policy", "off_policy"):
            scalars[f"train/{tag}_updates"] = len(
                metrics.pop(f"train/{tag}_updates", [])
            )
        episodes = metrics.pop("train/episode_reward", [])
        if episodes:
            scalars["train/reward"] = float(np.mean(episodes))
            scalars["train/episodes"] = len(episodes)
        for key, values in metrics.items():
            if values:
                scalars[key] = (
                    torch.stack([torch.as_tensor(v) for v in values])
                    .float()
                    .mean()
                    .item()
                )
        self._metrics = defaultdict(list)
        self.last_train_log = scalars
        if self.logger is not None:
            for key, value in scalars.items():
                self.logger.log_scalar(key, value, step=self.frames)

    def _evaluate(self):
        result = self.evaluator()
        self.last_eval = {"frames": self.frames, **result}
        if self.logger is not None:
            for key, value in result.items():
                self.logger.log_scalar(f"eval/{key}", value, step=self.frames)
        return result

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed to continue: parameters, the averaged policy, the
        optimizer, the replay contents, counters and random states."""
        return {
            "loss_module": self.loss_module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "target_updater": self.target_updater.state_dict(),
            "replay_buffer": None
            if self.replay_buffer is None
            else self.replay_buffer.state_dict(),
            "counters": {
                "frames": self.frames,
                "updates": self.updates,
                "segment_length": self.segment_length,
                "next_log": self._next_log,
                "next_eval": self._next_eval,
                "next_checkpoint": self._next_checkpoint,
                "recent_returns": list(self.recent_returns),
            },
            "rng": {
                "trainer": self._rng.get_state(),
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
        }

    def load_state_dict(self, state: dict) -> None:
        self.loss_module.load_state_dict(state["loss_module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.target_updater.load_state_dict(state["target_updater"])
        if (state["replay_buffer"] is None) != (self.replay_buffer is None):
            raise ValueError(
                "the checkpoint and this trainer disagree on having a replay buffer"
            )
        if self.replay_buffer is not None:
            self.replay_buffer.load_state_dict(state["replay_buffer"])
        counters = state["counters"]
        self.frames = counters["frames"]
        self.updates = counters["updates"]
        self.segment_length = counters["segment_length"]
        self._next_log = counters["next_log"]
        self._next_eval = counters["next_eval"]
        self._next_checkpoint = counters["next_checkpoint"]
        self.recent_returns.clear()
        self.recent_returns.extend(counters["recent_returns"])
        rng = state["rng"]
        self._rng.set_state(rng["trainer"])
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Writes the checkpoint atomically (``checkpoint_dir/last.pt`` by default)."""
        if path is None:
            if self.checkpoint_dir is None:
                raise ValueError("no checkpoint path given and no checkpoint_dir set")
            path = self.checkpoint_dir / "last.pt"
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)
        self.last_checkpoint = path
        return path

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "last.pt"
        if not path.is_file():
            raise FileNotFoundError(f"resume: no checkpoint at {path}")
        # on the CPU first: the random states must be CPU tensors, and the loss and
        # the optimizer copy their tensors to wherever their parameters are
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))

    def close(self) -> None:
        self.collector.shutdown()
        if self.evaluator is not None and hasattr(self.evaluator, "close"):
            self.evaluator.close()
