"""A replay of stacked-frame segments that stores each frame once, as uint8.

Atari agents see stacks of the last 4 frames, and a naive replay stores every stack
twice (for ``s`` and ``s'``): 8 frames, 56 KB per step as uint8 (over 200 KB as
float32). This buffer keeps, per step, only the newest frame of ``s_t``, and
rebuilds both stacks when a segment is sampled, so that a step costs one 84x84
frame (7 KB) plus its small entries.

Layout: one row per environment of every collector worker (``num_workers *
num_envs`` rows), each a ring of ``segment`` slots of ``T`` steps; a worker's
``[num_envs, T]`` batch fills one slot of each of its rows, and the workers'
rings advance apart. Beside the frames of ``s_t`` it keeps, per slot, the newest
frame of the last step's ``s'``, and, in a small side ring, the real last frame
of every episode that ends before a slot's last step (the next row starts with a
reset frame). A stack never reaches back past the first frame of its episode:
like the environment's frame stack, it repeats the episode's first frame (or
blank frames) instead. Slots are sampled whole, as ACER replays them; the oldest
slot of a full ring only serves as frame history for the next one.

Which worker collected a batch is read from its ``"worker_index"`` entry (written
by the environments :func:`~torchrl_acer.training.experiment.make_collector`
builds for each worker): TorchRL's multi collectors deliver the workers' batches
in any order (asynchronous) or stacked (synchronous), and nothing else in a batch
names its worker reliably (Ray workers' trajectory ids all start at 0, and frame
continuity cannot place a worker's first batch).

At every ``extend``, the history the buffer holds for each row's first stack is
checked against the stack the environment produced. A stack that starts an
episode (after a restart) has no history; one that neither continues its row
nor starts an episode (a batch of that worker was left out, e.g. dropped by the
trainer as too stale) makes its slot frame history only, never sampled.
"""

from __future__ import annotations

import warnings

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey, unravel_key

from torchrl_acer.training.refusal import ConfigError

__all__ = ["FrameStackReplayBuffer"]


