"""What a run reports while it trains, as a hook any TorchRL ``Trainer`` registers."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from tensordict import TensorDictBase
from torchrl.trainers.trainers import Trainer, TrainerHookBase

__all__ = ["TrainingLog"]


class TrainingLog(TrainerHookBase):
    """Logs the episodes a batch finished and the run's pace, through the trainer.

    TorchRL's :class:`~torchrl.trainers.LogScalar` averages a key over a batch's
    steps; an episode's return is worth reading where the episode ends only. At
    ``pre_steps_log`` this hook reads the returns of the episodes that ended in the
    batch (``return_key`` where ``done_key`` is set, as TorchRL's
    :class:`~torchrl.envs.RewardSum` writes them) and hands the trainer's
    ``_log`` (hence its logger and ``log_interval``):

    - ``train/reward`` (shown on the progress bar) and ``train/episodes``: the mean
      return of the last ``window`` finished episodes, and how many finished in
      this batch, once any episode has finished (no ``nan`` before);
    - ``time/fps``: frames per second of wall-clock time since the previous batch,
      or since ``train`` started for its first batch (collection and updates
      together), so that a resumed run logs it where the uninterrupted one did.

    The updates so far are TorchRL's own ``optim_steps`` entry. Where the
    collector writes to a replay buffer itself (TorchRL's trainer then hands its
    hooks no batch), only the pace is logged.

    Args:
        window (int): finished episodes averaged in ``train/reward``. Defaults to
            20.
        return_key, done_key: where the returns and the episode ends are.
    """

    def __init__(
        self,
        window: int = 20,
        return_key=("next", "episode_reward"),
        done_key=("next", "done"),
    ) -> None:
        self.recent = deque(maxlen=window)
        self.return_key, self.done_key = return_key, done_key
        self._trainer: Trainer | None = None
        self._last = (None, 0)  # (time, frames) at the previous batch

    def _episodes(self, batch: TensorDictBase | None) -> dict[str, Any] | None:
        if batch is None:  # the collector writes to a replay buffer itself
            return None
        ends, returns = batch.get(self.done_key, None), batch.get(self.return_key, None)
        if ends is None or returns is None:
            return None
        finished = returns[ends].flatten().tolist()
        self.recent.extend(finished)
        if not self.recent:
            return None
        mean = sum(self.recent) / len(self.recent)
        return {"train/reward": mean, "log_pbar": True}

    def _pace(self, batch: TensorDictBase | None) -> dict[str, Any]:
        trainer, now = self._trainer, time.perf_counter()
        then, frames = self._last
        self._last = (now, trainer.collected_frames)
        out = {}
        ends = None if batch is None else batch.get(self.done_key, None)
        if ends is not None:
            out["train/episodes"] = int(ends.sum())
        if then is not None:
            out["time/fps"] = (trainer.collected_frames - frames) / (now - then)
        return out

    def _start(self) -> None:
        self._last = (time.perf_counter(), self._trainer.collected_frames)

    def register(self, trainer: Trainer, name: str = "training_log") -> None:
        self._trainer = trainer
        trainer.register_op("setup", self._start)
        trainer.register_op("pre_steps_log", self._episodes)
        trainer.register_op("post_steps_log", self._pace)
        trainer.register_module(name, self)

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.recent.clear()
        self.recent.extend(state_dict["recent"])
