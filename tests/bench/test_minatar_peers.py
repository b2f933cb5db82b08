"""bench/minatar_peers.py: a resumed run keeps the evaluations and clock of its
checkpoint, the summary gives every game's peers over the seeds finished beside
ours, and bench/report.py puts the best finished peer in the README's MinAtar rows
(from fake records: no training, no Stable-Baselines3)."""

import json
import sys
from pathlib import Path

import pytest
from builders import load_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the scripts import their neighbours
peers = load_script("bench/minatar_peers.py")
report = load_script("bench/report.py")


def test_a_resumed_recorder_goes_on_with_its_checkpoints_evaluations_and_clock(clock):
    first = peers.PeerRecorder(budget=1_000_000)
    first.begin()
    clock.evaluate(first, 50_000, 1.0)
    clock.evaluate(first, 100_000, 2.0)
    clock.now += 3.0  # training after the save, lost with the process
    state = first.state(100_000)
    assert state["train_s"] == pytest.approx(23.0)
    state["train_s"] = 20.0  # the clock when the checkpoint was saved

    resumed = peers.PeerRecorder(budget=1_000_000)
    resumed.restore(state)
    assert not resumed.due(149_999) and resumed.due(150_000)
    clock.now += 500.0  # setup of the new process: not training time
    resumed.begin()
    clock.evaluate(resumed, 150_000, 3.0, train_s=10.0, eval_s=4.0)
    assert [e["return"] for e in resumed.evals] == [1.0, 2.0, 3.0]
    assert resumed.evals[-1]["train_s"] == pytest.approx(30.0)
    assert resumed.eval_s == pytest.approx(6.0)
    assert resumed.resumed_at == [100_000]
    assert resumed.stop_reason(150_000) is None  # no threshold: on to the budget


def record(game, algo, seed, final):
    return {
        "game": game,
        "candidate": algo,
        "seed": seed,
        "final_eval": final,
        "final_env_steps": 1_000_448 if algo == "sb3_ppo" else 1_000_000,
        "train_s": 100.0 * (seed + 1),
    }


def test_summary_gives_each_peer_over_its_finished_seeds_beside_ours():
    records = [
        record("breakout", "sb3_dqn", 0, 10.0),
        record("breakout", "sb3_dqn", 2, 20.0),
        record("breakout", "sb3_ppo", 1, 30.0),
        record("space_invaders", "sb3_a2c", 0, 100.0),
    ]
    progress = {"breakout-sb3_dqn-seed1": 300_000}
    games = peers.summary(records, [0, 1, 2], progress=progress)
    assert [g["game"] for g in games] == ["breakout", "space_invaders"]
    breakout = {p["algo"]: p for p in games[0]["peers"]}
    dqn = breakout["sb3_dqn"]
    assert dqn["seeds"] == [0, 2] and dqn["missing_seeds"] == [1]
    assert dqn["saved_env_steps_of_missing"] == {1: 300_000}
    assert dqn["final_eval"] == {"median": 15.0, "min": 10.0, "max": 20.0, "n": 2}
    assert breakout["sb3_ppo"]["final_env_steps"]["median"] == 1_000_448
    assert breakout["sb3_a2c"]["final_eval"] is None
    assert breakout["sb3_a2c"]["missing_seeds"] == [0, 1, 2]
    # ours: the committed learning file, on the same protocol
    ours = games[0]["ours"]
    assert ours["file"] == peers.OURS["breakout"]
    assert ours["final_eval"]["median"] == pytest.approx(14.1, abs=1e-4)
    assert sorted(ours["final_eval_per_seed"]) == [0, 1, 2]


def test_the_headline_names_the_best_finished_peer_and_its_file(monkeypatch):
    records = [
        record("breakout", "sb3_dqn", 0, 10.0),
        record("breakout", "sb3_ppo", 0, 30.0),
        record("breakout", "sb3_ppo", 1, 20.0),
    ]
    fake = {"summary": peers.summary(records, [0, 1, 2])}
    path = Path("minatar_peers-20270101T000000Z.json")
    monkeypatch.setattr(report, "newest", lambda prefix: (path, fake))
    cell, file = report.minatar_best_peer("minatar_breakout")
    assert file == path
    assert cell == (
        "Stable-Baselines3 PPO (zoo's Atari settings): 25.0 (20.0-30.0); "
        "2/3 seeds (missing 2)"
    )
    # no peer finished on SpaceInvaders, and no file has Asterix
    assert report.minatar_best_peer("minatar_space_invaders") is None
    assert report.minatar_best_peer("minatar_asterix") is None


def test_continue_restores_a_committed_results_runs_and_holds_to_its_settings(
    tmp_path, monkeypatch
):
    # as bench/lunar_lander.py's --continue: a fresh checkout goes on from the
    # committed result's finished runs
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "results"))
    settings = {
        "games": peers.GAMES,
        "budget_env_steps": 1_000_000,
        "protocol": peers.PROTOCOL,
        "save_interval": peers.SAVE_INTERVAL,
        "settings": json.loads(json.dumps(peers.SETTINGS)),
        "seeds": [0, 1, 2],  # the rest of a result's settings is not the runs'
    }
    runs = [
        record("breakout", "sb3_dqn", 0, 9.4),
        record("breakout", "sb3_ppo", 1, 5.1),
    ]
    committed = tmp_path / "minatar_peers-20270101T000000Z.json"
    committed.write_text(json.dumps({"settings": settings, "runs": runs}))

    def main(runs_dir, budget=1_000_000, resume=committed):
        argv = ["--summary", "--budget", str(budget), "--runs-dir", str(runs_dir)]
        argv += ["--continue", str(resume)] if resume else []
        monkeypatch.setattr(sys, "argv", ["minatar_peers.py", *argv])
        peers.main()

    main(tmp_path / "runs")
    record_file = tmp_path / "runs" / "breakout-sb3_dqn-seed0" / "record.json"
    assert json.loads(record_file.read_text()) == runs[0]
    (result,) = (tmp_path / "results").glob("minatar_peers-*.json")
    payload = json.loads(result.read_text())
    finished = [(r["game"], r["candidate"], r["seed"]) for r in payload["runs"]]
    assert sorted(finished) == [("breakout", "sb3_dqn", 0), ("breakout", "sb3_ppo", 1)]
    main(tmp_path / "runs", resume=None)  # the restored directory goes on
    with pytest.raises(SystemExit, match="already holds runs"):
        main(tmp_path / "runs")
    with pytest.raises(SystemExit, match="another setting"):
        main(tmp_path / "other", budget=500_000)
