"""Moved to :mod:`torchrl_acer.training.plot`; this path is an alias of it."""

from torchrl_acer._compat import alias_moved_module

if __name__ == "__main__":  # python -m torchrl_acer.plot, the 0.1 spelling
    from torchrl_acer.training.plot import main

    main()
else:
    alias_moved_module(__name__, "torchrl_acer.training.plot")
