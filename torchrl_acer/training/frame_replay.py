"""A replay of stacked-frame segments that stores each frame once, as uint8.

Atari agents see stacks of the last 4 frames, and a naive replay stores every stack
twice (for ``s`` and ``s'``): 8 frames, 56 KB per step as uint8 (over 200 KB as
float32). This buffer keeps, per step, only the newest frame of ``s_t``, and
rebuilds both stacks when a segment is sampled, so that a step costs one 84x84
frame (7 KB) plus its small entries.

Layout: per environment, a ring of ``segment`` slots of ``T`` steps, written by
``extend([num_envs, T])``. Beside the frames of ``s_t`` it keeps, per slot, the
newest frame of the last step's ``s'``, and, in a small side ring, the real last
frame of every episode that ends before a slot's last step (the next row starts
with a reset frame). A stack never reaches back past the first frame of its
episode: like the environment's frame stack, it repeats the episode's first frame
instead. Slots are sampled whole, as ACER replays them; the oldest slot of a full
ring only serves as frame history for the next one.

At every ``extend``, the history the buffer holds for the batch's first stacks is
checked against the stacks the environment produced; a batch that starts new
episodes (after a restart) is recognised, and any other mismatch raises.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

__all__ = ["FrameStackReplayBuffer"]


class FrameStackReplayBuffer:
    """Replay of ``T``-step segments with frame stacks rebuilt at sampling time.

    Args:
        num_envs: environments of the collector (rows of each batch).
        capacity_per_env: steps kept per environment (a multiple of ``T`` is used;
            one more slot is kept as frame history).
        segment_length: ``T``.
        batch_segments: segments per sampled batch.

    Keyword Args:
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
        if num_envs < 1 or batch_segments < 1:
            raise ValueError("num_envs and batch_segments must be positive")
        self.num_envs = num_envs
        self.T = segment_length
        self.slots = capacity_per_env // segment_length + 1
        self.batch_segments = batch_segments
        self.pixels_key = pixels_key
        self.done_key = (
            ("next", done_key)
            if isinstance(done_key, str)
            else (
                "next",
                *done_key,
            )
        )
        self.max_episode_ends = max_episode_ends or max(capacity_per_env // 64, 8)
        self.generator = generator
        self._initialized = False
        self._cursor = 0  # next slot to write
        self._written = 0  # slots written so far

    @property
    def required_keys(self) -> tuple:
        """The entries it reads from a stored batch besides those the loss reads:
        the frames and the game's done flag (where frame stacks restart)."""
        return (self.pixels_key, ("next", self.pixels_key), self.done_key)

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
        frame_shape = pixels.shape[-2:]
        N, S, T = self.num_envs, self.slots, self.T
        self._frames = torch.zeros(N, S, T, *frame_shape, dtype=pixels.dtype)
        self._last_next = torch.zeros(N, S, *frame_shape, dtype=pixels.dtype)
        self._ends = torch.zeros(
            N, self.max_episode_ends, *frame_shape, dtype=pixels.dtype
        )
        self._end_slot = torch.full((N, S, T), -1, dtype=torch.long)
        self._end_owner = torch.full((N, self.max_episode_ends), -1, dtype=torch.long)
        self._end_cursor = torch.zeros(N, dtype=torch.long)
        self._has_history = torch.zeros(N, S, dtype=torch.bool)
        self._slot_id = torch.full((S,), -1, dtype=torch.long)
        rest = self._strip(batch)
        self._data = rest.unsqueeze(1).expand(N, S, T).clone().apply(torch.zeros_like)
        self._initialized = True

    def _strip(self, batch: TensorDictBase) -> TensorDictBase:
        return batch.exclude(self.pixels_key, ("next", self.pixels_key))

    def __len__(self) -> int:
        """Number of segments that can be sampled."""
        filled = min(self._written, self.slots)
        if self._written > self.slots - 1:
            filled -= 1  # the oldest slot of a full ring is history only
        return filled * self.num_envs

    def extend(self, batch: TensorDictBase) -> None:
        """Stores a ``[num_envs, T]`` batch as one slot per environment."""
        if batch.batch_size != (self.num_envs, self.T):
            raise ValueError(
                f"FrameStackReplayBuffer.extend expects a [num_envs, T] = "
                f"[{self.num_envs}, {self.T}] batch, got {tuple(batch.batch_size)}"
            )
        if not self._initialized:
            self._init_storage(batch)
        pixels = batch.get(self.pixels_key)
        next_pixels = batch.get(("next", self.pixels_key))
        done = batch.get(self.done_key).reshape(self.num_envs, self.T)
        w = self._cursor
        slot_id = self._written
        self._frames[:, w] = pixels[:, :, -1]
        self._last_next[:, w] = next_pixels[:, -1, -1]
        self._data[:, w] = self._strip(batch)
        # the real last frame of episodes ending before the slot's last step
        self._end_slot[:, w] = -1
        for env, t in done[:, :-1].nonzero().tolist():
            j = int(self._end_cursor[env])
            self._ends[env, j] = next_pixels[env, t, -1]
            self._end_owner[env, j] = slot_id * self.T + t
            self._end_slot[env, w, t] = j
            self._end_cursor[env] = (j + 1) % self.max_episode_ends
        self._slot_id[w] = slot_id
        self._has_history[:, w] = self._check_history(pixels[:, 0], w)
        self._cursor = (w + 1) % self.slots
        self._written += 1

    def _check_history(self, first_stack: torch.Tensor, w: int) -> torch.Tensor:
        """Whether each env's first stack continues the previous slot's frames.

        The stack rebuilt from the previous slot must equal the one the environment
        produced; a stack that starts an episode (its first frame repeated), as
        after a restart, has no history. Anything else is an error.
        """
        N, K = self.num_envs, self.stack - 1
        older = first_stack[:, :-1]
        if self.padding == "zeros":
            is_reset = (older == 0).flatten(1).all(-1)
        else:
            is_reset = (older == first_stack[:, -1:]).flatten(1).all(-1)
        has = torch.zeros(N, dtype=torch.bool)
        if self._written > 0:
            prev = (w - 1) % self.slots
            done = self._data[:, prev].get(self.done_key).reshape(N, self.T)
            rebuilt, _ = rebuild_stacks(
                history=self._frames[:, prev, self.T - K :],
                history_done=done[:, self.T - K :],
                has_history=torch.ones(N, dtype=torch.bool),
                frames=first_stack[:, -1:],
                done=torch.zeros(N, 1, dtype=torch.bool),
                last_next=first_stack[:, -1],
                padding=self.padding,
            )
            has = (rebuilt[:, 0] == first_stack).flatten(1).all(-1)
        bad = ~(has | is_reset)
        if bad.any():
            env = int(bad.nonzero()[0])
            raise ValueError(
                f"FrameStackReplayBuffer: the first stack of environment {env} neither "
                f"continues its previous segment nor starts an episode; extend with "
                f"consecutive [num_envs, T] batches of the same environments"
            )
        return has

    # -- sampling ----------------------------------------------------------------

    def _sampleable_slots(self) -> torch.Tensor:
        slots = torch.arange(min(self._written, self.slots))
        if self._written >= self.slots:
            slots = slots[slots != self._cursor]  # the oldest: history only
        return slots

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """``[batch_size, T]`` segments, each one environment's consecutive steps,
        with ``pixels`` and ``("next", pixels)`` stacks rebuilt."""
        if len(self) == 0:
            raise RuntimeError("FrameStackReplayBuffer.sample: the buffer is empty")
        B = batch_size or self.batch_segments
        slots = self._sampleable_slots()
        pick = torch.randint(len(slots) * self.num_envs, (B,), generator=self.generator)
        env, slot = pick % self.num_envs, slots[pick // self.num_envs]
        return self.get_segments(env, slot)

    def get_segments(self, env: torch.Tensor, slot: torch.Tensor) -> TensorDictBase:
        """The stored segments of ``(env[i], slot[i])``, stacks rebuilt."""
        K, T = self.stack - 1, self.T
        prev = (slot - 1) % self.slots
        data = self._data[env, slot]
        done = data.get(self.done_key).reshape(len(env), T)
        prev_done = self._data[env, prev].get(self.done_key).reshape(len(env), T)
        ends = self._end_frames(env, slot, done)
        obs, nxt = rebuild_stacks(
            history=self._frames[env, prev, T - K :],
            history_done=prev_done[:, T - K :],
            has_history=self._has_history[env, slot],
            frames=self._frames[env, slot],
            done=done,
            last_next=self._last_next[env, slot],
            end_frames=ends,
            padding=self.padding,
        )
        data.set(self.pixels_key, obs)
        data.set(("next", self.pixels_key), nxt)
        return data

    def _end_frames(self, env, slot, done):
        index = self._end_slot[env, slot]  # [B, T], -1 where no episode ends
        has_end = index >= 0
        if not has_end.any():
            return None
        b, t = has_end.nonzero(as_tuple=True)
        j = index[b, t]
        owner = self._slot_id[slot[b]] * self.T + t
        if (self._end_owner[env[b], j] != owner).any():
            raise RuntimeError(
                "FrameStackReplayBuffer: the last frame of an episode inside a "
                "sampled segment was overwritten; raise max_episode_ends (now "
                f"{self.max_episode_ends} per environment)"
            )
        ends = torch.zeros(*index.shape, *self._ends.shape[-2:], dtype=self._ends.dtype)
        ends[b, t] = self._ends[env[b], j]
        return ends

    # -- checkpoints ---------------------------------------------------------------

    _STATE = (
        "_frames",
        "_last_next",
        "_ends",
        "_end_slot",
        "_end_owner",
        "_end_cursor",
        "_has_history",
        "_slot_id",
        "_data",
        "_cursor",
        "_written",
        "stack",
    )

    # per slot and per side-ring entry (both along dimension 1), and what a slot
    # or an entry not yet written holds
    _PER_SLOT = ("_frames", "_last_next", "_end_slot", "_has_history", "_data")
    _PER_END = ("_ends", "_end_owner")
    _BLANK = {"_end_slot": -1, "_end_owner": -1}

    def state_dict(self) -> dict:
        """The written slots and side-ring entries only (the storage is allocated
        at full capacity on the first ``extend``: saving all of it would cost the
        capacity, however little is stored), the cursors, and the sampling
        generator's state."""
        generator = None if self.generator is None else self.generator.get_state()
        if not self._initialized:
            return {"initialized": False, "generator": generator}
        slots = min(self._written, self.slots)
        written_ends = (self._end_owner >= 0).any(0).nonzero()
        ends = int(written_ends.max()) + 1 if len(written_ends) else 0
        state = {
            "initialized": True,
            "generator": generator,
            "slots": self.slots,
            "max_episode_ends": self.max_episode_ends,
            "filled_slots": slots,
            "filled_ends": ends,
            "_slot_id": self._slot_id[:slots].clone(),
            # clones: a saved view would write its whole storage
            **{k: getattr(self, k)[:, :slots].clone() for k in self._PER_SLOT},
            **{k: getattr(self, k)[:, :ends].clone() for k in self._PER_END},
        }
        for key in ("_end_cursor", "_cursor", "_written", "stack"):
            value = getattr(self, key)
            state[key] = value.clone() if hasattr(value, "clone") else value
        return state

    def load_state_dict(self, state: dict) -> None:
        saved_generator = state.get("generator")
        if self.generator is not None and saved_generator is not None:
            self.generator.set_state(saved_generator)
        if not state["initialized"]:
            return
        if "filled_slots" not in state:  # a whole storage, as saved before
            for key in self._STATE:
                value = state[key]
                setattr(self, key, value.clone() if hasattr(value, "clone") else value)
            self._initialized = True
            return
        mine = (self.num_envs, self.slots, self.max_episode_ends)
        theirs = (
            state["_end_cursor"].shape[0],
            state["slots"],
            state["max_episode_ends"],
        )
        if mine != theirs:
            raise ValueError(
                f"FrameStackReplayBuffer: the checkpoint's buffer has (num_envs, "
                f"slots, max_episode_ends) = {theirs}, this one {mine}"
            )
        N, S, E = mine

        def full(key, length, saved):
            """``saved``'s first entries along dimension 1, the rest blank."""
            if key == "_data":
                out = saved[:, :1].expand(N, length, self.T).clone()
                out = out.apply(torch.zeros_like)
            else:
                shape = (N, length, *saved.shape[2:])
                out = torch.full(shape, self._BLANK.get(key, 0), dtype=saved.dtype)
            out[:, : saved.shape[1]] = saved
            return out

        for key in self._PER_SLOT:
            setattr(self, key, full(key, S, state[key]))
        for key in self._PER_END:
            setattr(self, key, full(key, E, state[key]))
        # the slot ids: dimension 0
        self._slot_id = torch.full((S,), -1, dtype=torch.long)
        self._slot_id[: len(state["_slot_id"])] = state["_slot_id"]
        for key in ("_end_cursor", "_cursor", "_written", "stack"):
            value = state[key]
            setattr(self, key, value.clone() if hasattr(value, "clone") else value)
        self._initialized = True

    def nbytes(self) -> int:
        """Bytes held by the storage."""
        if not self._initialized:
            return 0
        tensors = [getattr(self, k) for k in self._STATE[:8]]
        tensors += list(self._data.values(True, True))
        return sum(t.numel() * t.element_size() for t in tensors)


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
