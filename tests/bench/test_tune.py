"""bench/tune.py: ``--study`` keeps a second study of a task apart from the first
(its own database and export), ``--space`` narrows the space it samples, and a study
refuses to resume over another space."""

import json
import sys
from pathlib import Path

import pytest
from builders import load_script

pytest.importorskip("optuna")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
tune = load_script("bench/tune.py")


def test_space_replaces_only_the_named_choices_and_ranges():
    space = tune.narrowed(["T=5,10", "replay_ratio=1.0,8.0", "lr=1e-4,1e-3"])
    assert space["T"] == ("collector.T", "cat", [5, 10])
    assert space["replay_ratio"] == ("replay.ratio", "cat", [1.0, 8.0])
    assert space["lr"] == ("optim.lr", "log", (1e-4, 1e-3))
    unchanged = set(tune.SPACE) - {"T", "replay_ratio", "lr"}
    assert {k: space[k] for k in unchanged} == {k: tune.SPACE[k] for k in unchanged}
    assert tune.narrowed(["delta=0.3,null"])["delta"][2] == [0.3, None]
    # one value pins a setting, a log-uniform one too (as one choice)
    assert tune.narrowed(["lr=0.002"])["lr"] == ("optim.lr", "cat", [0.002])


@pytest.mark.parametrize(
    "spec, words",
    [
        ("horizon=5,10", "name one of"),
        ("T", "name one of"),
        ("lr=1e-3,1e-4", "low,high"),
        ("T=five", "JSON value"),
    ],
)
def test_space_rejects_what_it_cannot_read(spec, words):
    with pytest.raises(SystemExit, match=words):
        tune.narrowed([spec])


