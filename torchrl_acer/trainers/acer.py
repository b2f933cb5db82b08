"""ACER's trainer: TorchRL's :class:`~torchrl.trainers.Trainer` wired for ACER's loop.

Upstream this file is ``torchrl/trainers/algorithms/acer.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import optim
from torchrl.collectors import BaseCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.objectives import SoftUpdate
from torchrl.objectives.common import LossModule
from torchrl.objectives.utils import TargetNetUpdater
from torchrl.trainers.trainers import (
    TYPE_DESCR,
    DefaultOptimizationStepper,
    OptimizationStepper,
    TargetNetUpdaterHook,
    Trainer,
    TrainerHookBase,
    UpdateWeights,
)

from torchrl_acer.trainers.hooks import NonFiniteGuard, batch_accepted

__all__ = ["ACERTrainer", "ACERUpdateSchedule", "make_segment_replay_buffer"]


def make_segment_replay_buffer(
    capacity_steps: int, segment_length: int, batch_segments: int
) -> TensorDictReplayBuffer:
    """A replay buffer of ``segment_length``-step segments, as ACER replays them.

    Each collected ``[num_envs, T]`` batch is stored as ``num_envs`` segments of one
    environment's ``T`` consecutive steps (episode boundaries inside a segment are
    handled by the loss), and a sample is ``[batch_segments, T]``. A segment never
    mixes environments or crosses the buffer's wrap-around.

    Args:
        capacity_steps: steps the buffer holds (all environments together).
        segment_length: ``T``.
        batch_segments: segments per sampled batch.
    """
    if segment_length < 1:
        raise ValueError(f"segment length T must be positive, got {segment_length}")
    if capacity_steps < segment_length:
        raise ValueError(
            f"replay capacity of {capacity_steps} steps is shorter than one segment "
            f"of T={segment_length} steps"
        )
    if batch_segments < 1:
        raise ValueError(f"replay batch size must be positive, got {batch_segments}")
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity_steps // segment_length),
        batch_size=batch_segments,
    )


def replay_keys(loss_module: LossModule, replay_buffer) -> list:
    """The keys replay keeps of a batch.

    What the loss reads (as its keys are set now, so that ``set_keys`` after
    building the trainer is honoured) and what the replay reads itself (a
    frame-stacking replay's frames and game ends). The rest of a batch (episode
    returns, trajectory ids, root-level flags, a shared trunk's features) would
    cost memory and the time to store and sample it.
    """
    return [*loss_module.in_keys, *getattr(replay_buffer, "required_keys", ())]


def module_device(module) -> torch.device | None:
    """The device of a module's first parameter (``None`` without parameters)."""
    parameters = module.parameters() if hasattr(module, "parameters") else ()
    first = next(iter(parameters), None)
    return None if first is None else first.device


def as_segments(batch: TensorDictBase) -> TensorDictBase:
    """A collected batch as ``[num_segments, T]``.

    ``[T]`` from one environment gains a leading dim, ``[workers, num_envs, T]``
    from a synchronous multi-process collector is flattened to
    ``[workers * num_envs, T]``.
    """
    if batch.ndim == 1:
        return batch.unsqueeze(0)
    if batch.ndim > 2:
        return batch.reshape(-1, batch.shape[-1])
    return batch


class ACERUpdateSchedule(TrainerHookBase):
    r"""ACER's updates for each collected batch (Wang et al. 2017, Algorithm 1).

    For each collected ``[N, T]`` batch, one on-policy update on the fresh batch,
    then :math:`n \sim \mathrm{Poisson}(\text{replay\_ratio})` updates on batches
    sampled from replay, once it holds ``replay_start`` steps. Registered on a
    :class:`~torchrl.trainers.Trainer` built with ``optim_steps_per_batch=None``:
    at ``batch_process`` (:meth:`store`) the fresh batch is stored in replay as
    ``[N, T]`` segments (:func:`as_segments`) and :math:`n` drawn; at
    ``process_optim_batch`` (:meth:`__call__`) the fresh batch, then the
    :math:`n` replayed ones are handed out, then ``StopIteration`` ends the
    batch's updates.

    Args:
        replay_buffer: a replay of ``T``-step segments
            (:func:`make_segment_replay_buffer`), or ``None`` to train on-policy.

    Keyword Args:
        replay_ratio (float): mean replayed updates per collected batch.
            Defaults to 4.
        replay_start (int): steps stored before replayed updates start.
            Defaults to 0.
        on_policy_updates (bool): update on each fresh batch (ACER's discrete
            setting); ``False`` trains on replay only, as the paper's continuous
            runs do. Defaults to ``True``.
        replay_keys (sequence of keys, or a callable returning them, optional):
            what replay keeps of a batch; ``None`` keeps everything.
        accept (sequence of callables): each takes the fresh batch and says
            whether to train on it; a batch one refuses gets no on-policy update
            and is not stored (its replayed updates still happen). One the
            trainer's guards refuse
            (:func:`~torchrl_acer.trainers.hooks.batch_accepted`) gets no update
            at all (the trainer skips its ``optim_steps``) and is not stored.
        device (torch.device, optional): where batches are handed out.
        seed (int): seeds the Poisson draws (the hook's own generator, in its
            state dict). Defaults to 0.
    """

    def __init__(
        self,
        replay_buffer=None,
        *,
        replay_ratio: float = 4.0,
        replay_start: int = 0,
        on_policy_updates: bool = True,
        replay_keys: Sequence | Callable[[], Sequence] | None = None,
        accept: Sequence[Callable[[TensorDictBase], bool]] = (),
        device: torch.device | str | None = None,
        seed: int = 0,
    ) -> None:
        if not (replay_ratio >= 0 and math.isfinite(replay_ratio)):
            # inf would draw no replay at all: torch.poisson(inf) is a huge negative
            raise ValueError(
                f"replay_ratio must be >= 0 and finite, got {replay_ratio}"
            )
        if replay_ratio > 0 and replay_buffer is None:
            raise ValueError(f"replay_ratio={replay_ratio} needs a replay_buffer")
        if not on_policy_updates and not replay_ratio > 0:
            raise ValueError(
                "on_policy_updates=False needs replay_ratio > 0: nothing would train"
            )
        if replay_start < 0:
            raise ValueError(f"replay_start must be >= 0, got {replay_start}")
        self.replay_buffer = replay_buffer
        self.replay_ratio = replay_ratio
        self.replay_start = replay_start
        self.on_policy_updates = on_policy_updates
        self.replay_keys = replay_keys
        self.accept = tuple(accept)
        self.device = None if device is None else torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self.segment_length: int | None = None
        self._pending: list = []  # what the batch's remaining updates train on
        #: the fresh batch's updates: on-policy (0 or 1) and replayed
        self.planned = {"on_policy": 0, "off_policy": 0}
        self._trainer: Trainer | None = None

    @property
    def replay_steps(self) -> int:
        """Steps held in replay."""
        if self.replay_buffer is None or self.segment_length is None:
            return 0
        return len(self.replay_buffer) * self.segment_length

    def store(self, batch: TensorDictBase) -> TensorDictBase:
        """Stores the fresh batch and plans its updates.

        Returns it as ``[N, T]`` segments on the schedule's device: the batch the
        trainer holds from here on, and the one its on-policy update trains on.
        """
        batch = as_segments(batch)
        if self.segment_length is None:
            self.segment_length = batch.shape[-1]
        # a batch the trainer's guards refuse gets no update at all (the trainer
        # skips its optim_steps); one an accept callable refuses, replayed ones
        guarded = self._trainer is None or batch_accepted(self._trainer)
        accepted = guarded and all(accept(batch) for accept in self.accept)
        draws = 0
        if self.replay_buffer is not None:
            if accepted:
                keys = self.replay_keys
                keys = keys() if callable(keys) else keys
                self.replay_buffer.extend(
                    batch if keys is None else batch.select(*keys, strict=False)
                )
            replays = self.replay_ratio > 0 and guarded
            if replays and self.replay_steps >= self.replay_start:
                rate = torch.tensor(float(self.replay_ratio))
                draws = int(torch.poisson(rate, generator=self.generator))
        # the trainer's batch from here on is the one its update trains on
        batch = self._on_device(batch)
        on_policy = [batch] if self.on_policy_updates and accepted else []
        self._pending = on_policy + [None] * draws  # replay sampled in its turn
        self.planned = {"on_policy": len(on_policy), "off_policy": draws}
        return batch

    def _on_device(self, batch: TensorDictBase) -> TensorDictBase:
        if self.device is not None and batch.device != self.device:
            return batch.to(self.device)
        return batch

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """The next batch to update on; ``StopIteration`` once they are done."""
        if not self._pending:
            if self._trainer is not None:
                # TorchRL counts the iteration that asks for one more batch
                # before asking: its _optim_count then counts updates only
                self._trainer._optim_count -= 1
            raise StopIteration
        sub_batch = self._pending.pop(0)
        if sub_batch is None:
            sub_batch = self._on_device(self.replay_buffer.sample())
        return sub_batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "segment_length": self.segment_length,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"])
        self.segment_length = state_dict["segment_length"]

    def register(self, trainer: Trainer, name: str = "acer_update_schedule") -> None:
        self._trainer = trainer
        trainer.register_op("batch_process", self.store)
        trainer.register_op("process_optim_batch", self)
        trainer.register_module(name, self)


class ACERTrainer(Trainer):
    r"""Trains an :class:`~torchrl_acer.ACERLoss` with ACER's replay-ratio loop.

    Wang et al., "Sample Efficient Actor-Critic with Experience Replay", ICLR 2017,
    https://arxiv.org/abs/1611.01224. A :class:`~torchrl.trainers.Trainer` whose
    ``__init__`` only wires hooks:

    - :class:`ACERUpdateSchedule`: per collected batch, the on-policy update,
      then Poisson(``replay_ratio``) replayed ones;
    - :class:`~torchrl.trainers.TargetNetUpdaterHook` (``post_optim``): the
      averaged policy :math:`\theta_{avg} \leftarrow \alpha \theta_{avg} + (1 -
      \alpha) \theta` after every optimizer step
      (:class:`~torchrl.objectives.SoftUpdate`);
    - :class:`~torchrl_acer.trainers.hooks.NonFiniteGuard` as the optimization
      stepper (``check_health``); a batch a guard refuses is not stored either;
    - :class:`~torchrl.trainers.UpdateWeights` (``post_steps``): the policy's
      weights to the collector every ``weight_update_interval`` batches.

    Besides TorchRL's loss terms it logs the trust region's statistics of each
    update (``train/trust_region_*``), the steps in replay (``replay/steps``)
    and each batch's updates (``train/on_policy_updates``,
    ``train/off_policy_updates``); ``_optim_count`` counts updates. Anything
    else (logging, evaluation, the guards of :mod:`torchrl_acer.trainers.hooks`)
    is registered as on any TorchRL trainer.

    Keyword Args:
        collector (BaseCollector): yields ``[num_envs, T]`` batches with the
            behaviour policy's logits and log-probabilities.
        total_frames (int): environment steps to collect.
        loss_module (ACERLoss): the loss; its actor is the collector's policy.
        optimizer (optim.Optimizer): over ``loss_module.parameters()``.
        replay_buffer, replay_ratio, replay_start, on_policy_updates: as
            :class:`ACERUpdateSchedule`.
        target_net_updater (TargetNetUpdater, optional): the averaged-policy
            update; defaults to ``SoftUpdate(loss_module, eps=alpha)``.
        alpha (float): the averaged policy's decay. Defaults to 0.99.
        weight_update_interval (int): batches between two weight pushes.
            Defaults to 1.
        check_health (bool): the stepper is a
            :class:`~torchrl_acer.trainers.hooks.NonFiniteGuard` stopping after
            ``max_nonfinite_in_a_row`` (default 10) non-finite updates or
            batches in a row; ``False``: TorchRL's default stepper (to measure
            the checks' cost). Defaults to ``True``.
        optimization_stepper: replaces the guard (with ``check_health=False``).
        frame_skip (int): as :class:`~torchrl.trainers.Trainer`. Defaults to 1.
        **kwargs: the other arguments of :class:`~torchrl.trainers.Trainer`
            (``logger``, ``clip_grad_norm``, ``clip_norm``, ``progress_bar``,
            ``seed``, ``save_trainer_file``, ``checkpoint``, ...).

    Examples:
        >>> import torch
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.collectors import Collector
        >>> from torchrl.envs import GymEnv
        >>> from torchrl.modules import MLP, ProbabilisticActor
        >>> from torchrl_acer.objectives import ACERLoss
        >>> env = GymEnv("CartPole-v1", categorical_action_encoding=True)
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(MLP(4, 2, num_cells=[32]), ["observation"], ["logits"]),
        ...     in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True)
        >>> critic = TensorDictModule(MLP(4, 2, num_cells=[32]), ["observation"],
        ...     ["action_value"])
        >>> loss = ACERLoss(actor, critic)
        >>> collector = Collector(env, actor, frames_per_batch=20, total_frames=-1,
        ...     auto_register_policy_transforms=False)
        >>> trainer = ACERTrainer(
        ...     collector=collector, total_frames=100, loss_module=loss,
        ...     optimizer=torch.optim.Adam(loss.parameters(), lr=1e-3),
        ...     replay_buffer=make_segment_replay_buffer(1000, 20, 2),
        ...     replay_ratio=2, progress_bar=False)
        >>> trainer.train()
        >>> trainer.collected_frames
        100
    """

    def __init__(
        self,
        *,
        collector: BaseCollector,
        total_frames: int,
        loss_module: LossModule,
        optimizer: optim.Optimizer | None = None,
        replay_buffer=None,
        replay_ratio: float = 4.0,
        replay_start: int = 0,
        on_policy_updates: bool = True,
        target_net_updater: TargetNetUpdater | None = None,
        alpha: float = 0.99,
        weight_update_interval: int = 1,
        check_health: bool = True,
        max_nonfinite_in_a_row: int = 10,
        optimization_stepper: OptimizationStepper | None = None,
        frame_skip: int = 1,
        **kwargs: Any,
    ) -> None:
        if total_frames <= 0:
            raise ValueError(f"total_frames must be positive, got {total_frames}")
        if kwargs.get("async_collection") or (
            getattr(collector, "replay_buffer", None) is not None
        ):
            # TorchRL's trainer then hands its hooks no batch: the schedule would
            # store nothing and plan no update, and the frames never add up
            raise ValueError(
                "ACERTrainer stores each collected batch in replay itself, as [N, T] "
                "segments; a collector writing to a replay buffer "
                "(Collector(replay_buffer=...)) or async_collection=True hands it "
                "no batch. Build the collector without replay_buffer, and pass the "
                "replay to ACERTrainer(replay_buffer=...)"
            )
        if not weight_update_interval >= 1:
            raise ValueError(
                f"weight_update_interval must be >= 1, got {weight_update_interval}"
            )
        if optimization_stepper is None:
            optimization_stepper = (
                NonFiniteGuard(max_nonfinite_in_a_row)
                if check_health
                else _DetachingStepper()
            )
        elif check_health:
            raise ValueError(
                f"optimization_stepper={type(optimization_stepper).__name__} takes "
                f"the optimizer step, and with check_health=True the non-finite "
                f"guard would too: pass check_health=False (or register a "
                f"NonFiniteGuard subclass as the stepper)"
            )
        # built (and its settings refused) before any of the pieces is touched
        self.schedule = ACERUpdateSchedule(
            replay_buffer,
            replay_ratio=replay_ratio,
            replay_start=replay_start,
            on_policy_updates=on_policy_updates,
            replay_keys=partial(replay_keys, loss_module, replay_buffer),
            device=module_device(loss_module),
            seed=kwargs.get("seed") or 0,
        )
        if target_net_updater is None:
            target_net_updater = SoftUpdate(loss_module, eps=alpha)
        # built now, so that a checkpoint restores its buffers
        loss_module.value_estimator  # noqa: B018
        super().__init__(
            collector=collector,
            total_frames=total_frames,
            frame_skip=frame_skip,
            optim_steps_per_batch=None,  # the schedule ends each batch's updates
            loss_module=loss_module,
            optimizer=optimizer,
            optimization_stepper=optimization_stepper,
            replay_buffer=replay_buffer,
            target_net_updater=target_net_updater,
            **kwargs,
        )
        self.schedule.register(self)
        # stepped after every optimizer step, as the paper's averaged policy is
        self.register_op("post_optim", TargetNetUpdaterHook(target_net_updater))
        update_weights = UpdateWeights(
            collector,
            weight_update_interval,
            policy_weights_getter=partial(
                TensorDict.from_module, loss_module.actor_network
            ),
        )
        self.register_op("post_steps", update_weights)
        self.register_op("post_optim_log", self._log_trust_region)
        self.register_op("post_steps_log", self._log_replay)
        if self.progress_bar:
            self.register_op("setup", self._draw_bar_once_a_batch)

    def _draw_bar_once_a_batch(self) -> None:
        # TorchRL's bar draws at update() (at its own rate) and again for the
        # description, the last batch a third time when closed: drawn here once
        # a batch (:meth:`_pbar_description`), the last one by close()
        self._pbar.mininterval = math.inf

    def _pbar_description(self) -> None:
        # called by TorchRL's loops with a progress bar only
        shown = self._pbar_str
        self._pbar.set_description(
            ", ".join(
                f"{key}: {shown[key]:{TYPE_DESCR.get(type(shown[key]), '4.4f')}}"
                for key in sorted(shown)
            ),
            refresh=False,
        )
        if self.collected_frames < self.total_frames:
            self._pbar.refresh()

    def _log_trust_region(self, sub_batch: TensorDictBase) -> dict | None:
        stats = getattr(self.loss_module, "trust_region_stats", None)
        if stats is None:
            return None
        return {f"train/trust_region_{key}": value for key, value in stats.items()}

    def _log_replay(self, batch: TensorDictBase) -> dict:
        planned = self.schedule.planned
        return {
            "replay/steps": self.schedule.replay_steps,
            "train/on_policy_updates": planned["on_policy"],
            "train/off_policy_updates": planned["off_policy"],
        }


class _DetachingStepper(DefaultOptimizationStepper):
    # TorchRL's stepper returns the loss terms still attached to their graph,
    # which the trainer then keeps in its running average of the batch's losses
    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        return super().step(trainer, sub_batch).detach()
