"""The Retrace value estimator and its functional core (``torchrl/objectives/value``)."""

from torchrl_acer.objectives.value.functional import retrace_lambda_return_estimate
from torchrl_acer.objectives.value.retrace import RetraceEstimator

__all__ = [
    "RetraceEstimator",
    "retrace_lambda_return_estimate",
]
