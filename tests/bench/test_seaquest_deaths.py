"""bench/seaquest_deaths.py tells how a Seaquest episode ended from the game's own
state: scripted action sequences whose ends are known from MinAtar's rules."""

import pytest
from builders import load_script

pytest.importorskip("minatar")

seaquest_deaths = load_script("bench/seaquest_deaths.py")

NOOP, UP, DOWN = 0, 2, 4


def scripted(actions, then):
    """``actions`` one per step, then ``then`` for ever (restarting each episode)."""
    state = {"step": 0}

    def choose(obs):
        step = state["step"]
        state["step"] += 1
        return actions[step] if step < len(actions) else then

    def reset():
        state["step"] = 0

    return choose, reset


def play_each(choose, reset, episodes, max_steps):
    records = []
    for i in range(episodes):
        reset()
        # without sticky actions, so that every step does what the script says
        records += seaquest_deaths.play(
            choose,
            1,
            max_steps,
            seed=seaquest_deaths.EPISODE_SEED + i,
            sticky_action_prob=0.0,
        )
    return records


def test_rising_without_a_diver_ends_the_game_as_surfaced_empty():
    # one step down, one up: back at the surface with no diver on board
    choose, reset = scripted([DOWN, UP], then=NOOP)
    records = play_each(choose, reset, episodes=5, max_steps=50)
    assert [r["end"] for r in records] == ["surfaced_empty"] * 5
    assert [r["length"] for r in records] == [2] * 5
    assert all(r["surfacings"] == 0 for r in records)


def test_staying_at_the_surface_uses_no_oxygen_and_reaches_the_limit():
    # enemies spawn in rows 1-8: at the surface nothing reaches the sub
    choose, reset = scripted([], then=NOOP)
    records = play_each(choose, reset, episodes=3, max_steps=400)
    assert [r["end"] for r in records] == ["limit"] * 3
    assert [r["length"] for r in records] == [400] * 3


def test_staying_under_water_ends_by_oxygen_after_one_tank_or_by_a_hit():
    choose, reset = scripted([], then=DOWN)
    records = play_each(choose, reset, episodes=10, max_steps=1_000)
    ends = {r["end"] for r in records}
    assert ends <= {"oxygen", "hit"}, ends
    assert "oxygen" in ends  # at the bottom row most episodes outlast the tank
    # the tank holds 200 steps under water; the first step down is the first
    for r in records:
        if r["end"] == "oxygen":
            assert r["length"] == seaquest_deaths.MAX_OXYGEN + 1
        else:
            assert r["length"] <= seaquest_deaths.MAX_OXYGEN


def test_summary_counts_every_end():
    records = [
        {"return": 1.0, "length": 10, "surfacings": 0, "most_divers": 0, "end": "hit"},
        {
            "return": 3.0,
            "length": 201,
            "surfacings": 1,
            "most_divers": 2,
            "end": "oxygen",
        },
        {
            "return": 5.0,
            "length": 201,
            "surfacings": 0,
            "most_divers": 1,
            "end": "oxygen",
        },
    ]
    summary = seaquest_deaths.summarize(records)
    assert summary["ends"] == {"hit": 1, "oxygen": 2}
    assert summary["episodes_with_a_surfacing"] == 1
    assert summary["return_median"] == 3.0
    assert summary["length_median"] == 201
