"""bench/lunar_lander.py: runs go on to the budget, a resumed run of ours keeps what
its checkpoint had, and the summary reports every seed."""

import json
import sys
from types import SimpleNamespace

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
    resumed.restore_kept(20_000)
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
        lunar_lander.BudgetRecorder(budget=100_000, path=path).restore_kept(20_000)


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


class Killed(Exception):
    """The session's end, killing the run's process mid-run."""


def fake_sb3(monkeypatch, clock, kill_at=None):
    """Stable-Baselines3 as train_sb3 uses it, for one DQN whose every rollout is
    1000 env steps of 1 s of training (``kill_at``: the env steps at which its
    process dies) and whose saves take 5 s; the seeds its envs were made with."""
    seeds = []

    class Callback:
        def init_callback(self, model):
            self.model = model

    class DQN:
        def __init__(self, policy, env, seed, device, verbose, **kwargs):
            self.num_timesteps, self.replay = 0, []

        @classmethod
        def load(cls, path, env, device):
            model = cls("MlpPolicy", env, None, device, 0)
            model.num_timesteps = json.loads(path.read_text())
            return model

        def save(self, path):
            clock.now += 5.0
            path.write_text(json.dumps(self.num_timesteps))

        @property
        def replay_buffer(self):
            return SimpleNamespace(size=lambda: len(self.replay))

        def save_replay_buffer(self, path):
            path.write_text(json.dumps(self.replay))

        def load_replay_buffer(self, path):
            self.replay = json.loads(path.read_text())

        def set_random_seed(self, seed):
            pass

        def get_vec_normalize_env(self):
            return None

        def predict(self, obs, deterministic):
            return [0] * len(obs), None

        def learn(self, total_timesteps, callback, reset_num_timesteps):
            assert reset_num_timesteps == (self.num_timesteps == 0)
            total_timesteps += self.num_timesteps  # as SB3 does without a reset
            callback.init_callback(self)
            callback._on_training_start()
            while self.num_timesteps < total_timesteps:
                callback._on_rollout_start()
                clock.now += 1.0
                self.num_timesteps += 1000
                self.replay.append(self.num_timesteps)
                if self.num_timesteps == kill_at:
                    raise Killed
                if not callback._on_step():
                    return

    modules = {
        "stable_baselines3": SimpleNamespace(
            A2C=None, PPO=None, DQN=DQN, __version__="fake"
        ),
        "stable_baselines3.common.callbacks": SimpleNamespace(BaseCallback=Callback),
        "stable_baselines3.common.env_util": SimpleNamespace(
            make_vec_env=lambda task, n_envs, seed: seeds.append(seed)
        ),
        "stable_baselines3.common.vec_env": SimpleNamespace(VecNormalize=None),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return seeds


def test_an_sb3_run_resumes_from_its_latest_save_with_its_evaluations_and_clock(
    tmp_path, monkeypatch, clock, capsys
):
    (tmp_path / "settings.json").write_text(json.dumps({"checkpoint_interval": 20_000}))
    run_dir = tmp_path / "sb3_dqn-seed3"
    run_dir.mkdir()
    returns = iter([-100.0, 210.0, 150.0, 180.0, 230.0])
    seeded = []  # whether each evaluation seeded its environment copies

    def greedy_return(envs, act, seed, first, max_steps):
        assert len(envs) == 10 and max_steps == 1_000
        act([[0.0] * 8] * len(envs))
        seeded.append(first)
        clock.now += 2.0
        return next(returns)

    train_sb3 = lunar_lander.train_sb3.__globals__
    monkeypatch.setitem(train_sb3, "greedy_return", greedy_return)
    monkeypatch.setitem(train_sb3, "eval_envs", lambda task, episodes: [None] * 10)

    # evaluations at 10k, 20k, 30k, 40k; saves at 20k and 40k; killed at 45k
    seeds = fake_sb3(monkeypatch, clock, kill_at=45_000)
    with pytest.raises(Killed):
        lunar_lander.run_sb3("sb3_dqn", "LunarLander-v3", 3, 50_000, None, run_dir)
    latest = json.loads((run_dir / "latest.json").read_text())
    assert latest["dir"] == "checkpoint-40000"
    assert [p.name for p in run_dir.glob("checkpoint-*")] == ["checkpoint-40000"]

    clock.now += 100.0  # the next session's setup: not training time
    resumed_seeds = fake_sb3(monkeypatch, clock)
    out = lunar_lander.run_sb3("sb3_dqn", "LunarLander-v3", 3, 50_000, None, run_dir)
    assert seeds == [3] and resumed_seeds == [3 + 40_000]  # fresh episodes
    assert out["stopped"] == "budget" and out["final_env_steps"] == 50_000
    assert out["resumed_at"] == [40_000]
    evals = [(e["env_steps"], e["return"]) for e in out["evals"]]
    assert evals == [
        (10_000, -100.0),
        (20_000, 210.0),
        (30_000, 150.0),
        (40_000, 180.0),
        (50_000, 230.0),
    ]
    assert out["env_steps_to_threshold"] == 20_000  # reached before the save
    # 50 rollouts of 1 s: the lost 5 s after the save, the saves, the setup and
    # the evaluations are not training time
    assert out["evals"][-1]["train_s"] == pytest.approx(50.0)
    assert out["eval_s_total"] == pytest.approx(10.0)
    assert seeded == [True, False, False, False, True]  # again in the new process
    # the replay came back with the model: the 40 rollouts' before the save
    assert "resumed at 40000 env steps, 40 transitions in replay" in (
        capsys.readouterr().out
    )
    assert json.loads((run_dir / "model.zip").read_text()) == 50_000  # the final


def test_continue_restores_a_committed_results_runs_and_holds_to_its_settings(
    tmp_path, monkeypatch
):
    # a fresh checkout has no runs directory: --continue brings back the finished
    # runs of the committed result, so that only the missing ones run
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(lunar_lander, "export_commit", lambda rev: (rev, tmp_path))
    settings = {
        "task": lunar_lander.TASK,
        "threshold": lunar_lander.THRESHOLD,
        "budget_env_steps": 500_000,
        "protocol": lunar_lander.PROTOCOL,
        "checkpoint_interval": lunar_lander.CHECKPOINT_INTERVAL,
        "ours_commit": "abc123",
        "seeds": [0, 1],  # the rest of a result's settings is not the runs'
    }
    runs = [record("sb3_dqn", 0, 80_000, 250.5), record("sb3_ppo", 0, None, 150.0)]
    for run in runs:
        run["settings"] = {"algo": run["candidate"]}
    committed = tmp_path / "lunar_lander_sb3-20270101T000000Z.json"
    committed.write_text(json.dumps({"settings": settings, "runs": runs}))

    def main(runs_dir, budget=500_000, resume=committed):
        argv = ["--candidates", "sb3_dqn", "--seeds", "0", "1", "--summary"]
        argv += ["--budget", str(budget), "--runs-dir", str(runs_dir)]
        argv += ["--result-name", "ll"] + (
            ["--continue", str(resume)] if resume else []
        )
        monkeypatch.setattr(sys, "argv", ["lunar_lander.py", *argv])
        lunar_lander.main()

    main(tmp_path / "runs")
    record_file = tmp_path / "runs" / "sb3_dqn-seed0" / "record.json"
    assert json.loads(record_file.read_text()) == runs[0]
    (result,) = (tmp_path / "results").glob("ll-*.json")
    payload = json.loads(result.read_text())
    assert [(r["candidate"], r["seed"]) for r in payload["runs"]] == [("sb3_dqn", 0)]
    assert not payload["complete"]
    assert payload["settings"]["ours_commit"] == "abc123"  # the committed runs'
    # the restored directory goes on as any other; restoring into it again would
    # mix two results
    main(tmp_path / "runs", resume=None)
    with pytest.raises(SystemExit, match="already holds runs"):
        main(tmp_path / "runs")
    # runs of another setting than the committed ones are refused
    with pytest.raises(SystemExit, match="another setting"):
        main(tmp_path / "other", budget=400_000)
