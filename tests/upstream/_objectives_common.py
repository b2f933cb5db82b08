"""A stand-in for the part of TorchRL's ``test/objectives/_objectives_common.py``
that the upstream tests use, so that they run here against the installed TorchRL,
whose wheel ships no tests. Upstream, the real module is imported instead (this
file is not part of the contribution). Written for this project: the checks say
what TorchRL's base class checks, in our words.
"""

from __future__ import annotations

import copy

import pytest
import torch


class LossModuleTestBase:
    """What every TorchRL loss's test class gets: the keys' contract and
    ``reset_parameters_recursive``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        assert hasattr(cls, "test_reset_parameters_recursive"), (
            f"{cls.__name__} needs a test_reset_parameters_recursive"
        )

    def tensordict_keys_test(self, loss_fn, default_keys, td_est=None):
        """``set_keys`` refuses an unknown key; each key has its default; each
        key, and all of them at once, can be set."""
        with pytest.raises(ValueError):
            copy.deepcopy(loss_fn).set_keys(not_a_key_of_this_loss="x")
        for name, key in default_keys.items():
            assert getattr(loss_fn.tensor_keys, name) == key, name
        for name in default_keys:
            one = copy.deepcopy(loss_fn)
            one.set_keys(**{name: "renamed"})
            assert getattr(one.tensor_keys, name) == "renamed", name
        every = copy.deepcopy(loss_fn)
        every.set_keys(**dict.fromkeys(default_keys, "renamed"))
        for name in default_keys:
            assert getattr(every.tensor_keys, name) == "renamed", name

    @staticmethod
    def reset_parameters_recursive_test(loss_fn):
        """After every parameter of the loss's networks (and their target copies)
        is moved far away, ``reset_parameters_recursive`` changes each again."""
        params = {
            name: module
            for name, module in loss_fn.named_children()
            if name.endswith("_params")
        }
        assert params, "the loss holds no functional parameters"
        with torch.no_grad():
            for module in params.values():
                module.apply(lambda p: p.add_(1000.0))
        before = {name: module.clone() for name, module in params.items()}
        loss_fn.reset_parameters_recursive()
        for name, module in params.items():
            for key, value in module.items(True, True):
                assert (value != before[name][key]).any(), (name, key)
