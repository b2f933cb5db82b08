import gymnasium as gym
import pytest
import torch
from _frame_replay_helpers import (
    RandomFrames,
    assert_rebuilt_as_collected,
    collect,
    make_stacked_env,
    tag_worker,
)
from gymnasium.wrappers import FrameStackObservation
from torchrl.envs import GymWrapper

from torchrl_acer.training.frame_replay import FrameStackReplayBuffer, rebuild_stacks


@pytest.mark.parametrize("padding", ["first", "zeros"])
@pytest.mark.parametrize("capacity", [1000, 40])
def test_rebuilt_stacks_equal_the_environment_stacks(capacity, padding):
    N, T = 3, 8
    env = make_stacked_env(N, padding=padding)
    batches = collect(env, T, 12)
    assert sum(b["next", "done"][:, :-1].sum() for b in batches) > 5  # mid-row ends
    assert sum((b["next", "truncated"]).sum() for b in batches) > 0
    rb = FrameStackReplayBuffer(
        N, capacity, T, 4, pixels_key="observation", padding=padding
    )
    for b in batches:
        rb.extend(b)
    # a full ring keeps capacity // T sampleable slots (and wraps around here)
    assert assert_rebuilt_as_collected(rb, [batches]) == N * min(
        len(batches), capacity // T
    )


@pytest.mark.parametrize("layout", ["async", "sync"])
def test_each_workers_batches_rebuild_its_own_environments_stacks(layout):
    """Two workers, each with environments of its own (distinct frames): their
    batches come interleaved (asynchronous collectors: in any order, one worker
    twice in a row) or together (synchronous: ``[workers, num_envs, T]``). Each
    goes to its worker's rows, found by ``"worker_index"``, and every segment
    that can be sampled rebuilds the stacks its environment produced, episode
    ends inside segments included, after the rings wrapped around."""
    N, T, W, per_worker = 2, 8, 2, 7
    batches = [
        tag_worker(collect(make_stacked_env(N, seed=10 + w), T, per_worker), w)
        for w in range(W)
    ]
    assert sum(b["next", "done"][:, :-1].sum() for bs in batches for b in bs) > 5
    rb = FrameStackReplayBuffer(
        N, 40, T, 4, num_workers=W, pixels_key="observation", padding="first"
    )
    if layout == "async":
        order, seen = [0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 1], [0, 0]
        for w in order:
            rb.extend(batches[w][seen[w]])
            seen[w] += 1
    else:
        for i, pair in enumerate(zip(*batches, strict=True)):
            # the worker index, not the position, routes: every other batch
            # holds the workers the other way round
            rb.extend(torch.stack(pair if i % 2 else pair[::-1]))
    assert rb.history_only_segments == 0
    # 40 steps per env: 5 sampleable slots of 8 (the sixth, oldest, is history)
    assert len(rb) == W * N * 5
    assert assert_rebuilt_as_collected(rb, batches) == W * N * 5
    assert rb.sample().batch_size == (4, T)


def test_sample_shapes_and_memory():
    N, T = 2, 8
    env = make_stacked_env(N, seed=1)
    rb = FrameStackReplayBuffer(N, 64, T, 5, pixels_key="observation", padding="first")
    for b in collect(env, T, 3):
        rb.extend(b)
    sample = rb.sample()
    assert sample.batch_size == (5, T)
    assert sample["observation"].shape == (5, T, 4, 84, 84)
    assert sample["observation"].dtype == torch.uint8
    assert len(rb) == 3 * N
    # one 84x84 frame per step plus small change: under 1.5 frames a step
    steps = rb.slots * N * T
    assert rb.nbytes() / steps < 1.5 * 84 * 84


def test_restart_starts_episodes_without_history():
    N, T = 2, 6
    rb = FrameStackReplayBuffer(N, 100, T, 4, pixels_key="observation", padding="first")
    first = collect(make_stacked_env(N, seed=2), T, 2)
    for b in first:
        rb.extend(b)
    # a new environment (as after resuming from a checkpoint) starts fresh episodes
    second = collect(make_stacked_env(N, seed=3), T, 2)
    for b in second:
        rb.extend(b)
    envs = torch.arange(N)
    for i, b in enumerate(first + second):
        got = rb.get_segments(envs, torch.full((N,), i))
        assert torch.equal(got["observation"], b["observation"])
        assert torch.equal(got["next", "observation"], b["next", "observation"])


