"""Moved to :mod:`torchrl_acer.modules.models`; this path is an alias of it."""

from torchrl_acer._compat import alias_moved_module

alias_moved_module(__name__, "torchrl_acer.modules.models")
