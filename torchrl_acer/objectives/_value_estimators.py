"""``ValueEstimators.Retrace``, here and upstream.

Upstream, ``Retrace`` is a member of TorchRL's ``ValueEstimators`` (written by
``tools/upstream_patch.py``). A TorchRL release without it gets a stand-in enum
holding ``Retrace`` alone, which TorchRL's registry accepts as any enum: TorchRL's
own enum cannot be extended from outside.
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
