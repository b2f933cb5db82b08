"""The training application: trainer, experiment runner, environments, replay, plots.

It imports :mod:`torchrl_acer.objectives` and :mod:`torchrl_acer.modules`; they never
import it. Its modules are imported one by one (the experiment runner needs the
``examples`` extra).
"""
