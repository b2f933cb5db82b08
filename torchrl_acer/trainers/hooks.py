"""ACER's run guarantees as TorchRL trainer hooks.

Each is a :class:`~torchrl.trainers.TrainerHookBase` that any TorchRL
:class:`~torchrl.trainers.Trainer` (``PPOTrainer``, ``DQNTrainer``, ACER's own)
registers as it registers TorchRL's ``UpdateWeights``:

- :class:`NonFiniteGuard`: non-finite updates and batches skipped and counted,
  too many in a row stop training, non-finite parameters never saved;
- :class:`PolicyVersion`: versioned weight pushes, each batch's policy lag
  measured, logged and bounded;
- :class:`GracefulStop`: a stop signal ends training at an iteration boundary,
  with a checkpoint;
- :class:`FailureCheckpoint`: an error saves what was trained, then goes on;
- :class:`RunDirectoryLock`: one process and one run per run directory.

Where the trainer has no stage for a guarantee (around ``train``, a save, an
update), ``register`` wraps the trainer's method on the instance
(:func:`_around`): hooks registered later wrap those registered earlier, and the
class is left alone. Hooks with no state are not the trainer's modules and, as
TorchRL's ``TargetNetUpdaterHook``, define no ``state_dict``.

Examples:
    >>> import tempfile, warnings
    >>> import torch
    >>> from tensordict.nn import TensorDictModule
    >>> from torchrl.checkpoint import Checkpoint
    >>> from torchrl.collectors import Collector
    >>> from torchrl.envs import GymEnv
    >>> from torchrl.modules import ProbabilisticActor, ValueOperator
    >>> from torchrl.objectives import ClipPPOLoss
    >>> from torchrl.trainers.algorithms import PPOTrainer
    >>> env = GymEnv("CartPole-v1")
    >>> actor = ProbabilisticActor(
    ...     TensorDictModule(torch.nn.Linear(4, 2), ["observation"], ["logits"]),
    ...     in_keys=["logits"], distribution_class=torch.distributions.Categorical,
    ...     spec=env.action_spec, return_log_prob=True)
    >>> critic = ValueOperator(torch.nn.Linear(4, 1), in_keys=["observation"])
    >>> policy = VersionedPolicy(actor)  # writes "policy_version" with each step
    >>> loss = ClipPPOLoss(actor, critic)
    >>> run_dir = tempfile.mkdtemp()
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")  # PPOTrainer is a prototype
    ...     trainer = PPOTrainer(
    ...         collector=Collector(env, policy, frames_per_batch=32, total_frames=-1),
    ...         total_frames=64, frame_skip=1, optim_steps_per_batch=1,
    ...         loss_module=loss, optimizer=torch.optim.Adam(loss.parameters()),
    ...         progress_bar=False, checkpoint=Checkpoint(),
    ...         save_trainer_file=f"{run_dir}/checkpoint")
    >>> RunDirectoryLock().register(trainer)
    >>> NonFiniteGuard(max_in_a_row=10).register(trainer)
    >>> PolicyVersion(max_policy_lag=8).register(trainer)
    >>> FailureCheckpoint().register(trainer)
    >>> stop = GracefulStop()
    >>> stop.register(trainer)
    >>> trainer.train()
    >>> trainer.collected_frames, stop.exit_code  # sys.exit(stop.exit_code)
    (64, 0)
"""

from __future__ import annotations

import functools
import math
import os
import re
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl._utils import logger as torchrl_logger
from torchrl.trainers.trainers import (
    DefaultOptimizationStepper,
    Trainer,
    TrainerHookBase,
    UpdateWeights,
)

__all__ = [
    "FailureCheckpoint",
    "GracefulStop",
    "NonFiniteGuard",
    "NonFiniteTrainingError",
    "PolicyInputCheck",
    "PolicyVersion",
    "RunDirInUseError",
    "RunDirectoryLock",
    "RunDirectoryOwnedError",
    "STOP_SIGNALS",
    "VersionedPolicy",
    "batch_accepted",
    "lock_run_dir",
]


