"""Old module paths kept as aliases of the modules that moved (0.1 had a flat package)."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias_moved_module(old_name: str, new_name: str) -> None:
    """Make ``old_name`` the module ``new_name`` in ``sys.modules``, with a warning.

    Called from the module at the old path while it is being imported: the import
    system then hands out the moved module itself, so classes, private helpers and
    monkeypatching all stay one object whichever path a user imports.
    """
    warnings.warn(
        f"{old_name} moved to {new_name}; import it from there",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old_name] = importlib.import_module(new_name)