class FrameStackReplayBuffer:
    """Replay of ``T``-step segments with frame stacks rebuilt at sampling time.

    Args:
        num_envs: environments of each collector worker (rows of its batches).
        capacity_per_env: steps kept per environment (a multiple of ``T`` is used;
            one more slot is kept as frame history).
        segment_length: ``T``.
        batch_segments: segments per sampled batch.

    Keyword Args:
        num_workers: collector workers whose batches it takes (one row per
            environment of each). A batch is ``[k * num_envs, T]``: ``k``
            workers' batches one after the other (``k = num_workers`` from a
            synchronous multi collector, whose ``[workers, num_envs, T]`` batches
            are also taken as they come), each naming its worker under
            ``worker_key``; with one worker the entry may be absent.
        worker_key: the entry naming the worker that collected each step.
        pixels_key: the stacked-frame observation, ``[*, stack, H, W]`` uint8.
        done_key: the environment's own end of episode (where its frame stack
            restarts), read under ``"next"``.
        max_episode_ends: side-ring slots per environment for the last frames of
            episodes that end inside a segment. Defaults to ``capacity_per_env //
            64`` (episodes of 64 steps on average fit; Atari games last hundreds);
            sampling a segment whose end frame was overwritten raises.
        padding: how the environment fills a stack at the start of an episode:
            ``"zeros"`` (the ALE vector env) or ``"first"`` (the first frame
            repeated), see :func:`rebuild_stacks`.
        generator: for sampling.
    """

    def __init__(
        self,
        num_envs: int,
        capacity_per_env: int,
        segment_length: int,
        batch_segments: int,
        *,
        num_workers: int = 1,
        worker_key: NestedKey = "worker_index",
        pixels_key: NestedKey = "pixels",
        done_key: NestedKey = "done",
        max_episode_ends: int | None = None,
        padding: str = "zeros",
        generator: torch.Generator | None = None,
    ):
        if padding not in ("zeros", "first"):
            raise ValueError(f"padding must be 'zeros' or 'first', got {padding!r}")
        self.padding = padding
        if segment_length < 1:
            raise ValueError(f"segment_length must be positive, got {segment_length}")
        if capacity_per_env < segment_length:
            raise ValueError(
                f"capacity_per_env={capacity_per_env} is shorter than one segment "
                f"of {segment_length} steps"
            )
        if num_envs < 1 or batch_segments < 1 or num_workers < 1:
            raise ValueError(
                "num_envs, batch_segments and num_workers must be positive"
            )
        self.num_envs = num_envs
        self.num_workers = num_workers
        self.T = segment_length
        self.slots = capacity_per_env // segment_length + 1
        self.batch_segments = batch_segments
        self.worker_key = worker_key
        self.pixels_key = pixels_key
        self.done_key = unravel_key(("next", done_key))
        self.max_episode_ends = max_episode_ends or max(capacity_per_env // 64, 8)
        self.generator = generator
        self._initialized = False
        # per worker: the next slot to write, and the slots written so far
        self._cursor = torch.zeros(num_workers, dtype=torch.long)
        self._written = torch.zeros(num_workers, dtype=torch.long)
        # segments stored that are frame history only (their first stacks
        # continue no stored segment of their row and start no episode)
        self.history_only_segments = 0
        self._sampleable_index = None  # [(slot, row)], cached between extends

    @property
    def rows(self) -> int:
        """``num_workers * num_envs``: worker ``w``'s environment ``e`` is row
        ``w * num_envs + e``."""
        return self.num_workers * self.num_envs

    @property
    def required_keys(self) -> tuple:
        """The entries it reads from a stored batch besides those the loss reads:
        the frames, the game's done flag (where frame stacks restart) and the
        worker that collected it."""
        return (
            self.pixels_key,
            ("next", self.pixels_key),
            self.done_key,
            self.worker_key,
        )

    # -- storage -----------------------------------------------------------------

    def _init_storage(self, batch: TensorDictBase) -> None:
        pixels = batch.get(self.pixels_key)
        self.stack = pixels.shape[-3]
        if not 2 <= self.stack <= self.T + 1:
            raise ValueError(
                f"FrameStackReplayBuffer needs stacks of 2 to T + 1 = {self.T + 1} "
                f"frames, got {self.stack} ({self.pixels_key!r} of shape "
                f"{tuple(pixels.shape)})"
            )
        self._allocate(pixels.shape[-2:], pixels.dtype, self._strip(batch[:1]))

    def _allocate(self, frame_shape, dtype, data: TensorDictBase) -> None:
        """Blank storage for every slot and side-ring entry: frames of
        ``frame_shape`` and ``dtype``, segment data like ``data`` (a ``[1, T]``
        row)."""
        R, S, T, E = self.rows, self.slots, self.T, self.max_episode_ends
        self._frames = torch.zeros(R, S, T, *frame_shape, dtype=dtype)
        self._last_next = torch.zeros(R, S, *frame_shape, dtype=dtype)
        self._ends = torch.zeros(R, E, *frame_shape, dtype=dtype)
        self._end_slot = torch.full((R, S, T), -1, dtype=torch.long)
        self._end_owner = torch.full((R, E), -1, dtype=torch.long)
        self._end_cursor = torch.zeros(R, dtype=torch.long)
        self._has_history = torch.zeros(R, S, dtype=torch.bool)
        self._history_only = torch.zeros(R, S, dtype=torch.bool)
        # the worker's count of slots written when each of its slots was
        self._slot_id = torch.full((self.num_workers, S), -1, dtype=torch.long)
        self._data = data.unsqueeze(1).expand(R, S, T).clone().apply(torch.zeros_like)
        self._initialized = True

    def _strip(self, batch: TensorDictBase) -> TensorDictBase:
        # the frames are stored apart, the worker is the row
        return batch.exclude(
            self.pixels_key, ("next", self.pixels_key), self.worker_key
        )

    def __len__(self) -> int:
        """Number of segments that can be sampled."""
        return len(self._sampleable())

    def extend(self, batch: TensorDictBase) -> None:
        """Stores ``k`` workers' ``[num_envs, T]`` batches, ``[k * num_envs, T]``
        (or ``[k, num_envs, T]``), as one slot of each of their environments' rows."""
        N, T = self.num_envs, self.T
        if batch.ndim == 3:  # [workers, num_envs, T], a synchronous collector's
            batch = batch.reshape(-1, batch.shape[-1])
        if batch.ndim != 2 or batch.shape[0] % N or batch.shape[1] != T:
            raise ValueError(
                f"FrameStackReplayBuffer.extend expects a [k * num_envs, T] = "
                f"[k * {N}, {T}] batch (k workers' [num_envs, T] batches), got "
                f"{tuple(batch.batch_size)}"
            )
        workers = self._workers_of(batch)
        if not self._initialized:
            self._init_storage(batch)
        for k, worker in enumerate(workers):
            self._write(batch[k * N : (k + 1) * N], worker)
        self._sampleable_index = None

    def _workers_of(self, batch: TensorDictBase) -> list[int]:
        """The worker of each ``num_envs`` rows of ``batch``."""
        k = batch.shape[0] // self.num_envs
        index = batch.get(self.worker_key, None)
        if index is None:
            if self.num_workers == 1 and k == 1:
                return [0]
            raise ValueError(
                f"FrameStackReplayBuffer for {self.num_workers} workers: a "
                f"[{batch.shape[0]}, {self.T}] batch without {self.worker_key!r}, "
                f"the worker that collected each step (make_collector's "
                f"environments write it)"
            )
        index = index.reshape(k, -1)
        workers = index[:, 0]
        if (index != workers[:, None]).any():
            raise ValueError(
                f"FrameStackReplayBuffer: {self.worker_key!r} varies inside a "
                f"worker's [num_envs={self.num_envs}, T] rows of the batch: "
                f"{index.unique().tolist()}"
            )
        if ((workers < 0) | (workers >= self.num_workers)).any():
            raise ValueError(
                f"FrameStackReplayBuffer for num_workers={self.num_workers}: a "
                f"batch from worker {workers.tolist()} (workers 0 to "
                f"{self.num_workers - 1} expected)"
            )
        return workers.tolist()

    def _write(self, batch: TensorDictBase, worker: int) -> None:
        """One worker's ``[num_envs, T]`` batch into the next slot of its rows."""
        N, T = self.num_envs, self.T
        rows = slice(worker * N, (worker + 1) * N)
        pixels = batch.get(self.pixels_key)
        next_pixels = batch.get(("next", self.pixels_key))
        done = batch.get(self.done_key).reshape(N, T)
        w = int(self._cursor[worker])
        slot_id = int(self._written[worker])
        self._frames[rows, w] = pixels[:, :, -1]
        self._last_next[rows, w] = next_pixels[:, -1, -1]
        self._data[rows, w] = self._strip(batch)
        # the real last frame of episodes ending before the slot's last step
        self._end_slot[rows, w] = -1
        for env, t in done[:, :-1].nonzero().tolist():
            row = worker * N + env
            j = int(self._end_cursor[row])
            self._ends[row, j] = next_pixels[env, t, -1]
            self._end_owner[row, j] = slot_id * T + t
            self._end_slot[row, w, t] = j
            self._end_cursor[row] = (j + 1) % self.max_episode_ends
        self._slot_id[worker, w] = slot_id
        has, starts = self._check_history(pixels[:, 0], worker, w)
        self._has_history[rows, w] = has
        self._history_only[rows, w] = broken = ~(has | starts)
        if broken.any():
            self.history_only_segments += int(broken.sum())
            warnings.warn(
                "FrameStackReplayBuffer: a batch does not continue the previous "
                "batch of its worker (one was left out, as a batch dropped for its "
                "policy lag): its segments serve as frame history only",
                stacklevel=3,
            )
        self._cursor[worker] = (w + 1) % self.slots
        self._written[worker] += 1

    def _check_history(self, first_stack: torch.Tensor, worker: int, w: int):
        """``(has_history, starts_episode)`` of each row's first stack: whether it
        continues the frames of the previous slot of its row (the stack rebuilt
        from them equals the one the environment produced), and whether it starts
        an episode (its older frames are padding, as after a restart)."""
        N, K = self.num_envs, self.stack - 1
        rows = slice(worker * N, (worker + 1) * N)
        older = first_stack[:, :-1]
        if self.padding == "zeros":
            starts = (older == 0).flatten(1).all(-1)
        else:
            starts = (older == first_stack[:, -1:]).flatten(1).all(-1)
        has = torch.zeros(N, dtype=torch.bool)
        if self._written[worker] > 0:
            prev = (w - 1) % self.slots
            done = self._data[rows, prev].get(self.done_key).reshape(N, self.T)
            rebuilt, _ = rebuild_stacks(
                history=self._frames[rows, prev, self.T - K :],
                history_done=done[:, self.T - K :],
                has_history=torch.ones(N, dtype=torch.bool),
                frames=first_stack[:, -1:],
                done=torch.zeros(N, 1, dtype=torch.bool),
                last_next=first_stack[:, -1],
                padding=self.padding,
            )
            has = (rebuilt[:, 0] == first_stack).flatten(1).all(-1)
        return has, starts

    # -- sampling ----------------------------------------------------------------

    def _sampleable(self) -> torch.Tensor:
        """``[M, 2]``: the ``(slot, row)`` of every segment that can be sampled,
        by slot then row."""
        if self._sampleable_index is None:
            if not self._initialized:
                return torch.zeros(0, 2, dtype=torch.long)
            slot = torch.arange(self.slots)
            written = slot < self._written.clamp(max=self.slots)[:, None]
            # the oldest slot of a full ring: history only
            oldest = (self._written >= self.slots)[:, None] & (
                slot == self._cursor[:, None]
            )
            ok = (written & ~oldest).repeat_interleave(self.num_envs, 0)
            ok &= ~self._history_only
            self._sampleable_index = ok.T.nonzero()
        return self._sampleable_index

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """``[batch_size, T]`` segments, each one environment's consecutive steps,
        with ``pixels`` and ``("next", pixels)`` stacks rebuilt."""
        index = self._sampleable()
        if len(index) == 0:
            raise RuntimeError("FrameStackReplayBuffer.sample: the buffer is empty")
        B = batch_size or self.batch_segments
        pick = torch.randint(len(index), (B,), generator=self.generator)
        slot, row = index[pick].unbind(1)
        return self.get_segments(row, slot)

    def get_segments(self, row: torch.Tensor, slot: torch.Tensor) -> TensorDictBase:
        """The stored segments of ``(row[i], slot[i])``, stacks rebuilt (row
        ``w * num_envs + e``: worker ``w``'s environment ``e``)."""
        K, T = self.stack - 1, self.T
        prev = (slot - 1) % self.slots
        data = self._data[row, slot]
        done = data.get(self.done_key).reshape(len(row), T)
        prev_done = self._data[row, prev].get(self.done_key).reshape(len(row), T)
        ends = self._end_frames(row, slot, done)
        obs, nxt = rebuild_stacks(
            history=self._frames[row, prev, T - K :],
            history_done=prev_done[:, T - K :],
            has_history=self._has_history[row, slot],
            frames=self._frames[row, slot],
            done=done,
            last_next=self._last_next[row, slot],
            end_frames=ends,
            padding=self.padding,
        )
        data.set(self.pixels_key, obs)
        data.set(("next", self.pixels_key), nxt)
        return data

    def _end_frames(self, row, slot, done):
        index = self._end_slot[row, slot]  # [B, T], -1 where no episode ends
        has_end = index >= 0
        if not has_end.any():
            return None
        b, t = has_end.nonzero(as_tuple=True)
        j = index[b, t]
        owner = self._slot_id[row[b] // self.num_envs, slot[b]] * self.T + t
        if (self._end_owner[row[b], j] != owner).any():
            raise RuntimeError(
                "FrameStackReplayBuffer: the last frame of an episode inside a "
                "sampled segment was overwritten; raise max_episode_ends (now "
                f"{self.max_episode_ends} per environment)"
            )
        ends = torch.zeros(*index.shape, *self._ends.shape[-2:], dtype=self._ends.dtype)
        ends[b, t] = self._ends[row[b], j]
        return ends

    # -- checkpoints ---------------------------------------------------------------

    # per row and slot (``_slot_id``: per worker and slot), and per row and
    # side-ring entry (all along dimension 1)
    _PER_SLOT = (
        "_frames",
        "_last_next",
        "_end_slot",
        "_has_history",
        "_history_only",
        "_data",
    )
    _PER_END = ("_ends", "_end_owner")
    # per row (``_end_cursor``) or worker: saved whole
    _CURSORS = ("_end_cursor", "_cursor", "_written")
    # the storage, as attributes
    _STATE = (*_PER_SLOT, *_PER_END, "_slot_id", *_CURSORS, "stack")

    def state_dict(self) -> dict:
        """The written slots and side-ring entries only (the storage is allocated
        at full capacity on the first ``extend``: saving all of it would cost the
        capacity, however little is stored), the cursors, and the sampling
        generator's state."""
        generator = None if self.generator is None else self.generator.get_state()
        if not self._initialized:
            return {"initialized": False, "generator": generator}
        slots = int(self._written.clamp(max=self.slots).max())
        written_ends = (self._end_owner >= 0).any(0).nonzero()
        ends = int(written_ends.max()) + 1 if len(written_ends) else 0
        return {
            "initialized": True,
            "generator": generator,
            "num_workers": self.num_workers,
            "slots": self.slots,
            "max_episode_ends": self.max_episode_ends,
            "filled_slots": slots,
            "filled_ends": ends,
            "history_only_segments": self.history_only_segments,
            # clones: a saved view would write its whole storage
            **{
                k: getattr(self, k)[:, :slots].clone()
                for k in (*self._PER_SLOT, "_slot_id")
            },
            **{k: getattr(self, k)[:, :ends].clone() for k in self._PER_END},
            **{k: getattr(self, k).clone() for k in self._CURSORS},
            "stack": self.stack,
        }

    def load_state_dict(self, state: dict) -> None:
        saved_generator = state.get("generator")
        if self.generator is not None and saved_generator is not None:
            self.generator.set_state(saved_generator)
        if not state["initialized"]:
            return
        state = _one_worker_state(state) if "num_workers" not in state else state
        if state["num_workers"] != self.num_workers:
            raise ConfigError(
                f"FrameStackReplayBuffer: the checkpoint's replay holds the "
                f"environments of {state['num_workers']} collector worker(s), this "
                f"one is for {self.num_workers} (a ring per worker's environment, "
                f"each continuing that environment's frames): resume with "
                f"collector.num_workers={state['num_workers']}"
            )
        mine = (self.num_envs, self.slots, self.max_episode_ends)
        theirs = (
            state["_end_cursor"].shape[0] // state["num_workers"],
            state["slots"],
            state["max_episode_ends"],
        )
        if mine != theirs:
            raise ValueError(
                f"FrameStackReplayBuffer: the checkpoint's buffer has (num_envs, "
                f"slots, max_episode_ends) = {theirs}, this one {mine}"
            )
        # the saved slots and side-ring entries into blank storage
        frames = state["_frames"]
        self._allocate(frames.shape[3:], frames.dtype, state["_data"][:1, 0])
        for key in (*self._PER_SLOT, "_slot_id", *self._PER_END):
            saved = state[key]
            getattr(self, key)[:, : saved.shape[1]] = saved
        for key in self._CURSORS:
            setattr(self, key, state[key].clone())
        self.stack = state["stack"]
        self.history_only_segments = state["history_only_segments"]
        self._sampleable_index = None

    def nbytes(self) -> int:
        """Bytes held by the storage."""
        if not self._initialized:
            return 0
        tensors = [getattr(self, k) for k in self._STATE if k not in ("_data", "stack")]
        return sum(t.numel() * t.element_size() for t in tensors) + self._data.bytes()


def _one_worker_state(state: dict) -> dict:
    """A state saved before the buffer kept workers apart (one ring for all
    rows: ``_cursor`` and ``_written`` numbers, ``_slot_id`` per slot), as the
    state of a buffer for one worker. A whole storage, as saved before only the
    written part was, is taken as all written."""
    state = dict(state)
    slot_id = state["_slot_id"]
    if "filled_slots" not in state:
        state["slots"] = slot_id.shape[0]
        state["max_episode_ends"] = state["_ends"].shape[1]
    state["num_workers"] = 1
    state["_slot_id"] = slot_id[None]
    state["_history_only"] = torch.zeros_like(state["_has_history"])
    state["_cursor"] = torch.tensor([state["_cursor"]])
    state["_written"] = torch.tensor([state["_written"]])
    state["history_only_segments"] = 0
    return state


def _stack_index(positions, episode_start, padding, blank):
    """Frame positions of stacks, those before the episode's start replaced."""
    start = episode_start[..., None]
    if padding == "first":
        return torch.maximum(positions, start)
    return torch.where(positions < start, blank, positions)


def rebuild_stacks(
    *,
    history: torch.Tensor,
    history_done: torch.Tensor,
    has_history: torch.Tensor,
    frames: torch.Tensor,
    done: torch.Tensor,
    last_next: torch.Tensor,
    end_frames: torch.Tensor | None = None,
    padding: str = "zeros",
):
    """Frame stacks of ``s_t`` and ``s'_t`` for ``B`` segments of ``T`` steps.

    Args:
        history: ``[B, K, H, W]``, the frames of the ``K = stack - 1`` steps before
            the segment.
        history_done: ``[B, K]``, their end-of-episode flags.
        has_history: ``[B]``; ``False`` where the segment starts an episode.
        frames: ``[B, T, H, W]``, the newest frame of each ``s_t``.
        done: ``[B, T]``, end of episode after each step.
        last_next: ``[B, H, W]``, the newest frame of ``s'_{T-1}``.
        end_frames: ``[B, T, H, W]``, the newest frame of ``s'_t`` where ``done``
            before the last step (else unused); ``None`` if there is none.

        padding: what fills a stack before the first frame of its episode:
            ``"zeros"`` (blank frames, as the ALE's vector env does) or ``"first"``
            (the episode's first frame repeated, as gymnasium's
            ``FrameStackObservation(padding_type="reset")`` does).

    Returns:
        ``(stacks of s_t, stacks of s'_t)``, each ``[B, T, K + 1, H, W]``. A stack
        never reaches past the first frame of its episode.
    """
    B, T = done.shape
    K = history.shape[1]
    all_frames = torch.cat([history, frames], 1)  # positions -K .. T-1
    all_done = torch.cat([history_done, done], 1).clone()
    all_done[:, K - 1] |= ~has_history  # no history: an episode starts at 0
    q = torch.arange(K + T)
    # the first position of the episode each position belongs to
    marker = torch.where(all_done, q + 1, torch.zeros_like(q))
    start = torch.cat(
        [torch.zeros(B, 1, dtype=torch.long), marker.cummax(1).values[:, :-1]], 1
    )
    t = torch.arange(T) + K  # positions of the segment's steps
    episode_start = start[:, t]  # [B, T]
    offsets = torch.arange(-K, 1)
    obs_index = _stack_index(t[:, None] + offsets, episode_start, padding, K + T)
    next_index = _stack_index(t[:, None] + offsets[1:], episode_start, padding, K + T)
    # position K + T is a blank frame, for zero padding
    all_frames = torch.cat([all_frames, torch.zeros_like(all_frames[:, :1])], 1)
    batch = torch.arange(B)[:, None, None]
    obs = all_frames[batch, obs_index]
    # the newest frame of s'_t: the next step's frame inside an episode, else the
    # episode's real last frame, and the stored one after the last step
    newest_next = torch.cat([frames[:, 1:], last_next[:, None]], 1)
    if end_frames is not None:
        ended = done.clone()
        ended[:, -1] = False
        newest_next = torch.where(ended[..., None, None], end_frames, newest_next)
    nxt = torch.cat([all_frames[batch, next_index], newest_next[:, :, None]], 2)
    return obs, nxt
