"""bench/_common.interleaved_samples: who runs after whom."""

from builders import _bench_common


def test_each_round_starts_one_function_further():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = _bench_common().interleaved_samples(fns, rounds=3, min_time=0.0)
    # one warm-up call each (no sizing calls with min_time=0), then the rounds
    rounds = calls[3:]
    assert rounds == list("abcbcacab")
    assert all(len(s) == 3 for s in samples.values())
