"""ACER's run guarantees as :class:`~torchrl.trainers.TrainerHookBase` s that any
TorchRL :class:`~torchrl.trainers.Trainer` can register."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

__all__ = [
    "NonFiniteTrainingError",
    "RunDirInUseError",
    "VersionedPolicy",
    "lock_run_dir",
]


class _Version(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("version", torch.zeros((), dtype=torch.long))


class VersionedPolicy(TensorDictModuleBase):
    """A collector worker's policy: ``policy``, and the version of its weights,
    written under ``"policy_version"`` with every action it takes.

    The version is pushed with the weights (:meth:`ACERTrainer._push_policy_weights`
    sends :meth:`weights`), so a step's version is that of the weights that chose
    its action and computed its stored log-probabilities. (TorchRL's
    ``track_policy_version`` tags steps from an environment transform, which can
    be one step off the weights around an update.)

    Weights may land while the policy acts: TorchRL's multi-process scheme
    applies them from a background thread of the worker. So the version is
    written twice, ``begin`` before the weights and ``end`` after them (the order
    the weights are copied in: the module's), and a forward that read ``end``
    before and ``begin`` after with the same value used that version's weights
    only; otherwise it runs again (a seqlock).
    """

    def __init__(self, policy):
        super().__init__()
        # registration order is the copy order: begin, the weights, end
        self.begin = _Version()
        self.policy = policy
        self.end = _Version()
        self.in_keys = list(policy.in_keys)
        self.out_keys = [*policy.out_keys, "policy_version"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        for _ in range(1000):
            version = int(self.end.version)
            tensordict = self.policy(tensordict)
            if int(self.begin.version) == version:
                break
        else:  # a writer that never finishes
            raise RuntimeError("the policy's weights kept changing while it acted")
        tensordict.set("policy_version", torch.full(tensordict.batch_size, version))
        return tensordict

    @staticmethod
    def weights(policy_weights: TensorDictBase, version: int) -> TensorDictBase:
        """A :class:`VersionedPolicy`'s weights: ``policy_weights`` (from
        ``TensorDict.from_module(policy)``) at ``version``, in copy order."""
        stamp = TensorDict({"version": torch.tensor(version)}, [])
        return TensorDict(
            {"begin": stamp, "policy": policy_weights, "end": stamp.clone()}, []
        )


class NonFiniteTrainingError(RuntimeError):
    """Training stopped: too many updates (or collected batches) in a row were
    non-finite. The message names the first non-finite term, the frame count and
    what the batch held."""


def _nonfinite_counts(batch: TensorDictBase) -> dict:
    """``{key: number of non-finite values}`` for the floating-point entries of
    ``batch`` that hold any (only computed once something went wrong)."""
    out = {}
    for key, value in batch.items(True, True):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            n = int((~torch.isfinite(value)).sum())
            if n:
                out[key] = n
    return out


def _describe_batch(batch: TensorDictBase) -> str:
    counts = _nonfinite_counts(batch)

    def last(key):
        return key[-1] if isinstance(key, tuple) else key

    rewards = sum(n for k, n in counts.items() if "reward" in last(k))
    observations = sum(
        n for k, n in counts.items() if "observation" in last(k) or "pixels" in last(k)
    )
    detail = ", ".join(f"{k!r}: {n}" for k, n in counts.items())
    return (
        f"{rewards} non-finite rewards and {observations} non-finite observations"
        + (f" (by entry: {detail})" if detail else "")
    )


def _grad_norm(params) -> torch.Tensor:
    """The global gradient norm (what ``clip_grad_norm_`` returns), unclipped."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:  # torch >= 2.6
        return get_total_norm(grads)
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in grads])
    )


def _batch_is_finite(batch: TensorDictBase) -> bool:
    """One reduction over the floating-point entries and one read-back."""
    flags = [
        torch.isfinite(value).all()
        for value in batch.values(True, True)
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    return not flags or bool(torch.stack(flags).all())


class RunDirInUseError(RuntimeError):
    """Another process holds the run directory (:func:`lock_run_dir`)."""


# the run directories this process holds, by resolved path: the open descriptors
# carry the locks, released when the process ends, however it ends
_RUN_DIR_LOCKS: dict[Path, int] = {}


def lock_run_dir(run_dir: str | os.PathLike) -> None:
    """Takes an exclusive lock on ``run_dir`` (made if missing) for the rest of this
    process, or raises :class:`RunDirInUseError` if another process has it.

    Why: a run resumed while its first process still trains would cut the CSV logs
    back to its checkpoint and write its own checkpoints over the other's, and each
    process's summary would be made from the other's rows. The lock is an
    ``flock`` on the directory itself (nothing is written into it), which the
    system drops when the holding process exits, even killed: no stale lock is
    left to clear. Taking it again in the process that holds it does nothing (a
    resume in the same process). Where ``fcntl`` is missing (Windows) there is no
    lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return
    path = Path(run_dir).resolve()
    if path in _RUN_DIR_LOCKS:
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirInUseError(
            f"run directory {path} is in use by another training process; two "
            f"runs writing one directory would overwrite each other's logs and "
            f"checkpoints. Wait for it to end or stop it, or pass another "
            f"logger.run_dir."
        ) from None
    _RUN_DIR_LOCKS[path] = fd