def test_first_trial_is_the_defaults_with_the_given_values_inside_the_space():
    space = tune.narrowed(["T=5,10"])
    assert tune.first_trial(space, ["T=5"]) == {**tune.DEFAULTS, "T": 5}
    # the defaults' T=20 is not a choice any more
    with pytest.raises(SystemExit, match="T=20 lies outside"):
        tune.first_trial(space, [])


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(tune, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    return tmp_path


def test_a_named_study_has_its_own_files_and_keeps_its_space(dirs):
    argv = ["--task", "CartPole-v1", "--study", "small", "--space", "T=5,10"]
    tune.main([*argv, "--first", "T=5", "--export"])
    assert (dirs / "runs" / "CartPole-v1-small.db").exists()
    assert not (dirs / "runs" / "CartPole-v1.db").exists()
    exported = json.loads(
        (dirs / "results" / "tune-cartpole_v1-small.json").read_text()
    )
    assert exported["space"]["T"] == ["collector.T", "cat", [5, 10]]
    assert "--study small" in exported["command"]
    assert "--space T=5,10" in exported["command"]
    assert "--seeds" not in exported["command"]  # the tuning seeds: the default
    # resumed over the same space: fine; over another: refused
    tune.main([*argv, "--first", "T=5", "--export"])
    with pytest.raises(SystemExit, match="another space"):
        tune.main([*argv[:-1], "T=5,20", "--first", "T=5", "--export"])


def test_the_exported_command_names_seeds_and_late_when_not_the_defaults(dirs):
    argv = ["--task", "CartPole-v1", "--seeds", "100", "101", "102", "103"]
    tune.main([*argv, "--late", "3", "--export"])
    exported = json.loads((dirs / "results" / "tune-cartpole_v1.json").read_text())
    assert "--seeds 100 101 102 103 --late 3" in exported["command"]
    assert exported["settings"]["seeds"] == [100, 101, 102, 103]


def test_without_study_the_first_study_files_are_used(dirs):
    tune.main(["--task", "CartPole-v1", "--export"])
    assert (dirs / "runs" / "CartPole-v1.db").exists()
    exported = json.loads((dirs / "results" / "tune-cartpole_v1.json").read_text())
    assert exported["command"] == (
        "nice -n 19 python bench/tune.py --task CartPole-v1 "
        "--trials 60 --budget 30000 --settle 10000"
    )
    assert exported["space"]["T"] == ["collector.T", "cat", [5, 10, 20, 40]]


def run(reached_at, stable, final, cpu_s=5.0):
    return {
        "reached": reached_at is not None,
        "stable": stable,
        "env_steps_to_threshold": reached_at,
        "cpu_s_to_threshold": None if reached_at is None else cpu_s / 2,
        "final_env_steps": final,
        "cpu_s_total": cpu_s,
    }


def test_env_steps_objective_ranks_every_stable_seed_before_any_other():
    budget = 30_000
    solved_late = run(29_000, True, 30_000)
    collapsed_early = run(6_000, False, 16_000)
    never = run(None, False, 30_000)
    value = {
        name: tune.seed_value(r, "env_steps", budget)
        for name, r in [
            ("late", solved_late),
            ("collapsed", collapsed_early),
            ("never", never),
        ]
    }
    assert value == {"late": 29_000, "collapsed": 16_000 + budget, "never": 60_000}
    # the default objective is unchanged: CPU seconds, FAIL_S for an unsolved seed
    assert tune.seed_value(solved_late) == 2.5
    assert tune.seed_value(never) == 5.0 + tune.FAIL_S


def test_a_study_keeps_its_objective(dirs):
    # a committed export with one finished trial: restored into a fresh database
    trial = {
        "number": 0,
        "state": "COMPLETE",
        "value": 1.0,
        "params": tune.DEFAULTS,
        "runs": [run(8_000, True, 18_000), run(None, False, 30_000)],
    }
    path = dirs / "results" / "tune-cartpole_v1-steps.json"
    path.write_text(json.dumps({"trials": [trial]}))
    argv = ["--task", "CartPole-v1", "--study", "steps", "--export"]
    tune.main([*argv, "--objective", "env_steps"])
    exported = json.loads(path.read_text())
    # ranked anew from its runs by this objective: (8k + 30k + 30k) / 2
    assert exported["trials"][0]["value"] == (8_000 + 60_000) / 2
    assert "--objective env_steps" in exported["command"]
    assert "env steps" in exported["objective"]
    with pytest.raises(SystemExit, match="minimises env_steps"):
        tune.main(argv)


def test_final_return_ranks_by_the_late_return_and_runs_to_the_budget(
    dirs, monkeypatch
):
    # a higher return at the budget ranks first, whether or not it ever solved
    steady = {**run(None, False, 500_000), "late_mean": 180.0}
    spiked = {**run(100_000, False, 500_000), "late_mean": -20.0}
    assert tune.seed_value(steady, "final_return", 500_000) == -180.0
    assert tune.seed_value(spiked, "final_return", 500_000) == 20.0
    # each run goes on past the threshold to the budget, with LunarLander's protocol
    seen = {}

    def fake_train(overrides, rec):
        seen["overrides"], seen["rec"] = overrides, rec

    def fake_run(task, seed, args, params, run_dir):
        seen["settle"] = args.settle
        result = tune.run_seed(
            task,
            seed,
            args.budget,
            args.settle,
            args.late,
            params,
            run_dir,
            args.objective,
        )
        return {**result, "late_mean": 100.0 + seed}

    monkeypatch.setattr(tune, "train_ours", fake_train)
    monkeypatch.setattr(tune, "run_in_process", fake_run)
    argv = ["--task", "LunarLander-v3", "--objective", "final_return"]
    tune.main(
        [*argv, "--budget", "500000", "--trials", "1", "--seeds", "100", "101"]
        + ["--sampler-seed", "3"]
    )
    assert seen["settle"] == 500_000
    assert "eval.interval=10000" in seen["overrides"]
    assert "eval.max_steps=1000" in seen["overrides"]
    assert seen["rec"].threshold == 200.0
    # evaluations only from late (5) intervals before the budget: those it reads
    rec, calls = seen["rec"], []
    rec.begin()
    for steps in (10_000, 440_000, 450_000, 500_000):
        rec.evaluate(steps, lambda steps=steps: calls.append(steps) or 100.0)
    assert calls == [450_000, 500_000]
    assert [e["env_steps"] for e in rec.evals] == [450_000, 500_000]
    exported = json.loads((dirs / "results" / "tune-lunarlander_v3.json").read_text())
    assert exported["trials"][0]["value"] == -200.5  # minus the mean of 200 and 201
    assert exported["trials"][0]["sampler_seed"] == 3  # the process's that ran it
    assert exported["protocol"] == {
        "interval": 10_000,
        "episodes": 10,
        "max_steps": 1_000,
    }
    assert "--objective final_return" in exported["command"]


def test_a_trial_exported_before_a_setting_joined_the_space_ran_at_its_default(dirs):
    older = {k: v for k, v in tune.DEFAULTS.items() if k != "lr_schedule"}
    trial = {
        "number": 0,
        "state": "COMPLETE",
        "value": 1.0,
        "sampler_seed": 1,
        "params": {**older, "lr": 0.002},
        "runs": [run(8_000, True, 18_000)],
    }
    path = dirs / "results" / "tune-cartpole_v1.json"
    path.write_text(json.dumps({"trials": [trial]}))
    tune.main(["--task", "CartPole-v1", "--export"])
    (restored,) = json.loads(path.read_text())["trials"]
    assert restored["params"] == {**tune.DEFAULTS, "lr": 0.002}
    assert restored["params"]["lr_schedule"] == "constant"
    assert restored["sampler_seed"] == 1


def test_a_restored_study_keeps_every_trials_number(dirs):
    # a failed trial and one still running when the machine went sit between two
    # finished ones: each keeps its number (the docs name trials by it), and the
    # unfinished ones come back failed, with the runs they had finished
    def trial(number, state, lr, runs):
        value = 1.0 if state == "COMPLETE" else None
        params = {**tune.DEFAULTS, "lr": lr}
        return {
            "number": number,
            "state": state,
            "value": value,
            "params": params,
            "runs": runs,
        }

    trials = [
        trial(0, "COMPLETE", 0.001, [run(8_000, True, 18_000)]),
        trial(1, "FAIL", 0.002, []),
        {**trial(2, "RUNNING", 0.003, [run(9_000, True, 19_000)]), "sampler_seed": 7},
        trial(3, "COMPLETE", 0.004, [run(7_000, True, 17_000, cpu_s=3.0)]),
    ]
    path = dirs / "results" / "tune-cartpole_v1.json"
    path.write_text(json.dumps({"trials": trials}))
    tune.main(["--task", "CartPole-v1", "--export"])
    exported = json.loads(path.read_text())["trials"]
    assert [(t["number"], t["state"]) for t in exported] == [
        (0, "COMPLETE"),
        (1, "FAIL"),
        (2, "FAIL"),
        (3, "COMPLETE"),
    ]
    assert [t["params"]["lr"] for t in exported] == [0.001, 0.002, 0.003, 0.004]
    assert exported[2]["runs"] == trials[2]["runs"]
    assert exported[2]["sampler_seed"] == 7
    # the best by its number: trial 3 (1.5 CPU s to a stable solve, trial 0 2.5)
    assert json.loads(path.read_text())["best"]["number"] == 3


def test_a_resumed_process_draws_other_trials_than_its_first_start(dirs, monkeypatch):
    # the sampler is seeded anew at each start: with only --sampler-seed, a process
    # resumed with the same seed drew its first start's trials again (same settings,
    # same runs, the same value: the LunarLander study repeated two trials so)
    def fake_run(task, seed, args, params, run_dir):
        return run(8_000, True, 18_000)

    monkeypatch.setattr(tune, "run_in_process", fake_run)
    argv = ["--task", "CartPole-v1", "--seeds", "100", "--sampler-seed", "1"]
    tune.main([*argv, "--trials", "3"])  # the defaults, then two sampled trials
    tune.main([*argv, "--trials", "5"])  # resumed: two more
    path = dirs / "results" / "tune-cartpole_v1.json"
    trials = json.loads(path.read_text())["trials"]
    assert len(trials) == 5
    settings = [json.dumps(t["params"], sort_keys=True) for t in trials]
    assert len(set(settings)) == 5
    # each records the seed its process's sampler had: reproducible from the study
    seeds = [t["sampler_seed"] for t in trials]
    assert seeds[:3] == [1, 1, 1] and seeds[3] == seeds[4] != 1


def test_fully_off_policy_trials_need_replay(dirs, monkeypatch):
    assert tune.override("replay.on_policy_updates", False).endswith("=false")
    assert tune.DEFAULTS["on_policy"] is True  # the example's default
    ran = []
    monkeypatch.setattr(
        tune, "run_in_process", lambda *a: ran.append(a) or run(8_000, True, 18_000)
    )
    argv = ["--task", "CartPole-v1", "--study", "off", "--seeds", "100"]
    space = ["--space", "on_policy=false", "replay_ratio=0.0,2.0"]
    first = ["--first", "on_policy=false", "replay_ratio=0.0"]
    tune.main([*argv, *space, *first, "--trials", "1"])
    path = dirs / "results" / "tune-cartpole_v1-off.json"
    (trial,) = json.loads(path.read_text())["trials"]
    # the example would refuse it: pruned, never run
    assert trial["state"] == "PRUNED" and not ran


def test_grid_runs_each_combination_once(dirs, monkeypatch):
    ran = []
    monkeypatch.setattr(
        tune, "run_in_process", lambda *a: ran.append(a[3]) or run(8_000, True, 18_000)
    )
    pinned = [f"{k}={json.dumps(v)}" for k, v in tune.DEFAULTS.items()]
    # the defaults need not be in a grid
    space = [*pinned, "num_envs=4", "on_policy=true,false", "replay_ratio=2.0,4.0"]
    argv = ["--task", "CartPole-v1", "--study", "grid", "--seeds", "100", "--grid"]
    tune.main([*argv, "--space", *space, "--trials", "2"])
    tune.main([*argv, "--space", *space, "--trials", "10"])  # resumed: the rest
    combos = sorted((p["on_policy"], p["replay_ratio"]) for p in ran)
    assert combos == [(False, 2.0), (False, 4.0), (True, 2.0), (True, 4.0)]
    assert all(p["lr"] == tune.DEFAULTS["lr"] and p["num_envs"] == 4 for p in ran)
    with pytest.raises(SystemExit, match="lr"):
        tune.main([*argv[:2], "--study", "grid2", "--grid", "--trials", "1"])
