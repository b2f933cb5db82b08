import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import FrameStackObservation
from torchrl.envs import GymWrapper

from torchrl_acer.training.frame_replay import FrameStackReplayBuffer, rebuild_stacks


class RandomFrames(gym.Env):
    """Random 84x84 uint8 frames; episodes end at random (terminated) or after
    ``limit`` steps (truncated). Every frame is distinct, so a wrong frame in a
    rebuilt stack cannot go unnoticed."""

    observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, p_end=0.08, limit=13):
        self.p_end, self.limit = p_end, limit

    def _frame(self):
        return self.np_random.integers(0, 256, (84, 84), dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < self.p_end)
        truncated = self.t >= self.limit and not terminated
        return self._frame(), 1.0, terminated, truncated, {}


GYM_PADDING = {"first": "reset", "zeros": "zero"}


def make_stacked_env(num_envs, seed=0, padding="first"):
    def make():
        return FrameStackObservation(
            RandomFrames(), 4, padding_type=GYM_PADDING[padding]
        )

    env = GymWrapper(
        gym.vector.SyncVectorEnv(
            [make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    env.set_seed(seed)
    return env


def collect(env, T, num_batches):
    """Consecutive [num_envs, T] batches of random actions, like a collector's."""
    batches = []
    td = env.reset()
    for _ in range(num_batches):
        steps = []
        for _ in range(T):
            td = env.rand_action(td)
            out, td = env.step_and_maybe_reset(td)
            steps.append(out.clone())
        batches.append(torch.stack(steps, 1))
    return batches


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
    slots = rb._sampleable_slots()
    # a full ring keeps capacity // T sampleable slots (and wraps around here)
    assert len(slots) == min(len(batches), capacity // T)
    for slot in slots.tolist():
        slot_id = int(rb._slot_id[slot])
        original = batches[slot_id]
        envs = torch.arange(N)
        got = rb.get_segments(envs, torch.full((N,), slot))
        assert torch.equal(got["observation"], original["observation"])
        assert torch.equal(got["next", "observation"], original["next", "observation"])
        for key in ("action", ("next", "reward"), ("next", "done")):
            assert torch.equal(got[key], original[key])


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


def test_inconsistent_batches_raise():
    N, T = 2, 6
    rb = FrameStackReplayBuffer(N, 100, T, 4, pixels_key="observation", padding="first")
    batches = collect(make_stacked_env(N, seed=4), T, 3)
    rb.extend(batches[0])
    with pytest.raises(ValueError, match="neither continues its previous segment"):
        rb.extend(batches[2])  # skips a batch
    with pytest.raises(ValueError, match=r"\[num_envs, T\] = \[2, 6\]"):
        rb.extend(batches[1][:, :3])


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
    for slot in rb._sampleable_slots().tolist():
        original = batches[int(rb._slot_id[slot])]
        got = rb.get_segments(torch.arange(N), torch.full((N,), slot))
        assert torch.equal(got["pixels"], original["pixels"])
        assert torch.equal(got["next", "pixels"], original["next", "pixels"])
