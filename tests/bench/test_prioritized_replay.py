"""bench/prioritized_replay.py: segments are replayed in proportion to their
priority, a replayed batch's priorities come from the update that trained on it,
and the recorded errors are the loss's own |Q_ret - Q| per segment."""

import pytest
import torch
from builders import discrete_setup, load_script
from tensordict import TensorDict

from torchrl_acer.objectives import acer
from torchrl_acer.trainers.acer import make_segment_replay_buffer

pr = load_script("bench/prioritized_replay.py")
T = 4


def segments(n, start=0):
    return TensorDict(
        {"x": torch.arange(start, start + n).repeat_interleave(T).view(n, T)}, [n, T]
    )


def test_replay_follows_priorities_updated_by_each_replayed_update():
    errors = {}
    replay = pr.PrioritizedSegments(make_segment_replay_buffer(40, T, 6), errors)
    replay.extend(segments(4))
    # new segments enter at the largest priority so far (1 in an empty buffer)
    assert replay.priority[:4].tolist() == [1.0] * 4
    batch = replay.sample()
    drawn = replay.pending.clone()
    assert batch["x"][:, 0].tolist() == drawn.tolist()
    # the update on that batch measured its errors: written at the next sample
    errors["error"] = torch.full((6,), 0.0)
    errors["error"][drawn == drawn[0]] = 7.0
    replay.sample()
    assert replay.priority[drawn[0]] == pytest.approx(7.0 + pr.EPS)
    others = set(range(4)) - set(drawn.tolist())
    assert all(replay.priority[i] == 1.0 for i in others)  # not replayed: unchanged
    # a segment far above the rest is drawn in proportion to priority ** ALPHA
    replay.priority[:4] = torch.tensor([100.0, 1.0, 1.0, 1.0])
    errors["error"] = None  # no update ran since: nothing is written
    torch.manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(500):
        replay.pending = None
        counts += torch.bincount(replay.sample()["x"][:, 0], minlength=4)
    share = (100**pr.ALPHA) / (100**pr.ALPHA + 3)
    assert counts[0] / counts.sum() == pytest.approx(share, abs=0.02)
    # later segments enter at the largest priority, above any segment's error
    replay.extend(segments(2, start=4))
    assert replay.priority[4:6].tolist() == [100.0, 100.0]


def test_recorded_errors_are_the_mean_absolute_retrace_error_per_segment(monkeypatch):
    errors = {}
    seen = {}
    original = acer.categorical_terms

    def spy(*args, **kwargs):
        seen["terms"] = original(*args, **kwargs)
        return seen["terms"]

    # through monkeypatch, so that record_errors' wrapper goes with the spy
    monkeypatch.setattr(acer, "categorical_terms", spy)
    pr.record_errors(errors)
    loss, batch, *_ = discrete_setup(delta=1.0)
    loss(batch)
    target = seen["terms"]["value_target"]
    q = seen["terms"]["action_value"].detach()
    expected = [
        sum(abs(float(target[b, t, 0] - q[b, t, 0])) for t in range(batch.shape[1]))
        / batch.shape[1]
        for b in range(batch.shape[0])
    ]
    assert errors["error"].tolist() == pytest.approx(expected)
