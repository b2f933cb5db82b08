"""``ValueEstimators.Retrace``, here and upstream.

Upstream, ``Retrace`` is a member of TorchRL's
``torchrl.objectives.utils.ValueEstimators``, with its defaults in
``_BUILTIN_VALUE_ESTIMATOR_DEFAULTS`` (``tools/upstream_patch.py`` writes both and
imports ``ValueEstimators`` from there in place of this module). A TorchRL
release without the member gets a stand-in enum holding ``Retrace`` alone, which
TorchRL's registry (``register_value_estimator``, ``dispatch_value_estimator``,
``default_value_kwargs``) accepts as it accepts any enum: TorchRL's own enum
cannot be extended from outside.
"""

from __future__ import annotations

from enum import Enum

from torchrl.objectives.utils import ValueEstimators as _TorchRLValueEstimators

__all__ = ["ValueEstimators"]

if hasattr(_TorchRLValueEstimators, "Retrace"):
    ValueEstimators = _TorchRLValueEstimators
else:

    class ValueEstimators(Enum):
        """The value estimators ACER adds to TorchRL's (``"retrace"`` selects it)."""

        Retrace = "Retrace(lambda)"
