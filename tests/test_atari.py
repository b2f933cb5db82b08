import pytest
import torch

pytest.importorskip("ale_py")

from builders import run_example

from torchrl_acer.training.atari import ale_game_name, make_atari_env  # noqa: E402
from torchrl_acer.training.checkpoint import read_checkpoint  # noqa: E402


def test_game_names():
    assert ale_game_name("ALE/Pong-v5") == "pong"
    assert ale_game_name("ALE/SpaceInvaders-v5") == "space_invaders"
    assert ale_game_name("ALE/BeamRider-v5") == "beam_rider"
    with pytest.raises(ValueError, match="not an ALE/<Game>-v5 id"):
        ale_game_name("Breakout-v4")


def test_preprocessing_and_training_signals():
    env = make_atari_env("ALE/Breakout-v5", num_envs=2, seed=0)
    td = env.rollout(300, break_when_any_done=False)
    assert (
        td["pixels"].shape == (2, 300, 4, 84, 84) and td["pixels"].dtype == torch.uint8
    )
    lives, next_lives = td["lives"], td["next", "lives"]
    done = td["next", "done"].squeeze(-1)
    life_lost = (next_lives < lives) & ~done
    assert life_lost.any()
    # a lost life ends the training episode; the game (and its score) goes on
    assert torch.equal(td["next", "train_terminated"].squeeze(-1), life_lost | done)
    assert torch.equal(td["next", "train_done"].squeeze(-1), life_lost | done)
    reward = td["next", "reward"]
    assert torch.equal(td["next", "reward_clipped"], reward.sign())
    # the score is the raw return of a game
    if done.any():
        e, t = done.nonzero()[0].tolist()
        first = 0 if not done[e, :t].any() else done[e, :t].nonzero()[-1].item() + 1
        expected = reward[e, first : t + 1].sum()
        assert td["next", "episode_reward"][e, t].item() == pytest.approx(
            expected.item()
        )


def test_unknown_game_is_named():
    with pytest.raises(ValueError, match="NoSuchGame"):
        make_atari_env("ALE/NoSuchGame-v5")


def test_pong_smoke_with_checkpoint_and_resume(tmp_path):
    """A few hundred agent steps of Pong through the whole loop, then a resume."""
    common = [
        "env.num_envs=2",
        "collector.T=10",
        "replay.start=0",
        "replay.capacity=400",
        "eval.interval=200",
        "eval.episodes=1",
        "eval.max_steps=30",
        "logger.progress_bar=false",
        "logger.log_interval=100",
        "checkpoint.interval=200",
    ]
    out = run_example(
        "acer_atari.py",
        *common,
        "collector.total_frames=300",
        f"logger.run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "after 300 env steps" in out.stdout
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    _, state = read_checkpoint(checkpoint)
    assert state["counters"]["frames"] == 300
    assert state["replay_buffer"]["_written"] == 15  # frame-lean replay contents
    out = run_example(
        "acer_atari.py",
        *common,
        "collector.total_frames=400",
        f"resume={checkpoint}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "at 300 frames" in out.stdout and "after 400 env steps" in out.stdout


def test_several_workers_with_the_frame_replay_are_refused_at_start(tmp_path):
    """Batches from several workers' envs cannot feed the frame-lean replay (each
    stack is rebuilt from the previous segment of the same env): refused before
    anything is built, naming the settings (not a ValueError from the replay
    after the first batches, as it was)."""
    out = run_example(
        "acer_atari.py",
        "collector.backend=multiprocess",
        "collector.num_workers=2",
        f"logger.run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "collector.num_workers=2" in out.stderr and "replay.ratio" in out.stderr
    assert not (tmp_path / "run").exists()
