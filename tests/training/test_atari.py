import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("ale_py")

from _frame_replay_helpers import assert_rebuilt_as_collected
from builders import checkpoint_component, example_config, run_example
from omegaconf import OmegaConf

from torchrl_acer.trainers import ACERTrainer  # noqa: E402
from torchrl_acer.training.atari import ale_game_name, make_atari_env  # noqa: E402
from torchrl_acer.training.experiment import (  # noqa: E402
    check_config,
    make_collector,
    make_loss,
    make_optimizer,
)
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer  # noqa: E402

# the example's own builders (its networks and training keys)
EXAMPLES = Path(__file__).parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
import utils_atari  # noqa: E402


def test_game_names():
    assert ale_game_name("ALE/Pong-v5") == "pong"
    assert ale_game_name("ALE/SpaceInvaders-v5") == "space_invaders"
    assert ale_game_name("ALE/BeamRider-v5") == "beam_rider"
    with pytest.raises(ValueError, match="not an ALE/<Game>-v5 id"):
        ale_game_name("Breakout-v4")


def test_preprocessing_and_training_signals():
    env = make_atari_env("ALE/Breakout-v5", num_envs=2, seed=0)
    # named, so that a collector brings a GPU policy's actions back (test_envs.py)
    assert env.device == torch.device("cpu")
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


def test_the_seeds_torchrl_gives_collector_workers_seed_the_games():
    """TorchRL seeds a collector's workers with ``seed_generator``'s draws, up to
    2**32 - 1; the ALE takes C ints (a worker given one over 2**31 - 1 died)."""
    games = []
    for _ in range(2):
        env = make_atari_env("ALE/Breakout-v5", num_envs=2)
        env.set_seed(2**32 - 2)
        torch.manual_seed(0)
        games.append(env.rollout(40, break_when_any_done=False)["next", "pixels"])
        env.close()
    assert torch.equal(*games)


def test_unknown_game_is_named():
    with pytest.raises(ValueError, match="NoSuchGame"):
        make_atari_env("ALE/NoSuchGame-v5")


# a short run of the example: 2 games, replay from the start, one short evaluation game
SHORT_RUN = [
    "env.num_envs=2",
    "collector.T=10",
    "replay.start=0",
    "replay.capacity=400",
    "eval.episodes=1",
    "eval.max_steps=30",
    "logger.progress_bar=false",
]


