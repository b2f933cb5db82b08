"""ACER's master loop (Wang et al. 2017, Algorithm 1) on TorchRL pieces.

Collect ``[num_envs, T]`` with a TorchRL collector, make one on-policy update on
the fresh batch, store it in a replay buffer of ``T``-step segments, then make
``n ~ Poisson(replay_ratio)`` off-policy updates on batches of stored segments once
``replay_start`` steps are stored. After every optimizer step the averaged policy
moves towards the current one (:class:`~torchrl.objectives.SoftUpdate`).

The pieces stay the user's: any collector, :class:`~torchrl_acer.ACERLoss`, any
optimizer and TorchRL logger. :class:`ACERTrainer` adds what a training run needs
around them: evaluation, logging, a progress bar and checkpoints.
"""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import threading
import time
import warnings
from collections import defaultdict, deque
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import set_composite_lp_aggregate
from torchrl.collectors import BaseCollector, Collector
from torchrl.data import TensorDictReplayBuffer
from torchrl.objectives import SoftUpdate

from torchrl_acer.objectives.acer import ACERLoss
from torchrl_acer.trainers.acer import (
    as_segments,
    check_update_schedule,
    make_segment_replay_buffer,
    module_device,
    replay_keys,
)
from torchrl_acer.trainers.checkpoint import (  # noqa: F401 (re-exported)
    load_replay_state_dict,
    replay_state_dict,
)
from torchrl_acer.trainers.evaluation import GreedyEvaluator, next_multiple
from torchrl_acer.trainers.hooks import (
    STOP_SIGNALS,
    NonFiniteTrainingError,
    VersionedPolicy,
    _batch_is_finite,
    _describe_batch,
    _grad_norm,
    _lag_bucket,
    _lag_since_push,
    _nonfinite_counts,
    _refuse_nonfinite_save,
    _worker_failure,
    first_few,
)
from torchrl_acer.training.checkpoint import (
    CheckpointError,
    check_config,
    load_payload,
    read_header,
    show_config_change,
    state_dict_mismatches,
    write_checkpoint,
)
from torchrl_acer.training.env_state import (
    collector_state_dict,
    env_state_dict,
    load_collector_state_dict,
    load_env_state_dict,
    restart_episodes,
    resume_seed,
)
from torchrl_acer.training.gym_collector import GymVectorCollector
from torchrl_acer.training.soft_update import ForeachSoftUpdate

__all__ = [
    "ACERTrainer",
    "CollectorWorkerError",
    "VersionedPolicy",
    "GreedyEvaluator",
    "NonFiniteTrainingError",
    "load_replay_state_dict",
    "make_segment_replay_buffer",
    "replay_state_dict",
]


def _resumed_schedule(
    saved: int | None, frames: int, interval: int | None, *, keep_due: bool = False
):
    """When a periodic task (log, evaluation, checkpoint) next runs after resuming
    at ``frames``: the checkpoint's ``saved`` schedule if it is one of
    ``interval``, else the next multiple of ``interval`` (``None`` without one).
    With ``keep_due``, a ``saved`` schedule the run had reached without running
    the task (a signal stopped the evaluation) is kept, so that it runs first."""
    if interval is None:
        return None
    if saved is not None and saved % interval == 0:
        if frames < saved:
            return min(saved, next_multiple(frames, interval))
        if keep_due:
            return saved
    return next_multiple(frames, interval)


class CollectorWorkerError(RuntimeError):
    """Training stopped: a collector worker (a process of a multi-process
    collector, a Ray actor) died. The message names the worker; the trainer's
    state, replay included, is in the checkpoint written before it is raised."""


