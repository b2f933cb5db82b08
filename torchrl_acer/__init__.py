"""ACER (Actor-Critic with Experience Replay) and Retrace for TorchRL."""

from torchrl_acer.frame_replay import FrameStackReplayBuffer
from torchrl_acer.functional import retrace_lambda_return_estimate
from torchrl_acer.loss import ACERLoss
from torchrl_acer.retrace import ACERValueEstimators, RetraceEstimator
from torchrl_acer.sdn import PlainQCritic, StochasticDuelingNetwork

__all__ = [
    "ACERLoss",
    "ACERValueEstimators",
    "FrameStackReplayBuffer",
    "PlainQCritic",
    "RetraceEstimator",
    "StochasticDuelingNetwork",
    "retrace_lambda_return_estimate",
]
