"""bench/lunar_lander.py: runs go on to the budget, a resumed run of ours keeps what
its checkpoint had, and the summary reports every seed."""

import pytest
from builders import load_script

lunar_lander = load_script("bench/lunar_lander.py")


def test_budget_recorder_trains_past_the_threshold_to_the_budget(clock):
    rec = lunar_lander.BudgetRecorder(budget=30_000)
    rec.begin()
    clock.evaluate(rec, 10_000, 250.0)
    assert rec.stop_reason(10_000) is None
    clock.evaluate(rec, 20_000, 150.0)
    clock.evaluate(rec, 30_000, 220.0)
    assert rec.stop_reason(30_000) == "budget"
    out = rec.result(30_000, "budget")
    assert out["env_steps_to_threshold"] == 10_000  # the first, not the last
    assert out["train_s_to_threshold"] == pytest.approx(10.0)
    assert out["final_eval"] == 220.0


def test_resumed_recorder_keeps_evaluations_and_clock_of_its_checkpoint(
    tmp_path, clock
):
    path = tmp_path / "recorder.json"
    first = lunar_lander.BudgetRecorder(budget=100_000, path=path)
    first.begin()
    clock.evaluate(first, 10_000, -100.0)
    clock.evaluate(first, 20_000, 210.0)
    clock.now += 5.0  # training after the evaluation, before the checkpoint
    first.keep(20_000)  # 25 s of training, 2 of evaluation
    clock.evaluate(first, 30_000, 0.0)
    first.keep(30_000)
    clock.evaluate(first, 40_000, 0.0)  # lost: no checkpoint after it

    # the process died; the last checkpoint written was the one at 20 000
    resumed = lunar_lander.BudgetRecorder(budget=100_000, path=path)
    resumed.restore(20_000)
    clock.now += 60.0  # the new process's setup: not training time
    resumed.begin()
    assert [e["env_steps"] for e in resumed.evals] == [10_000, 20_000]
    assert resumed.reached["env_steps"] == 20_000
    clock.evaluate(resumed, 30_000, 5.0, train_s=7.0)
    assert resumed.evals[-1]["train_s"] == pytest.approx(25.0 + 7.0)
    out = resumed.result(30_000, "budget")
    assert out["resumed_at"] == [20_000]
    assert out["eval_s_total"] == pytest.approx(3.0)


def test_restore_refuses_a_checkpoint_whose_clock_was_not_kept(tmp_path, clock):
    path = tmp_path / "recorder.json"
    rec = lunar_lander.BudgetRecorder(budget=100_000, path=path)
    rec.begin()
    rec.keep(10_000)
    with pytest.raises(RuntimeError, match="no training clock"):
        lunar_lander.BudgetRecorder(budget=100_000, path=path).restore(20_000)


def record(candidate, seed, reached_at, final):
    return {
        "candidate": candidate,
        "seed": seed,
        "reached": reached_at is not None,
        "env_steps_to_threshold": reached_at,
        "train_s_to_threshold": None if reached_at is None else reached_at / 1000,
        "final_eval": final,
        "final_env_steps": 1_000_000,
        "evals": [{"train_s": 500.0}],
    }


def test_summary_lists_every_seed_and_takes_medians_over_those_that_reached():
    records = [
        record("ours", 0, 300_000, 250.0),
        record("ours", 1, None, 120.0),
        record("ours", 2, 500_000, 230.0),
        record("di_acer", 0, None, -50.0),
    ]
    ours, di = lunar_lander.summary(records, seeds=[0, 1, 2])
    assert ours["env_steps_to_threshold_per_seed"] == {
        0: 300_000,
        1: "not reached",
        2: 500_000,
    }
    assert ours["reached"] == 2
    assert ours["env_steps_to_threshold"] == {
        "median": 400_000,
        "min": 300_000,
        "max": 500_000,
        "n": 2,
    }
    assert ours["final_eval"]["median"] == 230.0
    assert di["missing_seeds"] == [1, 2]
    assert di["env_steps_to_threshold"] is None