class _PolicyInputCheck:
    """The actor's forward pre-hook calling :meth:`ACERTrainer._check_policy_inputs`.

    Copies of the actor (a deepcopy, a pickle sent to a collector's worker
    process) get an inert hook, not a copy of the trainer."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __call__(self, module, args, kwargs):
        if self.trainer is not None:
            self.trainer._check_policy_inputs(module, args, kwargs)

    def __getstate__(self):
        return {"trainer": None}

    def __deepcopy__(self, memo):
        return _PolicyInputCheck(None)


class ACERTrainer:
    r"""Trains :class:`~torchrl_acer.ACERLoss` with ACER's replay-ratio loop.

    Keyword Args:
        collector: yields ``[num_envs, T]`` batches (``[T]`` for one environment)
            with the behaviour logits and log-probabilities stored (any TorchRL
            collector running the loss's actor; make it infinite, the trainer counts
            frames itself).
        loss_module (ACERLoss): the loss; its actor is the collector's policy.
        optimizer: over ``loss_module.parameters()``. The loss and the optimizer may
            sit on a GPU: batches (collected and replayed, kept wherever the collector
            and the replay buffer keep them) move to the loss's device for updates.
        total_frames (int): environment steps to collect.
        replay_buffer: from :func:`make_segment_replay_buffer`; ``None`` for
            on-policy training only (then ``replay_ratio`` must be 0).
        replay_ratio (float): mean number of off-policy updates per collected batch
            (Poisson). Defaults to 4.
        replay_start (int): steps stored before off-policy updates start.
        on_policy_updates (bool): make the on-policy update on each fresh batch
            (ACER's discrete setting). ``False`` trains fully off-policy, as the
            paper's continuous-control runs do. Defaults to ``True``.
        target_eps (float): decay of the averaged policy,
            :math:`\theta_{avg} \leftarrow \epsilon \theta_{avg} + (1 - \epsilon)\theta`.
            Defaults to 0.99. Unused when ``target_updater`` is given.
        target_updater (SoftUpdate, optional): the averaged-policy update, stepped
            after every optimizer step; defaults to
            ``SoftUpdate(loss_module, eps=target_eps)``.
        max_grad_norm (float, optional): global gradient-norm clip.
        evaluator (callable, optional): returns ``{"reward": ...}`` (a
            :class:`GreedyEvaluator`); run every ``eval_interval`` frames and at the
            end.
        eval_interval (int, optional): frames between evaluations.
        logger (torchrl Logger, optional): receives every metric against frames.
        log_interval (int): frames between training logs. Defaults to every batch.
        checkpoint_dir (str, optional): where checkpoints go (``last.pt``).
        checkpoint_interval (int, optional): frames between checkpoints; one is also
            written at the end and on Ctrl-C or SIGTERM.
        checkpoint_every_minutes (float, optional): also write one when this many
            minutes have passed since the last (or since :meth:`train` started), so
            that a crash loses bounded work.
        progress_bar (bool): a tqdm bar with frames, recent return and FPS.
        seed (int): seeds the trainer's own draws (the Poisson counts), and the
            fresh episodes a resume starts where the environments' state could not
            be saved (:func:`~torchrl_acer.training.env_state.resume_seed`; what a
            resume did with the environments is in :attr:`resume_notes`).
        episode_return_key: where a finished episode's return is read in a batch.
        episode_end_key: marks the steps where an episode ended.
        check_health (bool): check every update's ``loss_*`` terms and gradient
            norm for non-finite values (one reduction and one read-back per update),
            every collected batch's floating-point entries (on its device, the
            CPU in the examples) and the observations the policy acts on while
            collecting and evaluating (a forward pre-hook on the actor; a
            non-finite one stops the run naming it). A non-finite update is skipped (no optimizer or
            averaged-policy step) and counted (``train/nonfinite_updates``); a
            non-finite batch gets no on-policy update and is not stored in replay
            (``train/nonfinite_batches``). ``False`` skips the checks (to measure
            their cost); a checkpoint is never written from non-finite parameters
            either way. Defaults to ``True``.
        max_nonfinite_in_a_row (int): stop with :class:`NonFiniteTrainingError`,
            naming the first non-finite term, the frames and what the batch held,
            after this many non-finite updates (or batches) in a row. Defaults to
            10.
        config (dict, optional): the run's resolved config, stored in each
            checkpoint's header; :meth:`load_checkpoint` compares it with the
            stored one.
        weight_update_interval (int): collected batches between two pushes of
            the learner's policy weights to a collector whose workers act with
            their own copy (TorchRL's multi-process and Ray collectors:
            ``update_policy_weights_``), each after the batch's updates. An
            in-process :class:`~torchrl.collectors.Collector` acts with the
            learner's own policy and gets none. Defaults to 1.
        max_policy_lag (int, optional): a batch whose policy lag (learner updates
            since the weights that acted on its oldest step were pushed, read
            from the steps' ``"policy_version"``) exceeds this gets no
            on-policy update and is not stored in replay; dropped batches are
            counted (``collector/dropped_batches``). ``None``: no bound. The lag
            and the on-policy update's importance ratios by lag are logged
            (``collector/policy_lag``, ``collector/rho_mean_lag<a-b>``,
            ``collector/rho_clip_fraction_lag<a-b>``) whenever batches carry
            versions.
    """

    def __init__(
        self,
        *,
        collector,
        loss_module: ACERLoss,
        optimizer: torch.optim.Optimizer,
        total_frames: int,
        replay_buffer: TensorDictReplayBuffer | None = None,
        replay_ratio: float = 4.0,
        replay_start: int = 0,
        on_policy_updates: bool = True,
        target_eps: float = 0.99,
        target_updater: SoftUpdate | None = None,
        max_grad_norm: float | None = None,
        evaluator=None,
        eval_interval: int | None = None,
        logger=None,
        log_interval: int = 1,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_interval: int | None = None,
        checkpoint_every_minutes: float | None = None,
        progress_bar: bool = True,
        seed: int = 0,
        episode_return_key=("next", "episode_reward"),
        episode_end_key=("next", "done"),
        check_health: bool = True,
        max_nonfinite_in_a_row: int = 10,
        config: dict | None = None,
        weight_update_interval: int = 1,
        max_policy_lag: int | None = None,
    ):
        if total_frames <= 0:
            raise ValueError(f"total_frames must be positive, got {total_frames}")
        check_update_schedule(
            replay_buffer, replay_ratio, replay_start, on_policy_updates
        )
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm}")
        for name, value in (
            ("eval_interval", eval_interval),
            ("checkpoint_interval", checkpoint_interval),
            ("checkpoint_every_minutes", checkpoint_every_minutes),
            ("log_interval", log_interval),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if eval_interval is not None and evaluator is None:
            raise ValueError("eval_interval is set but there is no evaluator")
        if not weight_update_interval >= 1:
            raise ValueError(
                f"weight_update_interval must be >= 1, got {weight_update_interval}"
            )
        if max_policy_lag is not None and not max_policy_lag >= 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
        if not max_nonfinite_in_a_row >= 1:
            raise ValueError(
                f"max_nonfinite_in_a_row must be >= 1, got {max_nonfinite_in_a_row}"
            )
        self.collector = collector
        self.loss_module = loss_module
        # built now, so that checkpoints can restore its buffers
        loss_module.value_estimator  # noqa: B018
        self.optimizer = optimizer
        if target_updater is None:
            target_updater = ForeachSoftUpdate(loss_module, eps=target_eps)
        self.target_updater = target_updater
        self.replay_buffer = replay_buffer
        self.replay_ratio = replay_ratio
        self.replay_start = replay_start
        self.on_policy_updates = on_policy_updates
        self.max_grad_norm = max_grad_norm
        self.total_frames = total_frames
        self.evaluator = evaluator
        self.eval_interval = eval_interval
        self.logger = logger
        self.log_interval = log_interval
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_interval = checkpoint_interval
        self.checkpoint_every_minutes = checkpoint_every_minutes
        self.check_health = check_health
        self.max_nonfinite_in_a_row = max_nonfinite_in_a_row
        self.config = config
        self.progress_bar = progress_bar
        self.episode_return_key = episode_return_key
        self.episode_end_key = episode_end_key
        self.seed = seed
        self._rng = torch.Generator().manual_seed(seed)
        self._params = [p for p in loss_module.parameters() if p.requires_grad]
        self.device = module_device(loss_module) or torch.device("cpu")

        self.frames = 0
        self.updates = 0
        self.segment_length: int | None = None
        self.recent_returns: deque = deque(maxlen=20)
        self.last_eval: dict | None = None
        self.last_train_log: dict | None = None
        self.last_checkpoint: Path | None = None
        self.interrupted = False
        self.stop_signal: int | None = None  # SIGINT or SIGTERM, when one stopped it
        self.nonfinite_updates = 0  # skipped by the health checks
        self.nonfinite_batches = 0
        self._nonfinite_streaks = {"updates": 0, "batches": 0}
        self._nonfinite_first: dict = {}  # the first of each streak, described
        # "collecting" or "evaluating" while the policy acts: its inputs are checked
        self._acting: str | None = None
        # set when collection failed: the environments' state is not saved then
        self._envs_unsaved_reason: str | None = None
        loss_module.actor_network.register_forward_pre_hook(
            _PolicyInputCheck(self), with_kwargs=True
        )
        self._defer_signals = 0  # > 0: a signal waits (mid-iteration, saving)
        self._collecting_deferred = False
        self._pending_signal: int | None = None
        self._stopping = False
        self._last_save_time = time.monotonic()
        # what load_state_dict did with the environments (restored, or restarted)
        self.resume_notes: list[str] = []
        self._next_log = 0
        self._next_eval = 0 if eval_interval else None
        self._next_checkpoint = checkpoint_interval
        self._metrics: dict = defaultdict(list)
        # Weights go to collectors whose workers act with a copy of the policy
        # (TorchRL's multi-process and Ray collectors); an in-process Collector
        # (TorchRL's, or the lean GymVectorCollector) acts with the learner's own
        # modules.
        self.weight_update_interval = weight_update_interval
        self.max_policy_lag = max_policy_lag
        self._push_weights = isinstance(collector, BaseCollector) and not isinstance(
            collector, (Collector, GymVectorCollector)
        )
        # _pushed_at[v]: the learner's update count when policy version v was
        # pushed; version 0 is the weights the collector was built with
        self._pushed_at: list[int] = [0]
        self._batches_since_push = 0
        self.dropped_batches = 0  # beyond max_policy_lag
        self._worker_pids: list[int] = []

    # -- the loop ------------------------------------------------------------

    def train(self) -> None:
        """Runs until ``total_frames``.

        Ctrl-C (SIGINT) and SIGTERM stop it and write a checkpoint (with a
        ``checkpoint_dir``), then return with :attr:`interrupted` set and
        :attr:`stop_signal` naming the signal. A signal that arrives during an
        iteration's updates waits for the end of the iteration (collection and
        evaluation stop at once); one that arrives while a checkpoint is written
        waits for the file to be complete. The previous handlers come back on
        return.
        """
        self._pending_signal, self._stopping, self.stop_signal = None, False, None
        self._last_save_time = time.monotonic()
        previous = self._catch_signals()
        try:
            self._train()
        finally:
            self._restore_signals(previous)

    def _train(self) -> None:
        bar = None
        if self.progress_bar:
            from tqdm import tqdm

            bar = tqdm(total=self.total_frames, initial=self.frames, unit="frames")
        start_time, start_frames = time.perf_counter(), self.frames
        try:
            if self.frames >= self.total_frames:
                return
            if self._push_weights and self._pushed_at[-1] != self.updates:
                # resumed: the workers hold the weights they were built with
                self._push_policy_weights()
            if self.frames > 0:
                # resumed from a run stopped during an evaluation that was due
                self._evaluate_if_due()
            for batch in self._collected_batches():
                try:
                    self.train_on_batch(batch)
                except Exception as err:
                    # updating, storing, logging: what was trained is kept (the
                    # parameters of the last finite update; a checkpoint from
                    # non-finite ones is refused), with the environments, whose
                    # state is between two batches
                    phase = (
                        "updating"
                        if isinstance(err, NonFiniteTrainingError)
                        else "training on a batch"
                    )
                    self._checkpoint_after_failure(err, phase, envs=True)
                    raise
                if bar is not None:
                    bar.n = self.frames
                    elapsed = time.perf_counter() - start_time
                    bar.set_postfix(
                        ret=f"{self.recent_return:.1f}" if self.recent_returns else "-",
                        fps=f"{(self.frames - start_frames) / elapsed:.0f}",
                        refresh=False,
                    )
                    if self.frames < self.total_frames:  # close() draws the last
                        bar.refresh()
                if self.frames >= self.total_frames:
                    break
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            if bar is not None:
                bar.close()
        # from here on a signal only marks the run interrupted: the checkpoint
        # being written is completed first
        self._stopping = True
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        if self._pending_signal is not None:
            self.interrupted = True
        evaluated_now = self.last_eval is not None and (
            self.last_eval["frames"] == self.frames
        )
        if not self.interrupted and self.evaluator is not None and not evaluated_now:
            # a signal stops the final evaluation (the checkpoint is written)
            try:
                try:
                    self._stopping = False
                    self._evaluate()
                finally:
                    self._stopping = True
            except KeyboardInterrupt:
                self.interrupted = True

    def _collected_batches(self):
        """The collector's batches. When collecting fails (an environment raised,
        or the policy was given non-finite observations), a checkpoint of what was
        trained so far is written before the error goes on, with a note saying
        where it is."""
        iterator = iter(self.collector)
        while True:
            try:
                with self._collection_deferred(), self._policy_acting("collecting"):
                    try:
                        batch = next(iterator)
                    except Exception as err:
                        if isinstance(err, StopIteration):
                            raise
                        worker = _worker_failure(err, self.collector, self._worker_pids)
                        if worker is None:
                            raise
                        raise CollectorWorkerError(
                            f"{worker} died after {self.frames} frames; training "
                            f"stopped. What was trained on, the replay included, "
                            f"is in the checkpoint; the batches the workers had "
                            f"collected but not delivered are lost. Find why it "
                            f"died (out of memory: the kernel log; an environment "
                            f"error: the worker's output above), then resume "
                            f"(collector.num_workers may change on resume, except "
                            f"with the Atari frame replay, which keeps each "
                            f"worker's environments apart)"
                        ) from err
            except StopIteration:
                return
            if not self._worker_pids:
                # to name a dead worker by its pid (TorchRL closes the other
                # workers' handles when it finds one dead)
                procs = getattr(self.collector, "procs", None) or []
                self._worker_pids = [proc.pid for proc in procs]
            yield batch

    @contextmanager
    def _policy_acting(self, phase: str):
        """The policy acts in environments (``phase``: collecting, evaluating): its
        inputs are checked, and when the environments or the policy fail, a
        checkpoint of what was trained so far is written before the error goes
        on, with a note saying where it is (trainer state is consistent between
        iterations; the environments' state is left out, being what failed)."""
        self._acting = phase
        try:
            yield
        except Exception as err:
            self._acting = None
            if not isinstance(err, StopIteration):
                self._checkpoint_after_failure(err, phase)
            raise
        finally:
            self._acting = None

    def _checkpoint_after_failure(
        self, err: Exception, phase: str, envs: bool = False
    ) -> None:
        """Writes a checkpoint of what was trained before ``err`` goes on, and
        adds a note saying where it is. Without ``envs`` the environments' state
        is left out (it is what failed): a resume starts fresh episodes instead of
        stepping into the same failure."""
        if self.checkpoint_dir is None or getattr(err, "_acer_saved", False):
            return
        err._acer_saved = True  # once, by the innermost phase that failed
        if not envs:
            self._envs_unsaved_reason = (
                f"{phase} failed with {type(err).__name__} after {self.frames} frames"
            )
        try:
            path = self.save_checkpoint()
        except Exception as save_err:  # reported with the error that stopped it
            err.add_note(f"no checkpoint could be written: {save_err}")
        else:
            kept = (
                ""
                if envs
                else " (without the environments' state: a resume starts fresh "
                "episodes)"
            )
            err.add_note(
                f"training stopped while {phase}; a checkpoint of the "
                f"{self.frames} frames trained on was written{kept}. Resume "
                f"with: resume={path}"
            )
        finally:
            self._envs_unsaved_reason = None

    def _check_policy_inputs(self, module, args, kwargs) -> None:
        """Refuses non-finite observations while the policy acts (a forward
        pre-hook on the actor): acting on them would fail inside the action
        distribution, or pick an arbitrary action, without saying why."""
        if self._acting is None or not self.check_health:
            return
        tensordict = args[0] if args else kwargs.get("tensordict")
        if not isinstance(tensordict, TensorDictBase):
            return
        read = tensordict.select(*module.in_keys, strict=False)
        if _batch_is_finite(read):
            return
        counts = ", ".join(
            f"{key!r}: {n} non-finite values"
            for key, n in _nonfinite_counts(read).items()
        )
        raise NonFiniteTrainingError(
            f"the policy was given non-finite observations while {self._acting} "
            f"after {self.frames} frames ({counts}). The environment returned them; "
            f"the policy cannot act on them"
        )

    # -- signals -----------------------------------------------------------------

    def _catch_signals(self) -> dict:
        """Installs the handler for the signals that end a training process in
        ordinary use (:data:`~torchrl_acer.trainers.hooks.STOP_SIGNALS`: Ctrl-C,
        SIGTERM, a closed terminal's SIGHUP, ...; main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in STOP_SIGNALS:
            try:
                previous[signum] = signal.signal(signum, self._on_signal)
            except (ValueError, OSError):  # not allowed here (embedded interpreter)
                pass
        return previous

    @staticmethod
    def _restore_signals(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is None:
            self.stop_signal = signum
        if self._defer_signals > 0 or self._stopping:
            if self._pending_signal is None and not self._stopping:
                message = "stopping once the current iteration or checkpoint is done"
            elif self._collecting_deferred and not self._stopping:
                # a second signal does not wait for a collection that may hang
                print(
                    f"\n{name}: second signal; stopping the collection now",
                    file=sys.stderr,
                    flush=True,
                )
                raise KeyboardInterrupt
            else:
                message = (
                    "already stopping; the checkpoint being written is completed "
                    "first (kill -9 would keep the previous one)"
                )
            print(f"\n{name}: {message}", file=sys.stderr, flush=True)
            self._pending_signal = signum
            return
        raise KeyboardInterrupt

    @contextmanager
    def _collection_deferred(self):
        """Collecting a batch: a first signal waits for the batch, which is then
        trained on before the stop (interrupted inside an environment's step, a
        vector environment of worker processes was left mid-step: closing it hung
        or broke its pipes); a second one stops the collection at once."""
        self._defer_signals += 1
        self._collecting_deferred = True
        try:
            yield
        finally:
            self._defer_signals -= 1
            self._collecting_deferred = False

    @contextmanager
    def _signals_deferred(self):
        """A region a signal does not interrupt: it is acted on at the end."""
        self._defer_signals += 1
        try:
            yield
        finally:
            self._defer_signals -= 1
        if (
            self._defer_signals == 0
            and self._pending_signal is not None
            and not self._stopping
        ):
            raise KeyboardInterrupt

    def train_on_batch(self, batch: TensorDictBase) -> None:
        """One iteration: an on-policy update, storage, replayed updates, logging.

        With :attr:`check_health`, a batch holding non-finite values gets no
        on-policy update and is not stored (its replayed updates still happen);
        so does one beyond :attr:`max_policy_lag`. Every
        :attr:`weight_update_interval` batches the policy's weights go to the
        collector's workers."""
        batch = as_segments(batch)
        if self.segment_length is None:
            self.segment_length = batch.shape[-1]
        # a signal here waits for the end of the iteration's updates and storage
        with self._signals_deferred():
            self.frames += batch.numel()
            tick = time.perf_counter()
            self._record_episodes(batch)
            fresh = True
            if self.check_health:  # what the loss reads (not episode returns)
                read = batch.select(*self.loss_module.in_keys, strict=False)
                fresh = _batch_is_finite(read)
                self._health_event(
                    "batches",
                    fresh,
                    lambda: (
                        f"the batch collected at {self.frames} frames held "
                        f"{_describe_batch(read)}"
                    ),
                )
            lag = self._policy_lag(batch)
            if lag is not None and self.max_policy_lag is not None:
                if lag > self.max_policy_lag:
                    fresh = False  # no on-policy update, not stored
                    self.dropped_batches += 1
                    self._metrics["collector/dropped_batches"].append(1)
            if self.on_policy_updates and fresh:
                out = self.update(batch, tag="on_policy")
                if lag is not None:  # how far the lagging behaviour policy is off
                    bucket = _lag_bucket(lag)
                    for key in ("rho_mean", "rho_clip_fraction"):
                        self._metrics[f"collector/{key}_lag{bucket}"].append(out[key])
            if self.replay_buffer is not None:
                if fresh:
                    self.replay_buffer.extend(
                        batch.select(
                            *replay_keys(self.loss_module, self.replay_buffer),
                            strict=False,
                        )
                    )
                if self.replay_ratio > 0 and self.replay_steps >= self.replay_start:
                    rate = torch.tensor(float(self.replay_ratio))
                    for _ in range(int(torch.poisson(rate, generator=self._rng))):
                        self.update(self.replay_buffer.sample(), tag="off_policy")
            if self._push_weights:
                self._batches_since_push += 1
                if self._batches_since_push >= self.weight_update_interval:
                    self._push_policy_weights()
            self._metrics["time/iteration"].append(time.perf_counter() - tick)
            self._metrics["time/frames"].append(batch.numel())
            # schedules run on multiples of their interval, whatever the batch size
            if self.frames >= self._next_log:
                self._log_training()
                self._next_log = next_multiple(self.frames, self.log_interval)
        self._evaluate_if_due()
        save = False
        if self._next_checkpoint is not None and self.frames >= self._next_checkpoint:
            # advanced first, so that the checkpoint holds the next one to write
            # (otherwise a resumed run would rewrite this one at once)
            self._next_checkpoint = next_multiple(self.frames, self.checkpoint_interval)
            save = True
        if (
            self.checkpoint_every_minutes is not None
            and self.checkpoint_dir is not None
            and time.monotonic() - self._last_save_time
            >= 60 * self.checkpoint_every_minutes
        ):
            save = True
        if save:
            self.save_checkpoint()

    def _push_policy_weights(self) -> None:
        """Sends the learner's policy weights to the collector's workers
        (TorchRL's weight-sync scheme) as version ``len(_pushed_at)`` of their
        :class:`VersionedPolicy`."""
        for proc in getattr(self.collector, "procs", None) or []:
            try:
                alive = proc.is_alive()
            except ValueError:  # closed by TorchRL
                alive = False
            if not alive:
                # it would never acknowledge the weights: the push would wait
                # forever. Collecting next finds it dead and says which.
                return
        # a copy: the pushed tensors may be sent later, or shared with the
        # workers, and must not follow the learner's next updates
        weights = TensorDict.from_module(self.loss_module.actor_network).data.clone()
        weights = VersionedPolicy.weights(weights, len(self._pushed_at))
        self.collector.update_policy_weights_(weights)
        self._pushed_at.append(self.updates)
        self._batches_since_push = 0

    def _policy_lag(self, batch: TensorDictBase) -> int | None:
        """Learner updates since the weights that acted on the batch's oldest
        step were pushed (``None`` when the collector acts with the learner's own
        policy). Each step's ``"policy_version"`` was written by the
        :class:`VersionedPolicy` that acted."""
        if not self._push_weights:
            return None
        versions = batch.get("policy_version", None)
        if versions is None:
            return None
        lag = _lag_since_push(versions, self._pushed_at, self.updates)
        self._metrics["collector/policy_lag"].append(lag)
        return lag

    def update(self, batch: TensorDictBase, tag: str = "update") -> TensorDictBase:
        """One optimizer step on ``batch``, then the averaged-policy update.

        With :attr:`check_health`, neither step is taken when a ``loss_*`` term or
        the gradient norm is non-finite: the update is counted instead."""
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        with set_composite_lp_aggregate(False):
            out = self.loss_module(batch)
        terms = [(key, value) for key, value in out.items() if key.startswith("loss_")]
        loss = sum(value for _, value in terms)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        elif self.check_health:
            grad_norm = _grad_norm(self._params)
        if self.check_health:
            # the loss terms and the gradient norm: one reduction, one read-back
            checked = [value.detach().reshape(-1).float() for _, value in terms]
            if grad_norm is not None:
                checked.append(grad_norm.detach().reshape(-1).float())
            finite = bool(torch.isfinite(torch.cat(checked)).all())
            self._health_event(
                "updates",
                finite,
                lambda: self._describe_update(tag, terms, grad_norm, batch),
            )
            if not finite:  # no optimizer step, no averaged-policy step
                self.optimizer.zero_grad(set_to_none=True)
                return out.detach()
        if self.max_grad_norm is not None:
            self._metrics["train/grad_norm"].append(grad_norm.detach())
        self.optimizer.step()
        self.target_updater.step()
        self.updates += 1
        out = out.detach()
        for key, value in out.items():
            self._metrics[f"train/{key}"].append(value)
        stats = self.loss_module.trust_region_stats
        if stats is not None:
            for key, value in stats.items():
                self._metrics[f"train/trust_region_{key}"].append(value)
        self._metrics[f"train/{tag}_updates"].append(1)
        return out

    # -- numerical health ----------------------------------------------------------

    def _health_event(self, kind: str, finite: bool, describe) -> None:
        """Counts a non-finite update or batch (``kind``), warns at the first of a
        streak and stops after :attr:`max_nonfinite_in_a_row` in a row."""
        if finite:
            self._nonfinite_streaks[kind] = 0
            return
        streak = self._nonfinite_streaks[kind] = self._nonfinite_streaks[kind] + 1
        setattr(self, f"nonfinite_{kind}", getattr(self, f"nonfinite_{kind}") + 1)
        self._metrics[f"train/nonfinite_{kind}"].append(1)
        if streak == 1:
            self._nonfinite_first[kind] = describe()
            what = "update skipped" if kind == "updates" else "batch not trained on"
            warnings.warn(
                f"non-finite {what}: {self._nonfinite_first[kind]}",
                RuntimeWarning,
                stacklevel=3,
            )
        if streak >= self.max_nonfinite_in_a_row:
            what = "updates" if kind == "updates" else "collected batches"
            saved = (
                f"; the last checkpoint is {self.last_checkpoint}"
                if self.last_checkpoint is not None
                else ""
            )
            raise NonFiniteTrainingError(
                f"{streak} {what} in a row were non-finite "
                f"(max_nonfinite_in_a_row={self.max_nonfinite_in_a_row}); stopped "
                f"at {self.frames} frames. The first of them: "
                f"{self._nonfinite_first[kind]}. No optimizer step was taken on them: "
                f"the parameters are those of the last finite update{saved}"
            )

    def _describe_update(self, tag, terms, grad_norm, batch) -> str:
        first = "none"
        for key, value in terms:
            if not bool(torch.isfinite(value.detach()).all()):
                first = f"{key} = {value.detach().float().sum().item()}"
                break
        else:
            if grad_norm is not None:
                first = f"the gradient norm = {grad_norm.item()}"
        return (
            f"the {tag} update at {self.frames} frames, first non-finite term "
            f"{first}; its batch held "
            f"{_describe_batch(batch.select(*self.loss_module.in_keys, strict=False))}"
        )

    # -- bookkeeping -----------------------------------------------------------

    @property
    def replay_steps(self) -> int:
        if self.replay_buffer is None or self.segment_length is None:
            return 0
        return len(self.replay_buffer) * self.segment_length

    @property
    def recent_return(self) -> float:
        return float(np.mean(self.recent_returns)) if self.recent_returns else math.nan

    def _record_episodes(self, batch):
        ends = batch.get(self.episode_end_key, None)
        returns = batch.get(self.episode_return_key, None)
        if ends is None or returns is None:
            return
        finished = returns[ends].flatten().tolist()
        self.recent_returns.extend(finished)
        self._metrics["train/episode_reward"].extend(finished)

    def _log_training(self):
        metrics = self._metrics
        frames = sum(metrics.pop("time/frames", [])) or 1
        seconds = sum(metrics.pop("time/iteration", [])) or math.nan
        scalars = {
            "time/fps": frames / seconds,
            "train/frames": self.frames,
            "train/updates": self.updates,
            "replay/steps": self.replay_steps,
        }
        for tag in ("on_policy", "off_policy"):
            scalars[f"train/{tag}_updates"] = len(
                metrics.pop(f"train/{tag}_updates", [])
            )
        lags = metrics.pop("collector/policy_lag", [])
        if lags:
            scalars["collector/policy_lag"] = float(np.mean(lags))
            scalars["collector/policy_lag_max"] = max(lags)
        if self.max_policy_lag is not None:  # dropped since the last log
            scalars["collector/dropped_batches"] = len(
                metrics.pop("collector/dropped_batches", [])
            )
        if self.check_health:  # skipped since the last log
            for kind in ("updates", "batches"):
                scalars[f"train/nonfinite_{kind}"] = len(
                    metrics.pop(f"train/nonfinite_{kind}", [])
                )
        episodes = metrics.pop("train/episode_reward", [])
        if episodes:
            scalars["train/reward"] = float(np.mean(episodes))
            scalars["train/episodes"] = len(episodes)
        for key, values in metrics.items():
            if values:
                scalars[key] = (
                    torch.stack([torch.as_tensor(v) for v in values])
                    .float()
                    .mean()
                    .item()
                )
        self._metrics = defaultdict(list)
        self.last_train_log = scalars
        if self.logger is not None:
            for key, value in scalars.items():
                self.logger.log_scalar(key, value, step=self.frames)

    def _evaluate_if_due(self) -> None:
        """Evaluates when the schedule says so (on multiples of the interval,
        whatever the batch size), then moves the schedule on."""
        if self._next_eval is not None and self.frames >= self._next_eval:
            self._evaluate()
            self._next_eval = next_multiple(self.frames, self.eval_interval)

    def _evaluate(self):
        with self._policy_acting("evaluating"):
            result = self.evaluator()
        self.last_eval = {"frames": self.frames, **result}
        if self.logger is not None:
            for key, value in result.items():
                self.logger.log_scalar(f"eval/{key}", value, step=self.frames)
        return result

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed to continue: parameters, the averaged policy, the
        optimizer, the replay contents (its filled part, and its sampler's generator
        if it has one), counters and the metrics not yet logged, every random
        state, and the environments' state where it can be saved
        (:mod:`~torchrl_acer.training.env_state`), so that a resumed run continues
        the same run."""
        return {
            "loss_module": self.loss_module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "target_updater": self.target_updater.state_dict(),
            "replay_buffer": None
            if self.replay_buffer is None
            else replay_state_dict(self.replay_buffer),
            "counters": {
                "frames": self.frames,
                "updates": self.updates,
                "segment_length": self.segment_length,
                "next_log": self._next_log,
                "next_eval": self._next_eval,
                "next_checkpoint": self._next_checkpoint,
                "recent_returns": list(self.recent_returns),
                "last_eval": self.last_eval,
                "last_train_log": self.last_train_log,
                # accumulated since the last training log, logged at the next one
                "metrics": {key: list(values) for key, values in self._metrics.items()},
                # a streak goes on across a resume: the run stops where it would have
                "dropped_batches": self.dropped_batches,
                "nonfinite": {
                    "updates": self.nonfinite_updates,
                    "batches": self.nonfinite_batches,
                    "streaks": dict(self._nonfinite_streaks),
                    "first": dict(self._nonfinite_first),
                },
            },
            "rng": {
                "trainer": self._rng.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all()
                if torch.cuda.is_available() and torch.cuda.is_initialized()
                else None,
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
            "envs": self._env_states(),
        }

    def _env_states(self) -> dict:
        if self._envs_unsaved_reason is not None:
            unsaved = {"saved": False, "reason": self._envs_unsaved_reason}
            return {"collector": unsaved, "evaluator": unsaved}
        return {
            "collector": collector_state_dict(self.collector),
            "evaluator": None
            if getattr(self.evaluator, "env", None) is None
            else env_state_dict(self.evaluator.env),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores :meth:`state_dict`'s state into this trainer, built afresh
        with the same pieces. The environments continue their episodes where
        their state was saved, else start fresh ones (:attr:`resume_notes` says
        which); the schedules follow this trainer's intervals."""
        self.resume_notes = []
        self.loss_module.load_state_dict(state["loss_module"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.target_updater.load_state_dict(state["target_updater"])
        if (state["replay_buffer"] is None) != (self.replay_buffer is None):
            raise ValueError(
                "the checkpoint and this trainer disagree on having a replay buffer"
            )
        if self.replay_buffer is not None:
            load_replay_state_dict(self.replay_buffer, state["replay_buffer"])
        counters = state["counters"]
        self.frames = counters["frames"]
        self.updates = counters["updates"]
        self.segment_length = counters["segment_length"]
        # the schedules of this trainer's intervals (a resume may change them)
        self._next_log = _resumed_schedule(
            counters["next_log"], self.frames, self.log_interval
        )
        self._next_eval = _resumed_schedule(
            counters["next_eval"], self.frames, self.eval_interval, keep_due=True
        )
        self._next_checkpoint = _resumed_schedule(
            counters["next_checkpoint"], self.frames, self.checkpoint_interval
        )
        self.recent_returns.clear()
        self.recent_returns.extend(counters["recent_returns"])
        self.last_eval = counters.get("last_eval")
        self.last_train_log = counters.get("last_train_log")
        self._metrics = defaultdict(list)
        for key, values in counters.get("metrics", {}).items():
            self._metrics[key] = [
                v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values
            ]
        self.dropped_batches = counters.get("dropped_batches", 0)
        nonfinite = counters.get("nonfinite")  # absent in checkpoints older than it
        if nonfinite is not None:
            self.nonfinite_updates = nonfinite["updates"]
            self.nonfinite_batches = nonfinite["batches"]
            self._nonfinite_streaks = dict(nonfinite["streaks"])
            self._nonfinite_first = dict(nonfinite["first"])
        # the environments before the random states: a restart may draw from them
        self._load_env_states(state.get("envs") or {})
        rng = state["rng"]
        self._rng.set_state(rng["trainer"])
        torch.set_rng_state(rng["torch"])
        cuda = rng.get("cuda")
        if cuda is not None and torch.cuda.is_available():
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
            else:
                self.resume_notes.append(
                    f"CUDA random states: the checkpoint has {len(cuda)} devices, "
                    f"this machine {torch.cuda.device_count()}; not restored"
                )
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])

    def _load_env_states(self, envs: dict) -> None:
        """Restores the collector's and the evaluator's environments where their
        state was saved; elsewhere starts fresh episodes, seeded from
        ``(seed, frames)``. Each outcome goes to :attr:`resume_notes`."""
        targets = [("training", self.collector, envs.get("collector"))]
        evaluator_env = getattr(self.evaluator, "env", None)
        if evaluator_env is not None:
            targets.append(("evaluation", evaluator_env, envs.get("evaluator")))
        for stream, (name, target, saved) in enumerate(targets):
            reason = "the checkpoint has none" if saved is None else saved.get("reason")
            if saved is not None and saved["saved"]:
                try:  # checked before anything changes
                    if target is self.collector:
                        load_collector_state_dict(target, saved)
                    else:
                        load_env_state_dict(target, saved)
                except ValueError as err:  # other environments than the saved ones
                    reason = str(err)
                else:
                    self.resume_notes.append(
                        f"{name} environments: state restored ({saved['kind']} of "
                        f"{saved['num_envs']}), episodes continue"
                    )
                    continue
            seed = resume_seed(self.seed, self.frames, stream)
            restart_episodes(target, seed)
            self.resume_notes.append(
                f"{name} environments: state not saved ({reason}); fresh "
                f"episodes seeded with {seed}, derived from seed={self.seed} and "
                f"frames={self.frames}"
            )

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Writes the checkpoint (``checkpoint_dir/last.pt`` by default).

        The file (:mod:`~torchrl_acer.training.checkpoint`) holds a header (format
        and library versions, git commit, :attr:`config`, frames) and
        :meth:`state_dict`, with a sha256 of both. It is written to a temporary
        file, fsynced and renamed over ``path``, so that ``path`` is always a
        complete checkpoint; a signal arriving meanwhile waits for it. Refuses
        (:class:`NonFiniteTrainingError`, keeping the previous file) when a
        parameter or optimizer state holds non-finite values.
        """
        if path is None:
            if self.checkpoint_dir is None:
                raise ValueError("no checkpoint path given and no checkpoint_dir set")
            path = self.checkpoint_dir / "last.pt"
        path = Path(path)
        with self._signals_deferred():
            _refuse_nonfinite_save(
                self.loss_module,
                self.optimizer,
                path,
                self.frames,
                hint=". With check_health=True non-finite updates are skipped "
                "instead of applied",
            )
            header = {
                "frames": self.frames,
                "updates": self.updates,
                "config": self.config,
                # where the checkpoints go: the examples' run directory is its
                # parent (experiment.run_dir_for reads it back on resume)
                "checkpoint_dir": None
                if self.checkpoint_dir is None
                else str(self.checkpoint_dir.resolve()),
            }
            write_checkpoint(path, self.state_dict(), header)
            self.last_checkpoint = path
            self._last_save_time = time.monotonic()
        return path

    def load_checkpoint(
        self,
        path: str | os.PathLike,
        *,
        allow_config_change=(),
        force: bool = False,
    ) -> None:
        """Restores a checkpoint written by :meth:`save_checkpoint` (a directory
        means its ``last.pt``).

        The file must pass its checks (marker, length, sha256, format version:
        :class:`~torchrl_acer.training.checkpoint.CheckpointError` naming the file
        otherwise, before anything is loaded). When both it and this trainer have
        a :attr:`config`, settings that differ are refused, listed, except those
        in :data:`~torchrl_acer.training.checkpoint.SAFE_CONFIG_CHANGES` and those
        matching ``allow_config_change`` (dotted keys or ``fnmatch`` patterns such
        as ``"model.*"``); ``force`` accepts any difference. Parameters load
        strictly: a mismatch names the keys.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "last.pt"
        info = read_header(path)
        self._check_checkpoint_config(info, tuple(allow_config_change), force)
        # on the CPU first: the random states must be CPU tensors, and the loss and
        # the optimizer copy their tensors to wherever their parameters are
        state = load_payload(info)
        self._check_parameters_fit(path, state.get("loss_module", {}))
        try:
            self.load_state_dict(state)
        except RuntimeError as err:  # strict loading: names the keys
            raise CheckpointError(f"{path} does not fit this trainer: {err}") from err

    def _check_parameters_fit(self, path, saved: dict) -> None:
        """Refuses, naming the keys, parameters missing, unexpected or of another
        shape (the loss's own loading fails on the first, with its whole tree)."""
        problems = state_dict_mismatches(saved, self.loss_module.state_dict())
        if problems:
            shown = first_few(problems, 10, sep="\n  ")
            raise CheckpointError(
                f"{path} does not fit this trainer's networks:\n  {shown}"
            )

    def _check_checkpoint_config(self, info, allow: tuple, force: bool) -> None:
        changed = check_config(
            info.path,
            info.header.get("config"),
            self.config,
            allow=allow,
            force=force,
            how_to_allow="resume_allow_config_change=[{keys}] (or resume_force=true; "
            "ACERTrainer.load_checkpoint(allow_config_change=..., force=True))",
        )
        if changed:
            print(
                "resume: settings changed since the checkpoint, as allowed:\n"
                + "\n".join(show_config_change(*d) for d in changed),
                flush=True,
            )

    def close(self) -> None:
        self.collector.shutdown()
        if self.evaluator is not None and hasattr(self.evaluator, "close"):
            self.evaluator.close()