def test_a_left_out_batch_leaves_its_successor_as_history_only():
    """A batch the trainer did not store (dropped as too stale, or not finite):
    the next one of that worker continues nothing stored. Its segments, whose
    first stacks cannot be rebuilt, are kept as frame history only (never
    sampled); the batch after it is sampled, with the right stacks."""
    N, T = 2, 6
    rb = FrameStackReplayBuffer(N, 100, T, 4, pixels_key="observation", padding="first")
    batches = collect(make_stacked_env(N, seed=4), T, 4)
    rb.extend(batches[0])
    with pytest.warns(UserWarning, match="does not continue the previous batch"):
        rb.extend(batches[2])  # batches[1] left out
    rb.extend(batches[3])
    first = batches[2]["observation"][:, 0]
    starts = (first[:, :-1] == first[:, -1:]).flatten(1).all(-1)
    assert rb.history_only_segments == int((~starts).sum()) > 0
    stored = [[batches[0], batches[2], batches[3]]]
    assert assert_rebuilt_as_collected(rb, stored) == 2 * N + int(starts.sum())


def test_batches_that_cannot_be_placed_raise():
    N, T = 2, 6
    batch = collect(make_stacked_env(N, seed=4), T, 1)[0]
    rb = FrameStackReplayBuffer(N, 100, T, 4, pixels_key="observation", padding="first")
    with pytest.raises(ValueError, match=r"\[k \* num_envs, T\] = \[k \* 2, 6\]"):
        rb.extend(batch[:, :3])
    two = FrameStackReplayBuffer(
        N, 100, T, 4, num_workers=2, pixels_key="observation", padding="first"
    )
    with pytest.raises(ValueError, match="without 'worker_index'"):
        two.extend(batch)
    with pytest.raises(ValueError, match=r"from worker \[2\]"):
        two.extend(tag_worker([batch.clone()], 2)[0])


def test_state_dict_round_trip():
    N, T = 2, 6
    rb = FrameStackReplayBuffer(N, 30, T, 4, pixels_key="observation", padding="first")
    batches = collect(make_stacked_env(N, seed=5), T, 7)
    for b in batches:
        rb.extend(b)
    other = FrameStackReplayBuffer(
        N, 30, T, 4, pixels_key="observation", padding="first"
    )
    other.load_state_dict(rb.state_dict())
    assert len(other) == len(rb)
    envs, slots = torch.arange(N), torch.full((N,), 2)
    assert (other.get_segments(envs, slots) == rb.get_segments(envs, slots)).all()
    # and it keeps going where the first left off
    more = collect(make_stacked_env(N, seed=6), T, 1)[0]
    rb.extend(more)
    other.extend(more)
    assert (other._frames == rb._frames).all()


def test_state_dict_of_two_workers_round_trip_and_needs_two_workers():
    N, T = 2, 6
    batches = [
        tag_worker(collect(make_stacked_env(N, seed=20 + w), T, 4), w) for w in (0, 1)
    ]

    def make(workers):
        return FrameStackReplayBuffer(
            N,
            30,
            T,
            4,
            num_workers=workers,
            pixels_key="observation",
            padding="first",
            generator=torch.Generator().manual_seed(1),
        )

    rb = make(2)
    for i in range(3):
        rb.extend(batches[0][i])
    rb.extend(batches[1][0])  # worker 1 is behind
    state = rb.state_dict()
    other = make(2)
    other.load_state_dict(state)
    assert len(other) == len(rb) == 4 * N
    assert (other.sample() == rb.sample()).all()
    # both go on alike, each worker where it left off
    for b in (batches[1][1], batches[0][3]):
        rb.extend(b)
        other.extend(b)
    for key in FrameStackReplayBuffer._STATE:
        mine, theirs = getattr(rb, key), getattr(other, key)
        assert (mine == theirs).all() if hasattr(mine, "shape") else mine == theirs
    assert assert_rebuilt_as_collected(other, batches) == 6 * N
    for workers in (1, 3):
        with pytest.raises(ValueError, match=f"2 collector worker.*for {workers}"):
            make(workers).load_state_dict(state)