class _Version(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("version", torch.zeros((), dtype=torch.long))


class VersionedPolicy(TensorDictModuleBase):
    """A collector worker's policy: ``policy``, writing the version of its weights
    under ``"policy_version"`` with every action it takes.

    The version travels with the weights (:meth:`weights`), so a step's version
    is that of the weights that chose its action (TorchRL's
    ``track_policy_version`` transform can be one step off around an update).
    TorchRL's multi-process scheme applies weights from a background thread
    while the policy acts: the version is written before (``begin``) and after
    (``end``) the weights, and a forward that did not read the same version in
    both runs again (a seqlock).
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
    """Training stopped on non-finite values; the message names them.

    Too many non-finite updates or batches in a row, or a save or an action
    refused on non-finite values.
    """


def nonfinite_counts(state: Any, prefix: str = "") -> dict[str, int]:
    """``{dotted name: count}`` of the NaNs and infinities in ``state``.

    Only the floating tensors holding any, of ``state`` (a tensor, or nested
    mappings, sequences and tensordicts). One read-back per tensor: for naming
    what went wrong, or for a rare save.
    """
    if isinstance(state, torch.Tensor):
        if not (state.is_floating_point() or state.is_complex()):
            return {}
        count = int((~torch.isfinite(state)).sum())
        return {prefix: count} if count else {}
    if isinstance(state, TensorDictBase):
        state = state.to_dict()
    if isinstance(state, Mapping):
        items = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return {}
    out = {}
    for key, value in items:
        out.update(nonfinite_counts(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _entry_counts(batch: TensorDictBase) -> dict:
    """``{key: count}`` of the NaNs and infinities in ``batch``'s entries.

    By the tensordict's own keys (tuples for nested ones), for those holding any.
    """
    counts = {}
    for key, value in batch.items(True, True):
        if count := sum(nonfinite_counts(value).values()):
            counts[key] = count
    return counts


def _describe_batch(batch: TensorDictBase) -> str:
    counts = _entry_counts(batch)

    def total(*words):
        last = [(k[-1] if isinstance(k, tuple) else k, n) for k, n in counts.items()]
        return sum(n for k, n in last if any(w in k for w in words))

    detail = ", ".join(f"{k!r}: {n}" for k, n in counts.items())
    return (
        f"{total('reward')} non-finite rewards and "
        f"{total('observation', 'pixels')} non-finite observations"
        + (f" (by entry: {detail})" if detail else "")
    )


def _batch_is_finite(batch: TensorDictBase) -> bool:
    """One reduction over the floating-point entries and one read-back."""
    flags = [
        torch.isfinite(value).all()
        for value in batch.values(True, True)
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    return not flags or bool(torch.stack(flags).all())


def first_few(items: list[str], limit: int, sep: str = ", ") -> str:
    """The first ``limit`` of ``items`` joined by ``sep``, and how many more.

    The count is on a line of its own when ``sep`` starts lines.
    """
    more = len(items) - limit
    if more <= 0:
        return sep.join(items)
    tail = f"{sep}... and {more} more" if "\n" in sep else f" and {more} more"
    return sep.join(items[:limit]) + tail


class RunDirInUseError(RuntimeError):
    """Another process holds the run directory (:func:`lock_run_dir`)."""


# the run directories this process holds, by resolved path: the open descriptors
# carry the locks, released when the process ends, however it ends
_RUN_DIR_LOCKS: dict[Path, int] = {}


def lock_run_dir(run_dir: str | os.PathLike) -> None:
    """Takes an exclusive lock on ``run_dir`` (made if missing) for the rest of this
    process, or raises :class:`RunDirInUseError` if another process has it.

    The lock is an ``flock`` on the directory itself, which the system drops when
    the process exits, even killed: no stale lock to clear. Taking it again in the
    holder does nothing (a resume in the same process); without ``fcntl``
    (Windows) there is no lock."""
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
            f"checkpoints. Wait for it to end or stop it, or use another run "
            f"directory (logger.run_dir in the examples)."
        ) from None
    _RUN_DIR_LOCKS[path] = fd


def _around(trainer: Trainer, name: str, around: Callable) -> None:
    """Replaces ``trainer.<name>`` on the instance by ``around(inner, *args)``.

    ``inner`` is the method as it was (perhaps wrapped by another hook).
    """
    inner = getattr(trainer, name)

    @functools.wraps(inner)
    def wrapped(*args, **kwargs):
        return around(inner, *args, **kwargs)

    setattr(trainer, name, wrapped)


def _train_only_accepted(trainer: Trainer, hook) -> None:
    """Gives ``hook`` a say in whether the trainer trains on a collected batch.

    A batch is refused when the ``batch_ok`` of any hook registered here is false
    after ``batch_process``: the trainer's ``optim_steps`` is skipped (no updates
    on it, no replay storage at ``pre_epoch``), and a hook storing at
    ``batch_process`` (ACER's schedule) asks :func:`batch_accepted`.
    """
    checks = trainer.__dict__.setdefault("_batch_checks", [])
    if not checks:

        def optim_steps(inner, batch):
            if batch_accepted(trainer):
                inner(batch)

        _around(trainer, "optim_steps", optim_steps)
    checks.append(hook)


def batch_accepted(trainer: Trainer) -> bool:
    """Whether every hook judging the last collected batch accepted it."""
    return all(hook.batch_ok for hook in trainer.__dict__.get("_batch_checks", ()))


def _updates(trainer: Trainer) -> int:
    """The learner's optimizer steps: the stepper's count when it keeps one (it
    leaves skipped updates out), else the trainer's count of update iterations."""
    count = getattr(trainer.optimization_stepper, "optimizer_step_count", None)
    return trainer._optim_count if count is None else count


def _checkpoint_path(trainer: Trainer) -> Path | None:
    """Where the trainer's saves go (its rotation's newest, with a rotation)."""
    if trainer.checkpoint_rotation is not None:
        return trainer.checkpoint_rotation.latest()
    if trainer.save_trainer_file is not None:
        return Path(trainer.save_trainer_file)
    return None


class NonFiniteGuard(DefaultOptimizationStepper):
    """Skips non-finite updates, stops a run that stays non-finite, never saves them.

    One optimizer step on a NaN (a broken environment's reward, an overflow in a
    loss term) makes the parameters NaN for good, and every checkpoint after it.
    As the trainer's ``optimization_stepper`` this steps as TorchRL's
    :class:`~torchrl.trainers.DefaultOptimizationStepper` does, but skips an
    update whose ``loss_*`` terms or gradient norm are not finite: no optimizer
    step, no ``post_loss`` hooks (replay priorities), no ``post_optim`` hooks (a
    target network's ``SoftUpdate``). A collected batch non-finite where the loss
    reads (its ``in_keys``) is neither trained on nor stored in replay.

    Both are counted (``train/nonfinite_updates``, ``train/nonfinite_batches``,
    logged and checkpointed with :attr:`optimizer_step_count`), the first of a
    streak is warned naming what was non-finite, and the ``max_in_a_row``-th in
    a row raises :class:`NonFiniteTrainingError`, the parameters those of the
    last finite update (which a :class:`FailureCheckpoint` saves). A save while a
    parameter or an optimizer state is non-finite raises it too, naming them,
    and keeps the previous checkpoint.

    Args:
        max_in_a_row (int, optional): non-finite updates (or batches) in a row
            that stop training. Defaults to 10.
    """

    def __init__(self, max_in_a_row: int = 10) -> None:
        if not max_in_a_row >= 1:
            raise ValueError(f"max_in_a_row must be >= 1, got {max_in_a_row}")
        super().__init__()
        self.max_in_a_row = max_in_a_row
        self.nonfinite = {"updates": 0, "batches": 0}
        self.optimizer_step_count = 0
        self._streak = {"updates": 0, "batches": 0}
        self._first = {"updates": None, "batches": None}  # each streak's first
        self._applied = True
        #: whether the last collected batch was finite where the loss reads
        self.batch_ok = True

    def register(self, trainer: Trainer, name: str = "optimization_stepper") -> None:
        if trainer.optimization_stepper not in (None, self):
            raise ValueError(
                f"the trainer already has an optimization_stepper "
                f"({type(trainer.optimization_stepper).__name__}); NonFiniteGuard "
                f"takes the optimizer step itself and would replace it"
            )
        if trainer.optimizer is None or trainer.learner_backend != "local":
            raise ValueError(
                "NonFiniteGuard steps the trainer's optimizer in this process: it "
                f"needs one (got {trainer.optimizer}) and learner_backend='local' "
                f"(got {trainer.learner_backend!r})"
            )
        trainer.optimization_stepper = self
        super().register(trainer, name)
        _around(trainer, "_post_optim_hook", self._post_optim)
        _around(trainer, "_save_trainer", self._save)
        # TorchRL runs batch_process on collected batches only: none when the
        # collector writes to a replay buffer itself
        trainer.register_op("batch_process", self._check_batch)
        _train_only_accepted(trainer, self)
        trainer.register_op("post_steps_log", self._log)

    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        losses = trainer.compute_loss(sub_batch)
        terms = {k: v for k, v in losses.items() if k.startswith("loss")}
        if not terms:
            raise RuntimeError(
                f"the loss module returned no 'loss_*' term (keys: "
                f"{list(losses.keys())}): NonFiniteGuard has nothing to optimize"
            )
        unreduced = {k: tuple(v.shape) for k, v in terms.items() if v.numel() != 1}
        if unreduced:
            raise RuntimeError(
                f"the loss module returned terms that are not reduced to one "
                f"number ({unreduced}): a trainer steps on a scalar loss; build the "
                f"loss with reduction='mean' (the default) or 'sum'"
            )
        optimizer = trainer.optimizer
        optimizer.zero_grad(set_to_none=True)
        sum(terms.values()).backward()
        grad_norm = self._compute_and_clip_grad_norm(
            optimizer, trainer.clip_grad_norm, trainer.clip_norm
        )
        checked = torch.cat([v.detach().reshape(-1).float() for v in terms.values()])
        self._applied = math.isfinite(grad_norm) and bool(torch.isfinite(checked).all())
        if self._applied:
            trainer._post_loss_hook(sub_batch)  # priorities from finite updates only
            optimizer.step()
            self.optimizer_step_count += 1
        optimizer.zero_grad(set_to_none=True)
        self._event(
            "updates",
            self._applied,
            lambda: self._describe_update(terms, grad_norm, sub_batch),
        )
        out = losses.detach()
        out["grad_norm"] = torch.tensor(grad_norm)
        return out

    def _event(self, kind: str, finite: bool, describe: Callable[[], str]) -> None:
        """Counts a non-finite update or batch (``kind``).

        Warns at the first of a streak, and raises at the ``max_in_a_row``-th in
        a row.
        """
        if finite:
            self._streak[kind] = 0
            return
        self.nonfinite[kind] += 1
        self._streak[kind] += 1
        if self._streak[kind] == 1:
            self._first[kind] = describe()
            what = "update skipped" if kind == "updates" else "batch not trained on"
            warnings.warn(
                f"non-finite {what}: {self._first[kind]}", RuntimeWarning, stacklevel=3
            )
        if self._streak[kind] >= self.max_in_a_row:
            what = "updates" if kind == "updates" else "collected batches"
            raise NonFiniteTrainingError(
                f"{self._streak[kind]} {what} in a row were non-finite "
                f"(max_in_a_row={self.max_in_a_row}); stopped at "
                f"{self._trainer.collected_frames} frames. The first of them: "
                f"{self._first[kind]}. No optimizer step was taken on them: the "
                f"parameters are those of the last finite update"
            )

    def _read(self, batch: TensorDictBase) -> TensorDictBase:
        """What the loss reads of ``batch``: its ``in_keys`` (all when unknown)."""
        keys = getattr(self._trainer.loss_module, "in_keys", None)
        return batch if keys is None else batch.select(*keys, strict=False)

    def _describe_update(self, terms, grad_norm: float, batch) -> str:
        first = f"the gradient norm = {grad_norm}"
        for key, value in terms.items():
            if not bool(torch.isfinite(value.detach()).all()):
                first = f"{key} = {value.detach().float().sum().item()}"
                break
        return (
            f"the update at {self._trainer.collected_frames} frames, first "
            f"non-finite term {first}; its batch held "
            f"{_describe_batch(self._read(batch))}"
        )

    def _check_batch(self, batch: TensorDictBase) -> TensorDictBase:
        read = self._read(batch)
        self.batch_ok = _batch_is_finite(read)
        self._event(
            "batches",
            self.batch_ok,
            lambda: (
                f"the batch collected after {self._trainer.collected_frames} "
                f"frames held {_describe_batch(read)}"
            ),
        )
        return batch

    def _post_optim(self, inner) -> None:
        if self._applied:  # a skipped update moves no target network
            inner()

    def _save(self, inner) -> None:
        trainer = self._trainer
        bad = list(nonfinite_counts(trainer.loss_module.state_dict(), "loss_module"))
        state = trainer.optimizer.state_dict()["state"]  # register required one
        bad += list(nonfinite_counts(state, "optimizer.state"))
        if bad:
            rotation = trainer.checkpoint_rotation
            path = trainer.save_trainer_file if rotation is None else rotation.directory
            raise NonFiniteTrainingError(
                f"refusing to write a checkpoint to {path} at "
                f"{trainer.collected_frames} frames: {first_few(bad, 5)} hold "
                f"non-finite values (the previous checkpoint there, if any, is kept)"
            )
        inner()

    def _log(self, batch) -> dict:
        return {f"train/nonfinite_{kind}": n for kind, n in self.nonfinite.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "nonfinite": dict(self.nonfinite),
            "streak": dict(self._streak),
            "first": dict(self._first),
            "optimizer_step_count": self.optimizer_step_count,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.nonfinite = dict(state_dict["nonfinite"])
        self._streak = dict(state_dict["streak"])
        self._first = dict(state_dict["first"])
        self.optimizer_step_count = state_dict["optimizer_step_count"]


def _lag_bucket(lag: int) -> str:
    """``0``, ``1``, ``2-3``, ``4-7``, ...: the lags logged together."""
    if lag < 2:
        return str(lag)
    low = 1 << (lag.bit_length() - 1)
    return f"{low}-{2 * low - 1}"


class PolicyVersion(TrainerHookBase):
    """Versions the weights pushed to a collector, and measures and bounds each
    batch's policy lag.

    Collectors whose workers act with their own copy of the policy (TorchRL's
    multi-process and Ray collectors) collect with weights some updates behind
    the learner's. ACER's truncated importance weights correct a small lag; a
    batch far behind (a stalled worker) mostly adds variance. A batch's lag is
    the number of learner updates since the weights that acted on its oldest
    step were pushed.

    The collector's policy must be a :class:`VersionedPolicy`, pushed by the
    trainer's :class:`~torchrl.trainers.UpdateWeights` (``PPOTrainer`` and
    ``DQNTrainer`` register one; register yours first) through
    ``policy_weights_getter`` or ``weight_update_map``. Each push then sends
    :meth:`VersionedPolicy.weights` at the next version (a copy, on the CPU:
    workers copy it to wherever their policy acts), and one at ``setup``
    tells the workers' version after a resume too. Each batch's lag is logged
    (``collector/policy_lag``); a batch beyond ``max_policy_lag`` is neither
    trained on nor stored (:func:`batch_accepted`) and is counted
    (``collector/dropped_batches``). The importance ratios of the update on the
    fresh batch, when the stepper returns them, are logged by lag
    (``collector/rho_mean_lag<a-b>``, ``collector/rho_clip_fraction_lag<a-b>``,
    lags bucketed as 0, 1, 2-3, 4-7, ...). The pushes and the count are
    checkpointed.

    Args:
        max_policy_lag (int, optional): the largest lag trained on; ``None``
            bounds nothing. Defaults to ``None``.
    """

    def __init__(self, max_policy_lag: int | None = None) -> None:
        if max_policy_lag is not None and not max_policy_lag >= 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
        self.max_policy_lag = max_policy_lag
        self.dropped_batches = 0
        self.lag: int | None = None  # the last batch's
        self._pushed_at: list[int] = []  # [v]: learner updates when v was pushed
        #: whether the last collected batch is trained on (not beyond the bound)
        self.batch_ok = True
        self._batch = None  # the last collected batch, as the trainer holds it

    def register(self, trainer: Trainer, name: str = "policy_version") -> None:
        self._trainer = trainer
        ops = (*trainer._post_steps_ops, *trainer._post_optim_ops)
        self._update_weights = [
            hook
            for op, _ in ops
            if isinstance(hook := getattr(op, "__wrapped__", op), UpdateWeights)
        ]
        if not self._update_weights:
            raise ValueError(
                "the trainer has no UpdateWeights hook, whose pushes PolicyVersion "
                "versions: register torchrl.trainers.UpdateWeights first"
            )
        for hook in self._update_weights:
            if hook.policy_weights_getter is None and hook.weight_update_map is None:
                raise ValueError(
                    "PolicyVersion versions the weights UpdateWeights pushes to a "
                    "collector: give it a policy_weights_getter or a "
                    "weight_update_map (a sender pushes elsewhere; without either "
                    "the collector pushes its own copy)"
                )
        for collector in {
            id(h.collector): h.collector for h in self._update_weights
        }.values():
            _around(collector, "update_policy_weights_", self._stamped)
        trainer.register_op("setup", self._push)
        # first: before a hook that stores the batch (see batch_ok)
        trainer.register_op("batch_process", self._measure)
        trainer._batch_process_ops.insert(0, trainer._batch_process_ops.pop())
        # last: the batch as the trainer then holds it (ACER's schedule makes it
        # [N, T] segments on the learner's device, another tensordict), to tell
        # the update on it from those on replayed batches
        trainer.register_op("batch_process", self._hold)
        trainer.register_op("pre_steps_log", self._log)
        _train_only_accepted(trainer, self)
        if trainer.optimization_stepper is not None:
            _around(trainer.optimization_stepper, "step", self._step)
        trainer.register_module(name, self)

    def _stamped(self, inner, weights=None, /, *args, **kwargs):
        """The collector's ``update_policy_weights_``, the policy's weights
        versioned (a push of nothing, the collector's own copy, goes through)."""
        weights_dict = kwargs.get("weights_dict")
        if weights_dict is not None and "policy" in weights_dict:
            policy = self._stamp(weights_dict["policy"])
            kwargs["weights_dict"] = {**weights_dict, "policy": policy}
        elif isinstance(weights, (torch.nn.Module, TensorDictBase)):
            weights = self._stamp(weights)
        return inner(*(() if weights is None else (weights,)), *args, **kwargs)

    def _stamp(self, weights: torch.nn.Module | TensorDictBase) -> TensorDictBase:
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights)
        if "begin" in weights.keys():  # a VersionedPolicy's already: restamped
            weights = weights["policy"]
        self._pushed_at.append(_updates(self._trainer))
        # a copy: the pushed tensors may be sent later, or shared with the
        # workers, and must not follow the learner's next updates. On the CPU: a
        # worker process given a GPU learner's tensors opens them through CUDA
        # IPC, starting a CUDA context of its own (a Ray actor without a GPU
        # cannot); its policy copies them to wherever it acts
        weights = weights.data.apply(lambda t: t.to("cpu", copy=True))
        return VersionedPolicy.weights(weights, len(self._pushed_at) - 1)

    def _push(self) -> None:
        for hook in self._update_weights:
            if hook.weight_update_map is not None:
                hook._update_with_map()
            else:
                hook.collector.update_policy_weights_(hook.policy_weights_getter())

    def _measure(self, batch: TensorDictBase) -> TensorDictBase:
        versions = batch.get("policy_version", None)
        if versions is None:
            raise KeyError(
                "the collected batch has no 'policy_version' entry: the "
                "collector's policy must be a VersionedPolicy for PolicyVersion"
            )
        # version v was pushed after _pushed_at[v] learner updates
        oldest = int(versions.min())
        if not 0 <= oldest < len(self._pushed_at):
            raise RuntimeError(
                f"a batch carries policy version {oldest}, but versions 0 to "
                f"{len(self._pushed_at) - 1} only were pushed: the collector was "
                f"given weights by someone else"
            )
        self.lag = _updates(self._trainer) - self._pushed_at[oldest]
        self.batch_ok = self.max_policy_lag is None or self.lag <= self.max_policy_lag
        self.dropped_batches += not self.batch_ok
        return batch

    def _hold(self, batch: TensorDictBase) -> TensorDictBase:
        self._batch = batch
        return batch

    def _step(self, inner, trainer, sub_batch):
        out = inner(trainer, sub_batch)
        if sub_batch is self._batch and self.lag is not None:  # the fresh batch
            bucket = _lag_bucket(self.lag)
            ratios = {
                f"collector/{key}_lag{bucket}": out[key]
                for key in ("rho_mean", "rho_clip_fraction")
                if key in out.keys()
            }
            if ratios:
                trainer._log(**ratios)
        return out

    def _log(self, batch) -> dict:
        if self.lag is None:
            return {}
        return {
            "collector/policy_lag": self.lag,
            "collector/dropped_batches": self.dropped_batches,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "pushed_at": list(self._pushed_at),
            "dropped_batches": self.dropped_batches,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pushed_at = list(state_dict["pushed_at"])
        self.dropped_batches = state_dict["dropped_batches"]


# what ends a training process in ordinary use: Ctrl-C; kill, docker stop,
# systemd, Kubernetes, Slurm's time limit; a closed terminal or ssh session;
# Ctrl-backslash; schedulers' warnings (Slurm's --signal, SGE's -notify); a
# CPU-time limit. Not SIGKILL and SIGSTOP (uncatchable), SIGPIPE (Python ignores
# it) nor SIGALRM (a program's own timers).
_ENDING = "SIGINT SIGTERM SIGHUP SIGQUIT SIGUSR1 SIGUSR2 SIGXCPU".split()
STOP_SIGNALS = tuple(getattr(signal, n) for n in _ENDING if hasattr(signal, n))


class GracefulStop(TrainerHookBase):
    """Stops training at an iteration boundary, with a checkpoint, on the
    signals that end a training process (:data:`STOP_SIGNALS`).

    Without it Ctrl-C raises wherever the loop is, and SIGTERM or SIGHUP kill
    the process: what was trained since the last save is lost. With it, the
    first signal calls ``trainer.request_stop("received SIGxxx")``: the
    iteration under way finishes, TorchRL's ``train`` saves (given a checkpoint
    destination) and returns; :attr:`signum` keeps the signal, for
    ``sys.exit(stop.exit_code)``. A second signal waits for a checkpoint being
    written; at any other time it raises :class:`KeyboardInterrupt` at once,
    saving nothing.

    ``register`` wraps ``train`` (the handlers are installed, main thread only,
    and put back when it returns or raises) and ``_save_trainer`` (to tell a
    save under way). Register a :class:`FailureCheckpoint` before it, so that
    the handlers cover the save after a failure too.

    Examples:
        >>> stop = GracefulStop()
        >>> stop.signum, stop.exit_code  # after train(): sys.exit(stop.exit_code)
        (None, 0)
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saving = False

    @property
    def exit_code(self) -> int:
        """``128 + signum`` when a signal stopped training (as a shell reports a
        process the signal ended), else 0."""
        return 0 if self.signum is None else 128 + self.signum

    def register(self, trainer: Trainer, name: str = "graceful_stop") -> None:
        self._trainer = trainer
        _around(trainer, "train", self._train)
        _around(trainer, "_save_trainer", self._save)

    def _train(self, inner):
        self.signum = None
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            return inner()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _save(self, inner) -> None:
        self._saving = True
        try:
            inner()
        finally:
            self._saving = False

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            self._trainer.request_stop(f"received {name}")
            torchrl_logger.warning(
                f"{name}: stopping after this iteration, with a checkpoint; a "
                f"second signal stops at once, without one"
            )
        elif self._saving:
            torchrl_logger.warning(
                f"{name}: a checkpoint is being written; it is completed first "
                f"(kill -9 would keep the previous one)"
            )
        else:
            raise KeyboardInterrupt(f"{name}: a second signal; stopped without saving")


def _exit_codes(collector) -> list[tuple[int, int]]:
    """``(index, exit code)`` of the collector's worker processes that have exited."""
    exits = []
    for i, proc in enumerate(getattr(collector, "procs", None) or []):
        try:
            if proc.exitcode is not None:
                exits.append((i, proc.exitcode))
        except ValueError:  # closed: one TorchRL terminated
            continue
    return exits


def _worker_failure(err: Exception, collector, pids) -> str | None:
    """The collector worker that died when collecting raised ``err``, or ``None``.

    TorchRL's multi-process collectors, finding a worker dead, terminate the
    others and raise ``RuntimeError("... worker i (exit code c)...")`` (or a
    ``ValueError`` from closing one still exiting); Ray raises an
    ``ActorDiedError`` (a ``RayActorError``)."""
    index = code = None
    found = re.search(r"worker (\d+) \(exit code (-?\d+)\)", str(err))
    if found is not None:
        index, code = int(found.group(1)), int(found.group(2))
    else:
        exits = _exit_codes(collector)
        # a killed worker's pipe can break (BrokenPipeError, a ConnectionError)
        # before its exit is reaped, under load: wait up to 2 s for its exit code
        broken = isinstance(err, (ConnectionError, EOFError))
        if broken and not exits and getattr(collector, "procs", None):
            deadline = time.monotonic() + 2.0
            while not exits and time.monotonic() < deadline:
                time.sleep(0.05)
                exits = _exit_codes(collector)
        # the one that died first, not one TorchRL terminated after it (SIGTERM)
        exits = [e for e in exits if e[1] != -signal.SIGTERM] or exits
        if exits:
            index, code = exits[0]
    if index is not None:
        pid = f", pid {pids[index]}" if index < len(pids) else ""
        how = (
            f"killed by {signal.Signals(-code).name}"
            if code < 0 and -code in signal.valid_signals()
            else f"exit code {code}"
        )
        # TorchRL's class, not a subclass of it (experiment.PatientAsyncCollector)
        kind = next(
            (k for k in type(collector).mro() if k.__module__.startswith("torchrl.")),
            type(collector),
        ).__name__
        return f"collector worker {index} ({kind}{pid}, {how})"
    if any(k.__name__ in ("RayActorError", "ActorDiedError") for k in type(err).mro()):
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"a Ray collector actor ({type(err).__name__}: {first})"
    return None


class FailureCheckpoint(TrainerHookBase):
    """Saves what was trained when training fails, then lets the error go on
    with a note saying where.

    TorchRL's ``train`` handles no error: one while collecting (an environment,
    a dead worker), updating, logging (a full disk) or evaluating loses what was
    trained since the last save. ``register`` wraps ``train``: on an
    :class:`Exception` the trainer saves to its destination (through the save
    wrappers registered before: a :class:`NonFiniteGuard` refuses non-finite
    parameters), leaving out the checkpoint components that cannot save (a
    collector whose environment raised has closed it), and the error goes on
    with a note (``add_note``) naming the dead collector worker if one died,
    the checkpoint and how to resume, or why none was written. Parameters are
    whole between two updates; an error inside an optimizer step may leave them
    half-stepped. A :class:`KeyboardInterrupt` saves nothing.

    Args:
        resume_hint (callable, optional): how to resume from the checkpoint's
            path, as the note says it. Defaults to ``trainer.load_from_file``.
    """

    def __init__(self, resume_hint: Callable[[Path], str] | None = None) -> None:
        self.resume_hint = resume_hint
        self._pids: list[int] = []

    def register(self, trainer: Trainer, name: str = "failure_checkpoint") -> None:
        self._trainer = trainer
        _around(trainer, "train", self._train)

    def _train(self, inner):
        # to name a dead worker by its pid (TorchRL closes the other workers'
        # handles when it finds one dead)
        procs = getattr(self._trainer.collector, "procs", None) or []
        self._pids = [proc.pid for proc in procs]
        try:
            return inner()
        except Exception as err:
            err.add_note(self._save(err))
            raise

    def _save(self, err: Exception) -> str:
        trainer = self._trainer
        failed = f"training failed after {trainer.collected_frames} frames"
        worker = _worker_failure(err, trainer.collector, self._pids)
        if worker is not None:
            failed = (
                f"{worker} died: {failed}; the batches the workers had collected "
                f"but not delivered are lost. Find why it died (out of memory: the "
                f"kernel log; an environment error: the worker's output above)"
            )
        if not trainer._has_checkpoint_destination():
            return (
                f"{failed}; nothing was saved: the trainer has no "
                f"save_trainer_file or checkpoint_rotation"
            )
        left_out = []
        try:
            try:
                trainer._save_trainer()
            except Exception:
                left_out = self._unsaveable()
                if not left_out:
                    raise
                self._save_without(left_out)
        except Exception as err:
            return (
                f"{failed} and no checkpoint could be written "
                f"({type(err).__name__}: {err})"
            )
        path = _checkpoint_path(trainer)
        if self.resume_hint is not None:
            hint = self.resume_hint(path)
        else:
            strict = ", strict='warn'" if left_out else ""
            hint = f"trainer.load_from_file({str(path)!r}{strict})"
        saved = f"what was trained was saved to {path}"
        if left_out:
            saved += f", without {', '.join(left_out)}, which could not be saved"
        return f"{failed}; {saved}. Resume with {hint}"

    def _unsaveable(self) -> list[str]:
        """The trainer's checkpoint components whose ``state_dict`` raises."""
        if self._trainer.checkpoint is None:
            return []
        out = []
        components = self._trainer._sync_checkpoint_components().components
        for name, component in components.items():
            try:
                getattr(component, "state_dict", dict)()
            except Exception:
                out.append(name)
        return out

    def _save_without(self, left_out: list[str]) -> None:
        checkpoint = self._trainer.checkpoint
        default = checkpoint.save_components
        selected = checkpoint.components if default is None else default
        checkpoint.save_components = frozenset(selected).difference(left_out)
        try:
            self._trainer._save_trainer()
        finally:
            checkpoint.save_components = default


class _InputCheck:
    """The policy's forward pre-hook calling :meth:`PolicyInputCheck.check`.

    Copies of the policy (a deepcopy, a pickle sent to a collector's worker
    process) get an inert hook, not a copy of the trainer it would reach: both
    copy :meth:`__getstate__`."""

    def __init__(self, owner):
        self.owner = owner

    def __call__(self, module, args, kwargs):
        if self.owner is not None:
            self.owner.check(module, args, kwargs)

    def __getstate__(self):
        return {"owner": None}


class PolicyInputCheck(TrainerHookBase):
    """Refuses non-finite observations while the policy acts, naming them, and
    keeps what the trainer is doing in :attr:`phase`.

    A policy given a NaN observation fails inside its action distribution or
    picks an arbitrary action, without saying why. With this hook (a forward
    pre-hook on ``policy``) it raises :class:`NonFiniteTrainingError` naming the
    entries and the frames, while collecting or evaluating (the loss's calls, on
    batches a :class:`NonFiniteGuard` checks, are not checked).

    :attr:`phase` is ``"collecting"`` from ``setup`` and after each save,
    ``"training on a batch"`` from ``batch_process``, ``"updating"`` in
    ``optim_steps``, ``"evaluating"`` while ``evaluation`` (an
    :class:`~torchrl_acer.trainers.Evaluation`) runs and ``"saving"`` in
    ``save_trainer``; a call that raises leaves its phase.

    Args:
        policy (nn.Module): the policy that acts (the collector's, the
            evaluator's).
        evaluation (Evaluation, optional): marked ``"evaluating"`` while it runs.
        check (bool): check the policy's inputs; ``False`` keeps the phase only.
            Defaults to ``True``.
    """

    def __init__(self, policy, evaluation=None, check: bool = True) -> None:
        self.policy = policy
        self.evaluation = evaluation
        self.check_inputs = check
        self.phase: str | None = None
        self._trainer: Trainer | None = None

    def register(self, trainer: Trainer, name: str = "policy_input_check") -> None:
        self._trainer = trainer
        if self.check_inputs:
            self.policy.register_forward_pre_hook(_InputCheck(self), with_kwargs=True)
        trainer.register_op("setup", self._enter, phase="collecting")
        # before any batch_process op (a NonFiniteGuard's check raises there)
        batch = "training on a batch"
        _around(trainer, "_process_batch_hook", self._in_phase(batch, after=batch))
        _around(trainer, "optim_steps", self._in_phase("updating"))
        # the next batch is collected next
        _around(trainer, "save_trainer", self._in_phase("saving", after="collecting"))
        if self.evaluation is not None:
            _around(self.evaluation, "_run", self._in_phase("evaluating"))

    def _enter(self, phase) -> None:
        self.phase = phase

    def _in_phase(self, phase, after=None):
        """A wrapper in ``phase``, in ``after`` (the phase before) once it returns."""

        def around(inner, *args, **kwargs):
            previous, self.phase = self.phase, phase
            out = inner(*args, **kwargs)
            self.phase = previous if after is None else after
            return out

        return around

    def check(self, module, args, kwargs) -> None:
        if self.phase not in ("collecting", "evaluating"):
            return
        tensordict = args[0] if args else kwargs.get("tensordict")
        if not isinstance(tensordict, TensorDictBase):
            return
        read = tensordict.select(*module.in_keys, strict=False)
        if _batch_is_finite(read):
            return
        counts = ", ".join(
            f"{key!r}: {n} non-finite values" for key, n in _entry_counts(read).items()
        )
        raise NonFiniteTrainingError(
            f"the policy was given non-finite observations while {self.phase} "
            f"after {self._trainer.collected_frames} frames ({counts}). The "
            f"environment returned them; the policy cannot act on them"
        )


class RunDirectoryOwnedError(RuntimeError):
    """The run directory holds another run (:class:`RunDirectoryLock`)."""


RUN_ID_FILE = "run_id"


class RunDirectoryLock(TrainerHookBase):
    """Owns the run directory: one training process, and one run, at a time.

    A new run in a directory holding another run would write over its
    checkpoint; two processes in one directory over each other's. ``register``,
    before anything is written, takes the directory's lock (:func:`lock_run_dir`)
    and checks the run's identity: a random id, kept in the directory's
    ``run_id`` file and in this hook's state (hence in the checkpoints). A new
    run (``resume=False``) is refused (:class:`RunDirectoryOwnedError`) where
    the directory has a ``run_id`` or the trainer's checkpoint exists, and
    otherwise writes its id. A resumed run takes the directory's id, and
    ``trainer.load_from_file`` refuses a checkpoint of another run; in a
    directory without an id (a checkpoint copied elsewhere) it takes the
    checkpoint's.

    Args:
        run_dir (path, optional): the run's directory. Defaults to where the
            trainer's checkpoints go (``save_trainer_file`` 's parent, or
            ``checkpoint_rotation`` 's directory).
        resume (bool, optional): continue the run in ``run_dir``. Defaults to
            ``False``.
    """

    def __init__(
        self, run_dir: str | os.PathLike | None = None, resume: bool = False
    ) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.resume = resume
        self.run_id: str | None = None

    def register(self, trainer: Trainer, name: str = "run_directory") -> None:
        run_dir = self.run_dir
        if run_dir is None and trainer.checkpoint_rotation is not None:
            run_dir = trainer.checkpoint_rotation.directory
        elif run_dir is None and trainer.save_trainer_file is not None:
            run_dir = Path(trainer.save_trainer_file).parent
        elif run_dir is None:
            raise ValueError(
                "RunDirectoryLock needs a run_dir, or a trainer with a "
                "save_trainer_file or a checkpoint_rotation"
            )
        self.run_dir = run_dir = Path(run_dir).resolve()
        lock_run_dir(run_dir)
        id_file = run_dir / RUN_ID_FILE
        stored = id_file.read_text().strip() if id_file.exists() else None
        found = [p for p in (id_file, _checkpoint_path(trainer)) if p and p.exists()]
        if found and not self.resume:
            raise RunDirectoryOwnedError(
                f"run directory {run_dir} already holds a run "
                f"({', '.join(map(str, found))} exist); a new run would write "
                f"over its checkpoint. Resume it (RunDirectoryLock(resume=True), "
                f"then trainer.load_from_file) or use another directory"
            )
        self.run_id = stored
        if stored is None and not self.resume:
            self._write_id(uuid.uuid4().hex)
        # resumed into a directory of its own (a copied checkpoint): the run's
        # id comes with the checkpoint, in load_state_dict
        trainer.register_module(name, self)

    def _write_id(self, run_id: str) -> None:
        self.run_id = run_id
        id_file = self.run_dir / RUN_ID_FILE
        tmp = id_file.with_name(f".{RUN_ID_FILE}.{os.getpid()}")
        tmp.write_text(run_id + "\n")
        tmp.replace(id_file)

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.run_id is None and state_dict["run_id"] is not None:
            self._write_id(state_dict["run_id"])
        if state_dict["run_id"] != self.run_id:
            raise RunDirectoryOwnedError(
                f"the checkpoint being loaded was written by run "
                f"{state_dict['run_id']}, but run directory {self.run_dir} holds "
                f"run {self.run_id}: loading it would continue another run here"
            )
