"""ACER (Actor-Critic with Experience Replay) and Retrace for TorchRL.

Layout, the core (objectives, modules) importing only itself:

- :mod:`torchrl_acer.training`: the application (the examples' shared plumbing,
  environments, Atari, frame-lean replay, plots);
- :mod:`torchrl_acer.trainers`: ACER's trainer and its hooks, laid out as TorchRL's
  ``torchrl/trainers`` (the greedy evaluator resets environments with the
  application's helper, and checkpoint errors are its refusals);
- :mod:`torchrl_acer.objectives`: the loss and the value estimator, laid out as
  TorchRL's ``torchrl/objectives``;
- :mod:`torchrl_acer.modules`: networks (the stochastic dueling critic, model builders).
"""

from torchrl_acer.modules import PlainQCritic, StochasticDuelingNetwork
from torchrl_acer.objectives import (
    ACERLoss,
    RetraceEstimator,
    retrace_lambda_return_estimate,
)
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer

__all__ = [
    "ACERLoss",
    "FrameStackReplayBuffer",
    "PlainQCritic",
    "RetraceEstimator",
    "StochasticDuelingNetwork",
    "retrace_lambda_return_estimate",
]
