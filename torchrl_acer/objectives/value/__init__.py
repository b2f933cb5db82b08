"""The Retrace value estimator and its functional core (``torchrl/objectives/value``)."""

from torchrl_acer.objectives.value.functional import retrace_lambda_return_estimate
from torchrl_acer.objectives.value.retrace import ACERValueEstimators, RetraceEstimator

__all__ = [
    "ACERValueEstimators",
    "RetraceEstimator",
    "retrace_lambda_return_estimate",
]