def test_state_saved_with_one_ring_loads_as_one_worker():
    """A checkpoint written before the buffer kept workers apart (one ring for
    all rows: ``_cursor`` and ``_written`` numbers, ``_slot_id`` per slot, no
    ``num_workers``) resumes into a buffer for one worker."""
    N, T = 2, 6
    batches = collect(make_stacked_env(N, seed=5), T, 4)
    rb = FrameStackReplayBuffer(N, 30, T, 4, pixels_key="observation", padding="first")
    for b in batches[:3]:
        rb.extend(b)
    new = rb.state_dict()
    drop = ("num_workers", "_history_only", "history_only_segments")
    old = {k: v for k, v in new.items() if k not in drop}
    old.update(
        _slot_id=new["_slot_id"][0],
        _cursor=int(new["_cursor"][0]),
        _written=int(new["_written"][0]),
    )
    other = FrameStackReplayBuffer(
        N, 30, T, 4, pixels_key="observation", padding="first"
    )
    other.load_state_dict(old)
    other.extend(batches[3])
    assert assert_rebuilt_as_collected(other, [batches]) == 4 * N


def test_overwritten_episode_end_raises():
    N, T = 1, 8
    env = GymWrapper(
        gym.vector.SyncVectorEnv(
            [lambda: FrameStackObservation(RandomFrames(p_end=0.4), 4)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    )
    env.set_seed(0)
    rb = FrameStackReplayBuffer(
        N, 400, T, 1, pixels_key="observation", max_episode_ends=2, padding="first"
    )
    batches = collect(env, T, 6)
    for b in batches:
        rb.extend(b)
    with pytest.raises(RuntimeError, match="raise max_episode_ends"):
        rb.get_segments(
            torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        )


def test_rebuild_stacks_by_hand():
    # one segment, T = 4, stack of 3 (K = 2): frames are their own step numbers
    frame = lambda v: torch.full((1, 1), v, dtype=torch.uint8)  # noqa: E731
    history = torch.stack([frame(8), frame(9)])[None]
    frames = torch.stack([frame(10), frame(11), frame(12), frame(13)])[None]
    done = torch.tensor([[False, True, False, False]])  # episode ends after step 11
    end_frames = torch.zeros(1, 4, 1, 1, dtype=torch.uint8)
    end_frames[0, 1] = 99  # the real last frame of that episode
    obs, nxt = rebuild_stacks(
        history=history,
        history_done=torch.tensor([[False, False]]),
        has_history=torch.tensor([True]),
        frames=frames,
        done=done,
        last_next=frame(14)[None],
        end_frames=end_frames,
        padding="first",
    )
    values = lambda x: x[0, :, :, 0, 0].tolist()  # noqa: E731
    assert values(obs) == [[8, 9, 10], [9, 10, 11], [12, 12, 12], [12, 12, 13]]
    assert values(nxt) == [[9, 10, 11], [10, 11, 99], [12, 12, 13], [12, 13, 14]]
    # without history the first episode starts at step 10
    obs, _ = rebuild_stacks(
        history=history,
        history_done=torch.tensor([[False, False]]),
        has_history=torch.tensor([False]),
        frames=frames,
        done=done,
        last_next=frame(14)[None],
        end_frames=end_frames,
        padding="first",
    )
    assert values(obs)[:2] == [[10, 10, 10], [10, 10, 11]]
    # zero padding: blank frames before the episode's first
    obs, nxt = rebuild_stacks(
        history=history,
        history_done=torch.tensor([[False, False]]),
        has_history=torch.tensor([True]),
        frames=frames,
        done=done,
        last_next=frame(14)[None],
        end_frames=end_frames,
        padding="zeros",
    )
    assert values(obs) == [[8, 9, 10], [9, 10, 11], [0, 0, 12], [0, 12, 13]]
    assert values(nxt) == [[9, 10, 11], [10, 11, 99], [0, 12, 13], [12, 13, 14]]


def test_collector_batches_from_atari():
    ale_py = pytest.importorskip("ale_py")
    from torchrl.collectors import Collector

    from torchrl_acer.modules.models import atari_actor_critic
    from torchrl_acer.training.atari import make_atari_env

    gym.register_envs(ale_py)
    N, T = 2, 10
    env = make_atari_env("ALE/Breakout-v5", num_envs=N, seed=0, max_episode_steps=37)
    actor, _ = atari_actor_critic(
        env.action_spec.shape[-1], action_spec=env.action_spec[0]
    )
    collector = Collector(
        env,
        actor,
        frames_per_batch=N * T,
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    rb = FrameStackReplayBuffer(N, 60, T, 4)
    batches = []
    for i, batch in enumerate(collector):
        rb.extend(batch)
        batches.append(batch)
        if i == 9:
            break
    collector.shutdown()
    assert any(b["next", "done"][:, :-1].any() for b in batches)
    assert assert_rebuilt_as_collected(rb, [batches]) == N * 6
