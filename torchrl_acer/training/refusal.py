"""Refusals: errors whose one message is the whole story for the user.

A run refused for a reason the user can fix (a setting that cannot work, a
corrupted or foreign checkpoint, a config that differs on resume, an environment
the example cannot train, a run directory in use) raises a :class:`Refusal`
whose message names the setting, file or directory and what would work. The
examples end such a run with that message alone on stderr and exit status 1
(:func:`report_refusals`); any other exception is a bug and keeps its traceback.
``HYDRA_FULL_ERROR=1`` (Hydra's own switch) shows the traceback of a refusal too.
"""

from __future__ import annotations

import functools
import os
import sys

__all__ = ["ConfigError", "Refusal", "report_refusals"]


class Refusal(Exception):
    """Marker base of the errors that refuse a run, naming why and what to do.

    Used as a mixin next to the builtin error it is (``ValueError`` for a bad
    value, ``RuntimeError`` for a directory in use), so that code catching those
    keeps working."""


class ConfigError(Refusal, ValueError):
    """A setting (or an environment a setting names) that cannot work; the
    message names the key, its value and what it must be."""


def _refusals() -> tuple[type, ...]:
    # the run-directory refusals of the trainer hooks, which any TorchRL trainer
    # uses, cannot derive from this application's marker
    # nor can TorchRL's checkpoint errors (a corrupted or foreign checkpoint)
    from torchrl.checkpoint import CheckpointError

    from torchrl_acer.trainers.hooks import RunDirectoryOwnedError, RunDirInUseError

    return Refusal, RunDirInUseError, RunDirectoryOwnedError, CheckpointError


def _debugging() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def report_refusals(main):
    """Decorates an example's ``main(cfg)``: a :class:`Refusal` ends the process
    with its message on stderr and exit status 1, without Hydra's "Error
    executing job" and traceback around it (``HYDRA_FULL_ERROR=1`` keeps them).
    Other exceptions pass through unchanged.

    Put it under ``@hydra.main`` (Hydra finds the config next to the decorated
    function through ``__wrapped__``)."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as err:
            if not isinstance(err, _refusals()) or _debugging():
                raise
            sys.stdout.flush()  # what the run printed before, then the refusal
            print(err, file=sys.stderr, flush=True)
            # SystemExit is no Exception: Hydra's job runner lets it through
            raise SystemExit(1) from None

    return run
