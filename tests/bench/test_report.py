"""bench/report.py --check: the committed results pages, the README's results table
and the tables in the hand-written pages are what bench/results/*.json give, and a
stale one is caught."""

import shutil
import sys
from pathlib import Path

import pytest
from builders import load_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # report.py imports its neighbours
report = load_script("bench/report.py")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the generated files (the README and the docs' pages)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(
        ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("_build")
    )
    return tmp_path


def test_committed_pages_match_the_data(checkout):
    assert report.main(["--check", "--root", str(checkout)]) == 0


def test_a_stale_page_fails_the_check_with_a_diff(checkout, capsys):
    page = checkout / "docs" / "results" / "learning.md"
    page.write_text(page.read_text().replace("5/5", "4/5", 1))
    assert report.main(["--check", "--root", str(checkout)]) == 1
    assert "learning.md (committed)" in capsys.readouterr().out
    assert report.main(["--write", "--root", str(checkout)]) == 0
    assert report.main(["--check", "--root", str(checkout)]) == 0


def test_a_stale_readme_table_fails_the_check(checkout):
    readme = checkout / "README.md"
    readme.write_text(readme.read_text().replace("| CartPole-v1 → 500 | ", "| x | ", 1))
    assert report.main(["--check", "--root", str(checkout)]) == 1


def test_a_stale_table_in_a_hand_written_page_fails_the_check(checkout, capsys):
    page = checkout / "docs" / "recurrent.md"
    text = page.read_text()
    assert "<!-- report: recurrent_cartpole -->" in text
    page.write_text(text.replace("| 5/5 |", "| 4/5 |", 1))
    assert report.main(["--check", "--root", str(checkout)]) == 1
    assert "recurrent.md (committed)" in capsys.readouterr().out
    assert report.main(["--write", "--root", str(checkout)]) == 0
    assert page.read_text() == text


def test_every_block_named_in_the_pages_is_known_and_every_block_is_used():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    used = {
        m[2]
        for page in pages
        if "_build" not in page.parts
        for m in report.BLOCK.finditer(page.read_text())
    }
    assert used == set(report.BLOCKS)


def test_an_unknown_block_is_an_error_naming_it(checkout):
    page = checkout / "docs" / "atari.md"
    page.write_text(page.read_text() + "\n<!-- report: nope -->\n<!-- /report -->\n")
    with pytest.raises(KeyError, match="nope"):
        report.main(["--check", "--root", str(checkout)])


def test_a_longer_lunar_lander_run_is_read_at_the_peers_budget():
    """Ours' 1M runs beside the SB3 peers' 500k: the evaluation at the first point
    at or past the budget, a threshold reached only after it does not count, and
    the last-100k mean ends there too."""
    steps = [100_000, 450_000, 490_000, 500_136, 520_000, 1_000_000]
    values = [-100.0, 190.0, 180.0, 170.0, 250.0, 260.0]
    run = {
        "candidate": "ours",
        "seed": 0,
        "evals": [
            {"env_steps": s, "return": v} for s, v in zip(steps, values, strict=True)
        ],
    }
    out = report.at_budget(run, 500_000, 200.0)
    assert out["env_steps"] == 500_136
    assert out["return"] == 170.0
    assert out["to_threshold"] is None  # 250 at 520k is past the budget
    assert out["late_mean"] == pytest.approx((190.0 + 180.0 + 170.0) / 3)
    assert report.at_budget(run, 400_000, -150.0)["to_threshold"] == 100_000


def test_a_lunar_lander_run_that_stops_before_the_budget_is_refused():
    run = {
        "candidate": "sb3_dqn",
        "seed": 3,
        "evals": [{"env_steps": 10_000, "return": 0.0}],
    }
    with pytest.raises(ValueError, match="sb3_dqn seed 3 stops at 10000"):
        report.at_budget(run, 500_000, 200.0)


def test_a_peer_file_names_each_librarys_version_from_its_own_runs():
    """A LunarLander peers' file whose first run is TorchRL's PPO still names the
    Stable-Baselines3 version of its SB3 runs, and TorchRL's from TorchRL's."""
    result = {
        "runs": [
            {"candidate": "torchrl_ppo", "versions": {"torchrl": "0.14.1"}},
            {"candidate": "sb3_a2c", "versions": {"stable_baselines3": "2.9.2"}},
        ]
    }
    assert report.peer_version(result, "sb3", "stable_baselines3") == "2.9.2"
    assert report.peer_version(result, "torchrl_ppo", "torchrl") == "0.14.1"


def preset_file(overrides, seeds=(0, 1)):
    """A bench/learning.py file as ``preset_row`` reads it."""
    steps = [160, 250_080, 500_000]
    return {
        "overrides": overrides,
        "threshold": 200.0,
        "runs": [
            {
                "seed": seed,
                "eval_steps": [float(s) for s in steps],
                "eval_reward": [-100.0, 210.0 + seed, 250.0 + seed],
            }
            for seed in seeds
        ],
    }


PEERS = {
    "task": "LunarLander-v3",
    "threshold": 200.0,
    "budget_env_steps": 500_000,
    "seeds": [0, 1, 2],
    "protocol": {"interval": 10_000, "episodes": 10, "max_steps": 1_000},
}
PRESET = [
    "preset=lunar_lander",
    "env.name=LunarLander-v3",
    "eval.interval=10000",
    "eval.episodes=10",
    "eval.max_steps=1000",
]


def test_the_lunar_lander_preset_run_is_read_at_the_peers_budget(tmp_path):
    row = report.preset_row(tmp_path / "x.json", preset_file(PRESET), PEERS)
    assert row["candidate"] == "ours_preset" and row["missing"] == [2]
    assert [a["return"] for a in row["at_budget"]] == [250.0, 251.0]
    assert [a["to_threshold"] for a in row["at_budget"]] == [250_080, 250_080]


@pytest.mark.parametrize(
    "changed", ["eval.episodes=5", "env.name=LunarLander-v2", "preset=default"]
)
def test_a_preset_run_under_another_protocol_is_refused(tmp_path, changed):
    name = changed.split("=")[0]
    overrides = [o for o in PRESET if not o.startswith(name + "=")] + [changed]
    with pytest.raises(ValueError, match="not preset=lunar_lander under the protocol"):
        report.preset_row(tmp_path / "x.json", preset_file(overrides), PEERS)


def test_the_return_target_is_met_only_at_or_above_every_finished_peer():
    ours = [10.0, 14.0, 16.0]  # median 14
    below = ("dqn", [9.0, 10.0, 11.0], True)
    assert report.return_target_met(ours, [below, ("ppo", [5.0] * 3, True)]) == "yes"
    assert report.return_target_met(ours, [below, ("a2c", [14.0] * 3, True)]) == "yes"
    assert report.return_target_met(ours, [below, ("a2c", [15.0] * 3, True)]) == "no"
    unfinished = ("dqn", [20.0], False)  # ahead so far, seeds to go
    assert report.return_target_met(ours, [unfinished]).startswith("open")
