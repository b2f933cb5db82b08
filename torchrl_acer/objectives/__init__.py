"""What goes upstream as ``torchrl/objectives``: the ACER loss and the Retrace estimator.

This subpackage depends on torch, tensordict, torchrl and :mod:`torchrl_acer.modules`
only; the training application (:mod:`torchrl_acer.training`) is built on top of it.
"""

from torchrl_acer.objectives.acer import ACERLoss
from torchrl_acer.objectives.value import (
    RetraceEstimator,
    retrace_lambda_return_estimate,
)

__all__ = [
    "ACERLoss",
    "RetraceEstimator",
    "retrace_lambda_return_estimate",
]