def test_pong_smoke_with_checkpoint_and_resume(tmp_path):
    """A few hundred agent steps of Pong through the whole loop, then a resume."""
    common = [
        *SHORT_RUN,
        "compile=false",  # the default compiles: a minute for a few hundred steps
        "eval.interval=200",
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
    checkpoint = tmp_path / "run" / "checkpoints" / "last"
    assert checkpoint_component(checkpoint, "trainer_state")["collected_frames"] == 300
    replay = checkpoint_component(checkpoint, "replay_buffer")
    assert replay["_written"].tolist() == [15]  # frame-lean replay
    out = run_example(
        "acer_atari.py",
        *common,
        "collector.total_frames=400",
        f"resume={checkpoint}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "at 300 frames" in out.stdout and "after 400 env steps" in out.stdout


@pytest.mark.slow  # compiling the loss takes a minute or more on a small CPU
def test_the_default_compiled_loss_trains(tmp_path):
    """The example's defaults compile the loss (``compile=true``, with
    ``loss.check_values=false``): a short run trains with it, on-policy and
    replayed updates, and ends with its evaluation."""
    out = run_example(
        "acer_atari.py",
        *SHORT_RUN,
        "eval.interval=100",
        "collector.total_frames=100",
        f"logger.run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final greedy evaluation (1 episodes) after 100 env steps" in out.stdout
    checkpoint = tmp_path / "run" / "checkpoints" / "last"
    stepper = checkpoint_component(checkpoint, "trainer_module.optimization_stepper")
    assert stepper["optimizer_step_count"] > 5  # replayed updates beside one per batch


def breakout(num_envs, seed):
    """``make_collector``'s ``make_env`` (it must pickle): games cut at 37 agent
    steps, so that episodes end inside segments."""
    return make_atari_env(
        "ALE/Breakout-v5", num_envs=num_envs, seed=seed, max_episode_steps=37
    )


def test_two_async_worker_processes_train_with_the_frame_replay(tmp_path):
    """``collector.backend=multiprocess collector.num_workers=2
    collector.sync=false``, built as ``examples/acer_atari.py`` builds it: the
    workers' batches arrive interleaved, none dropped while the learner is busy,
    each goes to its worker's rows of the frame-lean replay, and every segment
    it can sample (its rings wrap around) rebuilds the frame stacks its worker's
    environment produced; the trainer makes replayed updates."""
    cfg = example_config("config_atari")
    for key, value in {
        "env.num_envs": 2,
        "collector.T": 10,
        "collector.backend": "multiprocess",
        "collector.num_workers": 2,
        "collector.sync": False,
        "collector.max_policy_lag": None,  # every batch stored
        "replay.start": 0,
    }.items():
        OmegaConf.update(cfg, key, value)
    check_config(cfg)
    torch.manual_seed(0)
    env = breakout(2, seed=0)
    actor, critic = utils_atari.make_models(env)
    loss = make_loss(cfg.loss, actor, critic)
    loss.set_keys(**utils_atari.TRAINING_KEYS)
    N, T, workers = 2, 10, 2
    trainer = ACERTrainer(
        collector=make_collector(cfg, breakout, actor, device="cpu", env=env),
        loss_module=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        total_frames=6 * workers * N * T,  # 6 batches per worker
        # 40 steps per env: 5 slots of T, the oldest overwritten by the sixth
        replay_buffer=FrameStackReplayBuffer(N, 40, T, N, num_workers=workers),
        replay_ratio=cfg.replay.ratio,
        replay_start=0,
        progress_bar=False,
        weight_update_interval=1,
    )
    collected = [[], []]  # each worker's batches, in order

    def record(batch):
        collected[int(batch["worker_index"].flatten()[0])].append(batch.clone())

    def busy():
        if sum(map(len, collected)) in (3, 4):
            # a learner busy for longer than TorchRL's one-second wait for room
            # in its queue: TorchRL's own async collector drops the waiting
            # worker's batch then (its next one does not continue it)
            time.sleep(2.5)

    trainer.register_op("batch_process", record)
    trainer.register_op("post_steps", busy)  # after the batch's updates
    try:
        trainer.train()
    finally:
        trainer.collector.shutdown()
    replay = trainer.schedule.replay_buffer
    written = [len(c) for c in collected]  # 6 each, as the workers take turns
    assert replay._written.tolist() == written and sum(written) == 12
    assert min(written) >= 4
    assert any(b["next", "done"][:, :-1].any() for c in collected for b in c)
    assert replay.history_only_segments == 0
    # 4 sampleable slots per env once the ring of 5 is full (the oldest: history)
    sampleable = N * sum(min(w, 5) - (w >= 5) for w in written)
    assert assert_rebuilt_as_collected(replay, collected) == sampleable
    # replayed updates beside one per batch
    assert trainer.optimization_stepper.optimizer_step_count > 12


def test_ray_workers_train_the_example_with_the_frame_replay(tmp_path):
    """``python examples/acer_atari.py collector.backend=ray
    collector.num_workers=2`` (issue #16), synchronous (a batch holds both
    workers' envs): it trains with the frame-lean replay, one ring per worker's
    env; its checkpoint resumes only with two workers, the message naming both
    numbers."""
    pytest.importorskip("ray", reason="Ray is an extra: pip install -e .[ray]")
    common = [
        *SHORT_RUN,
        "env.name=ALE/Breakout-v5",
        "compile=false",
        "eval.interval=null",
        "logger.log_interval=100",
        f"logger.run_dir={tmp_path / 'run'}",
        "threads=1",
    ]
    out = run_example(
        "acer_atari.py",
        *common,
        "collector.backend=ray",
        "collector.num_workers=2",
        "collector.sync=true",
        "ray.num_cpus=2",
        "collector.total_frames=200",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "after 200 env steps" in out.stdout
    checkpoint = tmp_path / "run" / "checkpoints" / "last"
    replay = checkpoint_component(checkpoint, "replay_buffer")
    assert replay["num_workers"] == 2 and replay["_written"].tolist() == [5, 5]
    assert replay["history_only_segments"] == 0
    stepper = checkpoint_component(checkpoint, "trainer_module.optimization_stepper")
    assert stepper["optimizer_step_count"] > 5  # replayed updates beside one per batch
    out = run_example(
        "acer_atari.py",
        *common,
        "collector.total_frames=300",
        f"resume={checkpoint}",
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "2 collector worker(s), this one is for 1" in out.stderr
