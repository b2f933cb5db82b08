"""The training application: the examples' shared plumbing, environments, replay, plots.

It imports :mod:`torchrl_acer.objectives` and :mod:`torchrl_acer.modules`; they never
import it. Its modules are imported one by one (the examples' plumbing needs the
``examples`` extra).
"""
