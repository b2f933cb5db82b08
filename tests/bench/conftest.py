"""Shared by the bench scripts' tests: a clock the test moves itself."""

import time

import pytest


class Clock:
    """A ``time.perf_counter`` that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def evaluate(self, rec, steps, value, train_s=10.0, eval_s=1.0):
        """``train_s`` of training, then ``rec``'s evaluation of ``eval_s`` returning
        ``value``."""
        self.now += train_s

        def fn():
            self.now += eval_s
            return value

        rec.evaluate(steps, fn)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock
