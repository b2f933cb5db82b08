"""Networks: ACER's stochastic dueling critic and the model builders of the examples."""

from torchrl_acer.modules.sdn import PlainQCritic, StochasticDuelingNetwork

__all__ = ["PlainQCritic", "StochasticDuelingNetwork"]
