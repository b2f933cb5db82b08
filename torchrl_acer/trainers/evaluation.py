"""Evaluation on a schedule of frames, as a hook any TorchRL ``Trainer`` registers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchrl.trainers.trainers import Trainer, TrainerHookBase

__all__ = ["Evaluation", "next_multiple"]


def next_multiple(frames: int, interval: int) -> int:
    """The first multiple of ``interval`` after ``frames``: a schedule on multiples
    holds whatever the batch size, and across a resume."""
    return (frames // interval + 1) * interval


class Evaluation(TrainerHookBase):
    """Runs ``evaluate`` every ``interval`` frames and once at the end, and logs it.

    The schedule is in collected frames, on multiples of ``interval`` whatever the
    batch size, so that runs with other batch sizes (or resumed ones) evaluate at
    the same points. The results go straight to the trainer's logger under
    ``prefix`` against the frame count (not through ``Trainer._log``, whose
    ``log_interval`` would drop evaluations that come more often), and the last
    one is kept in :attr:`last` (with its ``"frames"``) for a final summary.

    Args:
        evaluate: returns a mapping of scalars, e.g. a
            :class:`~torchrl_acer.training.trainer.GreedyEvaluator` (each
            environment copy's first greedy episode) or
            ``torchrl.collectors.Evaluator(...).evaluate``.
        interval (int, optional): frames between evaluations; ``None``: at the
            end only.

    Keyword Args:
        prefix (str): of the logged names. Defaults to ``"eval/"``.
        at_end (bool): evaluate when training ends (the trainer's ``shutdown``
            stage), unless an evaluation was made at the last frame count.
            Defaults to ``True``.

    Registered at ``post_steps_log`` (after each batch's updates) and
    ``shutdown``; its schedule and last result are in its state dict.
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
            self.next_frames = next_multiple(frames, self.interval)
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
