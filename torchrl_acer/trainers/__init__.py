"""ACER's trainer and the hooks it is made of, laid out as TorchRL's ``torchrl/trainers``.

The hooks (non-finite guard, policy versions, graceful stop, failure checkpoint,
run-directory ownership) are :class:`~torchrl.trainers.TrainerHookBase` s that any
TorchRL :class:`~torchrl.trainers.Trainer` can register.
"""

from torchrl_acer.trainers.acer import (
    ACERTrainer,
    ACERUpdateSchedule,
    make_segment_replay_buffer,
)
from torchrl_acer.trainers.checkpoint import ACERCheckpoint, SaveEvery
from torchrl_acer.trainers.evaluation import Evaluation, GreedyEvaluator
from torchrl_acer.trainers.hooks import (
    FailureCheckpoint,
    GracefulStop,
    NonFiniteGuard,
    PolicyVersion,
    RunDirectoryLock,
)
from torchrl_acer.trainers.progress import TrainingLog

__all__ = [
    "ACERCheckpoint",
    "ACERTrainer",
    "ACERUpdateSchedule",
    "Evaluation",
    "FailureCheckpoint",
    "GracefulStop",
    "GreedyEvaluator",
    "NonFiniteGuard",
    "PolicyVersion",
    "RunDirectoryLock",
    "SaveEvery",
    "TrainingLog",
    "make_segment_replay_buffer",
]
