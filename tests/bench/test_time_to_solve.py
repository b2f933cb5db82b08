"""bench/time_to_solve.py: a run stops at the first evaluation at the threshold, or
with ``settle`` that many env steps later, its late mean saying whether it stayed
solved; the summary counts the seeds that did; bench/report.py puts two files side
by side only if they share the protocol."""

import json
import sys
from pathlib import Path

import pytest
from builders import load_script

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
time_to_solve = load_script("bench/time_to_solve.py")


def run(rec, clock, returns, interval=1_000):
    """Evaluates ``returns`` in turn, 1 s of training apart, until ``rec`` stops;
    the env steps it stopped at."""
    rec.begin()
    for i, value in enumerate(returns, start=1):
        clock.now += 1.0
        rec.evaluate(i * interval, lambda value=value: value)
        if rec.stop_reason(i * interval):
            return i * interval
    raise AssertionError("the recorder never stopped")


def test_without_settle_a_run_stops_at_the_first_reach(clock):
    rec = time_to_solve.recorder("CartPole-v1", 100_000, None)
    steps = run(rec, clock, [20.0, 500.0, 30.0])
    out = rec.result(steps, rec.stop_reason(steps))
    assert (steps, out["stopped"]) == (2_000, "threshold")
    assert out["env_steps_to_threshold"] == 2_000
    assert out["train_s_to_threshold"] == pytest.approx(2.0)
    assert out["late_mean"] is None and out["solved_for_good"] is None


@pytest.mark.parametrize(
    "after, late_mean, good",
    [
        ([500.0] * 5, 500.0, True),
        ([500.0, 500.0, 500.0, 500.0, 100.0], 420.0, False),  # collapsed at the end
    ],
)
def test_with_settle_a_run_goes_on_and_its_late_mean_decides(
    clock, after, late_mean, good
):
    rec = time_to_solve.recorder("CartPole-v1", 100_000, None, settle=5_000, late=5)
    steps = run(rec, clock, [20.0, 500.0, *after, 500.0, 500.0])
    out = rec.result(steps, rec.stop_reason(steps))
    # reached at 2 000, settled 5 000 env steps later, not before
    assert (steps, out["stopped"]) == (7_000, "settled")
    assert out["env_steps_to_threshold"] == 2_000
    assert out["late_mean"] == pytest.approx(late_mean)
    assert out["solved_for_good"] is good
    summary = time_to_solve.summary(
        [{"candidate": "x", "task": "CartPole-v1", "returncode": 0, **out}]
    )[0]
    assert summary["solved_for_good"] == int(good)
    assert summary["late_mean"]["median"] == pytest.approx(late_mean)


def test_a_settled_run_that_never_reached_is_not_solved_for_good(clock):
    rec = time_to_solve.recorder("CartPole-v1", 3_000, None, settle=5_000)
    steps = run(rec, clock, [20.0, 30.0, 40.0])
    out = rec.result(steps, rec.stop_reason(steps))
    assert out["stopped"] == "budget" and out["solved_for_good"] is False


def result_file(
    directory, name, candidates, max_minutes=None, tasks=("CartPole-v1",), presets=None
):
    runs = [
        {"candidate": c, "task": t, "seed": 0, "returncode": 0}
        for t in tasks
        for c in candidates
    ]
    payload = {
        "settings": {
            "thresholds": {t: time_to_solve.THRESHOLDS[t] for t in tasks},
            "budget_env_steps": {t: 500_000 for t in tasks},
            "max_minutes": max_minutes,
            "protocol": {**time_to_solve.PROTOCOL, "text": "t"},
            "ours_tuned_presets": presets or time_to_solve.PRESETS,
        },
        "runs": runs,
        "summary": [{"candidate": c, "task": t} for t in tasks for c in candidates],
    }
    (directory / f"time_to_solve-{name}.json").write_text(json.dumps(payload))


def test_report_takes_ours_and_the_peers_from_their_newest_files(tmp_path, monkeypatch):
    report = load_script("bench/report.py")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    result_file(tmp_path, "1", ["ours", "sb3_a2c"])
    result_file(tmp_path, "2", ["sb3_a2c", "sb3_ppo"])
    result_file(tmp_path, "3", ["ours_tuned"])
    files, _, groups, _ = report.side_by_side()
    assert [p.name for p, _ in files] == [
        "time_to_solve-3.json",
        "time_to_solve-2.json",
    ]
    assert [g["candidate"] for g in groups] == ["ours_tuned", "sb3_a2c", "sb3_ppo"]
    report.side_by_side.cache_clear()
    result_file(tmp_path, "4", ["sb3_dqn"], max_minutes=3.0)
    with pytest.raises(ValueError, match="differ in settings.max_minutes"):
        report.side_by_side()


def test_report_takes_ours_per_task_from_the_newest_file_that_ran_it(
    tmp_path, monkeypatch
):
    """A file that re-ran one task's preset leaves the other task's rows as they were."""
    report = load_script("bench/report.py")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    both = ("CartPole-v1", "Acrobot-v1")
    result_file(tmp_path, "1", ["sb3_a2c"], tasks=both)
    old = {"CartPole-v1": "old", "Acrobot-v1": "acro"}
    result_file(tmp_path, "2", ["ours_tuned", "ours"], tasks=both, presets=old)
    new = {"CartPole-v1": "new", "Acrobot-v1": "acro"}
    result_file(tmp_path, "3", ["ours_tuned"], presets=new)
    files, settings, groups, runs = report.side_by_side()
    assert [p.name for p, _ in files] == [
        "time_to_solve-3.json",
        "time_to_solve-2.json",
        "time_to_solve-1.json",
    ]
    ours = [(g["task"], g["candidate"]) for g in groups if g["candidate"] != "sb3_a2c"]
    assert ours == [
        ("CartPole-v1", "ours_tuned"),
        ("Acrobot-v1", "ours_tuned"),
        ("Acrobot-v1", "ours"),
    ]
    assert settings["ours_tuned_presets"] == {
        "CartPole-v1": "new",
        "Acrobot-v1": "acro",
    }
    assert set(settings["thresholds"]) == set(both)
    assert len(runs) == len(groups)


@pytest.mark.parametrize("zoo_timesteps, stopped", [(10_000, "budget"), (256, None)])
def test_torchrl_ppo_trains_until_the_budget_or_the_zoo_timesteps(
    zoo_timesteps, stopped
):
    """TorchRL's PPO peer, a real run of two Collector batches (8 envs x 32 steps)
    at most: it ends at the budget, or at the zoo's n_timesteps when that comes
    first, with a last greedy evaluation there; it runs in the project's venv."""
    hp = time_to_solve.ZOO[("sb3_ppo", "CartPole-v1")]
    rec = time_to_solve.recorder("CartPole-v1", 512, None)
    steps, stop, version = time_to_solve.train_torchrl_ppo(
        "CartPole-v1", hp, 0, rec, zoo_timesteps, episodes=2, max_steps=50
    )
    assert steps == min(512, zoo_timesteps)
    assert stop == (stopped or "zoo n_timesteps")
    assert [e["env_steps"] for e in rec.evals] == [steps]
    assert 2 <= rec.evals[0]["return"] <= 50  # two greedy episodes, capped at 50
    assert version
    assert time_to_solve.python_for("torchrl_ppo", "/nowhere") == sys.executable
