"""ACER's trainer and the hooks it is made of, laid out as TorchRL's ``torchrl/trainers``.

The hooks (non-finite guard, policy versions, graceful stop, failure checkpoint,
run-directory ownership) are :class:`~torchrl.trainers.TrainerHookBase` s that any
TorchRL :class:`~torchrl.trainers.Trainer` can register.
"""

from torchrl_acer.trainers.acer import ACERTrainer, ACERUpdateSchedule
from torchrl_acer.trainers.checkpoint import ACERCheckpoint
from torchrl_acer.trainers.evaluation import Evaluation
from torchrl_acer.trainers.hooks import (
    FailureCheckpoint,
    GracefulStop,
    NonFiniteGuard,
    PolicyVersion,
    RunDirectoryLock,
)

__all__ = [
    "ACERCheckpoint",
    "ACERTrainer",
    "ACERUpdateSchedule",
    "Evaluation",
    "FailureCheckpoint",
    "GracefulStop",
    "NonFiniteGuard",
    "PolicyVersion",
    "RunDirectoryLock",
]
